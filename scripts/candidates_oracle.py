"""Block candidates, every one tested: how often some candidate passes (the
oracle) and how often the ranking's choice does, per number of candidates
(docs/quality.md, "Block candidates", session 27).

``bench --quality`` with ``completion.candidates: N`` shows only the chosen
answer. This decodes each candidate as the pipeline does
(:mod:`soldaemon.pipeline.candidates`: the greedy answer, then the request
sampled with the same temperature and seeds, each through the daemon's own
pipeline on the same cached prompt), scores each with the model part's
``score`` and runs every distinct answer's tests, so one run gives the
greedy figure, the oracle and the ranking rules for 1..N candidates.

    python scripts/candidates_oracle.py --model qwen2.5-coder-1.5b --candidates 4 \
        --holes 128 --json docs/quality/candidates-128-1.5b-s27.json

Timings are not recorded (the tests of every candidate run in between).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

from soldaemon.api import CancelToken, CompletionRequest, Done, document_window
from soldaemon.config import load_config
from soldaemon.measure.functional import cached_holes, holes_cache_path, passes
from soldaemon.measure.quality.columns import model_configs
from soldaemon.pipeline import candidates
from soldaemon.runtime.engine import part as model_part
from soldaemon.runtime.engine.local import load_engine


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--candidates", type=int, default=4)
    p.add_argument("--holes", type=int, default=128)
    p.add_argument("--json", required=True)
    args = p.parse_args()
    engine = load_engine(model_configs(load_config(), [args.model])[0][2])
    seen: dict[str, Any] = {}
    decode = model_part.LocalModelPart._decode

    def recorded(self: Any, req: Any, prompt: Any, *a: Any, **k: Any) -> Any:   # the tokens of each decode
        run, gen = yield from decode(self, req, prompt, *a, **k)
        seen["ids"], seen["prompt"] = list(gen.ids), prompt
        return run, gen

    model_part.LocalModelPart._decode = recorded          # type: ignore[method-assign]
    holes = cached_holes(args.holes, 0, holes_cache_path(("block",)), kinds=("block",), say=print)
    out: list[dict[str, Any]] = []
    for i, fh in enumerate(holes):
        h, uri, t0 = fh.hole, f"file:///hole{i}.py", time.time()
        text = h.prefix + h.suffix
        start, end = document_window(text, len(h.prefix))
        base = CompletionRequest(id="q", uri=uri, prefix=text[start:len(h.prefix)],
                                 suffix=text[len(h.prefix):end], language="python", max_tokens=128)
        verdicts: dict[str, bool] = {}
        cands = []
        for c in range(args.candidates):
            req = base if c == 0 else candidates.sampled(base, c)
            done = [ev for ev in engine.complete(req, CancelToken()) if isinstance(ev, Done)][0]
            engine.forget_shown(uri)
            answer = done.items[0] if done.items else ""
            ids, prompt = seen["ids"], seen["prompt"]
            shown = candidates.shown_tokens(engine.part.texts(prompt), ids, answer)
            logp = engine.part.score(base, prompt, ids).logp[:shown] if ids else []
            if answer not in verdicts:
                verdicts[answer] = passes(fh, answer)
            cands.append({"text": answer, "end": done.ends[0] if done.ends else "", "shown_tokens": shown,
                          "logp": logp, "pass": verdicts[answer]})
        engine.pool.acquire(uri).truncate(0)
        out.append({"id": f"{h.path}:{h.line}", "candidates": cands})
        print(i, out[-1]["id"], [c["pass"] for c in cands], f"{time.time() - t0:.1f}s", flush=True)
        report = {"model": args.model, "candidates": args.candidates, "temperature": candidates.SAMPLE_TEMPERATURE,
                  "seed": candidates.SAMPLE_SEED, "info": engine.info(), "summary": summarize(out), "holes": out}
        with open(args.json, "w") as f:
            json.dump(report, f, default=str)
    print(json.dumps(summarize(out), indent=1))
    return 0


def summarize(holes: list[dict[str, Any]]) -> dict[str, Any]:
    """Passes per number of candidates: the greedy answer, the oracle (any
    passes) and the pipeline's rule (highest mean log-p, the first on a tie)."""
    if not holes:
        return {}
    n = min(len(h["candidates"]) for h in holes)
    rows = {}
    for k in range(1, n + 1):
        oracle = chosen = 0
        for h in holes:
            cs = h["candidates"][:k]
            oracle += any(c["pass"] for c in cs)
            means = [sum(c["logp"]) / len(c["logp"]) if c["logp"] else -math.inf for c in cs]
            chosen += cs[means.index(max(means))]["pass"]
        rows[k] = {"oracle": oracle, "chosen": chosen}
    return {"holes": len(holes), "greedy": sum(h["candidates"][0]["pass"] for h in holes), "by_candidates": rows}


if __name__ == "__main__":
    sys.exit(main())
