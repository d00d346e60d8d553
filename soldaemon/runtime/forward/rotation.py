"""Rotations that make int8 activations accurate (a plan whose products
quantize each row's activations to int8: ``int8-dynamic`` and its blocked
twin).

Quantizing a row to int8 with one scale loses most where a few channels
hold values far above the rest: the scale follows the outliers and the
other channels keep a few levels. Qwen2.5's residual stream and its MLP's
inner product (silu(gate) * up) have such channels. An orthogonal rotation
spreads them over all channels before quantizing and changes no result in
exact arithmetic:

- the residual stream is kept rotated, ``x' = x Q`` with ``Q = diag(s) H``
  (a block Hadamard of 128 with random signs): the embedding is rotated as it is
  read, every layer's readers (q, k, v, gate, up) get ``W diag(g) Q`` (the
  RMSNorm gain ``g`` folded in; RMSNorm commutes with an orthogonal
  rotation), its writers (o, down) ``Q^T W``, and the final hidden rows are
  rotated back before the output layer (so the embedding table, tied to the
  output layer, is not copied);
- the MLP's inner product is rotated before the down product (``Q_d``,
  blocks of 32 over the 4,864 channels), the down weight gets ``W Q_d``;
  this one costs a small product per row at run time.

Measured on the 0.5B (docs/kernels.md, "Rotated activations"): the int8
plan's next-token agreement with float32 rose from 97.0 % to 98.6 % and its
KL divergence fell 4.7x, to weight-only int8's level.

A rotation is applied to each row on its own (a product over blocks of the
row): a verify's rows get the same bits as decode steps, checked once per
process (:func:`row_exact`); where the library's product rounds by batch
shape, short forwards rotate row by row.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

RESIDUAL_BLOCK = 128   # the stream's rotation is folded into the weights: free at run time
INNER_BLOCK = 32       # rotated per row at run time: 32 halves 64's cost (a 1k prompt +8 % against +17 %) for
                       # little accuracy (simulated KL to float32 0.00140 against 0.00127)
ROTATING_KERNELS = frozenset({"int8-dynamic", "int8-onednn"})   # kernels that quantize activations per row


def hadamard(n: int) -> torch.Tensor:
    """The Sylvester Hadamard matrix of order ``n`` (a power of two), scaled
    to be orthonormal (symmetric: its own inverse)."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"a Hadamard block needs a power of two, not {n}")
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(n)


def signs(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2, (n,), generator=g).float() * 2 - 1


@dataclass(frozen=True)
class BlockRotation:
    """``Q = blockdiag(M, M, …)`` with ``M = diag(s) H_b`` (random signs
    times an orthonormal Hadamard block, the same block along the row):
    ``rotate`` is ``x Q``, ``unrotate`` ``x Q^T``, for rows of ``x`` whose
    length the block divides. One small product per row, no other pass."""

    m: torch.Tensor          # [b, b] orthogonal
    mt: torch.Tensor         # its transpose, contiguous

    @classmethod
    def make(cls, n: int, block: int, seed: int, dtype: torch.dtype = torch.float32,
             device: torch.device | None = None) -> "BlockRotation":
        if n % block:
            raise ValueError(f"{n} channels are not a multiple of the rotation block {block}")
        m = (signs(block, seed)[:, None] * hadamard(block)).to(device=device, dtype=dtype)
        return cls(m, m.t().contiguous())

    def _blocks(self, x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return (x.reshape(-1, m.shape[0]) @ m.to(x.dtype)).reshape(x.shape)

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        return self._blocks(x, self.m)

    def unrotate(self, x: torch.Tensor) -> torch.Tensor:
        return self._blocks(x, self.mt)

    def _rows(self, x: torch.Tensor, m: torch.Tensor, exact: bool) -> torch.Tensor:
        """A [T, n] forward's rows times ``m``'s blocks; with ``exact`` False
        (the product rounds by batch shape here) row by row, as a decode step."""
        if exact or x.shape[0] == 1:
            return self._blocks(x, m)
        return torch.cat([self._blocks(x[i:i + 1], m) for i in range(x.shape[0])])

    def rotate_rows(self, x: torch.Tensor, exact: bool) -> torch.Tensor:
        return self._rows(x, self.m, exact)

    def unrotate_rows(self, x: torch.Tensor, exact: bool) -> torch.Tensor:
        return self._rows(x, self.mt, exact)


@dataclass(frozen=True)
class Rotations:
    """The residual stream's rotation and the MLP inner product's."""

    residual: BlockRotation
    inner: BlockRotation

    @classmethod
    def for_shapes(cls, hidden: int, intermediate: int, device: torch.device | None = None) -> "Rotations":
        return cls(BlockRotation.make(hidden, RESIDUAL_BLOCK, seed=0, device=device),
                   BlockRotation.make(intermediate, INNER_BLOCK, seed=1, device=device))

    def reader(self, w: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
        """A product that reads the normed residual stream ([N, D]): ``W diag(g) Q``."""
        return self.residual.rotate(w.float() * gain.float())

    def writer(self, w: torch.Tensor) -> torch.Tensor:
        """A product that writes the residual stream ([D, K]): ``Q^T W``."""
        return self.residual.rotate(w.float().t()).t().contiguous()

    def down(self, w: torch.Tensor) -> torch.Tensor:
        """The down product ([D, F]): ``Q^T W Q_d``."""
        return self.writer(self.inner.rotate(w.float()))


def rotation_applies(kernels: tuple[str, ...], device: torch.device, hidden: int, intermediate: int) -> bool:
    """Whether a plan running ``kernels`` on ``device`` gets the rotations:
    one of them quantizes activations per row, on a CPU (the only place
    those kernels run), with shapes the blocks divide."""
    return (device.type == "cpu" and bool(ROTATING_KERNELS & set(kernels))
            and hidden % RESIDUAL_BLOCK == 0 and intermediate % INNER_BLOCK == 0)


@functools.cache
def row_exact(n: int, block: int) -> bool:
    """Whether this machine's product gives a row of a many-row rotation
    the bits of the same row rotated alone (then short forwards rotate all
    rows at once)."""
    rot = BlockRotation.make(n, block, seed=2)
    x = torch.randn(9, n, generator=torch.Generator().manual_seed(3)) * 8
    many = rot.rotate(x)
    return all(torch.equal(many[i], rot.rotate(x[i:i + 1])[0]) for i in range(x.shape[0]))
