"""Speculation while sampling (runtime/decode/sampling.py's accept,
generate.py: the sampler's own draws, row by row) and drafts along a
reference answer (policy/draft.py's AlongReference): what block candidates
are sampled with."""

from __future__ import annotations

import inspect
import textwrap

import pytest
import torch

from soldaemon.policy.draft import AlongReference, DraftLength, PromptLookup
from soldaemon.runtime.decode.generate import generate
from soldaemon.runtime.decode.sampling import Greedy, TopP, row_by_row
from soldaemon.runtime.forward.backend import LeanBackend
from soldaemon.runtime.kv.session import KVSession
from tests.test_runtime import tiny  # noqa: F401  (the fixture: the tiny model and its tokenizer)

ROWS = torch.tensor([[2.0, 1.5, 0.5, -1.0, -3.0],
                     [0.0, 1.0, 2.0, 0.3, -2.0],
                     [1.0, 1.0, 1.0, 1.0, 1.0]])


def _step_by_step(sampler: TopP, draft: list[int]) -> tuple[int, int]:
    """What a decode without drafts draws over ROWS, as (kept, token)."""
    for i, d in enumerate(draft):
        token = sampler(ROWS[i])
        if token != d:
            return i, token
    return len(draft), sampler(ROWS[len(draft)])


@pytest.mark.parametrize("top_p", [1.0, 0.8])
@pytest.mark.parametrize("draft", [[0, 2], [1, 2], [3, 1], [4, 4]])
def test_a_verified_draft_keeps_the_samplers_own_draws(top_p: float, draft: list[int]) -> None:
    """Seed by seed, verification gives the tokens a decode without drafts
    draws; so a draft token is kept with its probability (the share kept
    across seeds), and one outside the nucleus never."""
    kept_first = 0
    for seed in range(400):
        verdict = TopP(0.7, top_p, seed=seed).accept(ROWS, draft)
        assert tuple(verdict) == _step_by_step(TopP(0.7, top_p, seed=seed), draft), seed
        kept_first += verdict.kept > 0
    p = torch.softmax(ROWS[0] / 0.7, -1)
    if top_p < 1.0:
        order = torch.argsort(p, descending=True)
        inside = set(order[:int((torch.cumsum(p[order], 0) - p[order] < top_p).sum())].tolist())
        p = torch.where(torch.tensor([t in inside for t in range(5)]), p, torch.zeros(5))
        p = p / p.sum()
    share = float(p[draft[0]])
    assert abs(kept_first / 400 - share) <= 5 * (share * (1 - share) / 400) ** 0.5 + 1e-9, (kept_first, share)


def test_greedy_verification_keeps_the_argmaxes() -> None:
    assert Greedy().accept(ROWS, [0, 2]) == (2, 0)                      # both argmaxes, then row 2's first
    assert Greedy().accept(ROWS, [0, 1]) == (1, 2)                      # row 1's argmax is 2
    assert Greedy().accept(ROWS, [1, 2]) == row_by_row(Greedy(), ROWS, [1, 2]) == (0, 0)


# -- drafts along a reference ------------------------------------------------------

def test_drafts_follow_the_reference_and_find_it_again() -> None:
    d = AlongReference([5, 6, 7, 8, 9, 10])
    d.reset([1, 2, 3, 4])
    d.extend([5])                                      # the prompt's tail and the first token match
    assert d.propose(3) == [6, 7, 8] and d.kind() == AlongReference.REFERENCE + 3
    d.extend([6, 99])                                  # the sample leaves it
    assert d.propose(3) == [] and d.kind() == 0
    d.extend([8])                                      # and comes back
    assert d.propose(3) == [9, 10] and d.kind() == AlongReference.REFERENCE + 1
    # a longer match in the history itself proposes from there
    h = AlongReference([9, 5, 1, 2])            # its 1-gram (5,) matches too
    h.reset([3, 4, 5, 6, 0, 3, 4])
    h.extend([5])
    assert h.propose(2) == [6, 0] and h.kind() == 3
    lookup = PromptLookup()
    lookup.reset([3, 4, 5, 6, 0, 3, 4, 5])
    assert h.propose(2) == lookup.propose(2)


def test_a_fresh_draft_length_keeps_the_costs_not_the_rates() -> None:
    length = DraftLength({1: 10.0, 9: 12.0}, 8, prior=0.5)
    for _ in range(20):
        length.update(8, 8, kind=3)
    fresh = length.fresh()
    assert fresh.costs_ms == length.costs_ms and fresh.costs_ms is not length.costs_ms
    assert fresh.rate_of(3) == 0.5 and length.rate_of(3) > 0.9


# -- in a decode, on the tiny model ------------------------------------------------

def _decode(session: KVSession, ids: list[int], sampler, n: int, drafter=None) -> tuple[list[int], object]:
    toks: list[int] = []
    last = None
    for ev in generate(session, ids, sampler=sampler, stop_ids=frozenset(), max_tokens=n, drafter=drafter):
        toks.extend(ev.tokens)
        last = ev
    assert last is not None
    return toks, last.stats


@pytest.mark.parametrize("temperature", [1e-4, 0.4, 1.0])
def test_a_sampled_decode_with_drafts_is_the_same_decode(tiny, temperature: float) -> None:
    """Seeded, a sampled decode gives the same tokens with drafts (prompt
    lookup, or along the greedy answer) as without; drafts are verified."""
    model, tok = tiny
    ids = tok(inspect.getsource(textwrap.dedent)[:400], add_special_tokens=False).input_ids * 2
    session = KVSession(LeanBackend(model, 2048))
    greedy, _ = _decode(session, ids, Greedy(), 30)
    plain, plain_stats = _decode(session, ids, TopP(temperature, 0.95, seed=3), 30)
    drafted, stats = _decode(session, ids, TopP(temperature, 0.95, seed=3), 30, PromptLookup())
    along, along_stats = _decode(session, ids, TopP(temperature, 0.95, seed=3), 30, AlongReference(greedy))
    assert plain == drafted == along
    assert plain_stats.draft_tokens == 0 and stats.draft_tokens > 0 and along_stats.draft_tokens > 0  # type: ignore[attr-defined]
    if temperature < 0.01:   # the greedy answer itself: every draft along it kept, a few forwards for 30 tokens
        assert along == greedy
        assert along_stats.accepted_tokens == along_stats.draft_tokens and along_stats.steps <= 5  # type: ignore[attr-defined]
