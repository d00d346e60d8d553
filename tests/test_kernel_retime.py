"""A kernel table timed under load is timed again while the daemon serves,
once the machine has been quiet for a while (runtime/forward/retime.py):
in pieces between requests, never during one, saved into the cache, and
shown by health and doctor. Recorded tables stand in for the loaded start;
the timing itself is real, on the tiny model's shapes."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from soldaemon.policy.kernel_plan import TimingTable, choose_plan

DATA = Path(__file__).parent / "data" / "kernel_tables"


def _loaded_table() -> TimingTable:
    """The Zen 4 recording as if timed at load 12 on 2 cores (the issue-58 bench)."""
    table = TimingTable.from_dict(json.loads((DATA / "zen4_avx512_bf16.json").read_text())["table"])
    return dataclasses.replace(table, load_1m=12.0, cores=2, measured_at=time.time() - 3600)


class QuietAfter:
    """A load reader on 2 cores: ``first`` (1-minute loads) in turn, then 0.2."""

    def __init__(self, first: list[float]) -> None:
        self.first = first
        self.readings = 0

    def __call__(self) -> tuple[float | None, int]:
        self.readings += 1
        return (self.first[self.readings - 1] if self.readings <= len(self.first) else 0.2), 2


def _quick_measure() -> Any:
    from soldaemon.runtime.forward.kernels import measure_table

    return functools.partial(measure_table, kernels=("float32", "int8-dynamic"), short_rows=(1, 2),
                             prefill_rows=(8,), repeats=1)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from soldaemon_bench.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-retime"))


def test_a_loaded_table_is_timed_again_after_the_machine_stays_quiet(tiny_path: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from transformers import AutoConfig

    from soldaemon.runtime.forward import kernels
    from soldaemon.runtime.forward.retime import BackgroundRetime

    monkeypatch.setenv("SOLDAEMON_CACHE_DIR", str(tmp_path))
    cfg = AutoConfig.from_pretrained(str(tiny_path))
    cpu = torch.device("cpu")
    table = _loaded_table()
    plan = choose_plan(table)
    assert BackgroundRetime.wanted(table, plan, cpu)
    assert not BackgroundRetime.wanted(dataclasses.replace(table, load_1m=0.3), plan, cpu)
    load = QuietAfter([6.0, 0.2, 6.0])      # a busy reading between quiet ones starts the count again
    pieces: list[float] = []

    @contextlib.contextmanager
    def turn() -> Iterator[None]:
        pieces.append(time.perf_counter())
        yield

    bg = BackgroundRetime(cfg, cpu, torch.float32, table, plan, row_copy=False, turn=turn, load=load,
                          poll_s=0.0, quiet_polls=2, measure=_quick_measure())
    got = bg.run()
    assert got is not None and bg.result is got
    # 3 readings, 2 quiet ones in a row, then the timing reads the load once as it begins
    assert load.readings == 3 + 2 + 1
    assert len(pieces) > 6                       # packing and every timed run, each a piece
    new = got.table
    assert new.background and new.load_1m == 0.2 and new.replaced_load_1m == 12.0
    assert new.products == kernels.PACKED_PRODUCTS
    cached = kernels.load_table(kernels.plan_key(cfg, cpu, torch.float32))
    assert cached == new                          # saved: the next start reads it
    assert got.plan == choose_plan(new, plan.precision, row_copy=False)
    assert got.in_use == ((got.plan.storage, got.plan.prefill, got.plan.short, got.plan.head_storage, got.plan.head)
                          == (plan.storage, plan.prefill, plan.short, plan.head_storage, plan.head))
    facts = got.facts()
    assert facts["background"] and facts["timed_under_load"] is False and "plan_in_use" in facts


def test_stopping_ends_the_wait_and_the_timing(tiny_path: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from transformers import AutoConfig

    from soldaemon.runtime.forward.retime import BackgroundRetime

    monkeypatch.setenv("SOLDAEMON_CACHE_DIR", str(tmp_path))
    cfg = AutoConfig.from_pretrained(str(tiny_path))
    table = _loaded_table()
    never = BackgroundRetime(cfg, torch.device("cpu"), torch.float32, table, choose_plan(table), row_copy=False,
                             load=lambda: (9.0, 2), poll_s=0.01, quiet_polls=2, measure=_quick_measure())
    never.start()
    time.sleep(0.05)
    never.stop()
    assert never.result is None and not list(tmp_path.glob("kernel-plans/*.json"))


def test_the_daemon_retimes_between_requests_never_during_one(tiny_path: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny model served from a loaded table: a request is held open
    mid-decode while the machine turns quiet; no piece of the timing runs
    until it ends; the timing then finishes between requests; answers
    before and after are the same; health and doctor say what happened."""
    import torch

    from soldaemon.api import CancelToken, CompletionRequest, Delta, Done
    from soldaemon.config import config_from_dict
    from soldaemon.doctor.plan import plan_report
    from soldaemon.runtime.engine.local import LocalEngine
    from soldaemon.runtime.forward.retime import BackgroundRetime
    from soldaemon.weights.loader import load_model

    monkeypatch.setenv("SOLDAEMON_CACHE_DIR", str(tmp_path))
    loaded = load_model(str(tiny_path), device="cpu", dtype="auto", progress=False)
    cfg = loaded.model.config
    table = _loaded_table()
    plan = choose_plan(table, row_copy=False)
    config = config_from_dict({"device": {"device": "cpu"}, "model": {"max_context": 2048},
                               "completion": {"speculative": False}})
    engine = LocalEngine(loaded, config, plan=plan, timings=table)
    req = CompletionRequest(id="r", prefix="def add(a, b):\n    return ", suffix="\n", max_tokens=12,
                            uri="file:///a.py")

    def answer() -> str:
        engine.forget()
        done = engine.complete_all(req)
        return done.items[0] if done.items else ""

    before = answer()
    in_request = threading.Event()
    during: list[bool] = []

    @contextlib.contextmanager
    def turn() -> Iterator[None]:
        with engine.part.between_requests():
            during.append(in_request.is_set())
            yield

    load = QuietAfter([])
    engine.retime = BackgroundRetime(cfg, torch.device("cpu"), torch.float32, table, plan, row_copy=False,
                                     turn=turn, load=load, poll_s=0.0, quiet_polls=2, measure=_quick_measure())
    engine.forget()
    events = engine.complete(dataclasses.replace(req, id="held"), CancelToken())
    first = next(events)                          # the request is mid-generation: the lock is held
    assert isinstance(first, Delta)
    in_request.set()
    engine.retime.start()
    time.sleep(0.3)
    assert engine.retime.result is None           # waiting for the request, not timing beside it
    in_request.clear()
    rest = list(events)
    assert isinstance(rest[-1], Done)
    engine.retime.join(60)
    result = engine.retime.result
    assert result is not None and during and not any(during)
    after = answer()
    assert before and after == before             # the plan in use is unchanged: the same answer
    info = engine.info()["precision"]
    assert info["table"]["background"] and info["table"]["replaced_load_1m"] == 12.0
    assert info["table"]["plan_in_use"] == result.in_use
    report = plan_report(("avx2",), root=tmp_path, served={"daemon": "0.1", "state": "ready", "model": "tiny",
                                                           "engine": {"precision": info}})
    assert "re-timed in the background at " in report["detail"] and report["verdict"] == "ok"
    if not result.in_use:
        assert "used from the next start" in report["detail"]
    engine.close()


