"""Single-line exact match of this checkout against an earlier commit, on
the same machine and the same holes (docs/quality.md, "Precision
and answers"; the float32 line record in docs/results/).

A figure measured on another CPU cannot say whether a change cost single
lines: the int8 plan's rounding moves answers at near-ties, and machines
differ. This runs both codes here: the earlier commit from a git worktree
(its own model cache and kernel plan, so this checkout's are untouched),
each through its own ``bench --quality`` path (``run_sol`` with the
``--models`` config) on the line holes this checkout's cutter picks from
the default corpus, and scores both with this checkout's scorer.

    python scripts/lines_against_commit.py 52ed8e2 --holes 120 \
        [--precision float32] [--set model.rotate=false] [--json out.json]

The child runs are this file run with ``--child`` (a code-layout shim keeps
it working across the move of modules by role, issue 29).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODEL = "qwen2.5-coder-0.5b"


def child(holes_path: str, out_path: str, settings: list[str]) -> None:
    """In the code on ``sys.path``: every hole through its daemon pipeline."""
    try:
        from soldaemon.measure.quality.columns import model_configs, run_sol
        from soldaemon.measure.holes import Hole
        from soldaemon.runtime.engine.local import load_engine
    except ImportError:                              # before the move by role
        from soldaemon.quality.columns import model_configs, run_sol  # type: ignore[no-redef]
        from soldaemon.holes import Hole  # type: ignore[no-redef]
        from soldaemon.runtime.engine import load_engine  # type: ignore[no-redef]
    from soldaemon.config import load_config

    config = load_config(None)
    for kv in settings:
        key, value = kv.split("=", 1)
        parsed: object = {"true": True, "false": False}.get(value, value)
        if isinstance(parsed, str) and parsed.isdigit():
            parsed = int(parsed)
        config = config.with_overrides({key: parsed}, source="bench")
    (_label, _target, cfg), = model_configs(config, [MODEL])
    engine = load_engine(cfg, progress=False)
    print(f"  {engine.info()['precision']['summary']}", file=sys.stderr, flush=True)
    holes = [Hole(**h) for h in json.loads(pathlib.Path(holes_path).read_text())]
    out = []
    for hole in holes:
        text, e2e_ms, *_ = run_sol(engine, hole, f"file:///{hole.path}", 48)
        out.append({"text": text, "e2e_ms": round(e2e_ms, 1)})
    pathlib.Path(out_path).write_text(json.dumps({"plan": engine.info()["precision"]["summary"], "answers": out}))


def run_code(code: pathlib.Path, holes: pathlib.Path, out: pathlib.Path, settings: list[str],
             env: dict[str, str]) -> dict:
    cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--child", str(holes), str(out), *settings]
    subprocess.run(cmd, cwd=code, env={**env, "PYTHONPATH": str(code)}, check=True)
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("commit", help="the earlier commit (any git revision)")
    ap.add_argument("--holes", type=int, default=120)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-prefix-tokens", type=int, default=384, help="bench --quality's default window")
    ap.add_argument("--max-suffix-tokens", type=int, default=128)
    ap.add_argument("--precision", default=None, help="model.precision for both (default: each code's own plan)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config setting for this checkout only (e.g. model.rotate=false)")
    ap.add_argument("--json", default=None, help="write holes, answers and scores here")
    args = ap.parse_args()

    from soldaemon.measure.holes import cut_holes, default_corpus
    from soldaemon.measure.quality.scores import edit_similarity, exact_match

    holes = cut_holes(default_corpus(), args.holes, args.seed, kinds=("line",))
    common = [f"model.max_prefix_tokens={args.max_prefix_tokens}", f"model.max_suffix_tokens={args.max_suffix_tokens}"]
    if args.precision:
        common.append(f"model.precision={args.precision}")
    with tempfile.TemporaryDirectory(prefix="sol-lines-") as tmp:
        work = pathlib.Path(tmp)
        hole_file = work / "holes.json"
        hole_file.write_text(json.dumps([{k: getattr(h, k) for k in ("path", "line", "prefix", "suffix", "expected",
                                                                      "kind")} for h in holes]))
        old = work / "old"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old), args.commit],
                       check=True, capture_output=True)
        try:
            env = dict(os.environ)
            print(f"{args.commit}:", file=sys.stderr, flush=True)
            before = run_code(old, hole_file, work / "old.json", common,
                              {**env, "SOLDAEMON_CACHE_DIR": str(work / "cache"),
                               "SOLDAEMON_STATE_DIR": str(work / "state")})
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], check=False)
        print("this checkout:", file=sys.stderr, flush=True)
        after = run_code(ROOT, hole_file, work / "new.json", common + args.set, dict(os.environ))

    def scores(run: dict) -> tuple[list[bool], float]:
        ok = [exact_match(a["text"], h.expected) for a, h in zip(run["answers"], holes)]
        return ok, 100 * sum(edit_similarity(a["text"], h.expected) for a, h in zip(run["answers"], holes)) / len(holes)

    (ok_b, es_b), (ok_a, es_a) = scores(before), scores(after)
    n = len(holes)
    same = sum(a["text"] == b["text"] for a, b in zip(before["answers"], after["answers"]))
    print(f"{n} line holes (seed {args.seed}, {args.max_prefix_tokens}/{args.max_suffix_tokens} tokens)")
    print(f"  {args.commit}: exact {sum(ok_b)}/{n} ({100 * sum(ok_b) / n:.1f} %), edit sim {es_b:.1f} %  [{before['plan']}]")
    print(f"  this checkout: exact {sum(ok_a)}/{n} ({100 * sum(ok_a) / n:.1f} %), edit sim {es_a:.1f} %  "
          f"[{after['plan']}]")
    print(f"  same text {same}/{n}; exact only before: {sum(b and not a for a, b in zip(ok_a, ok_b))}, "
          f"only now: {sum(a and not b for a, b in zip(ok_a, ok_b))}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({
            "commit": args.commit, "seed": args.seed, "precision": args.precision, "set": args.set,
            "windows": [args.max_prefix_tokens, args.max_suffix_tokens],
            "plans": {"before": before["plan"], "now": after["plan"]},
            "exact": {"before": sum(ok_b), "now": sum(ok_a), "n": n},
            "edit_sim": {"before": round(es_b, 2), "now": round(es_a, 2)},
            "holes": [{"path": h.path, "line": h.line, "expected": h.expected,
                       "before": b["text"], "now": a["text"], "exact_before": eb, "exact_now": ea}
                      for h, b, a, eb, ea in zip(holes, before["answers"], after["answers"], ok_b, ok_a)],
        }, indent=1))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        main()
