"""Rotated activations for plans that quantize them to int8
(runtime/forward/rotation.py): the rotations are orthogonal, the rotated
model is the same model in exact arithmetic, a verify still equals its
decode steps to the bit, and nothing is rotated where nothing is
quantized. That the rotation brings the int8 plan closer to float32 on
real code is tests/test_real_model.py's (the tiny model has no outlier
channels to spread)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from soldaemon.policy.kernel_plan import KernelPlan
from soldaemon.runtime.forward import backend as backend_mod
from soldaemon.runtime.forward.backend import LeanBackend, make_backend
from soldaemon.runtime.forward.rotation import BlockRotation, Rotations, hadamard, rotation_applies
from soldaemon.runtime.kv.session import KVSession
from soldaemon_bench.tiny import build_tiny_model

INT8 = KernelPlan("int8", "int8-dynamic", "int8-dynamic", "int8", "int8-dynamic")
WEIGHT_ONLY = KernelPlan("int8", "int8", "int8", "int8", "int8")


@pytest.fixture(scope="module")
def tiny128(tmp_path_factory: pytest.TempPathFactory):
    """A tiny Qwen2 whose widths the rotation blocks divide (hidden 128,
    MLP 384)."""
    from transformers import AutoModelForCausalLM

    path = build_tiny_model(tmp_path_factory.mktemp("tiny128"), hidden=128, layers=3)
    model = AutoModelForCausalLM.from_pretrained(str(path))
    model.eval()
    return model


def _ids(n: int, seed: int, vocab: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=g).tolist()


def test_block_rotations_are_orthogonal_and_refuse_bad_shapes() -> None:
    h = hadamard(32)
    assert torch.allclose(h @ h.t(), torch.eye(32), atol=1e-6)
    rot = BlockRotation.make(96, 32, seed=5)
    x = torch.randn(4, 96)
    assert torch.allclose(rot.unrotate_rows(rot.rotate(x), True), x, atol=1e-5)
    assert torch.allclose(rot.rotate(x).norm(dim=1), x.norm(dim=1), rtol=1e-5)   # lengths kept: RMSNorm commutes
    # one outlier channel is spread over its block
    spike = torch.zeros(1, 96)
    spike[0, 7] = 100.0
    assert rot.rotate(spike).abs().max() < 100.0 / 5
    # rotated row by row (the fallback where the product rounds by batch shape) = one row at a time
    assert torch.equal(rot.rotate_rows(x, exact=False)[2], rot.rotate(x[2:3])[0])
    with pytest.raises(ValueError, match="power of two"):
        hadamard(12)
    with pytest.raises(ValueError, match="not a multiple"):
        BlockRotation.make(100, 32, seed=0)


def test_rotation_only_where_activations_are_quantized() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert rotation_applies(("int8-dynamic",), cpu, 896, 4864)
    assert rotation_applies(("int8", "int8-onednn"), cpu, 896, 4864)
    assert not rotation_applies(("int8",), cpu, 896, 4864)          # weight-only: activations stay float
    assert not rotation_applies(("bfloat16",), cpu, 896, 4864)
    assert not rotation_applies(("int8-dynamic",), cuda, 896, 4864)
    assert not rotation_applies(("int8-dynamic",), cpu, 64, 192)    # the blocks do not divide the widths


def test_the_rotated_model_is_the_same_model(tiny128, monkeypatch: pytest.MonkeyPatch) -> None:
    """In float32 (no quantization to hide behind) the rotated weights, the
    rotated embedding and the rotated-back output give the unrotated
    model's logits, for a prompt and a verify."""
    monkeypatch.setattr(backend_mod, "rotation_applies", lambda *a, **k: True)
    f32 = KernelPlan.uniform("float32")
    vocab = tiny128.config.vocab_size
    ids, nxt = _ids(40, 1, vocab), _ids(6, 2, vocab)
    out = []
    for rotate in (False, True):
        be = LeanBackend(tiny128, 512, plan=f32, rotate=rotate)
        assert (be.rotations is not None) == rotate
        if rotate:   # the gains moved into the weights
            assert torch.equal(be.layers[0].ln1, torch.ones_like(be.layers[0].ln1))
        session = KVSession(be)
        first = session.prefill(ids).logits.clone()
        out.append((first, session.verify(nxt).clone()))
    (p0, v0), (p1, v1) = out
    assert torch.allclose(p0, p1, atol=1e-3, rtol=1e-4)
    assert torch.allclose(v0, v1, atol=1e-3, rtol=1e-4)
    assert (p0 - p1).abs().max() > 0          # the rotated path really ran


