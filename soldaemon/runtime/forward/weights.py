"""A decoder layer's weights as the forward reads them: packed once at load
(:class:`~.backend.LeanBackend`), in the kernel plan's storage
(:mod:`.kernels`), the products that share an input stacked into one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import torch


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer's tensors in the plan's storage: ``w*`` packed weights, ``s*`` per-row
    scales (int8; None for dense), ``b*`` biases in the compute dtype. Products reading one input
    are stacked: q, k, v in ``wqkv``, gate and up in ``wgu`` (per-row scales keep parts exact)."""

    ln1: torch.Tensor                  # [D] input RMSNorm
    ln2: torch.Tensor                  # [D] post-attention RMSNorm
    wqkv: torch.Tensor                 # [(H+2KV)*hd, D]: q's rows, then k's, then v's
    bqkv: torch.Tensor | None          # [(H+2KV)*hd]
    wo: torch.Tensor                   # [D, H*hd]
    bo: torch.Tensor | None
    wgu: torch.Tensor                  # [2F, D]: gate's rows, then up's
    wd: torch.Tensor                   # [D, F] down
    sqkv: torch.Tensor | None = None   # [(H+2KV)*hd] scales of wqkv (int8 storage)
    so: torch.Tensor | None = None
    sgu: torch.Tensor | None = None
    sd: torch.Tensor | None = None


PACKED = ("wqkv", "wo", "wgu", "wd")   # LayerWeights' product weights


def share_rows(linears: Sequence[Any], packed: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Point the modules' weights (and biases) at their rows of ``packed`` where those hold the
    very values (dense storage, same dtype and device): no second copy."""
    weights = [lin.weight for lin in linears]
    if packed.dtype != weights[0].dtype or packed.device != weights[0].device or packed.is_mkldnn:
        return
    sizes = [t.shape[0] for t in weights]
    for t, part in zip(weights, packed.split(sizes)):
        t.data = part
    if bias is not None and bias.dtype == weights[0].dtype:
        for lin, part in zip(linears, bias.split(sizes)):
            if getattr(lin, "bias", None) is not None:
                lin.bias.data = part


def storage_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the storages under ``tensors``, each counted once (None: skipped)."""
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in tensors if t is not None}.values())
