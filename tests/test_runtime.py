"""The runtime against transformers on a tiny random Qwen2: same greedy
tokens, reuse paths equal a full recompute, speculation is exact."""

from __future__ import annotations

import inspect
import random
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soldaemon.runtime.forward.backend import HFBackend, LeanBackend
from soldaemon.policy.kernel_plan import KernelPlan
from soldaemon.policy.draft import PromptLookup
from soldaemon.runtime.decode.generate import generate
from soldaemon.runtime.decode.sampling import Greedy, TopP, make_sampler
from soldaemon.errors import Cancelled
from soldaemon.runtime.kv.session import KVSession, common_prefix
from soldaemon_bench.tiny import build_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build_tiny_model(tmp_path_factory.mktemp("tiny"))
    model = AutoModelForCausalLM.from_pretrained(str(path))
    model.eval()
    return model, AutoTokenizer.from_pretrained(str(path))


SOURCE = inspect.getsource(textwrap)


def _prompts(tok, n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a = rng.randrange(0, len(SOURCE) - 600)
        out.append(tok(SOURCE[a:a + rng.randrange(40, 600)], add_special_tokens=False).input_ids)
    return out


def _hf_greedy(model, ids: list[int], n: int) -> list[int]:
    x = torch.tensor([ids])
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                         do_sample=False, pad_token_id=0)
    return out[0, len(ids):].tolist()


def _ours(session: KVSession, ids: list[int], n: int, drafter=None) -> list[int]:
    toks: list[int] = []
    for ev in generate(session, ids, sampler=Greedy(), stop_ids=frozenset(), max_tokens=n, drafter=drafter):
        toks.extend(ev.tokens)
    return toks


def test_lean_logits_match_transformers(tiny) -> None:
    model, tok = tiny
    ids = torch.tensor(_prompts(tok, 1)[0])
    backend = LeanBackend(model, 1024)
    with torch.no_grad():
        ref = model(ids[None]).logits[0]
    assert torch.allclose(backend.forward(ids, 0, last_only=False), ref, atol=1e-4)
    # incremental = full
    backend.forward(ids[:10], 0)
    assert torch.allclose(backend.forward(ids[10:], 10, last_only=False), ref[10:], atol=1e-4)


def test_a_forward_writes_only_the_cache_it_is_given(tiny) -> None:
    """No "current cache": a forward given a session's cache reads and
    writes that one; the backend's own is untouched, and two sessions
    interleaved compute what each computes alone."""
    model, tok = tiny
    a_ids, b_ids = _prompts(tok, 2, seed=3)
    backend = LeanBackend(model, 1024)
    assert not hasattr(backend, "use_cache") and not hasattr(backend, "current_cache")
    alone = [_ours(KVSession(backend, cache=backend.new_cache()), ids, 6) for ids in (a_ids, b_ids)]
    before = [t.clone() for t in backend.cache]
    one, two = KVSession(backend, cache=backend.new_cache()), KVSession(backend, cache=backend.new_cache())
    first, second = one.prefill(a_ids).logits, two.prefill(b_ids).logits
    out: list[list[int]] = [[], []]
    for _ in range(6):                      # step by step, alternating
        for i, (session, logits) in enumerate(((one, first), (two, second))):
            token = int((logits if not out[i] else session.decode_step(out[i][-1])).argmax())
            out[i].append(token)
    assert out == alone
    assert all(torch.equal(x, y) for x, y in zip(before, backend.cache))


@pytest.mark.parametrize("backend_cls", [LeanBackend, HFBackend])
def test_greedy_equals_generate(tiny, backend_cls) -> None:
    model, tok = tiny
    session = KVSession(backend_cls(model, 2048))
    for ids in _prompts(tok, 6):
        assert _ours(session, ids, 20) == _hf_greedy(model, ids, 20)


