"""CPU decode ms/token and greedy tokens of the lean backend at two commits,
in one run: the working tree against ``--ref`` (default ``HEAD~1``),
each in its own process, alternating, the best of ``--rounds`` kept.
Written for the packed q/k/v and gate/up products (docs/kernels.md,
"Packed products"); any change of the forward can be compared the same way.

    python scripts/packed_decode_ms.py [--ref COMMIT] [--steps 50] [--rounds 2] [--precision auto]

Prints one JSON object: per variant the ms/token (median of the steps of
each round, the best round), the plan, and whether every prompt's greedy
tokens are the same in both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = (
    "import os\nimport sys\n\n\ndef main(argv):\n    parser = ",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "def quicksort(xs):\n    if len(xs) <= 1:\n        return xs\n    pivot = ",
    "#include <stdio.h>\n\nint main(int argc, char **argv) {\n    for (int i = 0; i < argc; i++) {\n",
    "fn parse(line: &str) -> Option<(String, u32)> {\n    let mut parts = line.split(',');\n",
)


def measure(steps: int, precision: str, tokens: int) -> dict[str, object]:
    """In this process: load the default model on the CPU, greedy-decode
    every prompt, then time ``steps`` decode steps after the longest."""
    import torch

    from soldaemon.runtime.forward.backend import LeanBackend
    from soldaemon.runtime.forward.kernels import cpu_flags, plan_for
    from soldaemon.runtime.kv.session import KVSession
    from soldaemon.weights.loader import load_model

    loaded = load_model(device="cpu", progress=False)
    plan, _table, _cached = plan_for(loaded.model.config, torch.device("cpu"), torch.float32, precision)
    b = LeanBackend(loaded.model, 2048, plan=plan, release=True)
    session = KVSession(b)
    out: dict[str, list[int]] = {}
    for text in PROMPTS:
        ids = loaded.tokenizer(text, add_special_tokens=False).input_ids
        logits = session.prefill(ids).logits
        got: list[int] = []
        for _ in range(tokens):
            got.append(int(logits.argmax()))
            logits = session.decode_step(got[-1])
        out[text[:24]] = got
    ms: list[float] = []
    token = 0
    for _ in range(steps):
        t0 = time.perf_counter()
        token = int(session.decode_step(token).argmax())
        ms.append((time.perf_counter() - t0) * 1e3)
    return {"plan": plan.describe(), "tokens": out,
            "ms_per_token": round(statistics.median(ms), 2), "threads": torch.get_num_threads(),
            "cpu_flags": cpu_flags(), "load_avg_1m": round(os.getloadavg()[0], 2)}


def _run(tree: Path | None, args: argparse.Namespace) -> dict[str, object]:
    env = dict(os.environ)
    if tree is not None:                                  # the old tree's package first on the path
        env["PYTHONPATH"] = str(tree) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, __file__, "--child", "--steps", str(args.steps), "--precision", args.precision,
           "--tokens", str(args.tokens)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=tempfile.gettempdir())
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{'before' if tree is not None else 'after'}: {result['ms_per_token']} ms/token", file=sys.stderr, flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default="HEAD~1")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=24, help="greedy tokens compared per prompt")
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.steps, args.precision, args.tokens)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "ref.tar"
        subprocess.run(["git", "archive", "-o", str(archive), args.ref, "soldaemon"], cwd=ROOT, check=True)
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        runs: dict[str, list[dict[str, object]]] = {"before": [], "after": []}
        for _ in range(args.rounds):
            runs["before"].append(_run(Path(tmp), args))
            runs["after"].append(_run(None, args))
    best = {k: min(v, key=lambda r: float(r["ms_per_token"])) for k, v in runs.items()}  # type: ignore[arg-type]
    report = {
        "ref": args.ref,
        "same_tokens": all(r["tokens"] == runs["before"][0]["tokens"] for v in runs.values() for r in v),
        "before_ms_per_token": best["before"]["ms_per_token"], "after_ms_per_token": best["after"]["ms_per_token"],
        "rounds": {k: [r["ms_per_token"] for r in v] for k, v in runs.items()},
        "plan": best["after"]["plan"], "threads": best["after"]["threads"], "cpu_flags": best["after"]["cpu_flags"],
        "load_avg_1m": [r["load_avg_1m"] for v in runs.values() for r in v],
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
