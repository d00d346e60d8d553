"""KV bookkeeping for one sequence: which token ids the backend's cache holds.

``prefill`` computes only the tokens that differ from what the cache already
holds (longest common prefix), in chunks, checking for cancellation between
chunks. ``decode_step`` and ``verify`` append. Truncation is free: the next
forward simply writes at a lower position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .backend import Backend


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Cancelled(Exception):
    """Raised inside prefill when the cancel check fires between chunks."""


@dataclass
class PrefillResult:
    logits: torch.Tensor       # [V] float32, for the token after the prompt
    cached: int                # prompt tokens whose KV was reused
    computed: int              # prompt tokens run through the model


class KVSession:
    def __init__(self, backend: Backend, *, chunk: int = 512) -> None:
        self.backend = backend
        self.chunk = chunk
        self.tokens: list[int] = []        # token ids at cache positions 0 … len-1
        self._last_logits: torch.Tensor | None = None  # logits after self.tokens

    @property
    def n_ctx(self) -> int:
        return self.backend.n_ctx

    def _tensor(self, ids: Sequence[int]) -> torch.Tensor:
        return torch.tensor(ids, dtype=torch.long, device=self.backend.device)

    def prefill(self, ids: Sequence[int], *, cancelled: Callable[[], bool] = lambda: False,
                reuse_from: int | None = None) -> PrefillResult:
        """Make the cache hold exactly ``ids``; return the next-token logits.

        ``reuse_from`` caps the reused prefix (for callers that patched the
        cache themselves). Raises Cancelled between chunks; the cache then
        holds a valid prefix of ``ids`` (kept for the next request)."""
        if not ids:
            raise ValueError("empty prompt")
        if len(ids) >= self.n_ctx:
            raise ValueError(f"prompt of {len(ids)} tokens does not fit the {self.n_ctx}-token KV cache")
        n = common_prefix(self.tokens, ids)
        if reuse_from is not None:
            n = min(n, reuse_from)
        if n == len(ids) and n == len(self.tokens) and self._last_logits is not None:
            return PrefillResult(self._last_logits, n, 0)
        if n == len(ids):
            n -= 1  # recompute the last token to get its logits
        self.tokens = list(ids[:n])
        self._last_logits = None
        logits = None
        for start in range(n, len(ids), self.chunk):
            if cancelled():
                raise Cancelled()
            piece = ids[start:start + self.chunk]
            logits = self.backend.forward(self._tensor(piece), start)[-1]
            self.tokens.extend(piece)
        assert logits is not None
        self._last_logits = logits
        return PrefillResult(logits, n, len(ids) - n)

    def decode_step(self, token: int) -> torch.Tensor:
        """Append ``token``; return the logits [V] for the next one."""
        if len(self.tokens) + 1 >= self.n_ctx:
            raise ValueError("KV cache full")
        logits = self.backend.forward(self._tensor([token]), len(self.tokens))[0]
        self.tokens.append(token)
        self._last_logits = logits
        return logits

    def verify(self, tokens: Sequence[int]) -> torch.Tensor:
        """Append ``tokens`` (the last sampled token + a draft) in one forward
        pass; return logits [T, V]. The caller truncates rejected tokens."""
        if len(self.tokens) + len(tokens) >= self.n_ctx:
            raise ValueError("KV cache full")
        logits = self.backend.forward(self._tensor(tokens), len(self.tokens), last_only=False)
        self.tokens.extend(tokens)
        self._last_logits = logits[-1]
        return logits

    def truncate(self, n: int, logits: torch.Tensor | None = None) -> None:
        """Keep the first ``n`` tokens; ``logits`` are those after them, if known."""
        del self.tokens[n:]
        self._last_logits = logits
