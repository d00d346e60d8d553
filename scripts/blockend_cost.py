"""What the parser-based block end adds per completion, against the text
rules alone, on holes cut from the standard library (docs/quality.md,
"Where a block ends, and who ends it"). No model runs: each hole's model
text is simulated as its answer followed by the suffix's next lines, fed to
the stop check about one token (4 characters) at a time, then finished.

    python scripts/blockend_cost.py [N_HOLES]
"""

from __future__ import annotations

import statistics
import sys
import time

from soldaemon.measure.holes import Hole, cut_holes, default_corpus
from soldaemon.pipeline.ending import TextEnding, decide_multiline, ending_for, postprocess


def model_text(h: Hole) -> str:
    return h.expected + "\n".join(h.suffix.split("\n")[:4])


def text_rules(h: Hole, raw: str) -> str:
    multi = decide_multiline(h.prefix, h.suffix, "auto")
    lines = 8 if multi else 1
    ending = TextEnding(h.prefix, h.suffix, multi, lines)
    for n in range(4, len(raw) + 4, 4):
        if ending.may_stop(raw[:n]):
            raw = raw[:n]
            break
    return postprocess(raw, prefix=h.prefix, suffix=h.suffix, multiline=multi, max_lines=lines)


def block_end(h: Hole, raw: str) -> str:
    ending = ending_for(h.prefix, h.suffix, "python", "auto", 8, "model")
    finish = "length"
    for n in range(4, len(raw) + 4, 4):
        if ending.may_stop(raw[:n]):
            raw, finish = raw[:n], "stop"
            break
    return ending.shown(raw, finish, ending.rule).text


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 80
    holes = cut_holes(default_corpus(), n, seed=0)
    block_end(holes[0], model_text(holes[0]))      # the grammar's one-time load is not per completion
    for kind in ("line", "block"):
        hs = [h for h in holes if h.kind == kind]
        p50 = {}
        for name, f in (("text rules", text_rules), ("block end", block_end)):
            ms = []
            for h in hs:
                raw = model_text(h)
                t0 = time.perf_counter()
                f(h, raw)
                ms.append((time.perf_counter() - t0) * 1e3)
            p50[name] = statistics.median(ms)
            print(f"{kind} holes ({len(hs)}), {name}: p50 {p50[name]:.3f} ms, p90 "
                  f"{statistics.quantiles(ms, n=10)[-1]:.3f} ms")
        print(f"{kind}: added p50 {p50['block end'] - p50['text rules']:.3f} ms per completion")


if __name__ == "__main__":
    main()
