"""KV folding: a session parked in the :class:`~.session.SessionPool` keeps its KV compactly,
cut to its tokens, with each full :data:`BLOCK`-token block (per layer and KV head) scored under
``sol.kv_folding_entropy_threshold`` stored as int8 (KIVI's scales); the rest stays in the model's
dtype. Without recorded queries a parked session is only trimmed. Which blocks fold is policy
(:mod:`soldaemon.policy.fold`); this module scores, folds and unfolds."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from soldaemon.policy.fold import BLOCK, blocks_to_fold

__all__ = ["BLOCK", "FoldedKV", "block_scores", "fold", "fold_blocks", "kv_bytes_per_token", "unfold"]


@dataclass
class FoldedKV:
    """One parked session's KV: positions 0 … n-1 of every layer."""

    n: int                      # tokens held
    fold: torch.Tensor          # bool [L, KV, nb]: block stored as int8 (nb = n // BLOCK full blocks)
    k_full: torch.Tensor        # [kept, BLOCK, hd] model dtype, kept blocks in (layer, head, block) order
    v_full: torch.Tensor        # [kept, BLOCK, hd]
    k_q: torch.Tensor           # int8 [folded, BLOCK, hd]
    k_scale: torch.Tensor       # float32 [folded, 1, hd]: per channel
    v_q: torch.Tensor           # int8 [folded, BLOCK, hd]
    v_scale: torch.Tensor       # float32 [folded, BLOCK, 1]: per token
    k_tail: torch.Tensor        # [L, KV, n - nb*BLOCK, hd] model dtype (the partial last block)
    v_tail: torch.Tensor

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in vars(self).values() if isinstance(t, torch.Tensor)]

    def nbytes(self) -> int:
        """Bytes actually stored (measured from the tensors)."""
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def trimmed_bytes(self) -> int:
        """Bytes the same n tokens take unfolded (trimmed, full precision)."""
        L, KV, _ = self.fold.shape
        hd = self.k_tail.shape[-1]
        return 2 * L * KV * self.n * hd * self.k_tail.element_size()

    def folded_block_bytes(self) -> int:
        """Unfolded bytes of the blocks stored as int8."""
        hd = self.k_tail.shape[-1]
        # from a shape: other threads read this, and summing the device mask would sync the device
        return 2 * self.k_q.shape[0] * BLOCK * hd * self.k_tail.element_size()


