"""How often is prompt lookup's guess right, by the n-gram it rests on?
(docs/bench.md, "Tried and not kept": one acceptance rate for every draft.)

Replays the daemon's own answers from a ``bench --quality --functional``
JSON (the ``--column``'s text on each block hole) through
:class:`~soldaemon.policy.draft.PromptLookup` over the hole's prompt (built
as the daemon builds it) and counts, at every position of every answer, the
n-gram length the lookup matched and whether its first proposed token (and
how many of 4) is the answer's own next token. Then it runs
:class:`~soldaemon.policy.draft.DraftLength` over the same answers, with the
forward costs the engine measures at start-up on this machine, and prints the
decoded tokens per ms against no drafting: what the policy would gain if
every accepted guess were free of timing noise (no model runs here but the
start-up measurement).

    PYTHONPATH=. python scripts/lookup_acceptance.py --json docs/results/2026-12-02-block-128-0.5b-exact-speculation.json
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

from soldaemon.api import CompletionRequest
from soldaemon.config.loader import load_config
from soldaemon.measure.functional import cached_holes, holes_cache_path
from soldaemon.policy.draft import DraftLength, PromptLookup
from soldaemon.runtime.engine.local import load_engine


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, help="a bench --quality --functional JSON (block holes)")
    parser.add_argument("--column", default="sol[0.5b]")
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    args = parser.parse_args()
    run = json.loads(Path(args.json).read_text(encoding="utf-8"))
    texts = {(h["path"], h["line"]): h["out"][args.column]["text"] for h in run["holes"]}
    cfg = load_config().with_overrides({"model.path": None, "model.name": args.model, "model.draft": "off"},
                                       source="bench")
    engine = load_engine(cfg)
    holes = cached_holes(len(run["holes"]), run.get("seed", 0),
                         holes_cache_path(("block",)), kinds=("block",))
    pairs = []
    for fh in holes:
        text = texts.get((fh.hole.path, fh.hole.line))
        if text:
            req = CompletionRequest(id="lookup", prefix=fh.hole.prefix, suffix=fh.hole.suffix, max_tokens=128)
            pairs.append((engine.build_prompt(req)[0].ids, engine.tokenizer.encode(text, add_special_tokens=False)))

    stats: dict[int, list[int]] = collections.defaultdict(lambda: [0, 0, 0])   # n → positions, first right, accepted of 4
    for prompt, answer in pairs:
        lookup = PromptLookup()
        lookup.reset(prompt)
        for i, token in enumerate(answer[:-1]):
            lookup.extend([token])
            n, draft = lookup.kind(), lookup.propose(4)
            accepted = 0
            while accepted < len(draft) and i + 1 + accepted < len(answer) and draft[accepted] == answer[i + 1 + accepted]:
                accepted += 1
            row = stats[n]
            row[0] += 1
            row[1] += accepted > 0
            row[2] += accepted
    print(f"{len(pairs)} answers of {args.column}, {sum(len(a) for _, a in pairs)} tokens")
    print("| n-gram matched | positions | first token right | accepted of 4 (mean) |")
    print("|---|---|---|---|")
    for n, (count, first, accepted) in sorted(stats.items()):
        print(f"| {n or 'none'} | {count} | {first / count:.2f} | {accepted / count:.2f} |")

    costs = engine.measure_forward_costs()
    length = DraftLength(dict(costs), cfg.completion.draft_tokens)
    spent = 0.0
    for prompt, answer in pairs:
        lookup = PromptLookup()
        lookup.reset(prompt)
        i = 0
        while i < len(answer):
            lookup.extend([answer[i]])
            budget = len(answer) - i - 1
            kind = lookup.kind()
            k = length.choose(budget, kind) if budget > 0 and kind else 0
            draft = lookup.propose(k) if k else []
            accepted = 0
            while accepted < len(draft) and draft[accepted] == answer[i + 1 + accepted]:
                accepted += 1
            spent += length.cost(1 + len(draft))
            length.update(len(draft), accepted, kind)
            lookup.extend(answer[i + 1:i + 1 + accepted])
            i += 1 + accepted
    plain = sum(len(a) for _, a in pairs) * length.cost(1)
    print(f"start-up forward costs (ms): { {t: round(c, 1) for t, c in costs.items()} }")
    print(f"DraftLength over these answers: {plain / spent:.2f}x the tokens per ms of no drafting; "
          f"acceptance by n-gram: {length.rates()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
