"""Decode steps through CUDA graphs.

At batch 1 a decode step of a small model is a few hundred tiny kernels; on a
GPU the host's launch overhead, not the math, sets the step time. A CUDA graph
replays the whole step with one launch. A graph fixes its tensor addresses and
shapes, so the step is written in *static form*:

- the token and its position live in preallocated device tensors, written
  before each replay (no host sync inside the step);
- rotary tables are gathered by position (``index_select``) instead of sliced;
- K/V are written into the cache with ``index_copy_`` at the position tensor;
- attention runs over a fixed-length window of the cache (a *bucket*: 256,
  512, … up to ``n_ctx``) with a mask ``key position <= pos``, so one graph
  serves every position below its bucket.

One graph is captured per (KV cache, bucket) on first use — a session's cache
is a different tensor, so each session of the pool gets its own graphs — and
``warm_up`` captures the default cache's buckets ahead of the first request.
Any failure to capture disables graphs for good and is reported
(``info()["cuda_graphs"]``); the eager step is then used: outputs never
depend on which path ran (the static step is the same math; the tests check it
against the eager forward on the CPU, where :meth:`GraphDecoder.static_step`
runs without capture).

Graphs are only used while every layer is resident (``backend.all_resident``):
weight offload moves weights between steps, which a graph cannot follow.

A replay writes its logits into the graph's one static output tensor, which
every later replay of that graph overwrites (and documents that share a
compute buffer share the graph): :meth:`GraphDecoder.step` returns a view of
it, valid until the next replay; whoever keeps logits copies them (see
``KVSession.decode_step``). When the backend records queries for KV folding
(``record_queries``), the static step writes each layer's query too, so
folding weighs parked KV by the last decode step on a GPU as on a CPU.

``emulate=True`` runs the same machinery off CUDA: "capture" builds an
:class:`EmulatedGraph` whose ``replay`` runs the static step and copies its
result into one static output tensor, as a CUDA graph does. The tests and
``scripts/gpu_check.sh --cpu`` use it to run the graph path on a CPU.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from .backend import LeanBackend

log = logging.getLogger("soldaemon.cudagraph")

_MIN_BUCKET = 256


def buckets(n_ctx: int) -> list[int]:
    """Attention window sizes: powers of two from 256, and ``n_ctx``."""
    out: list[int] = []
    b = _MIN_BUCKET
    while b < n_ctx:
        out.append(b)
        b *= 2
    out.append(n_ctx)
    return out


class GraphDecoder:
    """Static-form decode steps over a :class:`~.backend.LeanBackend`, replayed
    from CUDA graphs on a CUDA device (see the module doc)."""

    def __init__(self, backend: LeanBackend, *, max_graphs: int = 32, emulate: bool = False) -> None:
        """``emulate``: off CUDA, replay :class:`EmulatedGraph` stand-ins
        (tests, dry runs) instead of reporting graphs unavailable."""
        self.b = backend
        self.device = backend.device
        self.buckets = buckets(backend.n_ctx)
        self.max_graphs = max_graphs
        self.emulated = emulate and self.device.type != "cuda"
        self.enabled = self.device.type == "cuda" or self.emulated
        self.failure: str | None = None if self.enabled else "not a CUDA device"
        self.token = torch.zeros(1, dtype=torch.long, device=self.device)
        self.pos = torch.zeros(1, dtype=torch.long, device=self.device)
        # (k_cache address, window, last_q address or 0) → (graph, its static logits [1, V])
        self._graphs: dict[tuple[int, int, int], tuple[Any, torch.Tensor]] = {}
        self.replays = 0
        self.captures = 0
        self.capture_ms = 0.0

    # -- the step in static form --------------------------------------------

    def _bucket(self, pos: int) -> int:
        for b in self.buckets:
            if pos < b:
                return b
        raise ValueError(f"KV cache overflow: position {pos} >= n_ctx {self.b.n_ctx}")

    @torch.inference_mode()
    def static_step(self, window: int) -> torch.Tensor:
        """One decode step of ``self.token`` at ``self.pos`` attending over the
        first ``window`` cache positions; logits [1, V] (float32). Only
        tensor operations whose shapes do not depend on the position. The
        matrices are multiplied by the kernel an eager decode step uses
        (the plan's short-forward kernel)."""
        b = self.b
        H, KV, hd = b.n_heads, b.n_kv, b.head_dim
        pos = self.pos
        cos = b.cos.index_select(0, pos)                 # [1, hd]
        sin = b.sin.index_select(0, pos)
        keep = torch.arange(window, device=self.device) <= pos          # [window]
        mask = torch.zeros(1, window, dtype=b.dtype, device=self.device).masked_fill(~keep, float("-inf"))
        lin = b.short_linear                             # the plan's decode kernel (static shapes)
        x = b.embed_tokens(self.token)                   # [1, D]
        dt = x.dtype
        for i, w in enumerate(b.layers):
            h = lin.prepare(b._rms(x, w.ln1))
            q = lin.multiply(h, w.wq, w.bq, w.sq, dt).view(1, H, hd).transpose(0, 1)   # [H, 1, hd]
            k = lin.multiply(h, w.wk, w.bk, w.sk, dt).view(1, KV, hd).transpose(0, 1)  # [KV, 1, hd]
            v = lin.multiply(h, w.wv, w.bv, w.sv, dt).view(1, KV, hd).transpose(0, 1)
            q = q * cos + b._rotate_half(q) * sin
            k = k * cos + b._rotate_half(k) * sin
            if b.last_q is not None:                     # KV folding's query (see the module doc)
                b.last_q[i].copy_(q[:, -1])              # [H, hd]
            b.k_cache[i].index_copy_(1, pos, k)
            b.v_cache[i].index_copy_(1, pos, v)
            keys = b.k_cache[i, :, :window]              # [KV, window, hd]
            vals = b.v_cache[i, :, :window]
            o = F.scaled_dot_product_attention(
                q.unsqueeze(0), keys.unsqueeze(0), vals.unsqueeze(0),
                attn_mask=mask, scale=b.scale, enable_gqa=True,
            )[0]                                         # [H, 1, hd]
            x = x + lin(o.transpose(0, 1).reshape(1, H * hd), w.wo, w.bo, w.so)
            h = lin.prepare(b._rms(x, w.ln2))
            x = x + lin(F.silu(lin.multiply(h, w.wg, None, w.sg, dt)) * lin.multiply(h, w.wu, None, w.su, dt),
                        w.wd, None, w.sd)
        x = b._rms(x, b.norm)
        return b.head_logits(x)

    # -- graphs ----------------------------------------------------------------

    def usable(self) -> bool:
        return self.enabled and self.b.all_resident

    def step(self, token: int, pos: int) -> torch.Tensor | None:
        """Logits [V] for ``token`` at ``pos`` through a graph, or None when
        graphs are off (the caller then runs the eager forward). The logits
        are a view of the graph's static output: the next replay of this
        graph (this or another document's) overwrites them, so a caller
        that keeps them copies them. With queries recorded, ``last_q`` then
        holds this step's queries and ``last_q_cache`` is the cache."""
        if not self.usable():
            return None
        window = self._bucket(pos)
        graph = self._graph(window)
        if graph is None:
            return None
        self.token.fill_(token)
        self.pos.fill_(pos)
        g, out = graph
        g.replay()
        self.replays += 1
        if self.b.last_q is not None:
            self.b.last_q_cache = self.b.k_cache
        return out[0]

    def invalidate(self) -> None:
        """Drop every captured graph (the weights moved: idle release and
        restore); the next step captures again."""
        self._graphs.clear()

    def _graph(self, window: int) -> tuple[Any, torch.Tensor] | None:
        last_q = self.b.last_q
        # a graph writes the tensors it was captured with: key on their addresses
        key = (self.b.k_cache.data_ptr(), window, 0 if last_q is None else last_q.data_ptr())
        found = self._graphs.get(key)
        if found is not None:
            return found
        if len(self._graphs) >= self.max_graphs:
            self._graphs.pop(next(iter(self._graphs)))
        try:
            found = self._capture(window)
        except Exception as exc:  # capture is best effort: fall back to eager for good
            self.enabled = False
            self.failure = f"{type(exc).__name__}: {exc}"
            self._graphs.clear()
            log.warning("CUDA graph capture failed, decoding eagerly from now on: %s", self.failure)
            return None
        self._graphs[key] = found
        return found

    def _capture(self, window: int) -> tuple[Any, torch.Tensor]:
        if self.emulated:
            emulated = EmulatedGraph(self, window)
            self.captures += 1
            return emulated, emulated.out
        t0 = time.perf_counter()
        # The capture writes K/V at self.pos: point it at the last slot of the
        # window, then restore what was there (it may be a live cache).
        b = self.b
        slot = window - 1
        saved_k = b.k_cache[:, :, slot].clone()
        saved_v = b.v_cache[:, :, slot].clone()
        self.pos.fill_(slot)
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):                           # warm the kernels outside the graph
                self.static_step(window)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self.static_step(window)
        b.k_cache[:, :, slot] = saved_k
        b.v_cache[:, :, slot] = saved_v
        torch.cuda.synchronize(self.device)
        ms = (time.perf_counter() - t0) * 1e3
        self.captures += 1
        self.capture_ms += ms
        log.info("captured a decode CUDA graph: window %d, %.1f ms", window, ms)
        return graph, out

    def warm_up(self, max_pos: int | None = None) -> None:
        """Capture the current cache's graphs up to ``max_pos`` (default: all
        buckets) before the first request."""
        if not self.usable():
            return
        for window in self.buckets:
            if self._graph(window) is None:
                return
            if max_pos is not None and window > max_pos:
                return

    def info(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "fallback_reason": self.failure,
            "graphs": len(self._graphs),
            "captures": self.captures,
            "capture_ms": round(self.capture_ms, 1),
            "replays": self.replays,
        }


class EmulatedGraph:
    """A CUDA graph's contract without CUDA: ``replay`` runs the decoder's
    static step for ``window`` and writes the logits into ``out``, the one
    static output tensor every replay reuses (as a captured graph's output
    is). Only for ``GraphDecoder(..., emulate=True)``."""

    def __init__(self, decoder: GraphDecoder, window: int) -> None:
        self.decoder = decoder
        self.window = window
        self.out = torch.zeros(1, decoder.b.vocab_size, dtype=torch.float32, device=decoder.device)  # [1, V]

    def replay(self) -> None:
        self.out.copy_(self.decoder.static_step(self.window))
