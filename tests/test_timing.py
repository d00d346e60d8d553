"""Issue 18, item 4: costs the runtime decides with are timed to the end of
the device's work, not to the return of an asynchronous launch. On the CPU
an asynchronous device is simulated: each forward queues 150 ms of work
that a synchronize waits for (as CUDA's queue does)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

from soldaemon.config import config_from_dict
from soldaemon.runtime.forward import timing
from soldaemon.runtime.forward.backend import LeanBackend
from soldaemon.runtime.decode.draft import DraftModel
from soldaemon.runtime.engine.local import load_engine
from soldaemon_bench.tiny import build_tiny_model

QUEUED_S = 0.15   # device work each forward leaves queued (s): well above a tiny step


class AsyncDevice:
    """Forwards return at once; their work is done when synchronized."""

    def __init__(self) -> None:
        self.pending_s = 0.0
        self.syncs = 0

    def wrap(self, forward: Any) -> Any:
        def queued(*args: Any, **kwargs: Any) -> Any:
            self.pending_s += QUEUED_S
            return forward(*args, **kwargs)
        return queued

    def synchronize(self, device: torch.device) -> None:
        self.syncs += 1
        time.sleep(self.pending_s)
        self.pending_s = 0.0


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


def test_forward_costs_include_the_queued_work(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = config_from_dict({"model": {"path": str(tiny), "max_context": 2048}, "device": {"device": "cpu"},
                               "completion": {"speculative": False}})
    engine = load_engine(config, progress=False)
    dev = AsyncDevice()
    monkeypatch.setitem(timing.SYNCHRONIZERS, "cpu", dev.synchronize)
    monkeypatch.setattr(engine.backend, "forward", dev.wrap(engine.backend.forward))
    costs = engine.measure_forward_costs(sizes=(1, 3))
    assert set(costs) == {1, 3} and dev.syncs >= 6
    assert min(costs.values()) >= QUEUED_S * 1e3 * 0.9, costs


def test_draft_model_step_includes_the_queued_work(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32).eval()
    backend = LeanBackend(hf, 256)
    draft = DraftModel(backend, vocab_limit=backend.vocab_size)
    dev = AsyncDevice()
    monkeypatch.setitem(timing.SYNCHRONIZERS, "cpu", dev.synchronize)
    monkeypatch.setattr(backend, "forward", dev.wrap(backend.forward))
    assert draft.measure(n=16) >= QUEUED_S * 1e3 * 0.9


def test_synchronize_is_a_no_op_on_a_cpu() -> None:
    t0 = time.perf_counter_ns()
    assert timing.elapsed_ms(t0, torch.device("cpu")) >= 0.0
    timing.synchronize(torch.device("meta"))   # a device type without a queue: nothing to wait for