def test_a_rotated_verify_is_its_decode_steps_bit_for_bit(tiny128) -> None:
    """Speculation still changes no answer: with the rotations the int8
    plan's verify rows are its decode steps, logits and KV, to the bit —
    and with the blocked copy the same bits again."""
    from soldaemon.runtime.forward.kernels import onednn_int8_exact

    vocab = tiny128.config.vocab_size
    ids, nxt = _ids(50, 3, vocab), _ids(9, 4, vocab)
    plans = [INT8] + ([replace(INT8, rows="int8-onednn")] if onednn_int8_exact() else [])
    results = []
    for plan in plans:
        be = LeanBackend(tiny128, 512, plan=plan)
        assert be.rotations is not None
        session = KVSession(be)
        session.prefill(ids)
        steps = torch.stack([session.decode_step(t) for t in nxt])
        kv = [c[:, :, :len(ids) + 9].clone() for c in be.cache]
        session.truncate(len(ids))
        rows = session.verify(nxt)
        assert torch.equal(rows, steps)
        for a, b in zip(kv, be.cache):
            assert torch.equal(a, b[:, :, :len(ids) + 9])
        results.append(rows.clone())
    assert all(torch.equal(results[0], r) for r in results[1:])


def test_nothing_is_rotated_where_nothing_is_quantized_or_when_asked(tiny128) -> None:
    assert LeanBackend(tiny128, 256, plan=WEIGHT_ONLY).rotations is None
    assert LeanBackend(tiny128, 256).rotations is None                  # the reference math
    assert make_backend(tiny128, 256, plan=INT8, rotate=False).rotations is None   # rotate=False
    rot = Rotations.for_shapes(128, 384)
    assert rot.residual.m.shape == (128, 128) and rot.inner.m.shape[0] == 32


def test_a_bench_header_names_the_plans_arithmetic_not_the_modules_dtype(tiny128) -> None:
    """A model under an int8 plan is held in float32 but computes its
    products in int8: the benches' first line (bench/soldaemon_bench/header.py) says so,
    and says rotated only where the plan rotates."""
    from soldaemon_bench.header import engine_label
    from soldaemon.runtime.forward.precision import precision_info

    def label(plan: KernelPlan, rotate: bool = True) -> str:
        be = make_backend(tiny128, 256, plan=plan, rotate=rotate)
        info = {"model": "tiny", "device": "cpu", "dtype": "float32", "backend": "lean",
                "precision": precision_info(be, torch.float32, None)}
        return engine_label(info)

    assert label(INT8) == "tiny (float32 activations, int8 weights, int8-dynamic kernels, rotated, lean) on cpu"
    assert label(INT8, rotate=False).endswith("int8-dynamic kernels, lean) on cpu")
    assert label(WEIGHT_ONLY) == "tiny (float32 activations, int8 weights, int8 kernels, lean) on cpu"
    assert label(KernelPlan.uniform("float32")) == (
        "tiny (float32 activations, float32 weights, float32 kernels, lean) on cpu")
    fallback = {"model": "tiny", "device": "cpu", "dtype": "bfloat16", "backend": "transformers",
                "precision": {"plan": None}}
    assert engine_label(fallback) == "tiny (bfloat16, transformers) on cpu"


def test_the_output_layer_reads_a_rotated_input(tiny128, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the stream is rotated, the output layer (and the embedding it
    is tied to) keeps rotated rows, so the int8 products of the head see a
    rotated input rather than the stream's outlier channels; packing the
    table a few rows at a time gives the table packed all at once."""
    monkeypatch.setattr(backend_mod, "rotation_applies", lambda *a, **k: True)
    f32 = KernelPlan.uniform("float32")
    be = LeanBackend(tiny128, 256, plan=f32)
    table = tiny128.lm_head.weight.detach().float()
    assert torch.allclose(be.head_w, be.rotations.residual.rotate(table), atol=1e-6)
    # the embedding table is rotated too: a token's rotated row is read as is
    assert torch.allclose(be.embed_tokens(torch.tensor([3])),
                          be.rotations.residual.rotate(tiny128.model.embed_tokens.weight[3:4].detach()), atol=1e-6)
    # an outlier channel in the last hidden row is spread before the head
    x = torch.zeros(1, 128)
    x[0, 5] = 50.0
    x[0, 6] = 1.0
    spread = be.final_norm(be.rotations.residual.rotate(x))
    plain = LeanBackend(tiny128, 256, plan=f32, rotate=False).final_norm(x)
    assert spread.abs().max() < plain.abs().max() / 4
    monkeypatch.setattr(backend_mod, "TABLE_CHUNK", 7)
    int8 = LeanBackend(tiny128, 256, plan=INT8)
    monkeypatch.setattr(backend_mod, "TABLE_CHUNK", 1 << 20)
    whole = LeanBackend(tiny128, 256, plan=INT8)
    # the same table up to the product's rounding by batch shape (one int8 step at most)
    assert (int8.head_w.int() - whole.head_w.int()).abs().max() <= 1
    assert torch.allclose(int8.head_s, whole.head_s, rtol=1e-5)