def test_prefix_reuse_equals_recompute(tiny) -> None:
    model, tok = tiny
    session = KVSession(LeanBackend(model, 2048))
    fresh = KVSession(LeanBackend(model, 2048))
    base = _prompts(tok, 1, seed=3)[0]
    _ours(session, base, 8)
    # the user typed: the prompt grows by a few tokens at its end
    edited = base + tok(" = value", add_special_tokens=False).input_ids
    pre = session.prefill(edited)
    assert pre.cached == len(base)          # everything before the edit reused
    assert pre.computed == len(edited) - len(base)
    assert _ours(session, edited, 12) == _ours(fresh, edited, 12)
    # a shorter prompt (backspace) reuses what still matches
    shorter = base[:-5]
    pre = session.prefill(shorter)
    assert pre.cached == len(shorter) - 1 and pre.computed == 1
    fresh.truncate(0)
    assert _ours(session, shorter, 12) == _ours(fresh, shorter, 12)


def test_chunked_prefill_equals_one_pass(tiny) -> None:
    model, tok = tiny
    ids = _prompts(tok, 1, seed=5)[0]
    one = KVSession(LeanBackend(model, 2048), chunk=4096)
    chunked = KVSession(LeanBackend(model, 2048), chunk=7)
    assert torch.allclose(one.prefill(ids).logits, chunked.prefill(ids).logits, atol=1e-4)
    assert _ours(one, ids, 16) == _ours(chunked, ids, 16)


def test_cancel_between_prefill_chunks_keeps_a_valid_prefix(tiny) -> None:
    model, tok = tiny
    ids = _prompts(tok, 1, seed=6)[0]
    session = KVSession(LeanBackend(model, 2048), chunk=8)
    calls = {"n": 0}

    def cancelled() -> bool:
        calls["n"] += 1
        return calls["n"] > 2

    with pytest.raises(Cancelled):
        session.prefill(ids, cancelled=cancelled)
    assert session.tokens == ids[:16]       # two chunks made it
    fresh = KVSession(LeanBackend(model, 2048))
    assert _ours(session, ids, 10) == _ours(fresh, ids, 10)


def test_cancel_stops_decode_within_one_step(tiny) -> None:
    model, tok = tiny
    session = KVSession(LeanBackend(model, 2048))
    ids = _prompts(tok, 1)[0]
    flag = {"cancel": False}
    events = []
    for ev in generate(session, ids, sampler=Greedy(), stop_ids=frozenset(), max_tokens=50,
                       cancelled=lambda: flag["cancel"]):
        events.append(ev)
        if len(events) == 3:
            flag["cancel"] = True
    assert events[-1].finish_reason == "cancelled"
    assert len(events) == 4                 # three token events, then the cancel, no more steps
    assert events[-1].stats.steps == 2      # prefill + two decode steps


def test_stop_token_and_length(tiny) -> None:
    model, tok = tiny
    session = KVSession(LeanBackend(model, 2048))
    ids = _prompts(tok, 1)[0]
    free = _ours(session, ids, 12)
    stop = free[5]
    events = list(generate(session, ids, sampler=Greedy(), stop_ids=frozenset({stop}), max_tokens=12))
    toks = [t for ev in events for t in ev.tokens]
    assert events[-1].finish_reason == "stop"
    assert toks == free[: free.index(stop)]
    events = list(generate(session, ids, sampler=Greedy(), stop_ids=frozenset(), max_tokens=7))
    assert events[-1].finish_reason == "length" and sum(len(e.tokens) for e in events) == 7


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), k=st.integers(1, 10), n=st.integers(1, 30))
def test_speculation_is_token_identical(tiny, seed: int, k: int, n: int) -> None:
    """Property: prompt-lookup speculation returns exactly the greedy tokens."""
    model, tok = tiny
    ids = _prompts(tok, 1, seed=seed)[0]
    session = KVSession(LeanBackend(model, 2048))
    plain = _ours(session, ids, n)
    spec: list[int] = []
    for ev in generate(session, ids, sampler=Greedy(), stop_ids=frozenset(), max_tokens=n,
                       drafter=PromptLookup(), draft_k=k):
        spec.extend(ev.tokens)
    assert spec == plain


