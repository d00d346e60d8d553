#!/usr/bin/env python3
"""Merge a ``scripts/gpu_check.sh`` run into one JSON and a short summary.

Reads what the run left in ``--work`` (``steps.tsv``: step, exit status or
``skipped``, ms; ``lat-SHAPE.json`` from gpu_latency.py; ``mem-SHAPE.json``
from gpu_memory.py; ``doctor.json``), writes ``gpu_check.json`` and
``summary.md`` to ``--out`` and prints the summary (``--quiet``: not).
Partial results are accepted: with ``--planned`` the steps that did not run
(killed, skipped for time) are named as missing, and the figures of the
steps that did are reported; ``--partial`` marks a render in the middle of
a run (the script re-renders after every step, so a killed run keeps its
report). Exit status 1 when a check failed: a planned step missing, a step
that exited non-zero (the doctor excepted: its 1 is a verdict on the
machine, recorded, and only a crash counts), or a failure listed by a
script. Performance targets (issue 18, for an H200 in
bfloat16) are reported met or missed; ``--require-targets`` makes a miss a
failure too.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

# (name, what is compared, the limit; a value ≤ the limit meets it)
TARGETS = (
    ("decode_graphs_vs_eager", "decode ms/token with graphs ÷ eager", 0.5),
    ("decode_graphs_vs_floor", "decode ms/token with graphs ÷ the memory-bandwidth floor", 1.5),
    ("reuse_ttft_ms", "keystroke TTFT p50 on the reuse path, ms", 10.0),
    ("prefill_1k_ms", "cold prefill of a 1k-token prompt, ms (0.5B shape)", 30.0),
    ("decode_graphs_vs_compiled", "decode ms/token with graphs ÷ the model alone, compiled", 1.0),
)


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def shape_figures(lat: dict[str, Any] | None, mem: dict[str, Any] | None, shape: str) -> dict[str, Any]:
    """The per-shape figures the issue asks for, from the two scripts' JSON."""
    lat = lat or {}
    mem = mem or {}
    summary = lat.get("summary", {})
    decode = lat.get("decode", {})
    graphs = lat.get("graphs") or {}
    check = lat.get("graph_check") or {}
    trace = lat.get("trace", {})
    prefill = lat.get("prefill", {})
    rows = mem.get("rows", [])
    offloaded = [r for r in rows if r.get("offloaded_layers")]
    fig = {
        "eager_ms_per_token": summary.get("sol-eager", {}).get("ms_per_token_p50"),
        "graphs_ms_per_token": summary.get("sol-graphs", {}).get("ms_per_token_p50"),
        "generate_ms_per_token": summary.get("generate", {}).get("ms_per_token_p50"),
        # transformers' forward alone over a static cache under torch.compile (gpt-fast's recipe)
        "compiled_ms_per_token": summary.get("model-compiled", {}).get("ms_per_token_p50"),
        "compiled_ttft_ms": summary.get("model-compiled", {}).get("ttft_p50_ms"),
        "compiled_compile_s": (lat.get("compiled") or {}).get("compile_s"),
        "compiled_error": (lat.get("compiled") or {}).get("error"),
        "decode_graphs_vs_compiled": decode.get("graphs_vs_compiled"),
        "floor_ms_per_token": decode.get("floor_ms"),
        "read_bandwidth_gbs": decode.get("read_bandwidth_gbs"),
        "decode_graphs_vs_eager": decode.get("graphs_vs_eager"),
        "decode_graphs_vs_floor": decode.get("sol-graphs_vs_floor"),
        "graph_logit_max_abs_diff": check.get("max_abs_diff"),
        "graph_argmax_agreement": check.get("agreement"),
        "graph_free_running_identical": f"{check.get('free_equal')}/{check.get('documents')}" if check else None,
        "eager_vs_transformers_max_abs_diff": check.get("ref_max_abs_diff"),
        "eager_vs_transformers_agreement": f"{check.get('ref_agree')}/{check.get('ref_steps')}" if check else None,
        # per path against a float32 copy (half precision only): mean and max of max|logit diff|
        "vs_float32_anchor": {path: {k: a.get(k) for k in ("mean_err", "max_err", "decisive_agree", "decisive_steps")}
                              for path, a in (check.get("anchor") or {}).items()},
        "graph_captures": graphs.get("captures"), "graph_capture_ms": graphs.get("capture_ms"),
        "reuse_ttft_ms": trace.get("reuse_ttft_p50"), "reuse_keystrokes": trace.get("reuse_keystrokes"),
        "prefill_tokens": prefill.get("tokens"), "prefill_ms": prefill.get("ms"),
        "copy_bandwidth_gbs": mem.get("copy_bandwidth_gbs"),
        "prefetch_hit_rate": [(r["resident_pct"], r.get("prefetch_hit_rate")) for r in offloaded],
        "offloaded_ms_per_token": [(r["resident_pct"], r.get("ms_per_token")) for r in offloaded],
        "idle_release": lat.get("idle_release"),
        "graph_replays": graphs.get("replays"), "graph_verify_replays": graphs.get("verify_replays"),
        "attention": [{k: r.get(k) for k in ("position", "bucket", "eager_step_ms", "graphs_step_ms",
                                              "eager_verify9_ms", "graphs_verify9_ms", "step_max_abs_diff",
                                              "verify_max_abs_diff")} for r in lat.get("attention") or []],
        "attention_kernels": lat.get("attention_kernels"),
        "attention_cudnn": (lat.get("attention_cudnn") or {}).get("reason"),
        "cudnn_kept": (lat.get("attention_cudnn") or {}).get("cudnn"),
        "kv_park": mem.get("kv_park"),
        # our decoder layer under inductor inside our graphs, as the engine chose at load
        "layer_compile": (lat.get("info") or {}).get("layer_compile"),
    }
    fig["prefill_1k_ms"] = fig["prefill_ms"] if shape == "0.5b" and fig["prefill_tokens"] == 1024 else None
    return fig


