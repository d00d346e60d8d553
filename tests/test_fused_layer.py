"""Fewer kernels per layer, the same math: q/k/v packed as one product and
gate/up as one, the residual add with its RMSNorm, RoPE without ``cat``.
Checked against the layer written apart (three products, two products,
rotate-half with ``cat``), kept here as the reference, and against
transformers' own forward on the tiny model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from soldaemon.policy.kernel_plan import KernelPlan
from soldaemon.runtime.forward import backend as backend_module
from soldaemon.runtime.forward.backend import LeanBackend
from soldaemon.runtime.forward.kernels import KERNEL_FNS, onednn_int8_exact, pack
from soldaemon.runtime.forward.layer import (CAUSAL, GROUPED, STEPWISE, Shape, causal_attention, grouped_attention,
                                             rms_norm, rope, signed_sin, stepwise_attention)
from soldaemon_bench.tiny import build_tiny_model

INT8 = KernelPlan("int8", "int8-dynamic", "int8-dynamic", "float32", "float32")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path: Path = build_tiny_model(tmp_path_factory.mktemp("tiny"))
    model = AutoModelForCausalLM.from_pretrained(str(path))
    model.eval()
    return model, AutoTokenizer.from_pretrained(str(path))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _qkv(shape: Shape, t: torch.Tensor | None, part: int) -> torch.Tensor | None:
    """q's, k's or v's rows (``part`` 0, 1, 2) of a packed q/k/v tensor."""
    if t is None:
        return None
    q_rows, kv_rows = shape.n_heads * shape.head_dim, shape.n_kv * shape.head_dim
    start = (0, q_rows, q_rows + kv_rows)[part]
    return t[start:start + (q_rows if part == 0 else kv_rows)]


def _gu(t: torch.Tensor | None, part: int) -> torch.Tensor | None:
    """gate's or up's rows (``part`` 0, 1) of the packed gate/up tensor."""
    return None if t is None else t.chunk(2)[part]


def _layer_apart(shape: Shape, w: Any, x: torch.Tensor, lin: Any, cos: torch.Tensor, sin_signed: torch.Tensor,
                 k_cache: torch.Tensor, v_cache: torch.Tensor, at: int | torch.Tensor, window: int,
                 mask: torch.Tensor | None, *, attention: str = GROUPED, q_out: torch.Tensor | None = None,
                 q_row: torch.Tensor | None = None, kind: str = "", bucket: int = 0) -> torch.Tensor:
    """The decoder layer as it was written before the packing: three
    products for q, k, v, two for gate and up, rotate-half with ``cat``."""
    T = x.shape[0]
    H, KV, hd = shape.n_heads, shape.n_kv, shape.head_dim
    dt = x.dtype
    sin = signed_sin(sin_signed)                     # its own inverse: the plain table
    bq, bk, bv = (_qkv(shape, w.bqkv, i) for i in range(3))
    h = lin.prepare(rms_norm(x, w.ln1, shape.eps))
    wq, wk, wv = (_qkv(shape, w.wqkv, i) for i in range(3))
    sq, sk, sv = (_qkv(shape, w.sqkv, i) for i in range(3))
    q = lin.multiply(h, wq, bq, sq, dt).view(T, H, hd).transpose(0, 1)
    k = lin.multiply(h, wk, bk, sk, dt).view(T, KV, hd).transpose(0, 1)
    v = lin.multiply(h, wv, bv, sv, dt).view(T, KV, hd).transpose(0, 1)
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    assert isinstance(at, int) and q_out is None
    k_cache[:, at:at + T] = k
    v_cache[:, at:at + T] = v
    keys, vals = k_cache[:, :window], v_cache[:, :window]
    if attention == CAUSAL:
        o = causal_attention(q, keys, vals, shape.scale)
    elif attention == STEPWISE:
        o = stepwise_attention(q, keys, vals, shape.scale, at)
    else:
        o = grouped_attention(q, keys, vals, shape.scale, mask)
    x = x + lin(o.transpose(0, 1).reshape(T, H * hd), w.wo, w.bo, w.so)
    h = lin.prepare(rms_norm(x, w.ln2, shape.eps))
    gate, up = (lin.multiply(h, _gu(w.wgu, i), None, _gu(w.sgu, i), dt) for i in range(2))
    gu = F.silu(gate, inplace=True).mul_(up)
    if shape.inner is not None:
        gu = shape.inner.rotate_rows(gu, shape.inner_exact)
    return x + lin(gu, w.wd, None, w.sd)