def test_speculation_accepts_on_repetitive_code(tiny) -> None:
    model, tok = tiny
    ids = _prompts(tok, 1, seed=1)[0]
    session = KVSession(LeanBackend(model, 2048))
    last = None
    for ev in generate(session, ids * 2, sampler=Greedy(), stop_ids=frozenset(), max_tokens=30,
                       drafter=PromptLookup()):
        last = ev
    assert last is not None and last.stats.draft_tokens > 0
    assert last.stats.steps < 30            # fewer forwards than tokens


def test_prompt_lookup_proposes_the_continuation() -> None:
    d = PromptLookup(max_n=3)
    d.reset([1, 2, 3, 4, 5, 9, 1, 2, 3])
    assert d.propose(2) == [4, 5]
    d.extend([7])
    assert d.propose(3) == []  # (2, 3, 7), (3, 7), (7,) never seen
    d.reset([5, 6, 5])
    assert d.propose(4) == [6, 5]


def test_samplers() -> None:
    logits = torch.tensor([0.0, 5.0, 1.0])
    assert Greedy()(logits) == 1
    assert isinstance(make_sampler(0.0), Greedy)
    s1, s2 = TopP(0.8, 0.9, seed=1), TopP(0.8, 0.9, seed=1)
    draws = [s1(logits) for _ in range(20)]
    assert draws == [s2(logits) for _ in range(20)]      # seeded: reproducible
    assert set(draws) <= {1, 2}
    assert all(TopP(1.0, 0.01, seed=i)(logits) == 1 for i in range(10))  # nucleus of one
    with pytest.raises(ValueError, match="temperature"):
        TopP(0.0)


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2]) == 2


def test_session_pool_keeps_one_cache_per_document(tiny) -> None:
    from soldaemon.runtime.kv.session import SessionPool

    model, tok = tiny
    a_ids, b_ids, c_ids = _prompts(tok, 3, seed=9)
    pool = SessionPool(LeanBackend(model, 1024), 2)
    sa = pool.acquire("a")
    _ours(sa, a_ids, 4)
    sb = pool.acquire("b")
    _ours(sb, b_ids, 4)
    assert sa is not sb and sa.cache[0].data_ptr() != sb.cache[0].data_ptr()
    # back to a: its cache survived b's work, so the whole prompt is reused
    assert pool.acquire("a") is sa
    pre = sa.prefill(a_ids)
    assert pre.cached == len(a_ids) - 1 or pre.computed == 0
    fresh = KVSession(LeanBackend(model, 1024))
    assert _ours(sa, a_ids, 8) == _ours(fresh, a_ids, 8)
    # a third document recycles the least recently used (b)
    sc = pool.acquire("c")
    assert sc is sb and sc.tokens == [] and len(pool) == 2
    assert _ours(sc, c_ids, 6) == _ours(fresh, c_ids, 6)


# int8 weights, two kernels over them: prefill and short forwards then differ
MIXED = KernelPlan("int8", "int8-dynamic", "int8", "float32", "float32")


def test_each_phase_runs_its_planned_kernel(tiny) -> None:
    """Long forwards run plan.prefill, short ones plan.short, over one int8
    copy of the weights; both close to the float32 model, neither identical."""
    model, tok = tiny
    ids = torch.tensor(_prompts(tok, 1, seed=4)[0])
    assert len(ids) > 16
    full = LeanBackend(model, 1024)
    mixed = LeanBackend(model, 1024, plan=MIXED)
    dyn = LeanBackend(model, 1024, plan=KernelPlan("int8", "int8-dynamic", "int8-dynamic", "float32", "float32"))
    wo = LeanBackend(model, 1024, plan=KernelPlan("int8", "int8", "int8", "float32", "float32"))
    assert mixed.layers[0].wqkv.dtype == torch.int8 and mixed.layers[0].sqkv is not None
    q_proj = model.model.layers[0].self_attn.q_proj.weight      # the reference shares the module's (q/k/v packed
    assert full.layers[0].wqkv.untyped_storage().data_ptr() == q_proj.untyped_storage().data_ptr()   # as one)
    short = mixed.forward(ids[:5], 0)                         # 5 tokens: a short forward
    assert torch.equal(short, wo.forward(ids[:5], 0))         # the short-forward kernel
    assert not torch.equal(dyn.forward(ids[:5], 0), short)
    long = mixed.forward(ids, 0)
    assert torch.equal(long, dyn.forward(ids, 0))             # the prefill kernel
    ref_short, ref_long = full.forward(ids[:5], 0), full.forward(ids, 0)
    for a, b in ((ref_long, long), (ref_short, short)):
        assert not torch.equal(a, b)
        assert torch.allclose(a, b, atol=0.05 * a.abs().max().item())
        assert int(a.argmax()) == int(b.argmax())


