"""Where block candidates pay: replays a candidates-oracle JSON (every hole's
greedy answer and 3 samples, each with its per-token log-probabilities and
its test verdict) under a gate: the greedy answer stands alone when its mean
log-probability per shown token is at least the threshold, else the surest
of the 4 is shown (soldaemon.pipeline.candidates).

    python scripts/candidates_gate.py docs/results/2026-12-04-candidates-oracle-128-1.5b.json

Prints, per threshold, the holes passing and the holes sampled; then a
2-fold check over 200 random splits: the threshold that samples least while
losing nothing on one half, judged on the other half.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
from pathlib import Path
from typing import Any

THRESHOLDS = (-0.4, -0.3, -0.25, -0.2, -0.15, -0.1)


def confidence(c: dict[str, Any]) -> float:
    n = c["shown_tokens"]
    return sum(c["logp"][:n]) / n if n > 0 else -math.inf


def replay(holes: list[dict[str, Any]], sure: float) -> tuple[int, int]:
    """(holes passing, holes sampled) with the gate at ``sure``."""
    passing = sampled = 0
    for h in holes:
        greedy, *samples = h["candidates"]
        if confidence(greedy) >= sure:
            passing += greedy["pass"]
            continue
        sampled += 1
        best, top = greedy, confidence(greedy)
        for c in samples:
            if confidence(c) > top:
                best, top = c, confidence(c)
        passing += best["pass"]
    return passing, sampled


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("oracle", type=Path)
    args = ap.parse_args(argv)
    holes = json.loads(args.oracle.read_text())["holes"]
    print(f"{len(holes)} holes: greedy alone {replay(holes, -math.inf)[0]}, always 4 {replay(holes, math.inf)[0]}")
    for t in THRESHOLDS:
        p, s = replay(holes, t)
        print(f"  gate {t:+.2f}: {p} passing, {s} sampled")
    rng, lost, share = random.Random(0), [], []
    for _ in range(200):
        order = list(range(len(holes)))
        rng.shuffle(order)
        halves = [holes[i] for i in order[: len(order) // 2]], [holes[i] for i in order[len(order) // 2:]]
        for train, test in (halves, halves[::-1]):
            full = replay(train, math.inf)[0]
            t = min(t for t in (*THRESHOLDS, math.inf) if replay(train, t)[0] >= full)
            p, s = replay(test, t)
            lost.append(replay(test, math.inf)[0] - p)
            share.append(s / len(test))
    print(f"2-fold, 400 halves: passes lost on the held-out half {statistics.mean(lost):.2f} on average "
          f"(at most {max(lost)}), {100 * statistics.mean(share):.0f} % of its holes sampled")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