def test_rope_without_cat_is_rotate_half_bit_for_bit() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 7, 64, generator=gen)                  # [T, heads, hd]
    cos, sin = torch.randn(5, 1, 64, generator=gen), torch.randn(5, 1, 64, generator=gen)
    assert torch.equal(rope(x, cos, signed_sin(sin)), x * cos + _rotate_half(x) * sin)
    xh = x.to(torch.bfloat16)
    assert torch.equal(rope(xh, cos.bfloat16(), signed_sin(sin.bfloat16())),
                       xh * cos.bfloat16() + _rotate_half(xh) * sin.bfloat16())


@pytest.mark.parametrize("kernel", ["int8-dynamic", "int8", "int8-onednn"])
def test_stacked_int8_products_keep_each_products_bits(kernel: str) -> None:
    """Per-output-row scales: the stacked weight is each part's rows as
    they were, and an integer product gives each part's columns exactly."""
    if kernel == "int8-onednn" and not onednn_int8_exact():
        pytest.skip("oneDNN's int8 product is not exact here")
    gen = torch.Generator().manual_seed(1)
    parts = [torch.randn(n, 96, generator=gen) * 0.05 for n in (64, 32, 32)]
    stacked, s = pack("int8", torch.cat(parts))
    apart = [pack("int8", p) for p in parts]
    assert s is not None and torch.equal(stacked, torch.cat([q for q, _ in apart]))
    assert torch.equal(s, torch.cat([t for _, t in apart if t is not None]))
    fn = KERNEL_FNS[kernel]
    if kernel == "int8-onednn":
        stacked, s = pack("int8-onednn", torch.cat(parts))
        apart = [pack("int8-onednn", p) for p in parts]
    for rows in (1, 3, 17):
        x = torch.randn(rows, 96, generator=gen)
        one = fn(x, stacked, None, s)
        assert torch.equal(one, torch.cat([fn(x, q, None, t) for q, t in apart], dim=1)), rows


def _tokens_and_logits(b: LeanBackend, ids: torch.Tensor, steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """A prompt, then greedy decode steps (one row each) and one 5-row short forward."""
    logits = [b.forward(ids, 0, precise=True)]
    out: list[int] = []
    pos = len(ids)
    for _ in range(steps):
        out.append(int(logits[-1][-1].argmax()))
        logits.append(b.forward(torch.tensor([out[-1]]), pos))
        pos += 1
    logits.append(b.forward(torch.tensor(out[:5]), pos, last_only=False))
    return out, logits


@pytest.mark.parametrize("plan", [None, INT8], ids=["reference", "int8-dynamic"])
def test_packed_layer_matches_the_layer_written_apart(tiny: tuple[Any, Any], plan: KernelPlan | None,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The same tokens; under the int8 plan (integer products) the same
    bits, under the float32 reference within rounding."""
    model, tok = tiny
    ids = torch.tensor(tok("def fused(a, b):\n    return a + b\n\nclass Layer:\n", add_special_tokens=False).input_ids)
    packed = _tokens_and_logits(LeanBackend(model, 256, plan=plan), ids, 12)
    monkeypatch.setattr(backend_module, "decoder_layer", _layer_apart)
    apart = _tokens_and_logits(LeanBackend(model, 256, plan=plan), ids, 12)
    assert packed[0] == apart[0]
    for a, b in zip(packed[1], apart[1]):
        if plan is None:
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)
        else:
            assert torch.equal(a, b)


def test_packed_layer_is_transformers_forward(tiny: tuple[Any, Any]) -> None:
    model, tok = tiny
    ids = torch.tensor(tok("import os\nfor name in os.listdir('.'):\n", add_special_tokens=False).input_ids)
    b = LeanBackend(model, 256)
    with torch.no_grad():
        ref = model(ids[None]).logits[0]
    ours = b.forward(ids, 0, last_only=False, precise=True)
    assert torch.allclose(ours, ref, atol=1e-4, rtol=1e-4)
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))
