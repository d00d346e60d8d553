"""The decoder layer, written once: the eager forward (:mod:`.backend`) and the graph step
(:mod:`.cudagraph`) both run :func:`decoder_layer`. Grouped-query attention stacks each group's
queries into [KV, G*T, hd], a plain multi-head call every SDPA backend takes with a mask (with a
mask, ``enable_gqa`` gets only CUDA's math kernel). The SDPA backend per kind of call is recorded
in :data:`ATTENTION_LOG`; where CUDA would run the math kernel, a batched matmul runs instead."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from soldaemon.policy.attention import AttentionChoice, AttentionTimings, choose_cudnn
from soldaemon.runtime.forward.timing import timed

log = logging.getLogger("soldaemon.attention")

_BACKEND_NAMES = {-1: "error", 0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}
GROUPED_MATMUL = "grouped-matmul"


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as the model computes it, the statistics in float32 (torch's own in float32)."""
    if x.dtype == torch.float32 and w.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def add_rms_norm(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + y, its RMSNorm): the one place a fused kernel (or the compiler's fusion) replaces."""
    x = x + y
    return x, rms_norm(x, w, eps)


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """The sine table [.., hd] with its first half negated: rotate-half's
    sign folded into the table, made once (see :func:`rope`)."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (rotate-half form) on x [.., T, hd] or [T, heads, hd] (cos/sin [T, hd] or
    [T, 1, hd], ``sin_signed`` from :func:`signed_sin`): the halves swapped by one flip, bit for
    bit ``rotate_half(x) * sin`` (a sign flip is exact)."""
    swapped = x.unflatten(-1, (2, x.shape[-1] // 2)).flip(-2).flatten(-2)     # (x2, x1), one copy
    return x * cos + swapped * sin_signed


def causal_mask(pos: int, T: int, S: int, device: torch.device) -> torch.Tensor:
    """bool [T, S]: row i (at position pos+i) sees positions 0 … pos+i."""
    return torch.ones(T, S, dtype=torch.bool, device=device).tril(diagonal=pos)


def group_mask(mask: torch.Tensor | None, groups: int) -> torch.Tensor | None:
    """A [T, S] mask for the grouped queries [G*T, S] (row g*T + t is query
    head g of the group at row t); T = 1 broadcasts as it is."""
    if mask is None or mask.shape[0] == 1:
        return mask
    return mask.repeat(groups, 1)


def additive_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A bool mask as the scores' addend (0 / -inf), made once per forward: SDPA would convert it
    in every layer, and the bits are the same."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


@dataclass
class AttentionLog:
    """Which attention backend ran: ``choices`` (device type, dtype, masked) → backend, chosen
    once; ``calls`` per (kind, bucket, backend); ``cudnn``: :func:`plan_attention`'s choice."""

    choices: dict[tuple[str, str, bool], str] = field(default_factory=dict)
    calls: dict[tuple[str, int, str], int] = field(default_factory=dict)
    cudnn: AttentionChoice | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, kind: str, bucket: int, backend: str) -> None:
        """One forward of ``kind`` over ``bucket`` positions (eager: rounded up to 2^n >= 256)."""
        if not kind.startswith("graph"):
            bucket = max(256, 1 << (bucket - 1).bit_length())
        key = (kind, bucket, backend)
        with self.lock:
            new = key not in self.calls
            self.calls[key] = self.calls.get(key, 0) + 1
        if new:
            log.info("attention: %s over %d positions runs %s", kind, bucket, backend)

    def summary(self) -> list[dict[str, Any]]:
        with self.lock:
            return [{"kind": k, "bucket": b, "backend": be, "forwards": n}
                    for (k, b, be), n in sorted(self.calls.items())]


ATTENTION_LOG = AttentionLog()


def _choose(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, causal: bool) -> str:
    """The SDPA backend for this kind of call (once per device, dtype and masked-or-not), or
    GROUPED_MATMUL where SDPA would run its math kernel on CUDA."""
    key = (q.device.type, str(q.dtype), mask is not None)
    found = ATTENTION_LOG.choices.get(key)
    if found is not None:
        return found
    try:
        code = int(torch._fused_sdp_choice(q, k, k, attn_mask=mask, dropout_p=0.0, is_causal=causal))
    except (RuntimeError, AttributeError, TypeError):  # an older or newer torch without the probe
        code = -1
    name = _BACKEND_NAMES.get(code, str(code))
    if q.device.type == "cuda" and name in ("math", "error"):
        name = GROUPED_MATMUL
    ATTENTION_LOG.choices[key] = name
    return name


def plan_attention(device: torch.device, *, kv_heads: int, groups: int, head_dim: int, dtype: torch.dtype,
                   layers: int, shapes: tuple[tuple[int, int], ...] = ((16, 1103), (128, 1201))) -> AttentionChoice | None:
    """On CUDA, whether cuDNN stays in SDPA's backend order: it plans per shape, and each
    keystroke's prompt is a new length. Masked grouped calls of new ``shapes`` (rows, positions)
    are timed cold and warm with cuDNN on and off (:mod:`soldaemon.policy.attention` decides).
    Once per process, kept in ``ATTENTION_LOG.cudnn``; None on a CPU or when cuDNN was off."""
    if device.type != "cuda":
        return None
    with _PLAN_LOCK:
        if ATTENTION_LOG.cudnn is not None:
            return ATTENTION_LOG.cudnn
        if not torch.backends.cuda.cudnn_sdp_enabled():
            return None
        t0 = time.perf_counter()
        by_option: dict[bool, tuple[list[float], list[float]]] = {True: ([], []), False: ([], [])}
        try:
            for enabled in (True, False):             # each option's kernels and handles loaded, untimed
                _attention_call(device, kv_heads, groups, head_dim, dtype, 8, 64 + enabled, enabled)
            for i, (rows, positions) in enumerate(shapes):
                for enabled in (True, False):
                    # a shape of its own per option and call: each first call plans anew
                    n = positions + 2 * i + enabled
                    cold = _attention_call(device, kv_heads, groups, head_dim, dtype, rows, n, enabled)
                    warm = _attention_call(device, kv_heads, groups, head_dim, dtype, rows, n, enabled)
                    by_option[enabled][0].append(cold)
                    by_option[enabled][1].append(warm)
            choice = choose_cudnn(AttentionTimings(tuple(by_option[True][0]), tuple(by_option[True][1])),
                                  AttentionTimings(tuple(by_option[False][0]), tuple(by_option[False][1])), layers)
        except RuntimeError as exc:                   # a cuDNN call that fails: it does not serve
            choice = AttentionChoice(False, AttentionTimings((), ()), AttentionTimings((), ()), layers,
                                     f"measuring failed: {exc}".splitlines()[0][:200])
        torch.backends.cuda.enable_cudnn_sdp(choice.cudnn)
        ATTENTION_LOG.choices.clear()             # re-probe: the order may have changed
        ATTENTION_LOG.cudnn = choice
        log.info("attention: cuDNN SDPA %s: %s (measured in %.0f ms)", "kept" if choice.cudnn else "off",
                 choice.reason, (time.perf_counter() - t0) * 1000)
        return choice


def _attention_call(device: torch.device, kv_heads: int, groups: int, head_dim: int, dtype: torch.dtype,
                    rows: int, positions: int, cudnn: bool) -> float:
    """ms of one masked grouped SDPA call (the last ``rows`` of ``positions``), cuDNN on or off."""
    torch.backends.cuda.enable_cudnn_sdp(cudnn)
    gen = torch.Generator(device=device).manual_seed(positions)
    q = torch.randn(1, kv_heads, groups * rows, head_dim, device=device, dtype=dtype, generator=gen)
    k = torch.randn(1, kv_heads, positions, head_dim, device=device, dtype=dtype, generator=gen)
    v = torch.randn(1, kv_heads, positions, head_dim, device=device, dtype=dtype, generator=gen)
    mask = additive_mask(group_mask(causal_mask(positions - rows, rows, positions, device), groups), dtype)
    return timed(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=head_dim ** -0.5), device)[1]


_PLAN_LOCK = threading.Lock()


def grouped_attention(q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, scale: float,
                      mask: torch.Tensor | None, *, kind: str = "", bucket: int = 0) -> torch.Tensor:
    """q [H, T, hd] attends to keys/vals [KV, S, hd] (H a multiple of KV)
    under ``mask`` (bool [G*T, S] or [1, S] from :func:`group_mask`, True =
    attend, or its :func:`additive_mask`; None: every key). Returns [H, T, hd]."""
    H, T, hd = q.shape
    KV, S, _ = keys.shape
    G = H // KV
    qg = q.reshape(KV, G * T, hd).unsqueeze(0)           # [1, KV, G*T, hd]
    k4, v4 = keys.unsqueeze(0), vals.unsqueeze(0)
    backend = _choose(qg, k4, mask, False)
    if kind:
        ATTENTION_LOG.note(kind, bucket or S, backend)
    if backend == GROUPED_MATMUL:
        scores = torch.matmul(qg[0], keys.transpose(1, 2)).float() * scale     # [KV, G*T, S]
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        o = torch.matmul(scores.softmax(-1).to(vals.dtype), vals)              # [KV, G*T, hd]
    else:
        o = F.scaled_dot_product_attention(qg, k4, v4, attn_mask=mask, scale=scale)[0]
    return o.reshape(H, T, hd)


def stepwise_attention(q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, scale: float, first: int,
                       *, kind: str = "", bucket: int = 0) -> torch.Tensor:
    """q [H, T, hd] at positions ``first`` …, each row over the keys up to its own position by the
    very call a decode step makes, so a verify's rows equal the steps bit for bit where the
    products do (one masked call rounds differently; docs/kernels.md)."""
    T = q.shape[1]
    rows = [grouped_attention(q[:, t:t + 1], keys[:, :first + t + 1], vals[:, :first + t + 1], scale, None,
                              kind=kind if t == 0 else "", bucket=bucket or first + T)
            for t in range(T)]
    return torch.cat(rows, dim=1)


def causal_attention(q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, scale: float) -> torch.Tensor:
    """A fresh prompt: q [H, T, hd] over its own keys [KV, T, hd], causal."""
    ATTENTION_LOG.note("prompt", keys.shape[1], "sdpa-causal-gqa")
    return F.scaled_dot_product_attention(q.unsqueeze(0), keys.unsqueeze(0), vals.unsqueeze(0),
                                          is_causal=True, scale=scale, enable_gqa=True)[0]


# How a layer's rows attend (decoder_layer's ``attention``):
GROUPED = "grouped"      # one grouped call under ``mask`` (None: every key); decode steps, graphs
CAUSAL = "causal"        # a fresh prompt at position 0: the kernel's causal path
STEPWISE = "stepwise"    # each row as its own decode step (a verify, the typed line; CPU)


@dataclass(frozen=True)
class Shape:
    """What a layer needs of the model besides its weights."""

    n_heads: int
    n_kv: int
    head_dim: int
    eps: float
    scale: float
    # the MLP inner product's rotation (None: none), and whether all rows may rotate at once
    inner: Any = None
    inner_exact: bool = True


def decoder_layer(shape: Shape, w: Any, x: torch.Tensor, lin: Any, cos: torch.Tensor, sin: torch.Tensor,
                  k_cache: torch.Tensor, v_cache: torch.Tensor, at: int | torch.Tensor, window: int,
                  mask: torch.Tensor | None, *, attention: str = GROUPED, q_out: torch.Tensor | None = None,
                  q_row: torch.Tensor | None = None, kind: str = "", bucket: int = 0) -> torch.Tensor:
    """One decoder layer on x [T, D] with :class:`~.weights.LayerWeights` ``w``: writes K/V into
    the layer's cache [KV, n_ctx, hd] at ``at`` (int: sliced; long tensor [T]: the graph's
    ``index_copy_``), then attends over ``window`` positions: GROUPED under ``mask``, CAUSAL, or
    STEPWISE (int ``at``). ``cos``/``sin`` [T, hd] at the rows' positions, ``sin`` from
    :func:`signed_sin`. ``q_out`` [H, hd] gets row ``q_row``'s query (None: the last row)."""
    T = x.shape[0]
    H, KV, hd = shape.n_heads, shape.n_kv, shape.head_dim
    dt = x.dtype
    h = lin.prepare(rms_norm(x, w.ln1, shape.eps))        # cast/quantized once for the q/k/v product
    qkv = lin.multiply(h, w.wqkv, w.bqkv, w.sqkv, dt).view(T, H + 2 * KV, hd)    # [T, H+2KV, hd]
    qk = rope(qkv[:, :H + KV], cos.unsqueeze(1), sin.unsqueeze(1))               # q and k rotated at once
    q = qk[:, :H].transpose(0, 1)                         # [H, T, hd]
    k = qk[:, H:].transpose(0, 1)                         # [KV, T, hd]
    v = qkv[:, H + KV:].transpose(0, 1)                   # [KV, T, hd]
    if q_out is not None:
        q_out.copy_(q[:, -1] if q_row is None else q.index_select(1, q_row)[:, 0])   # [H, hd]
    if isinstance(at, int):
        k_cache[:, at:at + T] = k
        v_cache[:, at:at + T] = v
    else:
        k_cache.index_copy_(1, at, k)
        v_cache.index_copy_(1, at, v)
    keys, vals = k_cache[:, :window], v_cache[:, :window]  # [KV, window, hd]
    if attention == CAUSAL:
        o = causal_attention(q, keys, vals, shape.scale)
    elif attention == STEPWISE:
        if not isinstance(at, int):   # a graph step: a mask-less GROUPED call would be wrong
            raise ValueError("stepwise attention needs the forward's first position as an int")
        o = stepwise_attention(q, keys, vals, shape.scale, at, kind=kind, bucket=bucket)
    else:
        o = grouped_attention(q, keys, vals, shape.scale, mask, kind=kind, bucket=bucket)
    x, normed = add_rms_norm(x, lin(o.transpose(0, 1).reshape(T, H * hd), w.wo, w.bo, w.so), w.ln2, shape.eps)
    gu = lin.multiply(lin.prepare(normed), w.wgu, None, w.sgu, dt)                # [T, 2F]: gate, then up
    inner = gu.shape[1] // 2
    act = F.silu(gu[:, :inner]).mul_(gu[:, inner:])       # [T, F], contiguous
    if shape.inner is not None:
        act = shape.inner.rotate_rows(act, shape.inner_exact)
    return x + lin(act, w.wd, None, w.sd)