@torch.inference_mode()
def block_scores(k_cache: torch.Tensor, last_q: torch.Tensor, n: int, scale: float) -> torch.Tensor:
    """Each full block's attention mass from ``last_q`` [L, H, hd] (after RoPE; mean over a KV
    head's queries) over the largest block's: [L, KV, n // BLOCK] in [0, 1], for positions
    0 … n-1 of ``k_cache`` [L, KV, n_ctx, hd]."""
    L, KV, _, hd = k_cache.shape
    H = last_q.shape[1]
    nb = n // BLOCK
    keys = k_cache[:, :, :n].float()                              # [L, KV, n, hd]
    q = last_q.float().view(L, KV, H // KV, hd)                   # [L, KV, G, hd]
    att = torch.softmax(q @ keys.transpose(-1, -2) * scale, -1)   # [L, KV, G, n]
    mass = att[..., :nb * BLOCK].reshape(L, KV, -1, nb, BLOCK).sum(-1).mean(2)  # [L, KV, nb]
    top = torch.maximum(mass.amax(-1, keepdim=True), att[..., nb * BLOCK:].sum(-1).mean(2, keepdim=True))
    return mass / top.clamp_min(1e-30)


def fold(k_cache: torch.Tensor, v_cache: torch.Tensor, n: int, scores: torch.Tensor | None,
         threshold: float) -> FoldedKV:
    """:func:`fold_blocks` with the blocks the policy folds for ``scores`` and ``threshold``
    (:func:`~soldaemon.policy.fold.blocks_to_fold`; ``scores`` None: only trimmed)."""
    return fold_blocks(k_cache, v_cache, n, blocks_to_fold(scores, threshold))


@torch.inference_mode()
def fold_blocks(k_cache: torch.Tensor, v_cache: torch.Tensor, n: int, mask: torch.Tensor | None) -> FoldedKV:
    """Fold positions 0 … n-1 of a [L, KV, n_ctx, hd] cache pair: full blocks where ``mask``
    [L, KV, n // BLOCK] is True to int8, the rest copied (None: only trimmed). Runs on every
    document switch: one copy of each block, quantized in place."""
    L, KV, _, hd = k_cache.shape
    nb = n // BLOCK
    cut = nb * BLOCK
    kb = k_cache[:, :, :cut].view(L, KV, nb, BLOCK, hd)            # views, no copy
    vb = v_cache[:, :, :cut].view(L, KV, nb, BLOCK, hd)
    if mask is None:
        mask = torch.zeros(L, KV, nb, dtype=torch.bool, device=k_cache.device)
    if not bool(mask.any()):                                        # trimming only: one plain copy
        k_full = kb.clone(memory_format=torch.contiguous_format).view(L * KV * nb, BLOCK, hd)
        v_full = vb.clone(memory_format=torch.contiguous_format).view(L * KV * nb, BLOCK, hd)
    else:
        keep = ~mask
        k_full, v_full = kb[keep], vb[keep]                         # a boolean gather is a copy
    k_q, k_scale = _quantize(kb[mask], 1)                           # scale per channel: [folded, 1, hd]
    v_q, v_scale = _quantize(vb[mask], 2)                           # scale per token: [folded, BLOCK, 1]
    return FoldedKV(
        n=n, fold=mask,
        k_full=k_full, v_full=v_full,
        k_q=k_q, k_scale=k_scale, v_q=v_q, v_scale=v_scale,
        k_tail=k_cache[:, :, cut:n].clone(), v_tail=v_cache[:, :, cut:n].clone(),
    )


def _quantize(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 of x [folded, BLOCK, hd] (a copy, overwritten here)
    with one float32 scale per slice along ``dim``: (int8 x, scale)."""
    x = x.float()                                                   # no copy when x is float32 already
    lo, hi = torch.aminmax(x, dim=dim, keepdim=True)                # faster here than abs().amax()
    scale = torch.maximum(hi, lo.neg_()).div_(127).clamp_min_(1e-12)
    return x.div_(scale).round_().to(torch.int8), scale


@torch.inference_mode()
def unfold(f: FoldedKV, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """Write ``f`` back into positions 0 … f.n-1 of a [L, KV, n_ctx, hd]
    cache pair (int8 blocks dequantized to the cache's dtype)."""
    L, KV, nb = f.fold.shape
    hd = k_cache.shape[-1]
    cut = nb * BLOCK
    kb = k_cache[:, :, :cut].view(L, KV, nb, BLOCK, hd)
    vb = v_cache[:, :, :cut].view(L, KV, nb, BLOCK, hd)
    if not f.k_q.shape[0]:                                          # trimmed only: one plain copy
        kb.copy_(f.k_full.view(L, KV, nb, BLOCK, hd))
        vb.copy_(f.v_full.view(L, KV, nb, BLOCK, hd))
    else:
        keep = ~f.fold
        kb[keep] = f.k_full
        vb[keep] = f.v_full
        kb[f.fold] = f.k_q.to(torch.float32).mul_(f.k_scale).to(k_cache.dtype)
        vb[f.fold] = f.v_q.to(torch.float32).mul_(f.v_scale).to(v_cache.dtype)
    k_cache[:, :, cut:f.n] = f.k_tail
    v_cache[:, :, cut:f.n] = f.v_tail


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, element_size: int) -> int:
    """Full-precision K+V bytes of one token over all layers."""
    return 2 * layers * kv_heads * head_dim * element_size
