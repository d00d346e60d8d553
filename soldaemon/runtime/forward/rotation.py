"""Rotations that make int8 activations accurate for kernels that quantize each row: a few outlier
channels set a row's scale, and an orthogonal rotation spreads them first, changing no exact
result. The residual stream stays rotated, ``x Q`` (``Q`` folded into every reader's and writer's
weights, the embedding and the output layer); the MLP's inner product is rotated per row at run
time before the down product. Design and figures: docs/kernels.md, "Rotated activations"."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

RESIDUAL_BLOCK = 128   # the stream's rotation is folded into the weights: free at run time
INNER_BLOCK = 32       # rotated per row at run time: half 64's cost for little accuracy
ROTATING_KERNELS = frozenset({"int8-dynamic", "int8-onednn"})   # kernels that quantize activations per row


def hadamard(n: int) -> torch.Tensor:
    """The orthonormal Sylvester Hadamard matrix of order ``n`` (a power of 2): its own inverse."""
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
    """``Q = blockdiag(M, M, …)``, ``M = diag(s) H_b`` (random signs times a Hadamard block):
    ``rotate`` is ``x Q``, ``unrotate`` ``x Q^T``, for rows whose length the block divides."""

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

    def _rows(self, x: torch.Tensor, m: torch.Tensor, exact: bool) -> torch.Tensor:
        """[T, n] rows times ``m``'s blocks; row by row, as a decode step, unless ``exact``."""
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
    """Whether a plan running ``kernels`` gets the rotations: one quantizes activations per row,
    on a CPU (where those kernels run), with shapes the blocks divide."""
    return (device.type == "cpu" and bool(ROTATING_KERNELS & set(kernels))
            and hidden % RESIDUAL_BLOCK == 0 and intermediate % INNER_BLOCK == 0)


@functools.cache
def row_exact(n: int, block: int) -> bool:
    """Whether a row of a many-row rotation gets the bits of that row alone on this machine (then
    short forwards rotate all rows at once, and a verify still equals the steps)."""
    rot = BlockRotation.make(n, block, seed=2)
    x = torch.randn(9, n, generator=torch.Generator().manual_seed(3)) * 8
    many = rot.rotate(x)
    return all(torch.equal(many[i], rot.rotate(x[i:i + 1])[0]) for i in range(x.shape[0]))
