"""Backends: the forward pass (batch 1) over a KV cache the caller gives it.

``forward`` runs ``tokens`` at ``pos … pos+T-1``, writes their K/V into that cache and returns
logits; positions ``>= pos`` are overwritten or ignored, so truncating is free. The backend holds
no "current cache"; which tokens a cache holds is :mod:`soldaemon.runtime.kv.session`'s business."""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol, Sequence

import torch

from soldaemon.policy.kernel_plan import KernelPlan
from soldaemon.runtime.forward.kernels import KERNEL_FNS, ROW_COPIES, Kernel, compute_dtype_for, embed_rows, pack
from soldaemon.runtime.forward.rotation import (INNER_BLOCK, RESIDUAL_BLOCK, Rotations, rotation_applies,
                                               row_exact)
from soldaemon.runtime.forward.weights import PACKED, LayerWeights, share_rows, storage_bytes
from soldaemon.runtime.forward.layer import (CAUSAL, GROUPED, STEPWISE, Shape, additive_mask, causal_mask,
                                             decoder_layer, group_mask, plan_attention, rms_norm, signed_sin)

if TYPE_CHECKING:
    from soldaemon.runtime.memory.weightstore import WeightStore

LEAN_ARCHITECTURES = {"qwen2", "llama", "mistral"}
TABLE_CHUNK = 16384       # rows of the output layer / embedding packed at a time (rotated)
log = logging.getLogger("soldaemon.backend")


class GraphSteps(Protocol):
    """Decode steps replayed from CUDA graphs (:class:`.cudagraph.GraphDecoder`), in ``graphs``."""

    def step(self, token: int, pos: int, cache: Any = None) -> torch.Tensor | None:
        """Logits [V] for ``token`` at ``pos`` over ``cache`` (None: own), or None: eager."""
        ...

    def verify(self, tokens: Sequence[int], pos: int, cache: Any = None) -> torch.Tensor | None:
        """Logits [T, V] for ``tokens`` at ``pos`` … over ``cache``, or None: eager."""
        ...

    def invalidate(self) -> None:
        """Forget every captured graph (the weights moved)."""
        ...

    def owes(self) -> bool:
        """Whether graphs are to be captured after the request (stale, or missed)."""
        ...

    def recapture(self, lock: threading.Lock | None = None) -> int:
        """Capture what ``owes`` names, outside any request, each under ``lock`` alone; a count."""
        ...


class Backend(Protocol):
    """The forward pass the sessions and the engine call (module doc)."""

    n_ctx: int                 # positions in the KV cache
    vocab_size: int
    cache: Any                 # the KV cache made at construction (the first document's; folding's buffer)
    device: torch.device
    graphs: GraphSteps | None  # CUDA-graph decode steps the sessions replay (None: eager); set at warm-up
    # KV folding's input: the latest forward's last-token queries [L, H, hd] (None: not recorded)
    # and the k cache they attended over
    last_q: torch.Tensor | None
    last_q_cache: torch.Tensor | None
    scale: float               # attention's score scale, head_dim ** -0.5 (folding's scores use it)
    decode_max_tokens: int     # tokens per forward past the precise split (KVSession's half chunk)

    @property
    def kv_bytes_per_session(self) -> int:
        """Bytes of one session's full KV buffer (0: not preallocated)."""
        ...

    def forward(self, tokens: torch.Tensor, pos: int, *, cache: Any = None, last_only: bool = True,
                precise: bool = False) -> torch.Tensor:
        """Logits [1, V] (``last_only``) or [T, V] float32 for ``tokens`` [T] (int64, on device)
        over ``cache`` (None: ``self.cache``). ``precise`` forbids the short-forward kernel:
        a prompt's logits must not depend on how much of it was cached."""
        ...

    def new_cache(self) -> Any:
        """Allocate another KV cache (for another document's session)."""
        ...


