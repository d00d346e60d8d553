"""No capture inside a request, on the CPU with emulated graphs: the session
pool's KV slots are made up front and their graphs captured at warm-up; a
new document, a typed line, a verify and the steps after a restore replay
or run eagerly, and what is missing is captured after the request, one
graph per hold of the generation lock. Captured graphs are evicted least
recently used first. Idle release on CUDA waits for memory pressure."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from soldaemon.runtime.forward.backend import LeanBackend
from soldaemon.runtime.forward.cudagraph import GraphDecoder
from soldaemon.runtime.kv.session import SessionPool
from soldaemon.runtime.memory.scheduler import MemoryScheduler, under_pressure
from soldaemon_bench.tiny import build_tiny_model


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoModelForCausalLM

    path: Path = build_tiny_model(tmp_path_factory.mktemp("tiny"))
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


class CountingLock:
    """A lock that counts how often it was taken."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.taken = 0

    def acquire(self, blocking: bool = True) -> bool:
        got = self.lock.acquire(blocking)
        self.taken += got
        return got

    def release(self) -> None:
        self.lock.release()

    def __enter__(self) -> "CountingLock":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _warm(tiny_hf: Any, slots: int = 2, max_pos: int | None = None) -> tuple[LeanBackend, SessionPool, GraphDecoder]:
    backend = LeanBackend(tiny_hf, 600)
    pool = SessionPool(backend, slots)
    pool.acquire("scratch")
    graphs = GraphDecoder(backend, emulate=True)
    backend.graphs = graphs
    graphs.warm_up(max_pos, caches=pool.caches())
    return backend, pool, graphs


def _request(pool: SessionPool, doc: str, ids: list[int], typed: int) -> list[int]:
    """A keystroke's request: the prompt with its last ``typed`` tokens at
    decode cost (the typed line), three greedy steps and a verify."""
    session = pool.acquire(doc)
    logits = session.prefill(ids, precise_until=len(ids) - typed).logits
    out = [int(logits.argmax())]
    for _ in range(3):
        out.append(int(session.decode_step(out[-1]).argmax()))
    session.verify([out[-1], 7, 8])
    return out


def test_warm_up_captures_every_slot_and_seals(tiny_hf: Any) -> None:
    backend, pool, graphs = _warm(tiny_hf, slots=3)
    per_slot = len(graphs.buckets) * (1 + len(graphs.verify_rows))
    assert len(pool.caches()) == 3 and graphs.slots_captured == 3
    assert graphs.captures == 3 * per_slot and graphs.sealed
    assert graphs.max_graphs >= graphs.captures and graphs.info()["graphs"] == graphs.captures


def test_new_documents_and_typed_lines_never_capture_inside_a_request(tiny_hf: Any) -> None:
    backend, pool, graphs = _warm(tiny_hf, slots=2)
    captured = graphs.captures
    ids = list(range(3, 40))
    for doc in ("a.py", "b.py", "c.py", "a.py"):          # more documents than slots: the LRU slot is taken
        replays = graphs.verify_replays
        _request(pool, doc, ids, typed=5)
        assert graphs.captures == captured, doc           # nothing captured inside the request
        assert graphs.verify_replays >= replays + 2       # the typed line and the verify replayed
        assert graphs.deferred == 0
        ids = ids[:-1] + [ids[-1] + 1]                    # the next keystroke


def test_the_typed_line_on_a_graph_gives_the_eager_tokens(tiny_hf: Any) -> None:
    """The replayed typed line is the static form of the same math: the
    same greedy tokens as the eager path on the CPU."""
    ids = list(range(5, 50))
    _, pool, _ = _warm(tiny_hf, slots=1)
    eager_pool = SessionPool(LeanBackend(tiny_hf, 600), 1)
    assert _request(pool, "a.py", ids, typed=6) == _request(eager_pool, "a.py", ids, typed=6)


def test_after_a_restore_requests_run_eagerly_and_the_graphs_come_back_one_lock_at_a_time(tiny_hf: Any) -> None:
    backend, pool, graphs = _warm(tiny_hf, slots=2)
    ids = list(range(3, 30))
    before = _request(pool, "a.py", ids, typed=3)
    captured = graphs.captures
    graphs.invalidate()                                     # the weights moved: restore
    replays = graphs.replays + graphs.verify_replays
    assert _request(pool, "a.py", ids, typed=3) == before  # eager, the same tokens
    assert graphs.captures == captured and graphs.replays + graphs.verify_replays == replays
    lock = CountingLock()
    sched = SimpleNamespace(backend=backend, gen_lock=lock, store=SimpleNamespace(released=False))
    with lock:                                              # a request holds the lock: not now
        assert MemoryScheduler.recapture_graphs(sched) == 0  # type: ignore[arg-type]
    assert graphs.owes()
    taken = lock.taken
    n = MemoryScheduler.recapture_graphs(sched)  # type: ignore[arg-type]
    assert n == captured and not graphs.owes()
    assert lock.taken - taken == n                          # each capture held the lock on its own
    replays = graphs.replays + graphs.verify_replays
    assert _request(pool, "b.py", ids, typed=3) == before and graphs.captures == 2 * captured
    assert graphs.replays + graphs.verify_replays > replays


