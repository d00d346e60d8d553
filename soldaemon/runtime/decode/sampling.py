"""Samplers (logits [V] → one token id) and token healing: :func:`soldaemon.fim.make_prompt` drops
the prompt's last tokens back to the word's start (``FimPrompt.heal``), :class:`HealingSampler`
constrains the first tokens to agree with them, the caller strips that text again.
"""

from __future__ import annotations

import bisect
from typing import Any, NamedTuple, Protocol, Sequence

import torch


class Accepted(NamedTuple):
    """What a sampler keeps of a verified draft: the first ``kept`` draft
    tokens, then ``token`` (drawn from row ``kept``)."""

    kept: int
    token: int


class Sampler(Protocol):
    greedy: bool

    @property
    def constrained(self) -> bool:
        """True while the next pick is forced or masked: drafts wait."""

    def __call__(self, logits: torch.Tensor) -> int:
        """logits: [V] float32. Returns the token id (one host sync)."""

    def accept(self, logits: torch.Tensor, draft: Sequence[int]) -> Accepted:
        """The verification of ``draft`` over ``logits`` [1+k, V]: what a step-by-step decode
        would have picked."""

    def take(self, token: int) -> None:
        """``token`` was emitted without this sampler's pick (a replayed or forced token)."""


class Free:
    """A sampler's parts for one that nothing constrains."""

    constrained = False

    def take(self, token: int) -> None:
        pass


class Greedy(Free):
    greedy = True

    def __call__(self, logits: torch.Tensor) -> int:
        return int(torch.argmax(logits))

    def accept(self, logits: torch.Tensor, draft: Sequence[int]) -> Accepted:
        """Keep draft tokens while each is its row's argmax, then that row's argmax (one sync)."""
        greedy = torch.argmax(logits, dim=-1).tolist()
        kept = 0
        while kept < len(draft) and draft[kept] == greedy[kept]:
            kept += 1
        return Accepted(kept, greedy[kept])


class TopP(Free):
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
        if logits.device.type == "cuda":
            return self._on_device(logits)
        probs = torch.softmax(logits.float().cpu() / self.temperature, dim=-1)
        if self.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < self.top_p  # keeps the top token
            sorted_p = sorted_p * keep
            choice = torch.multinomial(sorted_p / sorted_p.sum(), 1, generator=self.gen)
            return int(order[choice])
        return int(torch.multinomial(probs, 1, generator=self.gen))

    def accept(self, logits: torch.Tensor, draft: Sequence[int]) -> Accepted:
        """Coupled speculative sampling over ``logits`` [1+k, V]: each row drawn as a step would,
        the draft kept while draws equal it, so drafting never changes a seeded answer."""
        return row_by_row(self, logits, draft)

    # the device nucleus looks at these likeliest tokens first (nearly always enough)
    TOP_K = 256

    def _on_device(self, logits: torch.Tensor) -> int:
        """The same sampling on CUDA with one host sync; sorts all only when TOP_K falls short."""
        dev_gen = self._device_generator(logits.device)
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)
        if self.top_p >= 1.0:
            return int(torch.multinomial(probs, 1, generator=dev_gen))
        k = min(self.TOP_K, probs.shape[-1])
        vals, order = torch.topk(probs, k)              # sorted, on the device
        if k < probs.shape[-1] and bool(vals.sum() < self.top_p):   # a sync, rarely reached
            vals, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(vals, -1) - vals < self.top_p   # always keeps the top token
        return int(order[torch.multinomial(vals * keep, 1, generator=dev_gen)])

    def _device_generator(self, device: torch.device) -> torch.Generator:
        gen = getattr(self, "_dev_gen", None)
        if gen is None or gen.device != device:
            gen = torch.Generator(device=device)
            gen.manual_seed(int(torch.randint(0, 2**62, (1,), generator=self.gen)))
            self._dev_gen = gen
        return gen


def row_by_row(sampler: Sampler, logits: torch.Tensor, draft: Sequence[int]) -> Accepted:
    """``draft`` kept while ``sampler``'s pick per row equals it; the first other pick (or the one
    after the whole draft) is the next token."""
    for i, d in enumerate(draft):
        token = sampler(logits[i])
        if token != d:
            return Accepted(i, token)
    return Accepted(len(draft), sampler(logits[len(draft)]))


def make_sampler(temperature: float, top_p: float = 1.0, seed: int | None = None) -> Sampler:
    return Greedy() if temperature <= 0 else TopP(temperature, top_p, seed)


class TokenTexts:
    """Every token id's text, indexed by prefix and exact text (byte-level BPE: the only kind
    ``make_prompt`` heals)."""

    def __init__(self, tokenizer: Any, vocab_size: int | None = None) -> None:
        n = vocab_size if vocab_size is not None else len(tokenizer)
        self.texts: list[str] = tokenizer.batch_decode([[i] for i in range(n)])
        order = sorted(range(n), key=lambda i: self.texts[i])
        self._sorted = [self.texts[i] for i in order]
        self._ids = order
        self._exact: dict[str, list[int]] = {}
        for i, t in enumerate(self.texts):
            if t:
                self._exact.setdefault(t, []).append(i)

    def allowed(self, rest: str) -> list[int]:
        """Ids whose text starts with ``rest`` or is a non-empty proper prefix of it."""
        lo = bisect.bisect_left(self._sorted, rest)
        hi = bisect.bisect_left(self._sorted, rest + "\U0010ffff")
        ids = self._ids[lo:hi]
        for k in range(1, len(rest)):
            ids = ids + self._exact.get(rest[:k], [])
        return ids


class HealingSampler:
    """``inner`` with the first tokens constrained to agree with ``heal``; ``constrained`` (drafts
    wait) until the text covers it."""

    def __init__(self, inner: Sampler, texts: TokenTexts, heal: str) -> None:
        self.inner = inner
        self.greedy = inner.greedy
        self.texts = texts
        self.rest = heal

    @property
    def constrained(self) -> bool:
        return bool(self.rest)

    def __call__(self, logits: torch.Tensor) -> int:
        if not self.rest:
            return self.inner(logits)
        ids = [i for i in self.texts.allowed(self.rest) if i < logits.shape[-1]]
        if not self.rest.strip():
            # healed indentation: code follows, not more blanks
            rest = len(self.rest)
            ids = [i for i in ids if len(self.texts.texts[i]) < rest or self.texts.texts[i].strip()] or ids
        if not ids:              # nothing agrees (not with a full vocabulary): give up healing
            self.rest = ""
            return self.inner(logits)
        index = torch.tensor(ids, dtype=torch.long, device=logits.device)
        masked = torch.full_like(logits, float("-inf"))
        masked[index] = logits[index]
        token = self.inner(masked)
        self.take(token)
        return token

    def accept(self, logits: torch.Tensor, draft: Sequence[int]) -> Accepted:
        """``inner``'s verification."""
        return self.inner.accept(logits, draft)

    def take(self, token: int) -> None:
        """Consume ``token``'s text from what is left of ``heal``."""
        text = self.texts.texts[token]
        self.rest = self.rest[len(text):] if self.rest.startswith(text) else ""
