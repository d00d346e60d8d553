"""Whether speculation changes an answer: the greedy tokens of ``bench
--quality``'s holes (the bench's own hole cutter, the default corpus) with
speculation off, then with prompt lookup drafting a fixed number of tokens
(1, 2, 4, 8: every verify runs the token plus up to k drafts), on the
engine ``load_engine`` builds from the config with the embedded 0.5B
(``--model``; no draft model), the machine's ``auto`` plan unless
``--precision`` says otherwise.

    python scripts/spec_identity.py [--holes 48] [--tokens 64] [--draft-lengths 1 2 4 8]
                                    [--precision auto] [--seed 0] [--out FILE]

Each hole's prompt is built once (the pipeline's windows, no token healing:
a healed prompt's first token is constrained and never drafted), then
decoded greedily through the model part's own ``generate`` on a cold KV
session per run: the same prompt ids, no deadline, no block candidates, so
only the verify forwards differ between the runs. Prints one JSON object:
per draft length how many holes gave the very tokens of speculation off,
how many tokens were drafted and accepted (speculation really ran), and
for each hole that differs where it first did.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

DRAFT_LENGTHS = (1, 2, 4, 8)


def greedy_tokens(engine: Any, ids: list[int], until: int | None, max_tokens: int,
                  draft: int) -> tuple[list[int], int, int]:
    """The greedy tokens of prompt ``ids`` on a cold session, with prompt
    lookup drafting up to ``draft`` tokens a verify (0: no speculation).
    Returns (tokens, drafted, accepted)."""
    from soldaemon.policy.draft import PromptLookup
    from soldaemon.runtime.decode.generate import generate
    from soldaemon.runtime.decode.sampling import Greedy

    session = engine.pool.acquire("spec-identity")
    session.truncate(0)
    tokens: list[int] = []
    drafted = accepted = 0
    # draft_length None: every verify drafts min(draft, what is left) tokens
    for ev in generate(session, ids, sampler=Greedy(), stop_ids=engine.template.stop_ids, max_tokens=max_tokens,
                       drafter=PromptLookup() if draft else None, draft_k=draft, draft_length=None,
                       precise_until=until):
        tokens.extend(ev.tokens)
        drafted, accepted = ev.stats.draft_tokens, ev.stats.accepted_tokens
    session.truncate(0)
    return tokens, drafted, accepted


def hole_prompts(engine: Any, holes: Sequence[Any]) -> list[tuple[list[int], int | None]]:
    """Each hole's prompt ids as the pipeline builds them from what sol-lsp
    sends (``document_window``), and where its decode-cost part starts."""
    from soldaemon.api import CompletionRequest, document_window
    from soldaemon.runtime.engine.foresight import precise_until

    out = []
    for i, hole in enumerate(holes):
        text = hole.prefix + hole.suffix
        start, end = document_window(text, len(hole.prefix))
        req = CompletionRequest(id=f"h{i}", uri=f"file:///spec-identity/{i}.py", prefix=text[start:len(hole.prefix)],
                                suffix=text[len(hole.prefix):end], language="python", max_tokens=64)
        prompt, _ms = engine.pipeline.build_prompt(req, detached=True)
        out.append((list(prompt.ids), precise_until(prompt)))
    return out


def compare(engine: Any, holes: Sequence[Any], max_tokens: int,
            lengths: Sequence[int] = DRAFT_LENGTHS, say: Any = lambda _m: None) -> dict[str, Any]:
    """Speculation off against each draft length in ``lengths`` on
    ``holes``: the report's ``by_draft_length`` part."""
    prompts = hole_prompts(engine, holes)
    off = []
    t0 = time.perf_counter()
    for i, (ids, until) in enumerate(prompts):
        off.append(greedy_tokens(engine, ids, until, max_tokens, 0)[0])
        if (i + 1) % 8 == 0 and i + 1 < len(prompts):
            say(f"speculation off: {i + 1} of {len(prompts)} holes, {time.perf_counter() - t0:.0f} s")
    say(f"speculation off: {len(prompts)} holes in {time.perf_counter() - t0:.0f} s")
    by_k: dict[str, Any] = {}
    for k in lengths:
        same = drafted = accepted = 0
        differ = []
        t0 = time.perf_counter()
        for i, ((ids, until), ref) in enumerate(zip(prompts, off)):
            got, d, a = greedy_tokens(engine, ids, until, max_tokens, k)
            drafted += d
            accepted += a
            if got == ref:
                same += 1
            else:
                at = next((j for j, (x, y) in enumerate(zip(got, ref)) if x != y), min(len(got), len(ref)))
                differ.append({"hole": i, "path": holes[i].path, "line": holes[i].line, "kind": holes[i].kind,
                               "first_difference_at": at, "off": ref[at:at + 4], "on": got[at:at + 4]})
        by_k[str(k)] = {"identical": same, "holes": len(prompts), "drafted_tokens": drafted,
                        "accepted_tokens": accepted, "seconds": round(time.perf_counter() - t0, 1),
                        "differ": differ}
        say(f"draft length {k}: {same} of {len(prompts)} identical ({drafted} drafted, {accepted} accepted)")
    return by_k


