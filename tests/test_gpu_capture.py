"""Issue 27.3, 27.5, 27.6 on the CPU with emulated graphs: speculation is
priced on the path that runs (graph replays), capture survives one failure
and follows the weights' epoch, stale graphs are captured again after the
request and not inside it, and the health path never syncs the device."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from soldaemon.config import config_from_dict
from soldaemon.policy.draft import DraftLength
from soldaemon.runtime.forward import cudagraph
from soldaemon.runtime.forward.backend import LeanBackend
from soldaemon.runtime.forward.cudagraph import GraphDecoder
from soldaemon.runtime.engine.local import load_engine
from soldaemon.runtime.kv.fold import fold_blocks
from soldaemon.runtime.memory.scheduler import MemoryScheduler
from soldaemon_bench.tiny import build_tiny_model


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def tiny_hf(tiny_path: Path) -> object:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).eval()


def test_draft_costs_are_measured_on_graph_replays(tiny_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Recorded timings of the graph path (a replay made 25 ms slower than
    the eager forward): the costs DraftLength prices drafts with are those
    replays', for steps and for verifies."""
    engine = load_engine(config_from_dict({"model": {"path": str(tiny_path), "max_context": 2048},
                                           "device": {"device": "cpu"}}), progress=False)
    try:
        graphs = GraphDecoder(engine.backend, emulate=True)
        engine.backend.graphs = graphs
        replay = cudagraph.EmulatedGraph.replay

        def slow_replay(self: cudagraph.EmulatedGraph) -> None:
            time.sleep(0.025)
            replay(self)
        monkeypatch.setattr(cudagraph.EmulatedGraph, "replay", slow_replay)
        costs = engine.measure_forward_costs()
        assert graphs.replays >= 3 and graphs.verify_replays >= 12        # T=1 by step, T=2,3,5,9 by verify
        assert min(costs.values()) >= 25.0, costs
        length = DraftLength(costs, 8, prior=0.9)
        assert length.cost(1) == costs[1] and length.cost(9) == costs[9]
    finally:
        engine.close()


def test_a_failed_capture_is_retried_once_before_graphs_are_given_up(tiny_hf: object,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    backend = LeanBackend(tiny_hf, 600)
    graphs = GraphDecoder(backend, emulate=True)
    real = graphs._capture
    fails = {"left": 1}

    def flaky(cache: object, window: int, rows: int) -> object:
        if fails["left"]:
            fails["left"] -= 1
            raise RuntimeError("operation not permitted when stream is capturing")
        return real(cache, window, rows)
    monkeypatch.setattr(graphs, "_capture", flaky)
    assert graphs.step(5, 0) is None and graphs.enabled          # this step eager, graphs kept
    assert graphs.step(5, 0) is not None and graphs.failed_captures == 0
    fails["left"] = 2
    assert graphs.step(5, 300) is None and graphs.enabled
    assert graphs.step(5, 300) is None and not graphs.enabled   # two in a row: given up
    assert "RuntimeError" in (graphs.info()["fallback_reason"] or "")


def test_moved_weights_mean_another_graph(tiny_hf: object) -> None:
    """weights_epoch is in the graph key: a graph captured over weights that
    have since moved is never replayed."""
    backend = LeanBackend(tiny_hf, 600)
    store = SimpleNamespace(epoch=0, all_resident=True)
    backend.read_through(store)  # type: ignore[arg-type]
    graphs = GraphDecoder(backend, emulate=True)
    graphs.step(5, 0)
    graphs.step(6, 1)
    assert graphs.captures == 1
    store.epoch = 1
    graphs.step(7, 2)
    assert graphs.captures == 2


def test_stale_graphs_are_captured_again_after_the_request(tiny_hf: object) -> None:
    backend = LeanBackend(tiny_hf, 600)
    graphs = GraphDecoder(backend, emulate=True)
    backend.graphs = graphs
    graphs.step(5, 300)                                          # the 512 bucket in use
    graphs.invalidate()
    lock = threading.Lock()
    sched = SimpleNamespace(backend=backend, gen_lock=lock, store=SimpleNamespace(released=False))
    with lock:                                                   # a request holds the lock: not now
        assert MemoryScheduler.recapture_graphs(sched) == 0  # type: ignore[arg-type]
    assert graphs.stale
    captured = MemoryScheduler.recapture_graphs(sched)  # type: ignore[arg-type]
    assert captured == 1 + len(graphs.verify_rows) and not graphs.stale
    captures = graphs.captures
    assert graphs.step(5, 301) is not None and graphs.captures == captures   # replayed, not captured


def test_kv_stats_counts_folded_blocks_without_touching_the_device_mask() -> None:
    """The health handler reads kv_stats from another thread: the folded
    block count comes from a shape, not from summing the (device) mask."""
    k = torch.randn(2, 2, 256, 8)
    mask = torch.zeros(2, 2, 4, dtype=torch.bool)
    mask[0, 1, :2] = True
    f = fold_blocks(k, k.clone(), 256, mask)
    expected = f.folded_block_bytes()

    class NoSync(torch.Tensor):
        def sum(self, *a: object, **kw: object) -> torch.Tensor:  # type: ignore[override]
            raise AssertionError("summing the fold mask syncs a CUDA device")
    f.fold = f.fold.as_subclass(NoSync)
    assert f.folded_block_bytes() == expected == 2 * 2 * 64 * 8 * 4
