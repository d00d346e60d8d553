"""Whether cuDNN may serve attention on a CUDA device, from timings taken at load
(:func:`soldaemon.runtime.forward.layer.plan_attention`): cuDNN plans every new attention shape,
and a daemon meets a new prompt length at nearly every keystroke (docs/gpu.md). No torch here.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionTimings:
    """One option's measured calls, ms: a new shape's first (``cold``) and second (``warm``)."""

    cold_ms: tuple[float, ...]
    warm_ms: tuple[float, ...]

    def keystroke_ms(self, layers: int) -> float:
        """What one new prompt shape costs over ``layers`` layers: ``cold + (layers-1) * warm``."""
        if not self.cold_ms or not self.warm_ms:
            raise ValueError("no timings")
        return statistics.median(self.cold_ms) + max(layers - 1, 0) * statistics.median(self.warm_ms)


@dataclass(frozen=True)
class AttentionChoice:
    """The choice and what it was made from (for the engine's info)."""

    cudnn: bool
    with_cudnn: AttentionTimings
    without_cudnn: AttentionTimings
    layers: int
    reason: str

    def summary(self) -> dict[str, object]:
        return {"cudnn": self.cudnn, "reason": self.reason, "layers": self.layers,
                "with_cudnn_ms": {"cold": list(self.with_cudnn.cold_ms), "warm": list(self.with_cudnn.warm_ms)},
                "without_cudnn_ms": {"cold": list(self.without_cudnn.cold_ms),
                                     "warm": list(self.without_cudnn.warm_ms)}}


def choose_cudnn(with_cudnn: AttentionTimings, without_cudnn: AttentionTimings, layers: int) -> AttentionChoice:
    """Keep cuDNN in SDPA's order only when a new prompt shape costs less with it (tie: off)."""
    on, off = with_cudnn.keystroke_ms(layers), without_cudnn.keystroke_ms(layers)
    keep = on < off
    reason = (f"a new prompt shape over {layers} layers: {on:.2f} ms with cuDNN, {off:.2f} ms without "
              f"(first call {statistics.median(with_cudnn.cold_ms):.2f} vs "
              f"{statistics.median(without_cudnn.cold_ms):.2f} ms)")
    return AttentionChoice(keep, with_cudnn, without_cudnn, layers, reason)
