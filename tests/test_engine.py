"""The engine pipeline on the tiny model: events, timings, cancellation,
budget, candidates, errors; and the CLI's location handling."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from soldaemon.api import CancelToken, CompletionRequest, Delta, Done
from soldaemon.cli import parse_location, split_at
from soldaemon.config import config_from_dict
from soldaemon.errors import BadRequest
from soldaemon.runtime.engine.local import LocalEngine, load_engine
from soldaemon_bench.tiny import build_tiny_model

PREFIX = "import os\n\n\ndef join_all(parts):\n    result = []\n    for part in parts:\n        result.append("
SUFFIX = ")\n    return result\n"
# a cursor inside a word (token healing applies) where the tiny model writes
# a long completion: the type-through and generation-reuse tests need one
TYPED_PREFIX = PREFIX + "os"


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> LocalEngine:
    path = build_tiny_model(tmp_path_factory.mktemp("tiny"))
    # the float32 plan, pinned: the tiny model's text (which these tests rely on) must not
    # depend on the kernel timings a busy machine measured at load
    config = config_from_dict({"model": {"path": str(path), "max_context": 2048, "precision": "float32"},
                               "device": {"device": "cpu"}})
    return load_engine(config, progress=False)


def _run(engine: LocalEngine, req: CompletionRequest, cancel: CancelToken | None = None) -> tuple[list[Delta], Done]:
    events = list(engine.complete(req, cancel or CancelToken()))
    assert isinstance(events[-1], Done)
    assert all(isinstance(e, Delta) for e in events[:-1])
    return events[:-1], events[-1]  # type: ignore[return-value]


def test_complete_streams_then_done(engine: LocalEngine) -> None:
    deltas, done = _run(engine, CompletionRequest(id="a", prefix=PREFIX, suffix=SUFFIX, max_tokens=12,
                                                  multiline="multi"))
    assert done.id == "a" and len(done.items) == 1
    assert done.finish_reason in ("stop", "length")
    t = done.timings
    assert t.prompt_tokens > 10 and t.generated_tokens >= 1
    assert 0 <= t.queue_ms <= t.ttft_ms <= t.total_ms
    assert t.ttft_end_ns >= t.ttft_start_ns > 0
    streamed = "".join(d.text for d in deltas)
    assert all(d.text for d in deltas)
    # deltas are a preview of the raw text: never retracted, held back at the end
    assert "\ufffd" not in streamed


def test_second_request_reuses_the_kv_cache(engine: LocalEngine) -> None:
    _run(engine, CompletionRequest(id="a", prefix=PREFIX, suffix=SUFFIX, max_tokens=4))
    _, done = _run(engine, CompletionRequest(id="b", prefix=PREFIX + "p", suffix=SUFFIX, max_tokens=4))
    assert done.timings.cached_tokens > 0.5 * done.timings.prompt_tokens


def test_greedy_is_deterministic(engine: LocalEngine) -> None:
    req = CompletionRequest(id="a", prefix=PREFIX, suffix=SUFFIX, max_tokens=10)
    assert _run(engine, req)[1].items == _run(engine, req)[1].items


def test_cancel_before_start(engine: LocalEngine) -> None:
    cancel = CancelToken()
    cancel.supersede()
    _, done = _run(engine, CompletionRequest(id="c", prefix=PREFIX, suffix=SUFFIX, max_tokens=50), cancel)
    assert done.finish_reason == "superseded"


@pytest.mark.parametrize("operation, sampled, reason", [("cancel", False, "cancelled"),
                                                       ("supersede", True, "superseded")])
def test_a_stop_mid_decode_ends_with_the_tokens_reason(engine: LocalEngine, operation: str, sampled: bool,
                                                      reason: str) -> None:
    """Cancelled, or superseded where the run cannot park (a sampled one), decoding stops and the
    engine's own Done (no worker in between) names the operation that stopped it."""
    cancel = CancelToken()
    events = []
    for ev in engine.complete(CompletionRequest(id="c", prefix=PREFIX, suffix="", max_tokens=200, multiline="multi",
                                                temperature=0.8 if sampled else 0.0, seed=3), cancel):
        events.append(ev)
        if isinstance(ev, Delta):
            getattr(cancel, operation)()
    done = events[-1]
    assert isinstance(done, Done) and done.finish_reason == reason
    assert done.timings.generated_tokens < 200