MODEL = "qwen2.5-coder-0.5b"


def spec_engine(config: Any, precision: str | None = None, model_name: str = MODEL) -> Any:
    """The engine ``config`` loads with the embedded model ``model_name``
    (not ``auto``'s choice, which a loaded machine can tip to the 1.5B)
    and no draft model (prompt lookup drafts here), ``precision`` as
    model.precision instead of the config's; speculation on, token
    healing off."""
    from dataclasses import replace

    from soldaemon.runtime.engine.local import load_engine

    completion = replace(config.completion, token_healing=False, speculative=True)
    model = replace(config.model, name=model_name, draft="off", path=None,
                    **({"precision": precision} if precision else {}))
    engine = load_engine(replace(config, completion=completion, model=model), progress=False)
    if engine.retime is not None:
        engine.retime.stop()     # greedy_tokens runs forwards outside the generation lock it times under
    return engine


def _rows_alone(engine: Any, packed_shapes: Any, rows_alone: Any) -> dict[str, bool]:
    plan = engine.info()["precision"]["plan"]
    if plan is None:
        return {}
    cfg = engine.loaded.model.config
    shapes = packed_shapes(cfg)
    out = {}
    for kernel in dict.fromkeys((plan["prefill"], plan["short"], plan["rows"])):
        if kernel:
            out[f"{kernel} (layers)"] = all(rows_alone(kernel, n, k) for n, k in shapes)
    out[f"{plan['head']} (output layer)"] = rows_alone(plan["head"], 8192, int(cfg.hidden_size))
    return out


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--holes", type=int, default=48)
    ap.add_argument("--tokens", type=int, default=64, help="greedy tokens a hole at most (bench --quality: 64)")
    ap.add_argument("--draft-lengths", type=int, nargs="+", default=list(DRAFT_LENGTHS))
    ap.add_argument("--kinds", nargs="+", default=["line", "block"], help="hole kinds, taken in turn")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--precision", default=None, help="model.precision (default: the config's, auto)")
    ap.add_argument("--model", default=MODEL, help=f"the embedded model (default {MODEL})")
    ap.add_argument("--config", type=Path, default=None, help="a config file (default: the user's)")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = ap.parse_args(argv)
    if args.holes < 1 or args.tokens < 1 or min(args.draft_lengths) < 1:
        ap.error("--holes, --tokens and every draft length must be >= 1")

    import torch

    from soldaemon.config import load_config
    from soldaemon.runtime.forward.kernels import cpu_flags, packed_shapes, rows_alone
    from soldaemon_bench.holes import cut_holes, default_corpus

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    commit = _commit()                      # the tree the run starts from
    engine = spec_engine(load_config(args.config), args.precision, args.model)
    holes = cut_holes(default_corpus(), args.holes, args.seed, kinds=tuple(args.kinds))
    info = engine.info()
    say(f"{info['model']}: {info['precision']['summary']}; {len(holes)} holes")
    t0 = time.perf_counter()
    by_k = compare(engine, holes, args.tokens, args.draft_lengths, say)
    report = {
        "what": "greedy tokens with speculation (prompt lookup, a fixed draft length) against without, "
                "the same prompt ids on a cold KV session per run",
        "commit": commit, "model": info["model"], "plan": info["precision"]["summary"],
        "plan_detail": info["precision"]["plan"], "holes": len(holes), "kinds": args.kinds, "seed": args.seed,
        "tokens": args.tokens, "threads": torch.get_num_threads(), "cpu_flags": cpu_flags(),
        "load_avg_1m": round(os.getloadavg()[0], 2), "seconds": round(time.perf_counter() - t0, 1),
        "all_identical": all(v["identical"] == v["holes"] for v in by_k.values()),
        # per kernel of the plan: each row of a 9-row product equal to that row alone, on the
        # model's four packed products (the output layer's as 8,192 of its rows)
        "rows_alone": _rows_alone(engine, packed_shapes, rows_alone),
        "by_draft_length": by_k,
    }
    text = json.dumps(report, indent=1)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)
    return 0 if report["all_identical"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
