"""End-of-answer statistics for ``bench --quality``: where the answers to
block holes end, who ended them, and whether that was right.

Per column, over the block holes:

* ``open ends``: answers that end on a block opener whose body the suffix
  does not hold (target 0);
* ``prefix of raw``: answers that are a strict prefix of the ``raw``
  column's answer (the same model, to its own end token; ``raw[0.5b]``
  for the 0.5B's columns under ``--models``) when that raw
  answer passes its tests (functional holes) or matches exactly -- a right
  answer cut short;
* ``lines shown / cut``: lines of the answers, and lines of the raw answer
  that the answer left out where it is a prefix of it;
* ``ends``: how many answers ended by the model's end token (``model``)
  and by each cut rule (``suffix``, ``scope``, ``parse``, ``opener``,
  ``max_lines``, ...; see :mod:`soldaemon.pipeline.ending`), each with
  how many of those were right (passed, or exact where nothing ran).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from soldaemon_bench.quality.scores import Column, normalize


def _right(column: Column, i: int) -> bool:
    s = column.scores[i]
    return bool(s.passed) if s.passed is not None else s.exact


def _lines(text: str) -> int:
    t = normalize(text)
    return len(t.split("\n")) if t.strip() else 0


def summary(column: Column, kinds: list[str], raw: Column | None, kind: str = "block") -> dict[str, Any]:
    """The statistics (module doc) of ``column`` over the holes of ``kind``;
    ``raw``: the model-alone column of the same run (None: not run)."""
    idx = [i for i, k in enumerate(kinds) if k == kind and i < len(column.texts)]
    ends: Counter[str] = Counter()
    right: Counter[str] = Counter()
    prefix_of_raw = shown = cut = 0
    for i in idx:
        end = column.ends[i] if i < len(column.ends) and column.ends[i] else "unknown"
        ends[end] += 1
        right[end] += _right(column, i)
        text = normalize(column.texts[i])
        shown += _lines(text)
        if raw is None or raw is column or i >= len(raw.texts):
            continue
        full = normalize(raw.texts[i])
        if full.startswith(text) and len(full) > len(text):
            cut += _lines(full) - _lines(text)
            if _right(raw, i):
                prefix_of_raw += 1
    return {
        "n": len(idx),
        "open_ends": sum(column.open_ends[i] for i in idx if i < len(column.open_ends)),
        "prefix_of_passing_raw": prefix_of_raw if raw is not None else None,
        "lines_shown": shown,
        "lines_cut": cut if raw is not None else None,
        "ends": {e: {"n": n, "right": right[e]} for e, n in sorted(ends.items())},
    }


def raw_for(column: Column, columns: list[Column]) -> Column | None:
    """The ``raw`` column of the same model as ``column``: ``raw[0.5b]`` for
    ``sol[0.5b]`` or ``llama.vscode[0.5b]``, ``raw[1.5b]`` for
    ``sol[1.5b+0.5b]`` (``--models``), else ``raw``."""
    name = column.name
    label = name[name.rindex("[") + 1:-1] if name.endswith("]") and "[" in name else ""
    by_name = {c.name: c for c in columns}
    target = label.split("+")[0]           # sol[1.5b+0.5b]: the 1.5B drafted by the 0.5B
    return by_name.get(f"raw[{label}]") or by_name.get(f"raw[{target}]") or by_name.get("raw")


def table(columns: list[Column], kinds: list[str]) -> list[str]:
    """Markdown lines: the statistics per column for the block holes
    (nothing when there are none)."""
    if "block" not in kinds:
        return []
    out = ["", f"End of answers on the {kinds.count('block')} block holes (right = passed, or exact where "
           "nothing ran; prefix of raw = a strict prefix of the raw model's right answer):", "",
           "| column | open ends | prefix of raw | lines shown / cut | ends: n (right) |", "|---|---|---|---|---|"]
    for c in columns:
        raw = raw_for(c, columns)
        s = summary(c, kinds, raw)
        ends = ", ".join(f"{e} {v['n']} ({v['right']})" for e, v in s["ends"].items())
        pre = "—" if s["prefix_of_passing_raw"] is None or c is raw else str(s["prefix_of_passing_raw"])
        cut = "—" if s["lines_cut"] is None or c is raw else str(s["lines_cut"])
        out.append(f"| {c.name} | {s['open_ends']} | {pre} | {s['lines_shown']} / {cut} | {ends} |")
    return out
