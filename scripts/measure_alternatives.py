"""How should an invoked completion get up to three distinct candidates?

Compares, on the configured model (default: the embedded 0.5B) and holes cut
from the standard library (soldaemon.measure.holes), strategies that the daemon
supports today without engine changes:

- ``greedy``: one greedy candidate (what automatic completions get);
- ``greedy+n2@T``: greedy, then a second request with ``n=2`` sampled at
  temperature ``T`` (sol-lsp's choice for invoked completions: the greedy
  candidate stays first);
- ``n3@T``: one request, three sampled candidates (no greedy one).

For each it counts distinct non-empty candidates after the daemon's
post-processing (the engine applies it), how many parse
(:func:`soldaemon.measure.quality.parses`), and the wall time per hole (the sum of
its requests, after the prompt was prefilled once per hole — the times
compare decoding; the greedy request runs once per hole and counts in
every strategy that uses it).

Usage: ``python scripts/measure_alternatives.py [--holes 20] [--config FILE]``.
Prints a Markdown table for docs/editors.md. Slow on a CPU: run it on a
quiet machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import dataclass, field

from soldaemon.api import CancelToken, CompletionRequest, Done
from soldaemon.config import load_config
from soldaemon.measure.holes import Hole, cut_holes, default_corpus
from soldaemon.measure.quality import parses
from soldaemon.runtime.engine.local import load_engine

Step = tuple[int, float]          # (n, temperature) of one request
STRATEGIES: dict[str, tuple[Step, ...]] = {
    "greedy": ((1, 0.0),),
    "greedy+n2@0.4": ((1, 0.0), (2, 0.4)),
    "greedy+n2@0.8": ((1, 0.0), (2, 0.8)),
    "n3@0.8": ((3, 0.8),),
}


@dataclass
class Tally:
    distinct: int = 0          # distinct non-empty candidates, summed over holes
    parsing: int = 0           # of those, how many make the file parse
    three: int = 0             # holes with three distinct candidates
    seconds: list[float] = field(default_factory=list)   # wall time per hole


def run_step(engine: object, hole: Hole, step: Step, seed: int) -> tuple[list[str], float]:
    """The items of one request and its wall time (s)."""
    n, temperature = step
    req = CompletionRequest(id="m", prefix=hole.prefix, suffix=hole.suffix, uri="file:///hole.py",
                            language="python", max_tokens=64, n=n, temperature=temperature,
                            seed=seed if temperature > 0 else None)
    t0 = time.perf_counter()
    done = [e for e in engine.complete(req, CancelToken()) if isinstance(e, Done)]  # type: ignore[attr-defined]
    return list(done[-1].items) if done else [], time.perf_counter() - t0


def distinct(items: list[str]) -> list[str]:
    """Distinct non-empty items in order, at most three (what sol-lsp shows)."""
    out: list[str] = []
    for item in items:
        if item.strip() and item.rstrip() not in out:
            out.append(item.rstrip())
    return out[:3]


def cpu_line() -> str:
    """The CPU model and its SIMD flags that matter here, from /proc/cpuinfo."""
    model, flags = platform.processor() or "unknown CPU", ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model.startswith("unknown"):
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "fma", "f16c")
                    flags = " ".join(f for f in value.split() if f in wanted)
    except OSError:
        pass
    return f"{model}; {os.cpu_count()} logical CPUs; flags: {flags or 'n/a'}"


def report(tallies: dict[str, Tally], done: int, args: argparse.Namespace, model: str) -> str:
    """The Markdown table over the first ``done`` holes, with the command
    and the machine."""
    lines = [f"command: python scripts/measure_alternatives.py --holes {args.holes}",
             f"machine: {cpu_line()}; load average now {os.getloadavg()[0]:.2f}",
             f"model: {model}; {done} holes", "",
             "| strategy | distinct / hole | holes with 3 | parsing / hole | median s / hole |",
             "|---|---|---|---|---|"]
    n = max(1, done)
    for name, t in tallies.items():
        median = sorted(t.seconds)[len(t.seconds) // 2] if t.seconds else 0.0
        lines.append(f"| {name} | {t.distinct / n:.2f} | {t.three}/{done} | {t.parsing / n:.2f} | {median:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--holes", type=int, default=20)
    parser.add_argument("--config", default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    engine = load_engine(load_config(args.config), progress=False)
    holes = cut_holes(default_corpus(), args.holes, args.seed)
    tallies = {name: Tally() for name in STRATEGIES}
    for i, hole in enumerate(holes):
        # Prefill first, so that every strategy's time is its decoding: in
        # sol-lsp the sampled request also finds the prompt cached.
        engine.warm(CompletionRequest(id="w", prefix=hole.prefix, suffix=hole.suffix, uri="file:///hole.py",
                                      language="python"), CancelToken())
        ran: dict[Step, tuple[list[str], float]] = {}    # the greedy request runs once per hole
        for name, steps in STRATEGIES.items():
            items: list[str] = []
            seconds = 0.0
            for step in steps:
                if step not in ran:
                    ran[step] = run_step(engine, hole, step, seed=args.seed + i)
                items += ran[step][0]
                seconds += ran[step][1]
            found = distinct(items)
            tally = tallies[name]
            tally.seconds.append(seconds)
            tally.distinct += len(found)
            tally.three += len(found) == 3
            tally.parsing += sum(parses(hole.prefix, c, hole.suffix) for c in found)
        # the table so far after every hole: a long run cut short still reports
        print(report(tallies, i + 1, args, engine.info().get("model", "?")), file=sys.stderr, flush=True)
    print(report(tallies, len(holes), args, engine.info().get("model", "?")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
