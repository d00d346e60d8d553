"""Work ahead of a foreseeable request, on the tiny model (issue 16, item 5):
``warm`` prefills exactly the prompt the next ``complete`` there computes,
and leaves its answer unchanged; speculative FIM answers the request that
follows accepting a completion, identically to computing it cold, and gives
way to a real request within a step."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
import torch

from soldaemon.api import CancelToken, CompletionRequest, Done
from soldaemon.runtime.engine.local import LocalEngine
from soldaemon.runtime.engine.foresight import accepted_request
from tests.fixtures.engines import run_done, tiny_engine

PREFIX = "import os\n\n\ndef join_all(parts):\n    result = []\n    for part in parts:\n        result.append(os"
SUFFIX = ")\n    return result\n"
OTHER = "def other(x):\n    if x:\n        return x\n    return "


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> LocalEngine:
    return tiny_engine(tmp_path_factory)


def _req(rid: str, uri: str, prefix: str, suffix: str = SUFFIX, **kw: object) -> CompletionRequest:
    return CompletionRequest(id=rid, uri=uri, prefix=prefix, suffix=suffix, max_tokens=8, **kw)  # type: ignore[arg-type]


def speculate(engine: LocalEngine, req: CompletionRequest, item: str, cancel: CancelToken) -> Done | None:
    """What the server's worker does once ``item`` was delivered for ``req``
    and its queue is empty: the engine's work ahead, run to its end (None:
    the engine names no work)."""
    work = engine.work_ahead(req, Done(req.id, (item,), "stop"))
    return None if work is None else work(cancel)


def _memory(engine: LocalEngine) -> tuple[object, ...]:
    """The per-document memory later answers depend on, and the counters."""
    return dict(engine.pipeline.documents.anchors._anchors), dict(engine.pipeline.documents.shown), engine.part.stats.requests


def test_complete_after_warm_computes_only_what_was_typed(engine: LocalEngine) -> None:
    uri = "file:///warm_hit.py"
    run_done(engine, _req("cold", uri, OTHER, "\n"))              # the cache holds something else
    warm = engine.warm(_req("w", uri, PREFIX), CancelToken())
    assert warm.prompt_tokens > 30 and warm.cached_tokens < warm.prompt_tokens / 2
    same = run_done(engine, _req("a", uri, PREFIX)).timings
    assert same.source == "model" and same.prompt_tokens == warm.prompt_tokens
    assert same.cached_tokens == same.prompt_tokens              # nothing of the prompt computed
    engine.warm(_req("w2", uri, PREFIX + ".pa"), CancelToken())
    typed = run_done(engine, _req("b", uri, PREFIX + ".pat")).timings  # one character typed since the warm
    assert typed.source == "model"
    assert typed.prompt_tokens - typed.cached_tokens <= 3


def test_warm_leaves_the_kv_a_cold_complete_computes(engine: LocalEngine) -> None:
    """Token for token is not enough: the KV values must be the ones the
    complete would compute itself (the typed line at decode precision),
    or every later reuse of them drifts."""
    req = _req("kv", "file:///warm_kv.py", PREFIX)
    engine.warm(req, CancelToken())
    session = engine.pool.acquire(req.uri)
    n = len(session.tokens)
    warmed = list(session.tokens)
    warm_k, warm_v = (t[:, :, :n].clone() for t in session.cache)
    session.truncate(0)
    run_done(engine, req)                                            # computes the same prompt cold
    assert session.tokens[:n] == warmed
    assert torch.equal(warm_k, session.cache[0][:, :, :n])
    assert torch.equal(warm_v, session.cache[1][:, :, :n])


def test_warm_and_speculation_leave_the_per_document_state_alone(engine: LocalEngine) -> None:
    uri = "file:///state.py"
    run_done(engine, _req("s0", uri, PREFIX))
    before = _memory(engine)
    selector = engine.pipeline.documents.selector
    chosen = dict(selector._last) if selector is not None else None
    engine.warm(_req("w", uri, OTHER, "\n"), CancelToken())      # elsewhere in the same document
    spec = speculate(engine, _req("x", uri, OTHER, "\n"), "y", CancelToken())   # and ahead of accepting "y"
    assert spec is not None and spec.finish_reason in ("stop", "length")
    assert _memory(engine) == before
    assert (dict(selector._last) if selector is not None else None) == chosen


def test_the_answer_after_a_warm_is_the_answer_without_it(engine: LocalEngine) -> None:
    """Two documents with the same text and history, one warmed elsewhere
    in between: the sticky anchor (spanning two lines here) and hence the
    prompt and the completion are the same, token for token."""
    typed = PREFIX + ")\n        result.append(par"

    def history(uri: str, warm_between: bool) -> Done:
        run_done(engine, _req("h1", uri, PREFIX))
        run_done(engine, _req("h2", uri, typed))                     # the anchor stays on the first line
        if warm_between:
            engine.warm(_req("w", uri, OTHER, "\n"), CancelToken())
        return run_done(engine, _req("h3", uri, typed + "t"))

    plain, warmed = history("untitled:plain", False), history("untitled:warmed", True)
    assert plain.timings.source == warmed.timings.source == "model"
    assert warmed.items == plain.items
    assert (warmed.timings.prompt_tokens, warmed.timings.generated_tokens) == \
        (plain.timings.prompt_tokens, plain.timings.generated_tokens)


def test_accepting_a_completion_is_answered_from_the_speculation(engine: LocalEngine) -> None:
    first = _req("a", "untitled:spec", PREFIX)
    shown = run_done(engine, first)
    item = shown.items[0]
    assert item, "the tiny model should write something here"
    spec = speculate(engine, first, item, CancelToken())
    assert spec is not None and spec.finish_reason in ("stop", "length")
    accepted = dataclasses.replace(first, id="b", prefix=PREFIX + item, version=7)
    t0 = time.perf_counter()
    got = run_done(engine, accepted)
    ms = (time.perf_counter() - t0) * 1e3
    assert got.timings.source == "speculative" and got.items == spec.items
    assert got.timings.cached_tokens == got.timings.prompt_tokens > 0
    # the same document history with nothing computed ahead, in another document
    # (its anchor state), its KV cache emptied: computed cold
    run_done(engine, dataclasses.replace(first, uri="untitled:cold"))
    engine.pool.acquire("untitled:cold").truncate(0)
    cold = run_done(engine, dataclasses.replace(accepted, uri="untitled:cold"))
    assert cold.timings.source == "model" and cold.timings.cached_tokens == 0
    assert got.items == cold.items
    assert got.timings.generated_tokens == cold.timings.generated_tokens
    print(f"\naccepted completion from the speculation: {ms:.2f} ms, cold: {cold.timings.total_ms:.1f} ms")


def test_speculation_does_not_change_what_typing_gets(engine: LocalEngine) -> None:
    """Not accepting: typing the shown completion is still type-through,
    and the next computed answer is the one without speculation."""
    first = _req("a", "untitled:noaccept", PREFIX)
    item = run_done(engine, first).items[0]
    assert len(item) >= 2
    speculate(engine, first, item, CancelToken())
    through = run_done(engine, dataclasses.replace(first, id="b", prefix=PREFIX + item[0]))
    assert through.timings.source == "type-through" and through.items == (item[1:],)
    other = dataclasses.replace(first, id="c", prefix=PREFIX + "Q")
    with_spec = run_done(engine, other)
    run_done(engine, dataclasses.replace(first, uri="untitled:nospec"))
    without = run_done(engine, dataclasses.replace(other, uri="untitled:nospec"))
    assert with_spec.items == without.items and with_spec.timings.source == "model"


def test_nothing_to_foresee() -> None:
    base = CompletionRequest(id="a", prefix="x = ", suffix="\n")
    assert accepted_request(base, "") is None
    assert accepted_request(dataclasses.replace(base, temperature=0.5), "1") is None
    ahead = accepted_request(dataclasses.replace(base, budget_ms=50, priority="high"), "1")
    assert ahead is not None and ahead.prefix == "x = 1" and ahead.budget_ms is None and ahead.priority == "normal"


def test_a_request_preempts_speculation_within_a_step(engine: LocalEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Speculation on a long multi-line completion, cancelled while it
    decodes (as the worker does when a request arrives): it returns within
    one decode step, parked, so the accepted request resumes it. "Within a
    step" is counted (forwards begun after the cancel), not timed: a busy
    machine stretches a step, never adds one."""
    first = CompletionRequest(id="a", uri="untitled:preempt", prefix=OTHER, suffix="", max_tokens=200,
                              multiline="multi")
    shown = run_done(engine, dataclasses.replace(first, max_tokens=4))
    t = shown.timings
    item = shown.items[0]
    assert item
    step_ms = t.decode_ms / max(1, t.generated_tokens - 1)
    session = engine.pool.acquire(first.uri)
    cancel = CancelToken()
    ahead = accepted_request(first, item)
    assert ahead is not None
    result: list[Done | None] = []
    forward = engine.backend.forward
    begun_after_cancel = 0

    def counted(*args: object, **kwargs: object) -> object:
        nonlocal begun_after_cancel
        begun_after_cancel += cancel.cancelled
        return forward(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(engine.backend, "forward", counted)
    worker = threading.Thread(target=lambda: result.append(speculate(engine, first, item, cancel)))
    worker.start()
    deadline = time.monotonic() + 30
    while len(session.tokens) <= session.prompt_len + 3:       # decoding
        assert time.monotonic() < deadline and worker.is_alive(), "speculation never decoded"
        time.sleep(0.001)
    t0 = time.perf_counter()
    cancel.supersede()
    worker.join(30)
    waited_ms = (time.perf_counter() - t0) * 1e3
    assert not worker.is_alive()
    assert result and result[0] is not None and result[0].finish_reason == "superseded"
    print(f"\nrequest waited {waited_ms:.1f} ms for speculation to stop; a decode step {step_ms:.1f} ms")
    # at most the step whose cancel check ran just before the cancel
    assert begun_after_cancel <= 1, f"{begun_after_cancel} forwards began after the cancel"
    resumed = run_done(engine, dataclasses.replace(ahead, id="b", max_tokens=200))
    assert resumed.timings.source == "resumed"


def test_speculative_fim_off(tmp_path_factory: pytest.TempPathFactory) -> None:
    off = tiny_engine(tmp_path_factory, completion={"speculative_fim": False})
    first = _req("a", "untitled:off", PREFIX)
    item = run_done(off, first).items[0]
    assert speculate(off, first, item, CancelToken()) is None
    assert run_done(off, dataclasses.replace(first, prefix=PREFIX + item)).timings.source != "speculative"
