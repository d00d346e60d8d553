"""The pipeline owns the stages of every answer's source (issue 29): a
generation a model part hands over (a parked run resumed) is previewed,
post-processed, timed, counted and remembered by the pipeline; an answer
computed ahead is timed from the request that takes it; one builder,
:meth:`Clock.timings`, makes every Timings. Pure Python: a hand-made model
part, no model."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

import pytest

from soldaemon.api import CancelToken, CompletionRequest, Delta, Done, Event, Timings
from soldaemon.config import config_from_dict
from soldaemon.pipeline.clock import Clock
from soldaemon.pipeline.completion import Pipeline, Settings
from soldaemon.pipeline.sources import Generation, Source, Stats, Stream, precomputed
from soldaemon.pipeline.ending import ending_for

PREFIX = "total = add("
SUFFIX = ")\n"
# the raw text a generation produced after what the user typed: the rest of
# the call, the suffix's closer and a line past the hole (post-processing cuts both)
RAW_STEPS = ("a", "a, ", "a, b)", "a, b)\nprint(total)")


class HandMadePart:
    """A model part whose early answer is given by the test; it never
    builds a prompt (``generate`` fails the test if the pipeline asks)."""

    def __init__(self, early: Source | None) -> None:
        self.answer = early
        self.accounted: list[Timings] = []

    def scope(self, req: CompletionRequest) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def early(self, req: CompletionRequest, cancel: CancelToken, deadline: int | None,
              typed_through: bool) -> Source | None:
        answer, self.answer = self.answer, None
        return None if typed_through else answer

    def generating(self, req: CompletionRequest) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def generate(self, *args: Any) -> Iterator[str]:
        raise AssertionError("the early answer should have answered")

    def scorer(self) -> None:
        return None

    def recover(self, *args: Any) -> None:
        return None

    def account(self, timings: Timings) -> None:
        self.accounted.append(timings)


def resumed(multiline: bool, prompt_tokens: int = 57, tokens: int = 6) -> Source:
    """A parked generation handed over: its text grows step by step, each
    step a little later."""
    ending = ending_for(PREFIX, SUFFIX, None, "multi" if multiline else "single", 8, "model")

    def text() -> Stream:
        for raw in RAW_STEPS:
            time.sleep(0.002)
            yield raw
        return Generation(RAW_STEPS[-1], "stop", Stats(generated_tokens=tokens))

    return Source(text(), ending, "resumed", prompt_tokens=prompt_tokens)


def request(rid: str, prefix: str = PREFIX, **kw: Any) -> CompletionRequest:
    return CompletionRequest(id=rid, prefix=prefix, suffix=SUFFIX, uri="file:///sum.py", multiline="single",
                             received_ns=time.perf_counter_ns(), **kw)


@pytest.fixture
def pipeline() -> Pipeline:
    return Pipeline(Settings(config_from_dict({})), None, None, 2048, heal=False)  # type: ignore[arg-type]


def split(events: list[Event]) -> tuple[list[Delta], Done]:
    assert isinstance(events[-1], Done) and all(isinstance(e, Delta) for e in events[:-1])
    return events[:-1], events[-1]  # type: ignore[return-value]


def test_a_resumed_generation_is_previewed_post_processed_and_timed_by_the_pipeline(pipeline: Pipeline) -> None:
    part = HandMadePart(resumed(multiline=False))
    deltas, done = split(list(pipeline.run(request("r"), CancelToken(), part)))
    assert done.items == ("a, b",)                     # the line past the hole and the suffix's closer cut
    assert done.ends == ("line",) and done.finish_reason == "stop"
    preview = "".join(d.text for d in deltas)
    assert preview and "a, b".startswith(preview)      # only appended, never what post-processing cuts
    assert len(deltas) >= 2                            # streamed as it continued, not at the end
    t = done.timings
    assert t.source == "resumed" and t.prompt_tokens == t.cached_tokens == 57 and t.generated_tokens == 6
    assert 0 < t.ttft_ms < t.total_ms and t.decode_ms > 0 and t.ttft_end_ns >= t.ttft_start_ns > 0
    assert part.accounted == [t]                       # counted once
    # remembered: typing the answer's start is type-through
    rest = split(list(pipeline.run(request("t", PREFIX + "a,"), CancelToken(), part)))[1]
    assert rest.items == (" b",) and rest.timings.source == "type-through"


def test_a_resumed_generation_under_another_plan_is_cut_by_the_text_rules(pipeline: Pipeline) -> None:
    """Started multi-line, taken over by a single-line request: the stop
    check it decoded under does not fit, the text rules cut it."""
    part = HandMadePart(resumed(multiline=True))
    _, done = split(list(pipeline.run(request("r"), CancelToken(), part)))
    assert done.items == ("a, b",) and done.ends == () and done.timings.source == "resumed"


def test_an_answer_computed_ahead_is_timed_from_the_request_that_takes_it(pipeline: Pipeline) -> None:
    ahead = Done("a~ahead", ("a, b",), "length", Timings(prompt_tokens=40, cached_tokens=12, generated_tokens=3,
                                                         ttft_ms=900.0, total_ms=950.0))
    part = HandMadePart(precomputed(ahead))
    req = request("b")
    deltas, done = split(list(pipeline.run(req, CancelToken(), part)))
    assert [d.text for d in deltas] == ["a, b"] and done.items == ("a, b",) and done.finish_reason == "length"
    t = done.timings
    assert t.source == "speculative" and t.prompt_tokens == t.cached_tokens == 40 and t.generated_tokens == 3
    assert t.ttft_ms == t.total_ms < 900.0 and t.decode_ms == 0.0
    assert part.accounted == [t]


def test_foresee_leaves_the_memory_and_the_counters_alone(pipeline: Pipeline) -> None:
    part = HandMadePart(resumed(multiline=False))
    done = pipeline.foresee(request("x"), CancelToken(), part)
    assert done is not None and done.items == ("a, b",)
    assert part.accounted == [] and dict(pipeline.documents.shown) == {}


def test_clock_timings_measure_every_source_alike() -> None:
    ms = 1_000_000
    clock = Clock(arrival=100 * ms, arrival_wall=7_000, start=102 * ms)
    t = clock.timings(first_ns=110 * ms, first_wall_ns=9_000, end_ns=130 * ms, prompt_ms=1.5, prefill_ms=4.0,
                      prompt_tokens=50, cached_tokens=20, generated_tokens=9, draft_tokens=6, accepted_tokens=4)
    assert (t.queue_ms, t.ttft_ms, t.decode_ms, t.total_ms) == (2.0, 10.0, 20.0, 30.0)
    assert (t.ttft_start_ns, t.ttft_end_ns, t.source) == (7_000, 9_000, "model")
    assert (t.prompt_ms, t.prefill_ms, t.prompt_tokens, t.cached_tokens) == (1.5, 4.0, 50, 20)
    assert (t.generated_tokens, t.draft_tokens, t.accepted_tokens) == (9, 6, 4)
    none_came = clock.timings(end_ns=130 * ms)          # no token: the whole time to the end is TTFT
    assert (none_came.ttft_ms, none_came.decode_ms, none_came.total_ms) == (30.0, 0.0, 30.0)
    assert none_came.ttft_end_ns > 0
    warm = clock.timings(first_ns=None, end_ns=130 * ms)   # generates nothing by design: no TTFT
    assert (warm.ttft_ms, warm.decode_ms, warm.ttft_end_ns, warm.total_ms) == (0.0, 0.0, 0, 30.0)