class LeanBackend:
    """A Qwen2/Llama/Mistral decoder over a static KV cache: the model's math (float32 RMSNorm,
    rotate-half RoPE, grouped-query attention, SwiGLU), the linear layers run by a
    :class:`~soldaemon.policy.kernel_plan.KernelPlan`'s kernels."""

    def __init__(self, hf_model: Any, n_ctx: int, *, plan: KernelPlan | None = None,
                 short_max_tokens: int = 16, release: bool = False, rotate: bool = True) -> None:
        """``plan``: the kernels and the one weight storage (None: the model's math in its dtype);
        forwards of at most ``short_max_tokens`` rows, not ``precise``, run ``plan.short``, others
        ``plan.prefill``. ``rotate``: rotate activations where the plan quantizes them
        (:mod:`.rotation`). ``release``: empty the module's unshared parameters (it cannot run)."""
        cfg = hf_model.config
        if cfg.model_type not in LEAN_ARCHITECTURES:
            raise ValueError(f"lean backend does not support model_type {cfg.model_type!r}")
        rope = getattr(cfg, "rope_parameters", None) or {}
        rope_type = rope.get("rope_type", "default") if isinstance(rope, dict) else "default"
        if rope_type not in ("default", None):
            raise ValueError(f"lean backend supports plain RoPE only, not {rope_type!r}")
        theta = float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)) if isinstance(rope, dict) else getattr(cfg, "rope_theta", 10000.0))
        inner = hf_model.model
        self.device = inner.embed_tokens.weight.device
        model_dtype = inner.embed_tokens.weight.dtype
        self.dtype = compute_dtype_for(self.device, model_dtype)
        self.reference = plan is None                    # dense in the model's dtype: the model's own math
        self.plan = plan or KernelPlan.uniform(str(self.dtype).removeprefix("torch."), reason="reference")
        self.n_ctx = n_ctx
        self.vocab_size = int(cfg.vocab_size)
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv = int(cfg.num_key_value_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads)
        self.eps = float(cfg.rms_norm_eps)
        # CUDA: whether cuDNN may serve attention (it plans per prompt length), measured once
        self.attention_choice = plan_attention(self.device, kv_heads=self.n_kv, groups=self.n_heads // self.n_kv,
                                               head_dim=self.head_dim, dtype=self.dtype,
                                               layers=int(cfg.num_hidden_layers))
        self.decode_max_tokens = short_max_tokens        # rows of a forward that may run plan.short
        # short forwards of several rows attend row by row as steps do (layer.stepwise_attention): on a CPU a
        # verify then equals the steps bit for bit; a GPU's products round by batch shape anyway
        self.stepwise_short = self.device.type == "cpu"
        hidden, inner_size = int(cfg.hidden_size), int(cfg.intermediate_size)
        self._rotates = (rotate and not self.reference, hidden, inner_size)   # what use_kernels asks again
        self.rotations: Rotations | None = None
        if rotate and not self.reference and rotation_applies(
                (self.plan.prefill, self.plan.short) + ((self.plan.rows,) if self.plan.rows else ()),
                self.device, hidden, inner_size):
            self.rotations = Rotations.for_shapes(hidden, inner_size, self.device)
        self.rotation_exact = self.rotations is None or row_exact(hidden, RESIDUAL_BLOCK)
        self.prefill_linear = KERNEL_FNS[self.plan.prefill]
        self.short_linear = KERNEL_FNS[self.plan.short]
        self.head_linear = KERNEL_FNS[self.plan.head]
        self.norm = inner.norm.weight.to(self.dtype)     # [D]
        tied = hf_model.lm_head.weight is inner.embed_tokens.weight
        # the output layer and the embedding [V, D] in the head storage, rotated where the stream is
        self.head_w, self.head_s = self._pack_table(hf_model.lm_head.weight)
        if tied:
            self.embed_w, self.embed_s = self.head_w, self.head_s
        else:
            self.embed_w, self.embed_s = self._pack_table(inner.embed_tokens.weight)
        self.layers = [self._layer_weights(layer) for layer in inner.layers]
        n_layers = len(self.layers)
        # plan.rows: a blocked second copy of the int8 weights, read by every forward of more than one row
        self.rows_linear: Kernel | None = None
        self.rows_layers: list[LayerWeights] | None = None
        self.rows_head_w: torch.Tensor | None = None
        self.rows_bytes = 0                              # ≈ bytes of that copy (its tensors are opaque)
        self.steps_on_rows = False     # one-row forwards on that copy too: the warm-up's measured choice
        self.plain_released = False                      # keep_only_row_copy: the layers read the blocked copy alone
        if self.plan.rows is not None:
            self._make_row_copy(self.plan.rows)
        self.released = False
        if release:
            self._release(hf_model)
        self._kv_shape = (n_layers, self.n_kv, n_ctx, self.head_dim)
        self.cache = self.new_cache()
        # RoPE tables computed like transformers does (float32 outer product).
        inv_freq = 1.0 / (theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.int64).to(self.device, torch.float32) / self.head_dim))
        t = torch.arange(n_ctx, device=self.device, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)                 # [n_ctx, hd/2]
        emb = torch.cat((freqs, freqs), dim=-1)          # [n_ctx, hd]
        self.cos = emb.cos().to(self.dtype)
        self.sin = signed_sin(emb.sin().to(self.dtype))  # rotate-half's sign folded in (layer.rope)
        self.scale = self.head_dim ** -0.5
        self.shape = Shape(self.n_heads, self.n_kv, self.head_dim, self.eps, self.scale,
                           inner=None if self.rotations is None else self.rotations.inner,
                           inner_exact=self.rotations is None or row_exact(inner_size, INNER_BLOCK))
        # the weight store every layer's weights are read through (read_through), or None
        self.residency: WeightStore | None = None
        # KV folding's input (kv/fold.py): [layers, H, hd] after record_queries(), else None
        self.last_q: torch.Tensor | None = None
        self._q_buffer: torch.Tensor | None = None
        self.last_q_cache: torch.Tensor | None = None   # the k_cache those queries attended over
        self.graphs: GraphSteps | None = None            # set by the engine on CUDA (runtime/forward/cudagraph.py)

    @torch.no_grad()
    def _pack_table(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A [V, D] table in the head storage, rows rotated where the stream is (``W Q``), packed
        TABLE_CHUNK rows at a time so the rotation's float32 copy is never the whole table."""
        if self.rotations is None:
            return pack(self.plan.head_storage, w)
        parts = [pack(self.plan.head_storage, self.rotations.residual.rotate(w[i:i + TABLE_CHUNK].float()))
                 for i in range(0, w.shape[0], TABLE_CHUNK)]
        scales = [s for _, s in parts if s is not None]
        return torch.cat([q for q, _ in parts]), torch.cat(scales) if scales else None

    def _make_row_copy(self, kernel: str) -> None:
        """Lay the layers' and output layer's weights out again for ``kernel`` (plan.rows); where
        that fails (oneDNN missing or inexact) the plan drops ``rows``, logged."""
        make = ROW_COPIES[kernel]
        try:
            self.rows_layers = [replace(w, wqkv=make(w.wqkv), wo=make(w.wo), wgu=make(w.wgu), wd=make(w.wd))
                                for w in self.layers]
            self.rows_head_w = make(self.head_w)
        except RuntimeError as exc:
            log.warning("no blocked copy of the weights (%s): every forward reads the one copy", exc)
            self.rows_layers = self.rows_head_w = None
            self.plan = replace(self.plan, rows=None, reason=self.plan.reason + f"; blocked copy failed: {exc}")
            return
        self.rows_linear = KERNEL_FNS[kernel]
        self.rows_bytes = sum(getattr(w, n).numel() for w in self.layers for n in PACKED) + self.head_w.numel()

    def keep_only_row_copy(self) -> int:
        """When every forward reads the blocked copy (``steps_on_rows``, CPU): free the plain copy
        of the layers' products; returns bytes freed (0: does not apply). Storages are emptied in
        place, so the store's references see them empty; the output layer's plain rows stay (the
        embedding reads them)."""
        if (not self.steps_on_rows or self.rows_layers is None or self.rows_linear is None
                or self.device.type != "cpu" or self.plain_released):
            return 0
        freed = 0
        for w in self.layers:
            for name in PACKED:
                storage = getattr(w, name).untyped_storage()
                freed += storage.nbytes()
                storage.resize_(0)
        self.layers[:] = self.rows_layers        # in place: the store's list is this one
        self.prefill_linear = self.short_linear = self.rows_linear
        self.plain_released = True
        self.plan = replace(self.plan, reason=self.plan.reason + "; every forward reads the blocked copy: "
                            "the plain copy of the layers is freed")
        return freed

    def use_kernels(self, plan: KernelPlan) -> str | None:
        """Run ``plan``'s kernels from now on if they read the weights as packed (same storages,
        blocked copy and rotation): None, else why not. Between forwards only."""
        now, (rotate, hidden, inner_size) = self.plan, self._rotates
        kernels = (plan.prefill, plan.short) + ((plan.rows,) if plan.rows else ())
        if self.reference or (plan.storage, plan.head_storage, plan.rows) != (now.storage, now.head_storage, now.rows):
            return (f"the weights are packed as {now.storage} (head {now.head_storage}, blocked copy {now.rows}), "
                    f"the plan reads {plan.storage} (head {plan.head_storage}, blocked copy {plan.rows})")
        if (rotate and rotation_applies(kernels, self.device, hidden, inner_size)) != (self.rotations is not None):
            return "the new kernels rotate activations where the packed weights do not (or the reverse)"
        if not self.plain_released:             # else every forward reads the blocked copy's kernel
            self.prefill_linear, self.short_linear = KERNEL_FNS[plan.prefill], KERNEL_FNS[plan.short]
        self.head_linear = KERNEL_FNS[plan.head]
        self.plan = replace(plan, reason=plan.reason + "; swapped in while serving (timed again when quiet)")
        return None

    def drop_row_copy(self, why: str) -> None:
        """Free the blocked copy: every forward reads the one copy; the plan says ``why``."""
        if self.rows_layers is None or self.plain_released:
            return
        self.rows_layers = self.rows_head_w = None
        self.rows_linear = None
        self.rows_bytes = 0
        self.steps_on_rows = False
        self.plan = replace(self.plan, rows=None, reason=self.plan.reason + f"; blocked copy dropped: {why}")

    def _release(self, hf_model: Any) -> None:
        """Empty every HF parameter no packed tensor shares: only what the kernels read stays."""
        kept = {t.untyped_storage().data_ptr() for t in self._packed_tensors()}
        for p in hf_model.parameters():
            if p.numel() and p.untyped_storage().data_ptr() not in kept:
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        self.released = True

    def _packed_tensors(self) -> list[torch.Tensor]:
        out = self.fixed_weights()
        for w in self.layers:   # a blocked (opaque) tensor has no storage to read: rows_bytes counts it
            out.extend(t for t in vars(w).values() if isinstance(t, torch.Tensor) and not t.is_mkldnn)
        return out

    def weight_bytes(self) -> int:
        """Bytes of every weight tensor the backend holds, each storage once."""
        return storage_bytes(self._packed_tensors()) + self.rows_bytes

    @property
    def all_resident(self) -> bool:
        """No store, or it offloads nothing: CUDA-graph capture is only valid then."""
        return self.residency is None or self.residency.all_resident

    @property
    def weights_epoch(self) -> int:
        """Changes whenever the store moves layer weights: graphs captured before must be redone."""
        return 0 if self.residency is None else self.residency.epoch

    def read_through(self, store: WeightStore) -> None:
        """From now on every forward reads the layers' weights through ``store``."""
        self.residency = store

    def fixed_weights(self) -> list[torch.Tensor]:
        """Tensors outside the decoder layers (never offloaded)."""
        return [t for t in (self.embed_w, self.embed_s, self.norm, self.head_w, self.head_s) if t is not None]

    def record_queries(self, on: bool = True) -> None:
        """Keep each layer's last-token query (after RoPE) of the latest forward in ``last_q``."""
        if on and self._q_buffer is None:
            # one buffer for life: a graph captured while queries are recorded writes its address
            self._q_buffer = torch.zeros(len(self.layers), self.n_heads, self.head_dim, dtype=self.dtype,
                                         device=self.device)
        self.last_q = self._q_buffer if on else None
        self.last_q_cache = None

    def new_cache(self) -> tuple[torch.Tensor, torch.Tensor]:
        # [layers, kv_heads, n_ctx, head_dim] each, allocated once per session
        k = torch.zeros(self._kv_shape, dtype=self.dtype, device=self.device)
        return k, torch.zeros_like(k)

    @property
    def k_cache(self) -> torch.Tensor:
        """The keys of :attr:`cache` (the one made at construction)."""
        return self.cache[0]

    @property
    def v_cache(self) -> torch.Tensor:
        """The values of :attr:`cache`."""
        return self.cache[1]

    @property
    def kv_bytes_per_session(self) -> int:
        return 2 * math.prod(self._kv_shape) * self.k_cache.element_size()

    @torch.no_grad()
    def _layer_weights(self, layer: Any) -> LayerWeights:
        """The layer's tensors packed in the plan's storage, q/k/v and gate/up each one product;
        where the packed rows are the module's own values, its parameters become views of them."""
        a, m = layer.self_attn, layer.mlp
        st, dt, rot = self.plan.storage, self.dtype, self.rotations
        ln1, ln2 = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
        fields: dict[str, Any] = {"ln1": ln1.to(dt), "ln2": ln2.to(dt)}
        if rot is not None:   # the gains move into the readers' weights (rotation.py)
            fields["ln1"], fields["ln2"] = torch.ones_like(ln1, dtype=dt), torch.ones_like(ln2, dtype=dt)
        qkv, gu = (a.q_proj, a.k_proj, a.v_proj), (m.gate_proj, m.up_proj)
        read = (lambda lin, gain: lin.weight) if rot is None else (lambda lin, gain: rot.reader(lin.weight, gain))
        fields["wqkv"], fields["sqkv"] = pack(st, torch.cat([read(lin, ln1) for lin in qkv]))
        fields["wgu"], fields["sgu"] = pack(st, torch.cat([read(lin, ln2) for lin in gu]))
        biases = [getattr(lin, "bias", None) for lin in qkv]
        fields["bqkv"] = None if all(b is None for b in biases) else torch.cat(
            [torch.zeros(lin.weight.shape[0], dtype=dt, device=lin.weight.device) if b is None else b.to(dt)
             for lin, b in zip(qkv, biases)])
        o_w, d_w = a.o_proj.weight, m.down_proj.weight
        if rot is not None:
            o_w, d_w = rot.writer(o_w), rot.down(d_w)
        fields["wo"], fields["so"] = pack(st, o_w)
        fields["wd"], fields["sd"] = pack(st, d_w)
        bias = getattr(a.o_proj, "bias", None)
        if bias is not None and rot is not None:
            bias = rot.residual.rotate(bias.float())
        fields["bo"] = None if bias is None else bias.to(dt)
        w = LayerWeights(**fields)
        if rot is None:
            share_rows(qkv, w.wqkv, w.bqkv)
            share_rows(gu, w.wgu, None)
        return w

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [T] → embeddings [T, D] in the compute dtype (rotated where the stream is)."""
        return embed_rows(tokens, self.embed_w, self.embed_s, self.dtype)

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        """The final RMSNorm of hidden rows [T, D]; a rotated stream is rotated back for the gain,
        then again for the rotated output layer (whose int8 activations would meet the outliers)."""
        if self.rotations is None:
            return rms_norm(x, self.norm, self.eps)
        res = self.rotations.residual
        return res.rotate_rows(rms_norm(res.unrotate_rows(x, self.rotation_exact), self.norm, self.eps),
                               self.rotation_exact)

    def head_logits(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, D] after the final norm → logits [T, V] float32 (rows > 1: the blocked copy)."""
        if (x.shape[0] > 1 or self.steps_on_rows) and self.rows_linear is not None and self.rows_head_w is not None:
            return self.rows_linear(x, self.rows_head_w, None, self.head_s).float()
        return self.head_linear(x, self.head_w, None, self.head_s).float()

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, pos: int, *, cache: tuple[torch.Tensor, torch.Tensor] | None = None,
                last_only: bool = True, precise: bool = False) -> torch.Tensor:
        kv = self.cache if cache is None else cache
        T = tokens.shape[0]
        end = pos + T
        if end > self.n_ctx:
            raise ValueError(f"KV cache overflow: {end} > n_ctx {self.n_ctx}")
        cos = self.cos[pos:end]                          # [T, hd]
        sin = self.sin[pos:end]
        short = T <= self.decode_max_tokens and not precise
        attention, mask = self._attention(T, pos, short)
        x = self.embed_tokens(tokens)                    # [T, D]
        store = self.residency
        # the blocked copy where there is one (same bits), unless the store serves offloaded layers
        layers, lin = self.layers, self.short_linear if short else self.prefill_linear
        if (T > 1 or self.steps_on_rows) and self.rows_layers is not None and self.rows_linear is not None and (
                store is None or store.all_resident):
            layers, lin = self.rows_layers, self.rows_linear
        kind = "prompt" if attention == CAUSAL else ("step" if T == 1 else ("verify" if short else "prefill"))
        if store is not None and not store.all_resident:
            x = self._offloaded_layers(store, x, kv, pos, end, cos, sin, mask, attention, lin)
        else:
            marks = [time.perf_counter()]
            for i, w in enumerate(layers):
                x = self._block(x, w, i, kv, pos, end, cos, sin, mask, attention, lin, kind if i == 0 else "")
                marks.append(time.perf_counter())
            if store is not None:   # on CUDA host clocks only see kernel launches
                store.note_resident_forward(None if store.cuda else [(b - a) * 1e3 for a, b in zip(marks, marks[1:])])
        if self.last_q is not None:
            self.last_q_cache = kv[0]
        if last_only:
            x = x[-1:]
        return self.head_logits(self.final_norm(x))      # [T or 1, V]

    def _attention(self, T: int, pos: int, short: bool) -> tuple[str, torch.Tensor | None]:
        """How this forward's rows attend (decoder_layer's ``attention``), and the GROUPED mask."""
        if T == 1:
            return GROUPED, None
        if pos == 0:
            return CAUSAL, None          # a fresh prompt: the kernels' own causal path (no mask tensor)
        if short and self.stepwise_short:
            return STEPWISE, None
        # new token i (at pos+i) sees cache positions 0 … pos+i, tiled for the grouped queries
        mask = group_mask(causal_mask(pos, T, pos + T, self.device), self.n_heads // self.n_kv)
        # on a CPU, as the scores' addend once per forward (SDPA would convert it in every layer)
        return GROUPED, additive_mask(mask, self.dtype) if self.device.type == "cpu" else mask

    def _block(self, x: torch.Tensor, w: LayerWeights, i: int, kv: tuple[torch.Tensor, torch.Tensor], pos: int,
               end: int, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None, attention: str,
               lin: Kernel, kind: str = "") -> torch.Tensor:
        """Decoder layer i on x [T, D] (the one layer, :func:`.layer.decoder_layer`);
        writes its K/V into ``kv`` at pos … end-1 and attends over 0 … end-1."""
        return decoder_layer(self.shape, w, x, lin, cos, sin, kv[0][i], kv[1][i], pos, end, mask,
                             attention=attention, q_out=None if self.last_q is None else self.last_q[i],
                             kind=kind)

    def _offloaded_layers(self, store: WeightStore, x: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor],
                          pos: int, end: int, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
                          attention: str, lin: Any) -> torch.Tensor:
        """The layer loop when some layers live in host memory: weights come from the store
        (resident or a prefetched slot), and the store hears when each layer is done."""
        store.begin_forward()
        for i in range(len(self.layers)):
            w, stall_ms, outcome, copied = store.layer(i)
            t0 = time.perf_counter()
            x = self._block(x, w, i, kv, pos, end, cos, sin, mask, attention, lin)
            ms = None if store.cuda else (time.perf_counter() - t0) * 1e3
            store.end_layer(i, ms, stall_ms, outcome, copied)
        store.end_forward()
        return x


