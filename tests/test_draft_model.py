"""Speculation with a draft model (``model.draft_model``): token-identical to
plain greedy decoding whatever the draft proposes; its KV cache follows the
target's history; the engine loads it from the config and refuses a model
with another vocabulary."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soldaemon.api import CancelToken, CompletionRequest, Done
from soldaemon.config import config_from_dict
from soldaemon.errors import ModelError
from soldaemon.weights.loader import load_model
from soldaemon.runtime.forward.backend import LeanBackend
from soldaemon.runtime.decode.draft import DraftModel
from soldaemon.runtime.engine.local import load_engine
from soldaemon.runtime.decode.generate import generate
from soldaemon.runtime.decode.sampling import Greedy
from soldaemon.runtime.kv.session import KVSession
from soldaemon_bench.tiny import build_tiny_model


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The target and a differently initialized draft with the same tokenizer."""
    target = build_tiny_model(tmp_path_factory.mktemp("target"))
    draft = build_tiny_model(tmp_path_factory.mktemp("draft"), layers=2, seed=7)
    return target, draft


@pytest.fixture(scope="module")
def hf(models: tuple[Path, Path]) -> tuple[object, object]:
    from transformers import AutoModelForCausalLM

    return tuple(AutoModelForCausalLM.from_pretrained(str(p)).eval() for p in models)  # type: ignore[return-value]


def _greedy(session: KVSession, ids: list[int], n: int, drafter: DraftModel | None = None, k: int = 4) -> tuple[list[int], int, int]:
    toks: list[int] = []
    last = None
    for ev in generate(session, ids, sampler=Greedy(), stop_ids=frozenset(), max_tokens=n, drafter=drafter,
                       draft_k=k):
        toks.extend(ev.tokens)
        last = ev
    assert last is not None
    return toks, last.stats.draft_tokens, last.stats.accepted_tokens


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), k=st.integers(1, 8), n=st.integers(1, 24), same=st.booleans())
def test_draft_model_speculation_is_token_identical(hf: tuple[object, object], seed: int, k: int, n: int,
                                                    same: bool) -> None:
    target, draft = hf
    rng = random.Random(seed)
    ids = [rng.randrange(5, 1500) for _ in range(rng.randrange(3, 200))]
    session = KVSession(LeanBackend(target, 512))
    plain, _, _ = _greedy(session, ids, n)
    drafter = DraftModel(LeanBackend(target if same else draft, 512), vocab_limit=2048)
    spec, drafted, accepted = _greedy(session, ids, n, drafter, k)
    assert spec == plain
    if same and n > 2:   # the target drafting for itself is always right
        assert drafted > 0 and accepted == drafted


def test_draft_cache_follows_the_history(hf: tuple[object, object]) -> None:
    _, draft = hf
    drafter = DraftModel(LeanBackend(draft, 512), vocab_limit=2048)
    history = list(range(10, 60))
    drafter.reset(history)
    first = drafter.propose(3)
    assert len(first) == 3 and drafter.session.tokens == history
    drafter.extend(first[:1])
    drafter.propose(2)
    assert drafter.session.tokens == history + first[:1]
    # a new request sharing the prefix reuses the draft's KV
    drafter.reset(history[:40] + [7, 8])
    before = drafter.session.version
    drafter.propose(1)
    assert drafter.session.tokens == history[:40] + [7, 8] and drafter.session.version > before


def test_engine_loads_the_draft_model(models: tuple[Path, Path]) -> None:
    target, draft = models
    # one pinned plan for both engines: the pair's tokens are compared with the plain engine's
    config = config_from_dict({"model": {"path": str(target), "draft_model": str(draft), "max_context": 2048,
                                         "precision": "float32"}, "device": {"device": "cpu"}})
    engine = load_engine(config, progress=False)
    assert engine.part.draft_model is not None and engine.info()["drafter"] == "draft model"
    assert engine.part.draft_model_length is not None and engine.part.draft_model_length.draft_ms > 0
    req = CompletionRequest(id="a", prefix="def f(x):\n    return x", suffix="\n", max_tokens=12)
    done = [e for e in engine.complete(req, CancelToken()) if isinstance(e, Done)][0]
    plain = load_engine(config_from_dict({"model": {"path": str(target), "max_context": 2048, "precision": "float32"},
                                          "device": {"device": "cpu"}, "completion": {"speculative": False}}),
                        progress=False)
    ref = [e for e in plain.complete(req, CancelToken()) if isinstance(e, Done)][0]
    assert done.items == ref.items


def test_a_draft_model_with_another_vocabulary_is_refused(models: tuple[Path, Path], tmp_path: Path) -> None:
    target, _ = models
    config = config_from_dict({"model": {"path": str(target), "max_context": 2048}, "device": {"device": "cpu"}})
    engine = load_engine(config, progress=False)
    other = load_model(str(target), device="cpu", dtype="auto", progress=False)
    other.tokenizer.add_tokens(["<an_extra_token>"])
    with pytest.raises(ModelError, match="does not share the tokenizer"):
        engine.attach_draft_model(other)
    assert torch.get_num_threads() >= 1


def test_the_residency_planner_makes_room_for_the_draft(models: tuple[Path, Path]) -> None:
    """Under sol.memory_budget the pair is planned together: a budget that
    holds the target whole holds the draft too only by offloading layers.

    Every size the budget is made of comes from the engine under test (the
    same pair, unbudgeted), and every engine here runs one pinned kernel
    plan: a plan measured anew per engine (on a busy machine, another one)
    would change the weight bytes between the sizing and the budgeted run."""
    target, draft = models
    base = {"model": {"path": str(target), "max_context": 2048, "precision": "float32"}, "device": {"device": "cpu"}}
    pair_config = {**base, "model": {**base["model"], "draft_model": str(draft)}}
    sized = load_engine(config_from_dict(pair_config), progress=False)
    assert sized.memory is not None and sized.part.draft_model is not None
    store = sized.memory.store
    kv = sized.backend.kv_bytes_per_session * sized.config.model.kv_sessions
    layer = (store.device_bytes() - store.fixed_bytes) // len(sized.backend.layers)  # type: ignore[attr-defined]
    whole = store.device_bytes() + kv
    draft_bytes = sized.memory.kv_reserve_bytes - kv          # what this engine keeps beside the target for its draft
    sized.close()
    assert draft_bytes > layer // 2
    # room for the target whole, or for the pair with about one target layer offloaded
    mb = (whole + draft_bytes - layer // 2) / 2**20
    budget = {"memory_budget": f"{mb:.3f}MB", "prefetch_depth": 1}
    alone = load_engine(config_from_dict({**base, "sol": budget}), progress=False)
    assert alone.diagnosis()["offloaded_layers"] == 0
    alone.close()
    pair = load_engine(config_from_dict({**pair_config, "sol": budget}), progress=False)
    assert pair.part.draft_model is not None and pair.memory is not None
    assert pair.memory.kv_reserve_bytes == kv + draft_bytes
    assert pair.diagnosis()["offloaded_layers"] > 0
    req = CompletionRequest(id="a", prefix="def f(x):\n    return x", suffix="\n", max_tokens=8)
    assert [e for e in pair.complete(req, CancelToken()) if isinstance(e, Done)][0].items
    pair.close()