def test_budget_ends_generation(engine: LocalEngine) -> None:
    _, done = _run(engine, CompletionRequest(id="b", prefix=PREFIX, suffix="", max_tokens=500, budget_ms=1,
                                             multiline="multi"))
    assert done.finish_reason == "budget"


def test_several_candidates_need_sampling(engine: LocalEngine) -> None:
    with pytest.raises(BadRequest, match="temperature"):
        list(engine.complete(CompletionRequest(id="n", prefix=PREFIX, suffix="", n=3), CancelToken()))
    _, done = _run(engine, CompletionRequest(id="n", prefix=PREFIX, suffix="", n=3, temperature=0.8, seed=7,
                                             max_tokens=6))
    assert len(done.items) == 3


def test_prompt_too_long_for_context(engine: LocalEngine) -> None:
    with pytest.raises(BadRequest, match="max_context"):
        list(engine.complete(CompletionRequest(id="x", prefix=PREFIX, suffix="", max_tokens=2040), CancelToken()))


def test_cancel_from_another_thread(engine: LocalEngine) -> None:
    cancel = CancelToken()
    timer = threading.Timer(0.05, cancel.cancel)
    timer.start()
    try:
        _, done = _run(engine, CompletionRequest(id="t", prefix=PREFIX * 3, suffix="", max_tokens=2000 - 600,
                                                 multiline="multi"), cancel)
    finally:
        timer.cancel()
    assert done.finish_reason in ("cancelled", "stop")


def test_health_and_info(engine: LocalEngine) -> None:
    d = engine.diagnosis()
    assert set(d) >= {"active", "ttft_optimized", "prefetch_hit_rate", "kv_fold_ratio", "offloaded_layers"}
    info = engine.info()
    assert info["backend"] == "lean" and info["fim"] == "qwen2.5-coder" and info["device"] == "cpu"


def test_locations(tmp_path: Path) -> None:
    assert parse_location("a/b.py:3:7") == (Path("a/b.py"), 3, 7)
    with pytest.raises(BadRequest, match="FILE:LINE:COL"):
        parse_location("a.py:3")
    with pytest.raises(BadRequest, match="1-based"):
        parse_location("a.py:0:1")
    text = "ab\ncdef\n"
    assert split_at(text, 2, 3) == ("ab\ncd", "ef\n")
    assert split_at(text, 2, 99) == ("ab\ncdef", "\n")  # past the end: end of line
    assert split_at(text, 1, 1) == ("", text)
    with pytest.raises(BadRequest, match="past the end"):
        split_at(text, 9, 1)
    # lines as an editor counts them: a form feed or U+2028 inside a line is not a line break
    paged = "a\x0cb\nc\u2028d\nx = 1\n"
    assert split_at(paged, 3, 5) == ("a\x0cb\nc\u2028d\nx = ", "1\n")


def test_type_through_answers_without_the_model(engine: LocalEngine) -> None:
    uri = "file:///tmp/t.py"
    _, first = _run(engine, CompletionRequest(id="1", uri=uri, prefix=TYPED_PREFIX, suffix=SUFFIX, max_tokens=12))
    text = first.items[0]
    assert len(text) >= 2, f"the tiny model's completion changed: {text!r}"
    steps_before = engine.part.stats.requests
    deltas, done = _run(engine, CompletionRequest(id="2", uri=uri, prefix=TYPED_PREFIX + text[0], suffix=SUFFIX))
    assert done.timings.source == "type-through"
    assert done.items == (text[1:],) and "".join(d.text for d in deltas) == text[1:]
    assert done.timings.prompt_tokens == 0 and engine.part.stats.requests == steps_before  # no model work
    # typing something else goes back to the model
    _, other = _run(engine, CompletionRequest(id="3", uri=uri, prefix=PREFIX + "\u00e9", suffix=SUFFIX, max_tokens=4))
    assert other.timings.source == "model"
    # a different suffix (the user edited after the cursor) is not type-through
    _run(engine, CompletionRequest(id="4", uri=uri, prefix=TYPED_PREFIX, suffix=SUFFIX, max_tokens=12))
    _, moved = _run(engine, CompletionRequest(id="5", uri=uri, prefix=TYPED_PREFIX + text[0], suffix=SUFFIX + "x",
                                              max_tokens=4))
    assert moved.timings.source == "model"