def _int8_plan(short: str, head: str) -> Any:
    from soldaemon.policy.kernel_plan import KernelPlan

    return KernelPlan("int8", "int8-dynamic", short, "int8", head)


def test_kernels_swap_in_over_the_packed_weights_with_the_bits_of_a_fresh_backend(tiny_path: Path) -> None:
    """A plan over the same storages is swapped into a serving backend: its
    forwards then give exactly what a backend built for that plan gives. A
    plan that needs the weights packed otherwise is refused, with why."""
    import torch

    from soldaemon.policy.kernel_plan import KernelPlan
    from soldaemon.runtime.forward.backend import LeanBackend
    from soldaemon.weights.loader import load_model

    model = load_model(str(tiny_path), device="cpu", dtype="auto", progress=False).model
    serving, fresh_plan = _int8_plan("int8", "int8"), _int8_plan("int8-dynamic", "int8-dynamic")
    backend = LeanBackend(model, 64, plan=serving)
    fresh = LeanBackend(model, 64, plan=fresh_plan)
    tokens = torch.tensor([5, 17, 3, 99, 42, 7], dtype=torch.long)

    def logits(b: LeanBackend) -> torch.Tensor:
        b.forward(tokens[:4], 0, last_only=False)
        return b.forward(tokens[4:], 4, last_only=False)        # a short forward: the plan's decode kernel

    before = logits(backend)
    assert backend.use_kernels(fresh_plan) is None
    assert backend.plan.short == "int8-dynamic" and "swapped in while serving" in backend.plan.reason
    after, expected = logits(backend), logits(fresh)
    assert torch.equal(after, expected)
    assert not torch.equal(after, before)                       # the kernels did change
    why = backend.use_kernels(KernelPlan.uniform("float32"))
    assert why is not None and "int8" in why and "float32" in why
    assert backend.plan.short == "int8-dynamic"