def judge_targets(figures: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for key, what, limit in TARGETS:
        value = figures.get(key)
        if value is None:
            continue
        out.append({"target": key, "what": what, "limit": limit, "value": value, "met": value <= limit})
    return out


def doctor_readings(doctor: dict[str, Any] | None) -> dict[str, Any]:
    """Persistence mode, ECC, driver and CUDA versions from the doctor's JSON."""
    if not doctor:
        return {}
    gpus = (doctor.get("reading", {}).get("gpu") or {}).get("gpus") or []
    keep = ("name", "source", "driver_version", "cuda_driver_version", "compute_capability", "persistence_mode",
            "ecc_enabled", "ecc_pending", "pcie_gen_current", "pcie_gen_max", "pcie_width_current",
            "pcie_width_max", "sm_clock_max_mhz", "memory_total_bytes", "notes")
    return {"status": doctor.get("status"),
            "checks": {c.get("name"): f"{c.get('verdict')}: {c.get('detail')}" for c in doctor.get("checks", [])},
            "gpus": [{k: g.get(k) for k in keep if k in g} for g in gpus]}


def smi_header(path: Path, lines: int = 40) -> list[str]:
    """The head of ``nvidia-smi -q`` (driver, CUDA version, the GPU's name,
    its modes), up to the first section past the product's; [] without it."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    out = [line.rstrip() for line in text[:lines] if line.strip() and not set(line.strip()) <= {"="}]
    return out


def read_steps(work: Path) -> list[dict[str, Any]]:
    """steps.tsv's rows (a missing or half-written file: what can be read)."""
    steps = []
    try:
        text = (work / "steps.tsv").read_text()
    except OSError:
        return steps
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) != 3:
            continue                                       # a line cut by a kill
        name, rc, ms = parts
        skipped = rc == "skipped"
        try:
            steps.append({"step": name, "rc": None if skipped else int(rc), "skipped": skipped,
                          "s": int(ms) / 1000})
        except ValueError:
            continue                                       # a line cut by a kill
    return steps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--mode", default="cuda")
    ap.add_argument("--shapes", nargs="+", required=True)
    ap.add_argument("--planned", nargs="*", default=None, help="every step the run plans, in order")
    ap.add_argument("--partial", action="store_true", help="the run is still going (or was cut)")
    ap.add_argument("--quiet", action="store_true", help="do not print the summary")
    ap.add_argument("--require-targets", action="store_true")
    ap.add_argument("--commit", default="unknown", help="the checked-out commit the run tested")
    args = ap.parse_args(argv)

    steps = read_steps(args.work)
    ran = {s["step"] for s in steps if not s["skipped"]}
    planned = args.planned if args.planned is not None else [s["step"] for s in steps]
    missing = [name for name in planned if name not in ran]
    failures = [f"step {s['step']} exited {s['rc']}" for s in steps
                if not s["skipped"] and s["rc"] != 0 and not (s["step"] == "doctor" and s["rc"] == 1)]
    failures += [f"step {name} did not run" for name in missing if not args.partial]
    shapes: dict[str, Any] = {}
    targets: dict[str, list[dict[str, Any]]] = {}
    for shape in args.shapes:
        lat, mem = _load(args.work / f"lat-{shape}.json"), _load(args.work / f"mem-{shape}.json")
        for what, data in (("latency", lat), ("memory", mem)):
            if data is None and f"{what}-{shape}" in ran:
                failures.append(f"{shape}: the {what} step ran and wrote no JSON")
        if lat is None and mem is None:
            continue                                       # not reached: named in missing
        failures += [f"{shape}: {f}" for f in ((lat or {}).get("failures", []) + (mem or {}).get("failures", []))]
        shapes[shape] = {"figures": shape_figures(lat, mem, shape), "latency": lat, "memory": mem}
        # the targets are an H200's in bfloat16: a CPU dry run's figures are not judged
        targets[shape] = judge_targets(shapes[shape]["figures"]) if args.mode == "cuda" else []
    doctor = _load(args.work / "doctor.json")
    if doctor is None and "doctor" in ran:
        failures.append("doctor --json wrote no JSON")
    missed = [f"{shape}: {t['what']} = {t['value']} > {t['limit']}"
              for shape, ts in targets.items() for t in ts if not t["met"]]
    if args.require_targets:
        failures += [f"target missed: {m}" for m in missed]
    complete = not missing
    result = {"mode": args.mode, "commit": args.commit, "nvidia_smi_q": smi_header(args.work / "nvidia-smi-q.txt"),
              "ok": complete and not failures, "complete": complete,
              "in_progress": args.partial and not complete, "missing_steps": missing,
              "failures": failures, "targets_missed": missed, "steps": steps, "doctor": doctor_readings(doctor),
              "targets": targets, "shapes": shapes,
              # every step's JSON as written (the tarball beside this file holds the same and the rest)
              "step_json": {p.name: _load(p) for p in sorted(args.work.glob("*.json"))}}
    args.out.mkdir(parents=True, exist_ok=True)
    _write(args.out / "gpu_check.json", json.dumps(result, indent=1, default=str))
    text = summary_text(result)
    _write(args.out / "summary.md", text)
    if not args.quiet:
        print(text)
    return 0 if result["ok"] else 1