def test_a_keystroke_during_the_recapture_waits_for_one_capture_at_most(tiny_hf: Any) -> None:
    backend, pool, graphs = _warm(tiny_hf, slots=1)
    graphs.invalidate()
    lock = CountingLock()
    held: list[int] = []                                    # graphs captured whenever the keystroke got the lock
    real = graphs._capture

    def slow_capture(cache: Any, window: int, rows: int) -> Any:
        got = real(cache, window, rows)
        threading.Event().wait(0.01)
        return got

    graphs._capture = slow_capture  # type: ignore[method-assign]
    sched = SimpleNamespace(backend=backend, gen_lock=lock, store=SimpleNamespace(released=False))
    worker = threading.Thread(target=MemoryScheduler.recapture_graphs, args=(sched,))
    worker.start()
    while worker.is_alive():
        with lock:                                          # a keystroke's generation
            held.append(graphs.captures)
        threading.Event().wait(0.002)
    worker.join()
    assert len(held) >= 2 and len(set(held)) >= 2           # keystrokes ran between captures
    assert not graphs.owes()


def test_a_graph_missed_inside_a_request_is_captured_after_it(tiny_hf: Any) -> None:
    backend, pool, graphs = _warm(tiny_hf, slots=1, max_pos=100)    # the 256 window only
    captured = graphs.captures
    session = pool.acquire("a.py")
    session.prefill(list(range(3, 300)))                    # past 256: the 512 bucket
    assert session.decode_step(5) is not None and graphs.captures == captured
    assert graphs.deferred == 1 and graphs.owes()
    assert graphs.recapture() == 1 and graphs.step(6, 298) is not None


def test_captured_graphs_are_evicted_least_recently_used_first(tiny_hf: Any) -> None:
    backend = LeanBackend(tiny_hf, 600)
    graphs = GraphDecoder(backend, emulate=True, max_graphs=2)
    graphs.step(5, 0)                                       # the 256 window
    graphs.step(5, 300)                                     # the 512 window
    graphs.step(6, 1)                                       # the 256 one replayed: now the most recent
    graphs.verify([1, 2], 3)                                # a third graph: evicts the 512 step graph
    captures = graphs.captures
    assert graphs.step(7, 2) is not None and graphs.captures == captures     # 256 kept
    assert graphs.step(7, 301) is not None and graphs.captures == captures + 1
    assert graphs.evictions == 2


def test_memory_pressure_means_another_process_and_little_free() -> None:
    gib = 1 << 30
    assert under_pressure(free=gib // 2, total=24 * gib, others=3 * gib)
    assert not under_pressure(free=gib // 2, total=24 * gib, others=0)      # only we hold it
    assert not under_pressure(free=8 * gib, total=24 * gib, others=3 * gib)  # plenty left


def test_on_pressure_the_release_waits_for_another_process(tiny_hf: Any) -> None:
    from soldaemon.config import config_from_dict

    backend = LeanBackend(tiny_hf, 600)
    sol = config_from_dict({}).sol
    wants = [False]
    sched = MemoryScheduler(backend, sol, threading.Lock(), kv_reserve_bytes=0, idle_release=True,
                            pressure=lambda: wants[0], on_timer=False)
    try:
        late = sched.last_active + 10 * sol.idle_release_s
        sched.release_if_idle(now=late)
        assert not sched.store.released                      # idle for long, but nobody wants the memory
        wants[0] = True
        sched.release_if_idle(now=sched.last_active + 1)
        assert not sched.store.released                      # wanted, but a request just ended
        sched.release_if_idle(now=sched.last_active + 6)
        assert sched.store.released and sched.releases == 1
    finally:
        with sched.gen_lock:
            sched.restore()                                  # the module is shared with the other tests
        sched.close()


def test_the_other_slots_graphs_come_after_the_first_request_not_in_one(tiny_hf: Any) -> None:
    """The engine's warm-up captures the first slot and queues the others
    (a shorter start); the scheduler captures them after a request."""
    backend = LeanBackend(tiny_hf, 600)
    pool = SessionPool(backend, 3)
    pool.acquire("scratch")
    graphs = GraphDecoder(backend, emulate=True)
    backend.graphs = graphs
    graphs.warm_up(caches=pool.caches(), later=True)
    per_slot = len(graphs.buckets) * (1 + len(graphs.verify_rows))
    assert graphs.captures == per_slot and graphs.owes() and graphs.sealed
    ids = list(range(3, 40))
    _request(pool, "a.py", ids, typed=4)                  # the first slot: replays
    _request(pool, "b.py", ids, typed=4)                  # a queued slot: eager, nothing captured
    assert graphs.captures == per_slot
    assert graphs.recapture(threading.Lock()) == 2 * per_slot and not graphs.owes()
    replays = graphs.verify_replays
    _request(pool, "c.py", ids, typed=4)
    assert graphs.captures == 3 * per_slot and graphs.verify_replays > replays
