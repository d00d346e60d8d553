"""The quality table, plot and JSON."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from soldaemon.policy.kernel_plan import Quality
from soldaemon_bench.holes import Hole
from soldaemon_bench.quality import ends
from soldaemon_bench.quality.scores import Column, Score


_METRICS = (("exact", "exact match"), ("first_line", "first-line EM"), ("edit_sim", "edit sim"),
            ("parses", "parses"))


def table(columns: list[Column], kinds: list[str]) -> list[str]:
    """A markdown table: one row per column, overall scores, EM (and pass@1
    where the holes could be executed) per hole kind, latency, decode rate."""
    present = [k for k in ("line", "block") if k in kinds]
    functional = any(sc.passed is not None for c in columns for sc in c.scores)
    head = ["column", "exact match %", "first-line EM %", "edit sim %", "parses %"]
    head += ["pass@1 %"] if functional else []
    head += [f"EM {k} ({kinds.count(k)}) %" for k in present]
    head += [f"pass@1 {k} %" for k in present] if functional else []
    head += ["e2e p50 ms", "TTFT p50 ms", "decode tok/s", "prompt tok p50", "gen tok p50"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in columns:
        s = c.summary(kinds)
        cells = [c.name] + [f"{s[m]:.1f}" for m, _ in _METRICS]
        cells += [f"{s['pass_at_1']:.1f}"] if functional else []
        cells += [f"{c.summary(kinds, k)['exact']:.1f}" for k in present]
        cells += [f"{c.summary(kinds, k)['pass_at_1']:.1f}" for k in present] if functional else []
        cells += [f"{s['e2e_p50_ms']:.0f}", f"{s['ttft_p50_ms']:.0f}", f"{s['decode_tok_s']:.1f}",
                  f"{s['prompt_tokens_p50']:.0f}", f"{s['generated_p50']:.0f}"]
        out.append("| " + " | ".join(cells) + " |")
    return out + ends.table(columns, kinds)


def plot(columns: list[Column], kinds: list[str], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import textwrap

    import matplotlib.pyplot as plt

    functional = any(sc.passed is not None for c in columns for sc in c.scores)
    metrics = _METRICS + ((("pass_at_1", "pass@1"),) if functional else ())
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.5), gridspec_kw={"width_ratios": [3, 1]})
    width = 0.8 / max(1, len(columns))
    for j, c in enumerate(columns):
        s = c.summary(kinds)
        xs = [i + j * width for i in range(len(metrics))]
        bars = ax.bar(xs, [s[m] for m, _ in metrics], width, label=c.name)
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
        ax2.bar([j], [s["e2e_p50_ms"]], 0.6, label=c.name, color=bars.patches[0].get_facecolor())
    ax.set_xticks([i + width * (len(columns) - 1) / 2 for i in range(len(metrics))], [m for _, m in metrics])
    ax.set_ylabel("% of holes (edit sim: mean %)")
    ax.set_ylim(0, 105)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax2.set_xticks(range(len(columns)), [c.name for c in columns], rotation=20, fontsize=8)
    ax2.set_ylabel("end-to-end p50 (ms)")
    ax2.grid(axis="y", alpha=0.3)
    fig.suptitle(textwrap.fill(title, 130), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_json(path: Path, info: dict[str, Any], seed: int, max_tokens: int, files: list[Path],
                holes: list[Hole], columns: list[Column]) -> None:
    kinds = [h.kind for h in holes]
    path.write_text(json.dumps({
        "info": info, "seed": seed, "max_tokens": max_tokens, "files": [f.name for f in files],
        "summary": {c.name: {"all": c.summary(kinds), **{k: c.summary(kinds, k) for k in ("line", "block")},
                             "ends": ends.summary(c, kinds, ends.raw_for(c, columns))}
                    for c in columns},
        "holes": [{"path": h.path, "line": h.line, "kind": h.kind, "language": h.language, "expected": h.expected,
                   "out": {c.name: {"text": c.texts[i], **asdict(c.scores[i]), "e2e_ms": c.e2e_ms[i],
                                    "end": c.ends[i] if i < len(c.ends) else "",
                                    "ttft_ms": c.ttft_ms[i], "prompt_tokens": c.prompt_tokens[i]}
                           for c in columns}}
                  for i, h in enumerate(holes)],
    }, indent=1))


def paired(c: Column, ref: Column) -> Quality:
    """``c`` against ``ref`` on the same holes, each right or not (its tests
    passed where the hole could be executed, else exact match): the record
    the kernel plan's ``QUALITY`` table holds."""
    def right(sc: Score) -> bool:
        return sc.passed if sc.passed is not None else sc.exact
    pairs = [(right(a), right(b)) for a, b in zip(c.scores, ref.scores)]
    return Quality(lost=sum(b and not a for a, b in pairs), won=sum(a and not b for a, b in pairs), n=len(pairs))


def agreement(columns: list[Column]) -> list[str]:
    """Lines: how many completions of each ``sol[...]`` column are identical
    to ``sol[float32]``'s, and its holes right or wrong only on one side
    (when both ran)."""
    ref = next((c for c in columns if c.name == "sol[float32]"), None)
    if ref is None:
        return []
    out = [""]
    for c in columns:
        if c is not ref and c.name.startswith("sol"):
            same = sum(a == b for a, b in zip(c.texts, ref.texts))
            out.append(f"{c.name}: {same}/{len(ref.texts)} completions identical to sol[float32]; "
                       f"{paired(c, ref).note()}")
    return out


def ratios(columns: list[Column], kinds: list[str]) -> list[str]:
    """Lines: each daemon column's end-to-end and TTFT p50 over the
    llama.vscode column on the same model, measured in this run
    (``sol`` ↔ ``llama.vscode``, ``sol[1.5b]`` ↔ ``llama.vscode[1.5b]``)."""
    by_name = {c.name: c for c in columns}
    out: list[str] = []
    for c in columns:
        if not c.name.startswith("sol") or " " in c.name or "+ctx" in c.name:
            continue
        label = c.name[3:] if c.name.startswith("sol[") else ""
        peer = by_name.get(f"llama.vscode{label}")
        if peer is None and label.startswith("[") and "+" in label:   # target+draft: the target's server
            peer = by_name.get(f"llama.vscode{label.split('+')[0]}]")
        if peer is None:
            continue
        s, p = c.summary(kinds), peer.summary(kinds)
        out.append(f"{c.name} / {peer.name} (same run): e2e p50 {s['e2e_p50_ms'] / p['e2e_p50_ms']:.2f}x, "
                   f"TTFT p50 {s['ttft_p50_ms'] / p['ttft_p50_ms']:.2f}x")
    return [""] + out if out else []