def _interrupt(engine: LocalEngine, req: CompletionRequest, after_chars: int) -> tuple[str, Done]:
    """Run ``req`` and supersede it once ``after_chars`` characters were
    streamed, as the server does when the same document sends a newer
    request. Returns (streamed text, done)."""
    cancel = CancelToken()
    streamed = ""
    done = None
    for ev in engine.complete(req, cancel):
        if isinstance(ev, Delta):
            streamed += ev.text
            if len(streamed) >= after_chars:
                cancel.supersede()
        else:
            done = ev
    assert done is not None
    return streamed, done


def test_a_superseded_generation_is_resumed_when_the_user_types_along(engine: LocalEngine) -> None:
    """Generation reuse: the keystroke's answer equals the rest of the
    uninterrupted generation (the reference run, full recompute)."""
    uri = "file:///tmp/resume.py"
    req = CompletionRequest(id="ref", uri=uri, prefix=TYPED_PREFIX, suffix=SUFFIX, max_tokens=24, multiline="multi")
    _, ref = _run(engine, req)
    text = ref.items[0]
    assert len(text) >= 4, f"the tiny model's completion changed: {text!r}"
    engine.forget_shown()   # no type-through: this is about the generation itself
    streamed, first = _interrupt(engine, CompletionRequest(id="a", uri=uri, prefix=TYPED_PREFIX, suffix=SUFFIX,
                                                           max_tokens=24, multiline="multi"), 2)
    assert first.finish_reason == "superseded"
    typed = streamed[:2]
    assert text.startswith(typed)
    resumed_before = engine.part.stats.resumed
    deltas, done = _run(engine, CompletionRequest(id="b", uri=uri, prefix=TYPED_PREFIX + typed, suffix=SUFFIX,
                                                  max_tokens=24, multiline="multi"))
    assert done.timings.source == "resumed" and engine.part.stats.resumed == resumed_before + 1
    assert done.items == (text[len(typed):],)
    assert text[len(typed):].startswith("".join(d.text for d in deltas))
    assert done.timings.cached_tokens == done.timings.prompt_tokens   # no prompt recomputed


def test_a_parked_generation_is_dropped_when_the_user_types_something_else(engine: LocalEngine) -> None:
    uri = "file:///tmp/resume2.py"
    base = CompletionRequest(id="x", uri=uri, prefix=PREFIX, suffix=SUFFIX, max_tokens=24, multiline="multi")
    # the uninterrupted run streams more than one delta, so superseding it
    # after the first always lands before its end (no race with a fast model)
    ref_deltas, _ = _run(engine, base)
    assert len(ref_deltas) >= 2, f"the tiny model's completion changed: {ref_deltas!r}"
    engine.forget_shown()   # no type-through: the same request is generated again
    streamed, first = _interrupt(engine, base, 1)
    assert first.finish_reason == "superseded"
    other = "\u00e9" if not streamed.startswith("\u00e9") else "\u00e8"
    _, done = _run(engine, CompletionRequest(id="y", uri=uri, prefix=PREFIX + other, suffix=SUFFIX, max_tokens=4))
    assert done.timings.source == "model"
    # and the same after an edit of the suffix, or a warm of the document in between
    _interrupt(engine, base, 1)
    _, done = _run(engine, CompletionRequest(id="z", uri=uri, prefix=PREFIX + streamed[:1], suffix=SUFFIX + "#",
                                             max_tokens=4))
    assert done.timings.source == "model"
    _interrupt(engine, base, 1)
    engine.warm(CompletionRequest(id="w", uri=uri, prefix=PREFIX, suffix=SUFFIX), CancelToken())
    _, done = _run(engine, CompletionRequest(id="v", uri=uri, prefix=PREFIX + streamed[:1], suffix=SUFFIX,
                                             max_tokens=4, multiline="multi"))
    assert done.timings.source != "resumed"
    # a warm of another document: its KV session is acquired, which may fold or recycle the parked one's
    _interrupt(engine, base, 1)
    engine.warm(CompletionRequest(id="w2", uri="file:///tmp/elsewhere.py", prefix=PREFIX, suffix="\n"),
                CancelToken())
    _, done = _run(engine, CompletionRequest(id="u", uri=uri, prefix=PREFIX + streamed[:1], suffix=SUFFIX,
                                             max_tokens=24, multiline="multi"))
    assert done.timings.source == "model"
    # the control: with nothing in between, the same keystroke resumes it
    _interrupt(engine, base, 1)
    _, done = _run(engine, CompletionRequest(id="s", uri=uri, prefix=PREFIX + streamed[:1], suffix=SUFFIX,
                                             max_tokens=24, multiline="multi"))
    assert done.timings.source == "resumed"