INT8 = KernelPlan("int8", "int8-dynamic", "int8-dynamic", "int8", "int8-dynamic")   # integer products throughout


def test_a_verify_is_its_decode_steps_bit_for_bit(tiny) -> None:
    """With integer products (exact per row) and row-by-row attention, a
    k-row verify's logits and KV are the k single steps' exactly: a drafted
    token is accepted or refused on the very logits greedy decoding would
    have seen, so speculation cannot change an answer."""
    model, tok = tiny
    ids = _prompts(tok, 1, seed=21)[0]
    nxt = _prompts(tok, 1, seed=22)[0][:9]
    be = LeanBackend(model, 2048, plan=INT8)
    session = KVSession(be)
    session.prefill(ids)
    steps = torch.stack([session.decode_step(t) for t in nxt])
    kv_steps = [c[:, :, :len(ids) + 9].clone() for c in be.cache]
    session.truncate(len(ids))
    rows = session.verify(nxt)
    assert torch.equal(rows, steps)
    for a, b in zip(kv_steps, be.cache):
        assert torch.equal(a, b[:, :, :len(ids) + 9])
    # one masked call for the 9 rows is the same attention, not the same bits
    be.stepwise_short = False
    session.truncate(len(ids))
    masked = session.verify(nxt)
    assert torch.allclose(masked, steps, atol=1e-3) and not torch.equal(masked, steps)


def test_the_blocked_copy_changes_no_bit(tiny) -> None:
    """plan.rows: prompts and verifies read a blocked second copy of the
    weights; the logits and KV are the one copy's to the bit (so a verify
    still equals its decode steps), and the copy is counted in the weight
    bytes. Where oneDNN is not exact the backend keeps one copy and says
    so in its plan."""
    from soldaemon.runtime.forward.kernels import onednn_int8_exact

    model, tok = tiny
    ids = _prompts(tok, 1, seed=23)[0]
    nxt = _prompts(tok, 1, seed=24)[0][:9]
    one = LeanBackend(model, 2048, plan=INT8)
    two = LeanBackend(model, 2048, plan=replace(INT8, rows="int8-onednn"))
    if not onednn_int8_exact():
        assert two.plan.rows is None and two.rows_layers is None and "failed" in two.plan.reason
        return
    assert two.rows_layers is not None and two.weight_bytes() > one.weight_bytes() + two.rows_bytes // 2
    out = []
    for be in (one, two):
        session = KVSession(be)
        first = session.prefill(ids).logits.clone()
        rows = session.verify(nxt).clone()
        session.truncate(len(ids))
        steps = torch.stack([session.decode_step(t) for t in nxt])
        out.append((first, rows, steps, [c[:, :, :len(ids) + 9].clone() for c in be.cache]))
    (f1, r1, s1, kv1), (f2, r2, s2, kv2) = out
    assert torch.equal(f1, f2) and torch.equal(r1, r2) and torch.equal(s1, s2)
    assert torch.equal(r2, s2)                    # the verify is still its decode steps
    for a, b in zip(kv1, kv2):
        assert torch.equal(a, b)


