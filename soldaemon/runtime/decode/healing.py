"""Token healing: a cursor inside a word leaves the prompt ending in a token
the model rarely saw there, so :func:`soldaemon.fim.make_prompt` drops it
(``FimPrompt.heal``) and :class:`HealingSampler` constrains the first
generated tokens to text that agrees with it; the caller strips the dropped
text again (docs/quality.md).
"""

from __future__ import annotations

import bisect
from typing import Any, Sequence

import torch

from soldaemon.runtime.decode.sampling import Accepted, Sampler, accept_draft


class TokenTexts:
    """The text of every token id, indexed by prefix and by exact text; built
    once per tokenizer (byte-level BPE only: ``make_prompt`` heals no other)."""

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

    def __len__(self) -> int:
        return len(self.texts)

    def allowed(self, rest: str) -> list[int]:
        """Ids whose text agrees with ``rest``: starts with it, or is a
        non-empty proper prefix of it."""
        lo = bisect.bisect_left(self._sorted, rest)
        hi = bisect.bisect_left(self._sorted, rest + "\U0010ffff")
        ids = self._ids[lo:hi]
        for k in range(1, len(rest)):
            ids = ids + self._exact.get(rest[:k], [])
        return ids


class HealingSampler:
    """``inner`` with the first token(s) constrained to agree with ``heal``;
    ``constrained`` (so drafts wait) until the text covers it."""

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
            # healed indentation: the code comes after it, not more blanks (docs/quality.md)
            rest = len(self.rest)
            ids = [i for i in ids if len(self.texts.texts[i]) < rest or self.texts.texts[i].strip()] or ids
        if not ids:              # nothing agrees (cannot happen with a full vocabulary): give up healing
            self.rest = ""
            return self.inner(logits)
        index = torch.tensor(ids, dtype=torch.long, device=logits.device)
        masked = torch.full_like(logits, float("-inf"))
        masked[index] = logits[index]
        token = self.inner(masked)
        self.take(token)
        return token

    def accept(self, logits: torch.Tensor, draft: Sequence[int]) -> Accepted:
        """``inner``'s verification (drafts wait until healing is done)."""
        return accept_draft(self.inner, logits, draft)

    def take(self, token: int) -> None:
        """Account for a generated ``token``: what of ``heal`` is left."""
        text = self.texts.texts[token]
        self.rest = self.rest[len(text):] if self.rest.startswith(text) else ""
