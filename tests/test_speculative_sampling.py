"""Speculation while sampling (runtime/decode/sampling.py's accept,
generate.py) and drafts along a reference answer (policy/draft.py's
AlongReference): what block candidates are sampled with."""

from __future__ import annotations

import inspect
import textwrap

import pytest
import torch

from soldaemon.policy.draft import AlongReference, DraftLength, PromptLookup
from soldaemon.runtime.decode.generate import generate
from soldaemon.runtime.decode.sampling import Greedy, TopP, accept_draft
from soldaemon.runtime.forward.backend import LeanBackend
from soldaemon.runtime.kv.session import KVSession
from soldaemon.testing.tiny import build_tiny_model

ROWS = torch.tensor([[2.0, 1.5, 0.5, -1.0, -3.0],
                     [0.0, 1.0, 2.0, 0.3, -2.0],
                     [1.0, 1.0, 1.0, 1.0, 1.0]])
TRIALS = 6000


def _exact(sampler: TopP, row: torch.Tensor) -> torch.Tensor:
    """The distribution one plain step of ``sampler`` draws from, measured
    by drawing (not by the code under test)."""
    counts = torch.zeros(row.shape[-1])
    for _ in range(TRIALS):
        counts[sampler(row)] += 1
    return counts / TRIALS


@pytest.mark.parametrize("top_p", [1.0, 0.8])
@pytest.mark.parametrize("draft", [[0, 2], [3, 1], [4, 4]])
def test_a_verified_draft_draws_each_token_as_a_step_would(top_p: float, draft: list[int]) -> None:
    """Whatever the draft, the first token and (where the first kept the
    draft's) the second are distributed as plain sampling steps draw them."""
    first = torch.zeros(5)
    second = torch.zeros(5)
    kept_first = 0
    sampler = TopP(0.7, top_p, seed=7)
    for _ in range(TRIALS):
        verdict = sampler.accept(ROWS, draft)
        if verdict.kept == 0:
            first[verdict.token] += 1
            continue
        first[draft[0]] += 1
        kept_first += 1
        second[draft[1] if verdict.kept == 2 else verdict.token] += 1
    p0 = _exact(TopP(0.7, top_p, seed=8), ROWS[0])
    p1 = _exact(TopP(0.7, top_p, seed=9), ROWS[1])
    # 5 standard errors of two independent estimates of a share
    assert torch.all((first / TRIALS - p0).abs() <= 5 * (2 * p0 * (1 - p0) / TRIALS) ** 0.5 + 1e-3), (first, p0)
    if kept_first > 500:
        share = second / kept_first
        assert torch.all((share - p1).abs() <= 5 * (p1 * (1 - p1) / kept_first + p1 * (1 - p1) / TRIALS) ** 0.5
                         + 1e-3), (share, p1)
    if top_p < 1.0:   # outside the nucleus: never drawn, a draft token there never kept
        assert first[p0 == 0].sum() == 0 and second[p1 == 0].sum() == 0


def test_verification_is_seeded_and_greedy_keeps_the_argmaxes() -> None:
    runs = [[tuple(TopP(0.7, seed=s).accept(ROWS, [0, 2])[:2]) for s in range(30)] for _ in range(2)]
    assert runs[0] == runs[1] and len(set(runs[0])) > 1                 # seeded, and random across seeds
    assert Greedy().accept(ROWS, [0, 2])[:2] == (2, 0)                   # both argmaxes, then row 2's first
    assert Greedy().accept(ROWS, [0, 1])[:2] == (1, 2)                   # row 1's argmax is 2
    assert accept_draft(Greedy(), ROWS, [1, 2])[:2] == (0, 0)
    verdict = TopP(0.7, seed=1).accept(ROWS, [4, 4])
    if verdict.kept == 0:                                                # the row an end is refused from
        assert verdict.row[4] == float("-inf")


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

@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build_tiny_model(tmp_path_factory.mktemp("tiny"))
    model = AutoModelForCausalLM.from_pretrained(str(path))
    model.eval()
    return model, AutoTokenizer.from_pretrained(str(path))


def _decode(session: KVSession, ids: list[int], sampler, n: int, drafter=None) -> tuple[list[int], object]:
    toks: list[int] = []
    last = None
    for ev in generate(session, ids, sampler=sampler, stop_ids=frozenset(), max_tokens=n, drafter=drafter):
        toks.extend(ev.tokens)
        last = ev
    assert last is not None
    return toks, last.stats


def test_a_sampled_decode_verifies_drafts_and_keeps_its_tokens(tiny) -> None:
    """At a temperature near 0 a sample is the greedy answer: drafted or
    not, the same tokens; drafts along that answer are all kept (a few
    forwards for 30 tokens)."""
    model, tok = tiny
    ids = tok(inspect.getsource(textwrap.dedent)[:400], add_special_tokens=False).input_ids * 2
    session = KVSession(LeanBackend(model, 2048))
    greedy, _ = _decode(session, ids, Greedy(), 30)
    plain, plain_stats = _decode(session, ids, TopP(1e-4, seed=3), 30)
    drafted, stats = _decode(session, ids, TopP(1e-4, seed=3), 30, PromptLookup())
    along, along_stats = _decode(session, ids, TopP(1e-4, seed=3), 30, AlongReference(greedy))
    assert plain == drafted == along == greedy
    assert plain_stats.draft_tokens == 0                               # type: ignore[attr-defined]
    assert stats.draft_tokens > 0                                      # type: ignore[attr-defined]
    # along the answer itself every draft is kept: a few forwards for 30 tokens
    assert along_stats.accepted_tokens == along_stats.draft_tokens > 0    # type: ignore[attr-defined]
    assert along_stats.steps <= 5                                           # type: ignore[attr-defined]