def test_draft_length_weighs_acceptance_against_forward_cost() -> None:
    from soldaemon.policy.draft import DraftLength

    gpu_like = {1: 10.0, 2: 10.2, 3: 10.4, 5: 10.8, 9: 11.6}     # memory-bound: T barely matters
    cpu_like = {1: 100.0, 2: 190.0, 3: 260.0, 5: 330.0, 9: 420.0}
    assert DraftLength(gpu_like, 8, prior=0.9).choose(budget=20) == 8
    assert DraftLength(gpu_like, 8, prior=0.9).choose(budget=3) == 3     # never beyond the budget
    assert 2 <= DraftLength(gpu_like, 8, prior=0.4).choose(budget=20) < 8  # saturates: 1/(1-a) tokens at most
    assert DraftLength(cpu_like, 8, prior=0.4).choose(budget=20) == 0    # drafts cost more than they give
    high = DraftLength(cpu_like, 8, prior=0.95)
    assert high.choose(budget=20) >= 4                                   # long accepted drafts do pay
    for _ in range(30):
        high.update(8, 0)                                                # nothing accepted lately
    assert high.rate < 0.05 and high.choose(budget=20) == 0
    assert DraftLength(cpu_like, 8).cost(4) == pytest.approx(295.0)     # interpolated
    # costs seen in real use replace optimistic start-up samples
    lucky = DraftLength({1: 100.0, 2: 105.0, 3: 110.0}, 2, prior=0.6)
    assert lucky.choose(budget=20) >= 1
    for _ in range(30):
        lucky.observe(2, 190.0)
        lucky.observe(3, 280.0)
        lucky.observe(1, 100.0)
    assert lucky.cost(2) == pytest.approx(190.0, rel=0.01) and lucky.choose(budget=20) == 0
    lucky.observe(7, 500.0)                                              # a size not measured at start-up
    assert lucky.cost(7) == 500.0 and list(lucky.costs_ms) == sorted(lucky.costs_ms)
    # one pre-empted forward (60x the usual) does not price drafts out for good
    flat = DraftLength({1: 18.0, 2: 23.0, 5: 42.0, 9: 52.0}, 8, prior=0.8)
    assert flat.choose(budget=20) > 0
    flat.observe(2, 1600.0)
    flat.observe(4, 1600.0)
    assert flat.cost(2) <= 1.2 * 23.0 * 1.01 and flat.choose(budget=20) > 0


def test_draft_length_estimates_the_geometric_rate_per_kind_and_explores() -> None:
    from soldaemon.policy.draft import DraftLength, PromptLookup

    cpu_like = {1: 40.0, 2: 56.0, 3: 58.0, 5: 62.0, 9: 70.0}      # a 2-core Zen 4, 0.5B, ~1k context
    # 8-token drafts with 4 accepted: 4 acceptances and one rejection each,
    # a = 0.8 (accepted/drafted would read 0.5 and the tokens after the
    # rejection, never tested, as failures)
    dl = DraftLength(cpu_like, 8)
    for _ in range(40):
        dl.update(8, 4, kind=3)
    assert dl.rate_of(3) == pytest.approx(0.8, abs=0.01) and dl.rate == pytest.approx(0.8, abs=0.01)
    for _ in range(40):
        dl.update(8, 8, kind=3)                       # all accepted: no rejection seen
    assert dl.rate_of(3) > 0.99
    # kinds are kept apart: single-token lookups failing do not price out 3-gram ones
    for _ in range(40):
        dl.update(2, 0, kind=1)
    assert dl.rate_of(1) < 0.01 and dl.rate_of(3) > 0.99
    assert dl.choose(budget=20, kind=3) >= 4
    assert dl.choose(budget=20, kind=1) == 0
    assert dl.rate_of(2) == dl.prior                  # never drafted: the prior
    assert set(dl.rates()) == {1, 3}
    # a kind turned down explore_every times in a row is drafted one token once
    dl = DraftLength(cpu_like, 8, explore_every=4)
    for _ in range(30):
        dl.update(4, 0, kind=1)
    picks = [dl.choose(budget=20, kind=1) for _ in range(8)]
    assert picks == [0, 0, 0, 1, 0, 0, 0, 1]
    assert dl.choose(budget=0, kind=1) == 0           # nothing left to draft: no exploring
    # what prompt lookup's proposal rests on: the longest n-gram that matches
    lookup = PromptLookup(max_n=3)
    lookup.reset([5, 6, 7, 8, 1, 2, 6, 7])
    assert lookup.kind() == 2 and lookup.propose(2) == [8, 1]
    lookup.extend([8])
    assert lookup.kind() == 3 and lookup.propose(3) == [1, 2, 6]
    lookup.extend([99])
    assert lookup.kind() == 0 and lookup.propose(3) == []


