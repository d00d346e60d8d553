"""When the model ends a block answer by its own token, how sure was it?
(the ends of the block runs in docs/quality.md, "Where an answer ends, and why".)

Reruns, through the daemon's pipeline as ``bench --quality`` runs it
(``run_sol``: the editor's cut of the file, a cold cache), the holes of a
``bench --quality --functional`` JSON whose ``--column`` answer ended by
the model's end token, and records at that end the probability of the end
tokens and the likeliest other tokens. The pipeline's own decision is left
as it is (the end is taken); each rerun answer is checked against the
JSON's text, so a changed answer shows.

    PYTHONPATH=. python scripts/end_confidence.py --model qwen2.5-coder-1.5b \\
        --from docs/results/2026-12-03-block-128-1.5b-outline.json --json out.json

Prints one row per hole, lowest end probability first: pass/short/fail
(short: fewer lines than the code cut out), lines written/expected.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="embedded model name (the JSON's column's model)")
    ap.add_argument("--from", dest="src", required=True, type=Path, help="a bench --quality --functional JSON")
    ap.add_argument("--column", help="the column to read (default: the JSON's first)")
    ap.add_argument("--tokens", type=int, default=128, help="max tokens (the run's --tokens)")
    ap.add_argument("--limit", type=int, help="only the first N of those holes")
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args()

    import torch

    import soldaemon.runtime.decode.generate as generate_module
    from soldaemon.config import load_config
    from soldaemon.measure.functional import cached_holes, holes_cache_path
    from soldaemon.measure.quality.columns import run_sol
    from soldaemon.runtime.engine.local import load_engine

    run = json.loads(args.src.read_text(encoding="utf-8"))
    column = args.column or next(iter(run["summary"]))
    ended = {(h["path"], h["line"]): h for h in run["holes"] if h["out"][column]["end"] == "model"}
    holes = [fh.hole for fh in cached_holes(len(run["holes"]), run.get("seed", 0), holes_cache_path(("block",)),
                                            kinds=("block",))
             if (fh.hole.path, fh.hole.line) in ended][:args.limit]
    config = load_config().with_overrides({"model.path": None, "model.name": args.model, "model.draft": "off",
                                           "completion.hold_end": True}, source="end_confidence")
    engine = load_engine(config)
    seen: list[tuple[float, list[tuple[str, float]]]] = []

    def observe(token: int, logits: Any, stop_ids: frozenset[int], sampler: Any, hold: Any) -> int:
        """Record the end's probability; never refuse it (the run's own decision)."""
        if token in stop_ids:
            p = torch.softmax(logits.float(), -1)
            top = torch.topk(p, 4)
            alts = [(engine.tokenizer.decode([int(i)]), round(float(v), 4))
                    for v, i in zip(top.values, top.indices) if int(i) not in stop_ids]
            seen.append((float(p[list(stop_ids)].sum()), alts[:3]))
        return token

    # completion.hold_end on makes the decode loop ask at every end token; this
    # observer answers as hold_end off would (take the end)
    generate_module.refuse_end = observe
    rows = []
    for i, hole in enumerate(holes):
        seen.clear()
        text, *_ = run_sol(engine, hole, f"file:///end-confidence/{i}/{hole.path}", args.tokens)
        was = ended[(hole.path, hole.line)]["out"][column]
        p_end, alts = seen[-1] if seen else (float("nan"), [])
        rows.append({"path": hole.path, "line": hole.line, "passed": was["passed"], "first_line": was["first_line"],
                     "same_text": text == was["text"], "p_end": round(p_end, 4), "alternatives": alts,
                     "lines": text.count("\n") + 1, "expected_lines": hole.expected.count("\n") + 1})
    for r in sorted(rows, key=lambda r: r["p_end"]):
        tag = "pass" if r["passed"] else ("short" if r["lines"] < r["expected_lines"] else "fail")
        print(f"{r['p_end']:.3f} {tag:5s} lines {r['lines']}/{r['expected_lines']} {r['path']}:{r['line']} "
              f"{'' if r['same_text'] else '(text changed) '}{r['alternatives'][:2]}")
    print(f"{len(rows)} answers ended by the model; {sum(r['same_text'] for r in rows)} texts as in {args.src.name}")
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "from": args.src.name, "column": column,
                                         "rows": rows}, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
