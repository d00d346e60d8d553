"""Issue 27.2: grouped-query attention without repeating K/V per query head
(runtime/forward/layer.py), one decoder layer for the eager forward and the graph
step, numerics against the reference at several buckets up to 4096
positions, with masks. On the CPU; the ``gpu`` tests repeat the graph
checks on a CUDA device, in bfloat16, and check no call ran SDPA's math
kernel there."""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import pytest
import torch

from soldaemon.runtime.forward import layer
from soldaemon.runtime.forward.backend import LeanBackend
from soldaemon.runtime.forward.cudagraph import GraphDecoder
from soldaemon.runtime.forward.layer import (ATTENTION_LOG, causal_mask, group_mask, grouped_attention,
                                             plan_attention)
from soldaemon.runtime.kv.session import KVSession
from soldaemon_bench.tiny import build_tiny_model

N_CTX = 4160          # buckets 256 … 4096 and 4160


def _reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                         mask: torch.Tensor | None) -> torch.Tensor:
    """The textbook form: K/V repeated per query head, float64 softmax."""
    G = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(G, 0).double(), v.repeat_interleave(G, 0).double()
    s = q.double() @ k.transpose(1, 2) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return (s.softmax(-1) @ v).to(q.dtype)


@pytest.mark.parametrize("S", [256, 1024, 4096])
@pytest.mark.parametrize("T", [1, 9])
def test_grouped_attention_is_attention_with_repeated_heads(S: int, T: int) -> None:
    gen = torch.Generator().manual_seed(S + T)
    H, KV, hd = 14, 2, 64                        # Qwen2.5-Coder-0.5B's heads
    q, k, v = (torch.randn(n, T if n == H else S, hd, generator=gen) for n in (H, KV, KV))
    pos = S - T - 7                              # rows at pos … pos+T-1: the last 7 keys are padding
    mask = causal_mask(pos, T, S, q.device)
    out = grouped_attention(q, k, v, hd ** -0.5, group_mask(mask, H // KV))
    ref = _reference_attention(q, k, v, hd ** -0.5, mask)
    assert out.shape == (H, T, hd)
    assert torch.allclose(out, ref, atol=2e-5, rtol=1e-4), float((out - ref).abs().max())
    # a head attends to its own group's keys: a wrong grouping is caught
    wrong = grouped_attention(q.flip(0), k, v, hd ** -0.5, group_mask(mask, H // KV)).flip(0)
    assert not torch.allclose(wrong, ref, atol=1e-3)


def test_stepwise_attention_is_each_rows_decode_step_bit_for_bit() -> None:
    """A verify's rows attend as the decode steps would: the very call a
    step makes (one row, no mask, the window ending at the row), so the
    output equals the steps' exactly -- where one masked call does not."""
    gen = torch.Generator().manual_seed(5)
    H, KV, hd, first, T = 14, 2, 64, 700, 9
    S = first + T
    q, k, v = (torch.randn(n, T if n == H else S, hd, generator=gen) for n in (H, KV, KV))
    steps = torch.cat([grouped_attention(q[:, t:t + 1], k[:, :first + t + 1], v[:, :first + t + 1],
                                         hd ** -0.5, None) for t in range(T)], dim=1)
    assert torch.equal(layer.stepwise_attention(q, k, v, hd ** -0.5, first), steps)
    masked = grouped_attention(q, k, v, hd ** -0.5, group_mask(causal_mask(first, T, S, q.device), H // KV))
    assert torch.allclose(masked, steps, atol=1e-5)        # the same attention …
    assert not torch.equal(masked, steps)                  # … rounded otherwise


def test_the_batched_matmul_fallback_is_the_same_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(8, 9, 32, generator=gen), torch.randn(2, 300, 32, generator=gen), torch.randn(2, 300, 32, generator=gen)
    mask = causal_mask(280, 9, 300, q.device)
    sdpa = grouped_attention(q, k, v, 0.2, group_mask(mask, 4))
    monkeypatch.setattr(layer, "_choose", lambda *a: layer.GROUPED_MATMUL)
    mm = grouped_attention(q, k, v, 0.2, group_mask(mask, 4))
    assert torch.allclose(sdpa, mm, atol=1e-5)


@pytest.mark.parametrize("T,S", [(512, 1024), (269, 1293), (9, 300)])
def test_the_mask_as_an_addend_changes_no_bit(T: int, S: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU forward hands the layers its mask once as the scores' addend
    (layer.additive_mask) instead of the bool mask SDPA converts in every
    layer: the same bits, through SDPA and through the batched-matmul form;
    a wrong addend (one masked key let through) is caught."""
    gen = torch.Generator().manual_seed(T + S)
    H, KV, hd = 14, 2, 64
    q, k, v = (torch.randn(n, T if n == H else S, hd, generator=gen) for n in (H, KV, KV))
    mask = group_mask(causal_mask(S - T, T, S, q.device), H // KV)
    add = layer.additive_mask(mask, q.dtype)
    assert add is not None and add.dtype == q.dtype and add.shape == mask.shape
    assert torch.equal(add == 0, mask) and bool(torch.isneginf(add[~mask]).all())
    assert layer.additive_mask(None, q.dtype) is None and layer.additive_mask(add, q.dtype) is add
    assert torch.equal(grouped_attention(q, k, v, hd ** -0.5, add), grouped_attention(q, k, v, hd ** -0.5, mask))
    leaky = add.clone()
    leaky[0, -1] = 0.0                            # row 0 may not see the last key
    assert not torch.equal(grouped_attention(q, k, v, hd ** -0.5, leaky), grouped_attention(q, k, v, hd ** -0.5, mask))
    monkeypatch.setattr(layer, "_choose", lambda *a: layer.GROUPED_MATMUL)
    assert torch.equal(grouped_attention(q, k, v, hd ** -0.5, add), grouped_attention(q, k, v, hd ** -0.5, mask))


def test_a_cpu_prefill_chunk_gets_the_addend() -> None:
    """The lean backend on a CPU passes a later prompt chunk (masked
    GROUPED) the addend, and a fresh prompt and a decode step no mask."""
    from soldaemon.runtime.forward.layer import CAUSAL, GROUPED

    be = object.__new__(LeanBackend)
    be.device, be.dtype, be.n_heads, be.n_kv, be.stepwise_short = torch.device("cpu"), torch.float32, 14, 2, True
    how, mask = be._attention(300, 512, False)
    assert how == GROUPED and mask is not None and mask.dtype == torch.float32 and mask.shape == (7 * 300, 812)
    assert torch.equal(mask == 0, group_mask(causal_mask(512, 300, 812, be.device), 7))
    assert be._attention(300, 0, False) == (CAUSAL, None) and be._attention(1, 40, True) == (GROUPED, None)


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory: pytest.TempPathFactory) -> object:
    from transformers import AutoModelForCausalLM

    path = build_tiny_model(tmp_path_factory.mktemp("tiny"), kv_heads=1)   # 4 query heads on 1 KV head
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _reference_logits(hf: object, ids: list[int]) -> torch.Tensor:
    x = torch.tensor([ids], device=hf.device)  # type: ignore[attr-defined]
    with torch.inference_mode():
        return hf(input_ids=x, use_cache=False).logits[0].float()  # type: ignore[operator]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")])])
def test_eager_and_graph_paths_match_transformers_at_every_bucket(tiny_hf: object, device: str) -> None:
    """Positions in the 256, 1024 and 4096 buckets: a masked 9-row verify
    (eager and graphed), a decode step (eager and graphed), all against
    transformers' own forward of the whole sequence."""
    hf = tiny_hf if device == "cpu" else copy.deepcopy(tiny_hf).to("cuda")  # type: ignore[attr-defined]
    backend = LeanBackend(hf, N_CTX)
    graphs = GraphDecoder(backend, emulate=device == "cpu")
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(10, backend.vocab_size, (4100,), generator=gen).tolist()
    ref = _reference_logits(hf, ids).to(backend.device)
    tol = 2e-3 * float(ref.abs().max())
    session = KVSession(backend)
    seen_buckets = set()
    for pos in (200, 1000, 4075):
        backend.graphs = None
        session.truncate(0)
        session.prefill(ids[:pos])
        for name, g in (("eager", None), ("graphs", graphs)):
            backend.graphs = g
            replays = (graphs.replays, graphs.verify_replays)
            rows = session.verify(ids[pos:pos + 9])
            session.truncate(pos)
            step = session.decode_step(ids[pos])
            session.truncate(pos)
            assert float((rows - ref[pos:pos + 9]).abs().max()) < tol, (name, pos)
            assert float((step - ref[pos]).abs().max()) < tol, (name, pos)
            if g is not None:                    # the graph path really ran, at this bucket
                assert (graphs.replays, graphs.verify_replays) == (replays[0] + 1, replays[1] + 1)
                seen_buckets.add(graphs.bucket(pos + 15))   # the 9 rows pad to 16
    assert seen_buckets == {256, 1024, 4096}
    kinds = {(r["kind"], r["bucket"]) for r in ATTENTION_LOG.summary()}
    assert {("graph-step", 4096), ("graph-verify", 4096)} <= kinds
    if device == "cuda":                          # never SDPA's math kernel on CUDA
        assert "math" not in {c for (dev, _, _), c in ATTENTION_LOG.choices.items() if dev == "cuda"}


def test_the_layer_is_written_once() -> None:
    """The eager forward and the graph step run runtime/forward/layer.py's layer:
    neither module calls SDPA or the norm/rotary math itself."""
    root = Path(__file__).resolve().parents[1] / "soldaemon" / "runtime" / "forward"
    layer_math = {"scaled_dot_product_attention", "grouped_attention", "causal_attention", "rotate_half", "silu",
                  "rsqrt"}
    for name in ("backend.py", "cudagraph.py"):
        tree = ast.parse((root / name).read_text())
        called = {n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
                  for n in ast.walk(tree) if isinstance(n, ast.Call)}
        named = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        # the graph step calls self.layer: decoder_layer, or its compiled form (compiled.py)
        assert "decoder_layer" in called or ("layer" in called and "decoder_layer" in named), name
        assert not called & layer_math, (name, called & layer_math)


def test_a_cpu_backend_measures_nothing_and_leaves_the_cudnn_flag_alone() -> None:
    kept = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        for flag in (True, False):
            torch.backends.cuda.enable_cudnn_sdp(flag)
            assert plan_attention(torch.device("cpu"), kv_heads=2, groups=7, head_dim=64, dtype=torch.float32,
                                  layers=24) is None
            assert torch.backends.cuda.cudnn_sdp_enabled() is flag
    finally:
        torch.backends.cuda.enable_cudnn_sdp(kept)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_measures_whether_cudnn_serves_once_and_sets_the_flag_to_the_choice() -> None:
    """cuDNN plans per shape (several hundred ms each new prompt length on the
    H200 on 2026-12-04): whether it serves is measured once per process,
    both options timed, and SDPA's order set to the choice."""
    kept, saved = torch.backends.cuda.cudnn_sdp_enabled(), ATTENTION_LOG.cudnn
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        ATTENTION_LOG.cudnn = None
        choice = plan_attention(torch.device("cuda"), kv_heads=2, groups=7, head_dim=64, dtype=torch.bfloat16,
                                layers=24)
        assert choice is not None and ATTENTION_LOG.cudnn is choice
        assert len(choice.with_cudnn.cold_ms) == len(choice.without_cudnn.cold_ms) == 2, choice
        assert all(t > 0 for t in choice.with_cudnn.cold_ms + choice.without_cudnn.warm_ms)
        assert torch.backends.cuda.cudnn_sdp_enabled() is choice.cudnn
        print(choice.reason)
        assert plan_attention(torch.device("cuda"), kv_heads=2, groups=7, head_dim=64, dtype=torch.bfloat16,
                              layers=24) is choice                     # once per process
    finally:
        torch.backends.cuda.enable_cudnn_sdp(kept)
        ATTENTION_LOG.cudnn = saved


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_backend_attends_as_measured(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path), dtype=torch.bfloat16).to("cuda").eval()
    backend = LeanBackend(hf, 1024)
    choice = backend.attention_choice or ATTENTION_LOG.cudnn
    assert choice is not None, "a CUDA backend measures whether cuDNN serves"
    assert torch.backends.cuda.cudnn_sdp_enabled() is choice.cudnn
    backend.forward(torch.arange(5, 40, device="cuda"), 0)
    backend.forward(torch.tensor([7], device="cuda"), 35)
    if not choice.cudnn:
        assert all(c != "cudnn" for c in ATTENTION_LOG.choices.values()), ATTENTION_LOG.choices