def test_adaptive_speculation_is_still_exact(tiny) -> None:
    from soldaemon.policy.draft import DraftLength

    model, tok = tiny
    session = KVSession(LeanBackend(model, 2048))
    for ids in _prompts(tok, 4, seed=11):
        plain = _ours(session, ids, 20)
        dl = DraftLength({1: 1.0, 9: 1.1}, 8, prior=0.9)
        spec = [t for ev in generate(session, ids * 2, sampler=Greedy(), stop_ids=frozenset(), max_tokens=20,
                                     drafter=PromptLookup(), draft_length=dl) for t in ev.tokens]
        assert spec == _ours(session, ids * 2, 20)


def test_prompt_logits_do_not_depend_on_the_cache(tiny) -> None:
    """With a short-forward kernel unlike the prefill one, a prompt's
    next-token logits are the same whether it was prefilled whole or mostly
    reused from the cache (prompt tokens always take the precise path)."""
    model, tok = tiny
    ids = _prompts(tok, 1, seed=12)[0]
    session = KVSession(LeanBackend(model, 2048, plan=MIXED))
    whole = session.prefill(ids).logits.clone()
    _ours(session, ids, 5)                   # generation leaves decode-step KV behind
    again = session.prefill(ids)             # reuses all but the last token
    assert again.computed == 1
    # the prefill kernel either way (row-vs-matrix rounding only), not the short one
    assert (again.logits - whole).abs().max().item() < 1e-4
    half_step = session.backend.forward(torch.tensor(ids[-1:]), len(ids) - 1)[0]
    assert (half_step - whole).abs().max().item() > 1e-4   # the half path would differ


def test_a_prompt_tail_at_decode_cost_is_the_same_reused_or_whole(tiny) -> None:
    """``precise_until`` (the engine passes the middle token's position): the
    tail runs on the decode weights, by position, so the logits and the KV
    are the same whether the tail was computed at once or a token at a time
    across requests (each keystroke adding one)."""
    model, tok = tiny
    ids = _prompts(tok, 1, seed=13)[0]
    split = len(ids) - 4
    fresh = KVSession(LeanBackend(model, 2048, plan=MIXED))
    whole = fresh.prefill(ids, precise_until=split).logits.clone()
    typed = KVSession(LeanBackend(model, 2048, plan=MIXED))
    for end in range(split + 1, len(ids) + 1):        # one keystroke at a time
        pre = typed.prefill(ids[:end], precise_until=split)
        _ours(typed, ids[:end], 3)                    # a generation in between
    assert pre.computed == 1
    assert (pre.logits - whole).abs().max().item() < 1e-3
    assert int(pre.logits.argmax()) == int(whole.argmax())
    n = len(ids)
    for a, b in ((fresh.backend.k_cache, typed.backend.k_cache), (fresh.backend.v_cache, typed.backend.v_cache)):
        assert (a[:, :, :n] - b[:, :, :n]).abs().max().item() < 1e-3
    # all-precise would differ: the tail really took the decode weights
    precise = KVSession(LeanBackend(model, 2048, plan=MIXED)).prefill(ids).logits
    assert (precise - whole).abs().max().item() > 1e-4
