"""Samplers: logits [V] → one token id. Passed into generation as callables."""

from __future__ import annotations

from typing import Protocol

import torch


class Sampler(Protocol):
    greedy: bool

    def __call__(self, logits: torch.Tensor) -> int:
        """logits: [V] float32. Returns the token id (one host sync)."""
        ...


class Greedy:
    greedy = True

    def __call__(self, logits: torch.Tensor) -> int:
        return int(torch.argmax(logits))


class TopP:
    """Temperature + nucleus sampling with its own seeded generator."""

    greedy = False

    def __init__(self, temperature: float, top_p: float = 1.0, seed: int | None = None) -> None:
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 for sampling, got {temperature}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        self.temperature = temperature
        self.top_p = top_p
        self.gen = torch.Generator()
        if seed is not None:
            self.gen.manual_seed(seed)
        else:
            self.gen.seed()

    def __call__(self, logits: torch.Tensor) -> int:
        probs = torch.softmax(logits.float().cpu() / self.temperature, dim=-1)
        if self.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < self.top_p  # always keeps the top token
            sorted_p = sorted_p * keep
            choice = torch.multinomial(sorted_p / sorted_p.sum(), 1, generator=self.gen)
            return int(order[choice])
        return int(torch.multinomial(probs, 1, generator=self.gen))


def make_sampler(temperature: float, top_p: float = 1.0, seed: int | None = None) -> Sampler:
    return Greedy() if temperature <= 0 else TopP(temperature, top_p, seed)