class HFBackend:
    """Any transformers causal LM over its own ``DynamicCache``, cropped to ``pos`` before each
    forward (StaticCache cannot be rewound); the fallback for architectures the lean path lacks."""

    def __init__(self, hf_model: Any, n_ctx: int) -> None:
        self.model = hf_model
        self.n_ctx = n_ctx
        self.vocab_size = int(hf_model.config.vocab_size)
        self.device = next(hf_model.parameters()).device
        self._config = hf_model.config
        self.cache = self.new_cache()
        # the Backend hooks, unused here: no graphs, no recorded queries (no KV folding)
        self.graphs: GraphSteps | None = None
        self.last_q: torch.Tensor | None = None
        self.last_q_cache: torch.Tensor | None = None
        self.scale = 1.0
        # one kernel for every forward: no cap of its own, the session's chunk decides
        self.decode_max_tokens = sys.maxsize

    @property
    def kv_bytes_per_session(self) -> int:
        return 0                              # DynamicCache grows with use: nothing preallocated

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self._config)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, pos: int, *, cache: Any = None, last_only: bool = True,
                precise: bool = False) -> torch.Tensor:
        cache = self.cache if cache is None else cache
        have = cache.get_seq_length()
        if pos > have:
            raise ValueError(f"forward at {pos} but the cache holds {have} positions")
        if pos < have:
            cache.crop(pos - have)
        T = tokens.shape[0]
        out = self.model(
            input_ids=tokens.unsqueeze(0), cache=cache,
            cache_position=torch.arange(pos, pos + T, device=self.device),
            use_cache=True, logits_to_keep=1 if last_only else 0,
        )
        return out.logits[0].float()



def make_backend(hf_model: Any, n_ctx: int, *, plan: KernelPlan | None = None, release: bool = False,
                 rotate: bool = True) -> Backend:
    """The lean backend where the architecture allows (arguments as :class:`LeanBackend`'s),
    else the HF one."""
    if getattr(hf_model.config, "model_type", None) in LEAN_ARCHITECTURES:
        try:
            return LeanBackend(hf_model, n_ctx, plan=plan, release=release, rotate=rotate)
        except ValueError as exc:
            log.info("lean backend unavailable (%s): transformers' module stack runs instead", exc)
    return HFBackend(hf_model, n_ctx)
