"""The server's parts in-process, with a scripted engine: the worker's
priority queue, withdrawal of queued jobs, timings from arrival, error
mapping; the rate limiter; the metrics exposition."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from typing import Any, Iterator

import pytest

from soldaemon.api import CancelToken, CompletionRequest, Delta, Done, Event, Timings
from soldaemon.errors import BadRequest
from soldaemon.server.metrics import Metrics
from soldaemon.protocol import ErrorFrame
from soldaemon.server.connection import TokenBucket
from soldaemon.server.worker import Job, Worker
from tests.fixtures.fake_engine import FakeEngine


class GatedEngine(FakeEngine):
    """Blocks its first request until ``gate`` is set (``entered`` says it
    is running), and records order."""

    def __init__(self) -> None:
        super().__init__(step_ms=1.0)
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.order: list[str] = []

    def complete(self, req: CompletionRequest, cancel: CancelToken) -> Iterator[Event]:
        self.order.append(req.id)
        if req.id == "blocker":
            self.entered.set()
            self.gate.wait(30)
        yield from super().complete(req, cancel)

    async def running_blocker(self) -> None:
        """Until the worker runs the blocker (the next jobs queue behind it)."""
        assert await asyncio.to_thread(self.entered.wait, 30), "the worker never took the blocker"

    def warm(self, req: CompletionRequest, cancel: CancelToken) -> Timings:
        self.order.append(req.id)
        return super().warm(req, cancel)


class Collector:
    def __init__(self) -> None:
        self.events: dict[str, list[Delta | Done | ErrorFrame]] = {}
        self.ended: dict[str, asyncio.Future[Done | ErrorFrame]] = {}

    def job(self, kind: str, rid: str, **fields: Any) -> Job:
        loop = asyncio.get_running_loop()
        self.ended[rid] = loop.create_future()
        req = CompletionRequest(id=rid, prefix=fields.pop("prefix", "abc"), suffix="", **fields)
        return Job.arrive(kind, req, self.deliver)  # type: ignore[arg-type]

    def deliver(self, job: Job, event: Delta | Done | ErrorFrame) -> None:
        self.events.setdefault(job.id, []).append(event)
        if not isinstance(event, Delta):
            assert not self.ended[job.id].done(), "two final events"
            self.ended[job.id].set_result(event)

    async def end(self, rid: str) -> Done | ErrorFrame:
        return await asyncio.wait_for(self.ended[rid], 5)


async def started_worker(engine: FakeEngine) -> Worker:
    worker = Worker(asyncio.get_running_loop())
    await asyncio.wait_for(worker.start(lambda: engine), 5)
    return worker


@pytest.mark.asyncio
async def test_priority_high_then_normal_then_warm() -> None:
    engine = GatedEngine()
    worker = await started_worker(engine)
    c = Collector()
    try:
        worker.submit(c.job("complete", "blocker", max_tokens=1))
        await engine.running_blocker()
        worker.submit(c.job("warm", "w1"))
        worker.submit(c.job("complete", "n1", max_tokens=1))
        worker.submit(c.job("complete", "h1", max_tokens=1, priority="high"))
        worker.submit(c.job("complete", "n2", max_tokens=1))
        assert worker.queue_depth == 4
        engine.gate.set()
        for rid in ("blocker", "w1", "n1", "h1", "n2"):
            assert isinstance(await c.end(rid), Done)
        assert engine.order == ["blocker", "h1", "n1", "n2", "w1"]
        assert worker.queue_depth == 0
        warm = await c.end("w1")
        assert isinstance(warm, Done) and warm.items == () and warm.finish_reason == "stop"
    finally:
        engine.gate.set()
        worker.stop()


def test_cancel_and_supersede_are_named_operations_the_first_wins() -> None:
    cancel, supersede, both = CancelToken(), CancelToken(), CancelToken()
    assert not cancel.cancelled and not cancel.superseded
    cancel.cancel()
    supersede.supersede()
    both.cancel()
    both.supersede()                      # too late: it was cancelled
    assert cancel.cancelled and not cancel.superseded and cancel.reason == "cancelled"
    assert supersede.cancelled and supersede.superseded and supersede.reason == "superseded"
    assert not both.superseded and both.reason == "cancelled"


@pytest.mark.asyncio
async def test_withdrawn_queued_job_ends_at_once_without_the_engine() -> None:
    engine = GatedEngine()
    worker = await started_worker(engine)
    c = Collector()
    try:
        worker.submit(c.job("complete", "blocker", max_tokens=1))
        await engine.running_blocker()
        queued = c.job("complete", "q", max_tokens=1)
        worker.submit(queued)
        worker.supersede(queued)
        end = await c.end("q")  # before the gate opens
        assert isinstance(end, Done) and end.finish_reason == "superseded" and end.items == ()
        assert end.timings.generated_tokens == 0 and end.timings.total_ms >= 0
        engine.gate.set()
        await c.end("blocker")
        worker.submit(c.job("complete", "after", max_tokens=1))
        await c.end("after")                   # the worker went past where q was queued
        assert engine.order == ["blocker", "after"]
        assert c.events["q"] == [end]
    finally:
        engine.gate.set()
        worker.stop()


@pytest.mark.asyncio
async def test_running_job_cancel_within_a_step_and_reason_kept() -> None:
    engine = FakeEngine(step_ms=20.0)
    worker = await started_worker(engine)
    c = Collector()
    try:
        job = c.job("complete", "r", max_tokens=500)
        worker.submit(job)
        while "r" not in c.events:
            await asyncio.sleep(0.005)
        t0 = time.perf_counter()
        worker.supersede(job)
        assert job.cancel.cancelled and job.cancel.reason == "superseded"   # the running engine's token, at once
        end = await c.end("r")
        latency_ms = (time.perf_counter() - t0) * 1000
        assert isinstance(end, Done) and end.finish_reason == "superseded"
        # the engine checks its token before each step (counted in tests/test_foresight.py for
        # the real one); the latency is a figure, not a verdict a busy machine could change
        print(f"\nwithdraw → done {latency_ms:.1f} ms (a step is 20 ms)")
        assert 0 < end.timings.generated_tokens < 500
    finally:
        worker.stop()


@pytest.mark.asyncio
async def test_timings_count_from_arrival() -> None:
    engine = GatedEngine()
    worker = await started_worker(engine)
    c = Collector()
    try:
        worker.submit(c.job("complete", "blocker", max_tokens=1))
        late = c.job("complete", "late", max_tokens=3)
        worker.submit(late)
        await asyncio.sleep(0.1)
        engine.gate.set()
        end = await c.end("late")
        assert isinstance(end, Done)
        t = end.timings
        assert t.queue_ms >= 90
        assert t.ttft_ms >= t.queue_ms and t.total_ms >= t.ttft_ms
        assert abs(t.ttft_start_ns - late.arrival_ns) < 1_000_000 and t.ttft_end_ns > t.ttft_start_ns
        # wall-clock stamps against perf_counter spans: equal but for the gaps between clock
        # reads, which a preempted thread can stretch by a scheduler slice or two
        assert abs((t.ttft_end_ns - t.ttft_start_ns) / 1e6 - t.ttft_ms) < 50
    finally:
        engine.gate.set()
        worker.stop()


@pytest.mark.asyncio
async def test_budget_spent_in_the_queue_never_reaches_the_engine() -> None:
    engine = GatedEngine()
    worker = await started_worker(engine)
    c = Collector()
    try:
        worker.submit(c.job("complete", "blocker", max_tokens=1))
        worker.submit(c.job("complete", "b", max_tokens=3, budget_ms=20.0))
        await asyncio.sleep(0.08)
        engine.gate.set()
        end = await c.end("b")
        assert isinstance(end, Done) and end.finish_reason == "budget"
        assert "b" not in engine.order
    finally:
        engine.gate.set()
        worker.stop()


@pytest.mark.asyncio
async def test_engine_errors_become_error_frames_without_details() -> None:
    worker = await started_worker(FakeEngine())
    c = Collector()
    try:
        worker.submit(c.job("complete", "bad", prefix="!raise-bad"))
        worker.submit(c.job("complete", "bug", prefix="!raise-bug"))
        worker.submit(c.job("complete", "ok", max_tokens=2))
        bad, bug, ok = await c.end("bad"), await c.end("bug"), await c.end("ok")
        assert bad == ErrorFrame("bad", BadRequest.code, "the prompt is empty after windowing", False, None)
        assert isinstance(bug, ErrorFrame) and bug.code == "internal" and "secret" not in bug.message
        assert isinstance(ok, Done) and ok.finish_reason == "length"
    finally:
        worker.stop()


@pytest.mark.asyncio
async def test_load_failure_reaches_the_caller() -> None:
    worker = Worker(asyncio.get_running_loop())

    def load() -> FakeEngine:
        raise BadRequest("no such model")

    with pytest.raises(BadRequest):
        await asyncio.wait_for(worker.start(load), 5)


def test_token_bucket() -> None:
    bucket = TokenBucket(rate=10.0, burst=20.0)
    assert sum(bucket.take() for _ in range(100)) == 20
    bucket.stamp -= 0.5  # half a second later: 5 more
    assert sum(bucket.take() for _ in range(100)) == 5


def test_metrics_exposition() -> None:
    live = {"queue_depth": 2, "in_flight": 3, "connections": 1}
    m = Metrics(lambda: live, lambda: {"fallback_count": 7})
    m.record_done("complete", Done("a", ("x",), "stop", Timings(ttft_ms=12.0, total_ms=40.0, prompt_tokens=100,
                                                                cached_tokens=75, generated_tokens=4)))
    m.record_done("complete", Done("b", (), "cancelled", Timings(prompt_tokens=100, cached_tokens=25)))
    m.requests.labels("complete", "internal").inc()
    m.client_errors.labels("bad_json").inc()
    m.record_event("accepted")
    text, content_type = m.render()
    body = text.decode()
    assert content_type.startswith("text/plain")
    for line in ('sol_requests_total{kind="complete",outcome="stop"} 1.0',
                 'sol_requests_total{kind="complete",outcome="cancelled"} 1.0',
                 'sol_requests_total{kind="complete",outcome="internal"} 1.0',
                 "sol_ttft_seconds_count 1.0", 'sol_ttft_seconds_bucket{le="0.02"} 1.0',
                 "sol_e2e_seconds_count 1.0", "sol_queue_depth 2.0", "sol_in_flight 3.0",
                 "sol_connections 1.0", "sol_fallback_total 7.0", "sol_kv_cache_hit_ratio 0.5",
                 'sol_client_errors_total{code="bad_json"} 1.0',
                 'sol_completion_events_total{kind="accepted"} 1.0'):
        assert line in body, line


class StubSocket:
    """Stands in for a websocket whose client never reads."""

    def __init__(self) -> None:
        self.closed_with: int | None = None

    async def send(self, frame: str) -> None:
        await asyncio.sleep(3600)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.closed_with = code


@pytest.mark.asyncio
async def test_a_client_that_does_not_read_is_closed_1008(tmp_path: Any) -> None:
    from soldaemon.protocol import Status
    from soldaemon.server.connection import Connection
    from soldaemon.server.daemon import Daemon
    from soldaemon.server.settings import ServerSettings

    settings = ServerSettings(max_outbox_frames=5, token_path=tmp_path / "token")
    daemon = Daemon(settings, "t" * 43, "stub", asyncio.get_running_loop())
    ws = StubSocket()
    conn = Connection(daemon, ws)  # type: ignore[arg-type]
    for _ in range(5):
        conn.send(Status("health"))
    assert conn.open and ws.closed_with is None
    conn.send(Status("health"))
    await asyncio.sleep(0)
    assert not conn.open and ws.closed_with == 1008
    conn.send(Status("health"))  # dropped, no error


class SaysMoreEngine(FakeEngine):
    """Its Done says why the answer ends and which answer it streamed."""

    def complete(self, req: CompletionRequest, cancel: CancelToken) -> Iterator[Event]:
        for event in super().complete(req, cancel):
            yield dataclasses.replace(event, ends=("model",), streamed="a = 1") if isinstance(event, Done) else event


@pytest.mark.asyncio
async def test_the_worker_passes_on_everything_the_engine_says_in_its_done() -> None:
    # the worker re-times the Done from the request's arrival; its ends and streamed answer travel as they are
    worker = await started_worker(SaysMoreEngine(step_ms=1.0))
    c = Collector()
    try:
        worker.submit(c.job("complete", "m1", max_tokens=2))
        done = await c.end("m1")
        assert isinstance(done, Done) and done.ends == ("model",) and done.streamed == "a = 1"
        assert done.timings.queue_ms >= 0 and done.finish_reason in ("stop", "length")
    finally:
        worker.stop()


def test_the_free_heap_goes_back_to_the_system() -> None:
    """Freed C-heap pages below a live block stay resident until the trim
    returns them (glibc: CI and the supported Linux machines)."""
    import psutil

    from soldaemon.runtime.memory.heap import return_free_heap

    proc = psutil.Process()
    blocks = [bytes(4000) for _ in range(50_000)]      # ~200 MB through malloc, not Python's arenas
    pin = blocks.pop()                                 # the last one, kept: the heap's top stays in use
    del blocks
    held = proc.memory_info().rss
    assert return_free_heap(), "not glibc: the supported Linux builds are"
    assert proc.memory_info().rss < held - 100 * 2**20
    del pin


@pytest.mark.asyncio
async def test_the_worker_returns_the_heap_once_idle_after_work(monkeypatch: pytest.MonkeyPatch) -> None:
    import soldaemon.server.worker as worker_module

    returned: list[float] = []
    monkeypatch.setattr(worker_module, "HEAP_IDLE_S", 0.05)
    monkeypatch.setattr(worker_module, "return_free_heap", lambda: returned.append(time.monotonic()) or True)
    engine = GatedEngine()
    worker = await started_worker(engine)
    c = Collector()
    try:
        await asyncio.sleep(0.3)
        assert worker.heap_returns == 1, "once after the load, then not again while nothing runs"
        worker.submit(c.job("complete", "blocker", max_tokens=1))
        await engine.running_blocker()
        worker.submit(c.job("complete", "n1", max_tokens=1))
        await asyncio.sleep(0.2)
        assert worker.heap_returns == 1, "not while a request runs"
        engine.gate.set()
        await c.end("blocker")
        done_at = time.monotonic()
        await c.end("n1")
        await asyncio.sleep(0.3)
        assert worker.heap_returns == 2, "once after the two requests, not between them"
        assert returned[-1] >= done_at + 0.04
    finally:
        engine.gate.set()
        worker.stop()


@pytest.mark.asyncio
async def test_the_worker_asks_the_heap_keeper_after_every_request() -> None:
    asked: list[str] = []
    engine = GatedEngine()
    engine.gate.set()
    worker = await started_worker(engine)
    worker.heap.after_request = lambda: asked.append("after") is None and False   # type: ignore[method-assign]
    c = Collector()
    try:
        for rid in ("a", "b"):
            worker.submit(c.job("complete", rid, max_tokens=1))
            await c.end(rid)
        await asyncio.sleep(0.05)
        assert asked == ["after", "after"]
    finally:
        worker.stop()