def _write(path: Path, text: str) -> None:
    """Write whole or not at all (a kill mid-write leaves the last report)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def summary_text(result: dict[str, Any]) -> str:
    verdict = "PASS" if result["ok"] else ("INCOMPLETE (in progress or cut)" if result["in_progress"] else "FAIL")
    lines = [f"# gpu_check ({result['mode']}): {verdict}", "", f"commit: {result['commit']}"]
    lines += [f"    {line.strip()}" for line in result["nvidia_smi_q"]
              if line.strip().startswith(("Driver Version", "CUDA Version", "Product Name"))]
    lines.append("")
    if result["missing_steps"]:
        lines.append("- MISSING (did not run): " + ", ".join(result["missing_steps"]))
    lines += [f"- FAIL: {f}" for f in result["failures"]]
    lines.append("steps: " + ", ".join(f"{s['step']} skipped" if s["skipped"] else f"{s['step']} rc={s['rc']} {s['s']:.0f}s"
                                       for s in result["steps"]))
    doc = result["doctor"]
    if doc:
        lines.append(f"doctor: {doc.get('status')}; gpus {doc.get('gpus')}")
        lines += [f"- {name}: {text}" for name, text in doc.get("checks", {}).items()]
    for shape, data in result["shapes"].items():
        f = data["figures"]
        lines += ["", f"## {shape}",
                  f"- decode ms/token: eager {_n(f['eager_ms_per_token'])}, graphs {_n(f['graphs_ms_per_token'])}"
                  f" (generate() {_n(f['generate_ms_per_token'])}); floor {_n(f['floor_ms_per_token'])} at "
                  f"{_n(f['read_bandwidth_gbs'])} GB/s; graphs/eager {_n(f['decode_graphs_vs_eager'])}, "
                  f"graphs/floor {_n(f['decode_graphs_vs_floor'])}",
                  f"- model alone, compiled (gpt-fast's recipe): {_n(f['compiled_ms_per_token'])} ms/token, TTFT "
                  f"{_n(f['compiled_ttft_ms'])} ms, compiled in {_n(f['compiled_compile_s'])} s; graphs/compiled "
                  f"{_n(f['decode_graphs_vs_compiled'])}" + (f" ({f['compiled_error']})" if f["compiled_error"] else ""),
                  f"- graphs vs eager: max |logit diff| {_n(f['graph_logit_max_abs_diff'])}, argmax agreement "
                  f"{_n(f['graph_argmax_agreement'])}, free-running identical {f['graph_free_running_identical']}; "
                  f"{f['graph_captures']} captures, {_n(f['graph_capture_ms'])} ms; eager vs transformers' "
                  f"forward: max |logit diff| {_n(f['eager_vs_transformers_max_abs_diff'])}, argmax agreement "
                  f"{f['eager_vs_transformers_agreement']}"
                  + "".join(f"; vs float32: {p} mean {_n(a['mean_err'])} max {_n(a['max_err'])}"
                            f" (decisive argmax {a['decisive_agree']}/{a['decisive_steps']})"
                            for p, a in f.get("vs_float32_anchor", {}).items()),
                  f"- keystroke TTFT p50 on the reuse path {_n(f['reuse_ttft_ms'])} ms "
                  f"({f['reuse_keystrokes']} keystrokes); cold prefill of {f['prefill_tokens']} tokens "
                  f"{_n(f['prefill_ms'])} ms",
                  f"- copy {_n(f['copy_bandwidth_gbs'])} GB/s; offloaded (resident %, ms/token) "
                  f"{f['offloaded_ms_per_token']}, prefetch hit rate {f['prefetch_hit_rate']}",
                  f"- idle release/restore: {f['idle_release']}",
                  f"- graph replays: {f['graph_replays']} steps, {f['graph_verify_replays']} verifies; attention "
                  "kernels: " + "; ".join(f"{a['kind']}@{a['bucket']}={a['backend']}" for a in (f["attention_kernels"] or [])),
                  f"- cuDNN attention {'kept' if f.get('cudnn_kept') else 'off'}: {f.get('attention_cudnn')}",
                  _layer_compile_line(f.get("layer_compile")),
                  "- attention rows (position, bucket: eager/graph step ms, eager/graph 9-row verify ms, max |diff|): "
                  + "; ".join(f"{r['position']}, {r['bucket']}: {_n(r['eager_step_ms'])}/{_n(r['graphs_step_ms'])}, "
                              f"{_n(r['eager_verify9_ms'])}/{_n(r['graphs_verify9_ms'])}, {_n(r['step_max_abs_diff'])}"
                              for r in f["attention"]),
                  "- KV parking: " + "; ".join(f"threshold {r['threshold']}: score {r['score_ms']} + park "
                                               f"{r['park_ms']} + restore {r['restore_ms']} ms"
                                               for r in (f["kv_park"] or []))]
        for t in result["targets"].get(shape, []):
            lines.append(f"- target {t['what']} <= {t['limit']}: {_n(t['value'])} "
                         f"{'met' if t['met'] else 'MISSED'}")
    return "\n".join(lines) + "\n"


def _layer_compile_line(choice: dict[str, Any] | None) -> str:
    """The engine's layer-compile choice (runtime/forward/compiled.py) as one line."""
    if not choice:
        return "- layer compiled (inductor in our graphs): not reported"
    return (f"- layer compiled (inductor in our graphs): {'kept' if choice.get('compiled') else 'not kept'}; "
            f"eager {_n(choice.get('eager_ms'))} vs compiled {_n(choice.get('compiled_ms'))} ms/step, compile "
            f"{_n(choice.get('compile_s'))} s{' (recorded)' if choice.get('reused') else ''}: {choice.get('reason')}")


def _n(x: Any) -> str:
    return f"{x:.4g}" if isinstance(x, (int, float)) and not isinstance(x, bool) else str(x)


if __name__ == "__main__":
    sys.exit(main())