def test_a_retimed_plan_over_the_same_weights_is_swapped_in_between_requests(tiny_path: Path, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon serves an int8 plan whose decode kernel is weight-only;
    the quiet re-timing (here: of int8-dynamic alone) gives another plan over
    the same packed weights: it is swapped in under the generation lock, what
    the old kernels computed (a document's KV) is dropped, the draft sizing
    is measured again, health and doctor say so, and the answers are a fresh
    engine's on the new plan."""
    import torch

    from soldaemon.api import CompletionRequest
    from soldaemon.config import config_from_dict
    from soldaemon.doctor.plan import plan_report
    from soldaemon.runtime.engine.local import LocalEngine
    from soldaemon.runtime.forward.kernels import measure_table
    from soldaemon.runtime.forward.retime import BackgroundRetime
    from soldaemon.weights.loader import load_model

    monkeypatch.setenv("SOLDAEMON_CACHE_DIR", str(tmp_path))
    config = config_from_dict({"device": {"device": "cpu"}, "model": {"max_context": 2048}})
    serving = _int8_plan("int8", "int8")
    table = _loaded_table()

    def engine_on(plan: Any) -> LocalEngine:
        return LocalEngine(load_model(str(tiny_path), device="cpu", dtype="auto", progress=False), config,
                           plan=plan, timings=table)

    engine = engine_on(serving)
    req = CompletionRequest(id="r", prefix="def add(a, b):\n    return ", suffix="\n", max_tokens=12,
                            uri="file:///a.py")
    before = engine.complete_all(req).items
    assert engine.pool.acquire("file:///a.py").tokens and engine.part.draft_length is None
    locked_at_swap: list[bool] = []
    use_kernels = engine.backend.use_kernels

    def watched(plan: Any) -> str | None:
        locked_at_swap.append(engine.part._lock.locked())
        return use_kernels(plan)

    monkeypatch.setattr(engine.backend, "use_kernels", watched)
    only_dynamic = functools.partial(measure_table, kernels=("int8-dynamic",), short_rows=(1, 2),
                                     prefill_rows=(8,), repeats=1)
    engine.retime = BackgroundRetime(engine.loaded.model.config, torch.device("cpu"), torch.float32, table, serving,
                                     row_copy=False, turn=engine.part.between_requests, load=QuietAfter([]),
                                     poll_s=0.0, quiet_polls=1, measure=only_dynamic, swap=engine.use_kernels)
    result = engine.retime.run()
    assert result is not None and result.swapped and result.in_use and result.not_swapped is None
    assert engine.backend.plan.short == result.plan.short == "int8-dynamic" and locked_at_swap == [True]
    assert not engine.pool.acquire("file:///a.py").tokens       # the old kernels' KV is gone
    assert engine.part.draft_length is not None                # drafts sized by the new kernels' costs
    info = engine.info()["precision"]
    assert info["table"]["swapped_in"] and info["plan"]["short"] == "int8-dynamic"
    report = plan_report(("avx2",), root=tmp_path, served={"daemon": "0.1", "state": "ready", "model": "tiny",
                                                           "engine": {"precision": info}})
    assert "swapped in while serving" in report["detail"]
    fresh = engine_on(result.plan)
    after = engine.complete_all(req).items
    assert after == fresh.complete_all(req).items and before
    # a plan whose verify would not give the steps' bits is refused while speculation is on
    refused = dataclasses.replace(result.plan, verify_exact=False)
    assert "speculation is on" in (engine.use_kernels(refused) or "")
    engine.close()
    fresh.close()
