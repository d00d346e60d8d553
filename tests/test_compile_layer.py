"""The decoder layer under torch.compile (runtime/forward/compiled.py): the
keep/drop decision over recorded timings, the record a later start reuses,
off by default on a CPU, and the tiny model's layer compiled on the CPU
(gcc) giving the same tokens as the eager layer through emulated graphs."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from soldaemon.runtime.forward import compiled
from soldaemon.runtime.forward.backend import LeanBackend
from soldaemon.runtime.forward.compiled import CompileChoice, decide
from soldaemon.runtime.forward.cudagraph import GraphDecoder
from soldaemon.runtime.forward.layer import decoder_layer
from soldaemon_bench.tiny import build_tiny_model

# Recorded decode-step timings (ms), the shapes a device run gives: a layer
# whose fused kernels win, and one where the compiled step is no faster.
FASTER = ([3.07, 3.10, 3.05, 3.12, 3.08], [2.41, 2.39, 2.45, 2.40, 2.38])
NO_GAIN = ([1.52, 1.50, 1.55, 1.51, 1.53], [1.50, 1.49, 1.51, 1.52, 1.50])


def test_decide_keeps_the_faster_and_drops_a_small_gain() -> None:
    keep = decide(*FASTER, 41.5)
    assert keep.compiled and keep.eager_ms == 3.08 and keep.compiled_ms == 2.40 and keep.compile_s == 41.5
    assert "kept" in keep.reason
    drop = decide(*NO_GAIN, 12.0)
    assert not drop.compiled and "not 3% faster, dropped" in drop.reason
    assert not decide([1.0], [], None).compiled                       # a compile that gave no timings
    assert decide([1.0, 1.0], [0.99, 0.99], None, min_gain=0.0).compiled


def test_the_record_round_trips_and_reads_as_reused(tmp_path: Path) -> None:
    path = compiled.record_path("dev-key", tmp_path)
    assert compiled.load_choice(path) is None
    compiled.save_choice(path, decide(*FASTER, 41.5))
    again = compiled.load_choice(path)
    assert again is not None and again.compiled and again.reused and again.compile_s == 41.5
    path.write_text("{not json")
    assert compiled.load_choice(path) is None
    assert compiled.record_key(torch.device("cpu"), "L4 D64").startswith("cpu-torch")
    assert "/" not in compiled.record_key(torch.device("cpu"), "a/b")


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoModelForCausalLM

    path = build_tiny_model(tmp_path_factory.mktemp("tiny"))
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def greedy(graphs: GraphDecoder, first: int, n: int) -> list[int]:
    """n greedy tokens decoded through the graphs from ``first`` at 0."""
    tokens, tok = [], first
    for pos in range(n):
        logits = graphs.step(tok, pos)
        assert logits is not None
        tok = int(logits.argmax())
        tokens.append(tok)
    return tokens


def test_off_by_default_on_a_cpu_and_forced_off(tiny_hf: Any, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(compiled.ENV_OVERRIDE, raising=False)
    graphs = GraphDecoder(LeanBackend(tiny_hf, 600), emulate=True)
    choice = compiled.choose_layer(graphs, root=tmp_path)
    assert not choice.compiled and "off on a CPU" in choice.reason and graphs.layer is decoder_layer
    assert not compiled.choose_layer(graphs, force=False, root=tmp_path).compiled
    monkeypatch.setenv(compiled.ENV_OVERRIDE, "off")
    assert compiled.choose_layer(graphs, root=tmp_path, on_cpu=True).reason == "off"
    monkeypatch.setenv(compiled.ENV_OVERRIDE, "on")
    monkeypatch.setattr(compiled, "compile_layer", lambda: slowed(0.0)())
    assert compiled.choose_layer(graphs, root=tmp_path).reason == "forced on"
    assert graphs.layer is not decoder_layer
    assert not (tmp_path / "layer-compile").exists()                  # nothing measured, nothing recorded


def slowed(ms: float) -> Callable[[], Callable[..., torch.Tensor]]:
    """A stand-in "compiler": the eager layer with a sleep of ``ms``."""
    def layer(*args: Any, **kw: Any) -> torch.Tensor:
        time.sleep(ms / 1000)
        return decoder_layer(*args, **kw)
    return lambda: layer


def test_measure_drops_a_slower_layer_on_a_scratch_cache(tiny_hf: Any) -> None:
    backend = LeanBackend(tiny_hf, 600)
    graphs = GraphDecoder(backend, emulate=True)
    live = backend.cache
    before = live[0].clone()
    drop = compiled.measure(graphs, steps=4, compiler=slowed(5.0))      # 5 ms a layer slower
    assert not drop.compiled and drop.compile_s is not None and "dropped" in drop.reason
    assert drop.compiled_ms is not None and drop.eager_ms is not None and drop.compiled_ms > drop.eager_ms
    assert graphs.layer is decoder_layer and graphs.info()["graphs"] == 0     # measuring graphs dropped
    assert backend.cache[0] is live[0] and torch.equal(live[0], before)   # no session's cache written


def test_measure_keeps_a_faster_layer_and_a_later_start_reuses_the_record(
        tiny_hf: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(compiled.ENV_OVERRIDE, raising=False)
    monkeypatch.setattr(compiled, "decoder_layer", slowed(5.0)())      # the "eager" layer is the slow one
    graphs = GraphDecoder(LeanBackend(tiny_hf, 600), emulate=True)
    graphs.use_layer(compiled.decoder_layer)
    fast = compiled.measure(graphs, steps=4, compiler=lambda: decoder_layer)
    assert fast.compiled and graphs.layer is decoder_layer and "kept" in fast.reason

    # choose_layer measures once and records; the next start reads the record
    monkeypatch.setattr(compiled, "measure", lambda *a, **k: fast)
    first = compiled.choose_layer(graphs, root=tmp_path, on_cpu=True)
    assert first == fast and list((tmp_path / "layer-compile").glob("*.json"))
    monkeypatch.setattr(compiled, "measure", lambda *a, **k: pytest.fail("a recorded choice is measured again"))
    monkeypatch.setattr(compiled, "compile_layer", lambda: slowed(0.0)())
    again = compiled.choose_layer(graphs, root=tmp_path, on_cpu=True)
    assert again.compiled and again.reused and again.eager_ms == fast.eager_ms
    assert graphs.layer is not decoder_layer                           # the recorded choice: compiled


def test_a_failed_compile_keeps_the_eager_layer(tiny_hf: Any) -> None:
    def broken() -> Callable[..., torch.Tensor]:
        raise RuntimeError("InductorError: no C++ compiler")
    graphs = GraphDecoder(LeanBackend(tiny_hf, 600), emulate=True)
    choice = compiled.measure(graphs, steps=2, compiler=broken)
    assert not choice.compiled and choice.reason.startswith("compile failed: RuntimeError")
    assert graphs.layer is decoder_layer and choice.eager_ms is not None


def test_graphs_that_do_not_replay_measure_nothing(tiny_hf: Any) -> None:
    graphs = GraphDecoder(LeanBackend(tiny_hf, 600), emulate=True)
    graphs.enabled = False                                              # as after two failed captures
    choice = compiled.measure(graphs, steps=2, compiler=lambda: pytest.fail("nothing to compile for"))
    assert not choice.compiled and choice.eager_ms is None
    assert choice.reason == "eager steps failed: RuntimeError: no graph replayed (graphs off)"


@pytest.mark.slow
def test_the_compiled_layer_gives_the_same_tokens_on_the_cpu(tiny_hf: Any) -> None:
    """Inductor on the CPU (gcc): the tiny model's layer compiled, decoded
    greedily through emulated graphs, gives the eager layer's tokens
    (slow: the compile takes ~75 s on the 2-core machine)."""
    graphs = GraphDecoder(LeanBackend(tiny_hf, 600), emulate=True)
    eager = greedy(graphs, 5, 12)
    graphs = GraphDecoder(LeanBackend(tiny_hf, 600), emulate=True)
    t0 = time.perf_counter()
    graphs.use_layer(compiled.compile_layer())
    tokens = greedy(graphs, 5, 12)
    print(f"compile and 12 steps: {time.perf_counter() - t0:.1f} s")
    assert tokens == eager
    assert graphs.replays == 12


def test_the_device_checks_report_has_a_layer_compile_line() -> None:
    """scripts/gpu_check_report.py: the engine's choice (its info()'s
    ``layer_compile``, in the latency step's JSON) as one line per shape."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "gpu_check_report", Path(__file__).resolve().parents[1] / "scripts" / "gpu_check_report.py")
    assert spec is not None and spec.loader is not None
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    choice = decide(*FASTER, 41.5)
    fig = report.shape_figures({"info": {"layer_compile": dataclasses.asdict(choice)}}, None, "0.5b")
    line = report._layer_compile_line(fig["layer_compile"])
    assert line.startswith("- layer compiled (inductor in our graphs): kept; eager 3.08 vs compiled 2.4 ms/step, "
                           "compile 41.5 s: compiled 2.400 ms vs eager 3.080 ms a step: kept")
    assert report._layer_compile_line(None).endswith("not reported")
