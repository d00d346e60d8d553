"""Issue 18, item 2: graph steps are compared with eager ones directly
(logits and greedy tokens) against a stated tolerance. On the CPU the graph
path runs through emulated graphs; a static step with an off-by-one mask
must be caught."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from soldaemon.runtime.forward.backend import LeanBackend
from soldaemon.runtime.forward.cudagraph import GraphDecoder
from soldaemon_bench.graphcheck import (TOLERANCES, AnchorDeviation, GraphAgreement, compare_graphs, tolerance_for,
                                          transformers_reference)
from soldaemon_bench.tiny import build_tiny_model


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> LeanBackend:
    from transformers import AutoModelForCausalLM

    path = build_tiny_model(tmp_path_factory.mktemp("tiny"))
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return LeanBackend(hf, 1024)


def _prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    # 250 + 10 steps crosses the 256-key window into the 512 one
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (40, 250)]


class OnePositionEarly(GraphDecoder):
    """A static step that reads its position one early (rotary tables,
    K/V slot and mask): the bug class the comparison exists for."""

    def static_step(self, window: int, cache: Any = None) -> torch.Tensor:
        self.pos.sub_(1)
        try:
            return super().static_step(window, cache)
        finally:
            self.pos.add_(1)


def test_graphs_agree_with_eager_steps_in_float32(backend: LeanBackend) -> None:
    graphs = GraphDecoder(backend, emulate=True)
    result = compare_graphs(backend, graphs, _prompts(backend.vocab_size), 10)
    assert result.failures() == [], result.to_dict()
    assert result.documents == 2 and result.steps == 20 and result.agree == 20 and result.free_equal == 2
    assert result.replays == 20 + 2 * 9 and result.max_abs_diff < 1e-3
    assert getattr(backend, "graphs", None) is None                   # left as found


def test_eager_steps_agree_with_transformers_forward(backend: LeanBackend, tmp_path: Path) -> None:
    """The reference check: the lean eager steps against transformers' own
    forward of the same model; a different model's forward is caught."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "same"), dtype=torch.float32).eval()
    result = compare_graphs(backend, GraphDecoder(backend, emulate=True), _prompts(backend.vocab_size), 10,
                            reference=transformers_reference(hf))
    assert result.failures() == [] and result.ref_steps == 20 and result.ref_agree == 20, result.to_dict()
    other = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "other", seed=1),
                                                 dtype=torch.float32).eval()
    wrong = compare_graphs(backend, GraphDecoder(backend, emulate=True), _prompts(backend.vocab_size), 10,
                           reference=transformers_reference(other))
    assert any(f.startswith("eager steps vs the reference") for f in wrong.failures()), wrong.to_dict()


def test_a_wrong_static_step_is_caught(backend: LeanBackend) -> None:
    result = compare_graphs(backend, OnePositionEarly(backend, emulate=True), _prompts(backend.vocab_size), 10)
    assert result.failures(), result.to_dict()
    assert result.max_abs_diff > 1e-2


def test_every_path_is_measured_against_the_float32_anchor(backend: LeanBackend, tmp_path: Path) -> None:
    """With an anchor each path's deviation from it is counted; a graph
    step one position early stays a failure under the half-precision
    rule, since it moves the graphs away from the anchor and not eager."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "same"), dtype=torch.float32).eval()
    anchor = transformers_reference(hf)
    prompts = _prompts(backend.vocab_size)
    good = compare_graphs(backend, GraphDecoder(backend, emulate=True), prompts, 10,
                          reference=transformers_reference(hf), anchor=anchor)
    assert set(good.anchor) == {"eager", "graphs", "reference"} and good.failures() == [], good.to_dict()
    assert all(a.steps == 20 and a.max_err < 1e-3 for a in good.anchor.values())
    assert good.to_dict()["anchor"]["graphs"]["mean_err"] < 1e-3
    wrong = compare_graphs(backend, OnePositionEarly(backend, emulate=True), prompts, 10,
                           tolerance=TOLERANCES[torch.bfloat16], anchor=anchor)
    assert wrong.anchor["graphs"].mean_err > 10 * wrong.anchor["eager"].mean_err
    assert any(f.startswith("logits differ") and "float32 anchor" in f for f in wrong.failures()), wrong.to_dict()


def _half(strain: float, graphs_err: float, eager_err: float, graphs_agree: int = 19) -> GraphAgreement:
    r = GraphAgreement("bfloat16", TOLERANCES[torch.bfloat16], documents=1, steps=20, agree=20, strain=strain,
                       max_abs_diff=0.9, decisive_steps=20, decisive_agree=20, replays=20, free_equal=1)
    r.anchor = {"graphs": AnchorDeviation(20, 20 * graphs_err, graphs_err, 20, graphs_agree),
                "eager": AnchorDeviation(20, 20 * eager_err, eager_err, 20, 20)}
    return r


def test_half_precision_over_the_tolerance_passes_only_as_close_to_the_anchor() -> None:
    assert _half(1.3, graphs_err=0.5, eager_err=0.45).failures() == []        # rounding: both as far
    assert _half(1.3, graphs_err=0.9, eager_err=0.45).failures()              # graphs twice as far: a bug
    assert _half(1.3, graphs_err=0.5, eager_err=0.45, graphs_agree=15).failures()   # argmax off the anchor
    exact = _half(1.3, graphs_err=0.5, eager_err=0.45)
    exact.tolerance = TOLERANCES[torch.float32]                               # float32: the tolerance alone
    assert exact.failures()
    plain = _half(1.3, graphs_err=0.5, eager_err=0.45)
    plain.anchor = {}                                                         # no anchor measured
    assert plain.failures()


def test_no_graph_step_is_a_failure(backend: LeanBackend) -> None:
    off = GraphDecoder(backend)                                       # off the GPU, not emulated: graphs off
    result = compare_graphs(backend, off, _prompts(backend.vocab_size)[:1], 4)
    assert result.replays == 0 and "no graph step ran" in result.failures()


def test_tolerances_are_stated_per_dtype() -> None:
    assert tolerance_for(torch.bfloat16) is TOLERANCES[torch.bfloat16]
    assert tolerance_for(torch.float64) is TOLERANCES[torch.float32]
    assert TOLERANCES[torch.float32].free_must_match and not TOLERANCES[torch.bfloat16].free_must_match


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_captured_graphs_agree_with_eager_steps_on_cuda(dtype: torch.dtype, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path), dtype=dtype).to("cuda").eval()
    cuda = LeanBackend(hf, 1024)
    graphs = GraphDecoder(cuda)
    result = compare_graphs(cuda, graphs, _prompts(cuda.vocab_size), 10, reference=transformers_reference(hf))
    assert graphs.failure is None and graphs.captures >= 2          # a 256- and a 512-key window
    assert result.failures() == [] and result.ref_steps == 20, result.to_dict()


def test_the_tolerance_follows_the_decode_kernel(backend: LeanBackend) -> None:
    """A plan whose decode kernel rounds coarser than the compute dtype (a
    float32 CPU running bfloat16 or int8 products) is judged by the
    coarser precision."""
    from soldaemon_bench.graphcheck import decode_precision
    from soldaemon.policy.kernel_plan import KernelPlan

    assert decode_precision(backend) == torch.float32                  # the reference plan
    kept = backend.plan
    try:
        for storage, precision in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
            backend.plan = KernelPlan.uniform(storage)
            assert decode_precision(backend) == precision
        backend.plan = KernelPlan("int8", "int8", "int8", "float32", "float32")
        assert decode_precision(backend) == torch.bfloat16              # int8 weights, bfloat16 activations
    finally:
        backend.plan = kept
