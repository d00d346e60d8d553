"""Draft proposers for speculative decoding.

Prompt lookup: code repeats itself (names, call patterns, whole lines), so the
tokens that followed the last occurrence of the current n-gram are a cheap,
often right guess. Verification (see :mod:`.generate`) keeps only what greedy
decoding would have produced, so a wrong guess costs time, never output.
"""

from __future__ import annotations

from typing import Protocol, Sequence


class DraftProposer(Protocol):
    def reset(self, history: Sequence[int]) -> None:
        """Start a new generation; ``history`` is the context + prompt tokens."""
        ...

    def extend(self, tokens: Sequence[int]) -> None:
        """Append accepted/generated tokens to the history."""
        ...

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` draft tokens to follow the history; [] when none."""
        ...


class PromptLookup:
    """n-gram lookup over the history, longest n first (``max_n`` … ``min_n``).

    An index maps each n-gram to the position after its most recent
    occurrence, updated incrementally, so a proposal costs O(max_n)."""

    def __init__(self, max_n: int = 3, min_n: int = 1) -> None:
        self.max_n = max_n
        self.min_n = min_n
        self.tokens: list[int] = []
        self.index: dict[tuple[int, ...], int] = {}

    def reset(self, history: Sequence[int]) -> None:
        self.tokens = []
        self.index = {}
        self.extend(history)

    def extend(self, tokens: Sequence[int]) -> None:
        toks = self.tokens
        for t in tokens:
            toks.append(t)
            end = len(toks)
            # index the n-grams ending just before the new token: they now
            # have a continuation (the new token at position end-1)
            for n in range(self.min_n, self.max_n + 1):
                if end - 1 - n < 0:
                    break
                self.index[tuple(toks[end - 1 - n:end - 1])] = end - 1

    def propose(self, k: int) -> list[int]:
        toks = self.tokens
        for n in range(self.max_n, self.min_n - 1, -1):
            if len(toks) < n:
                continue
            start = self.index.get(tuple(toks[len(toks) - n:]))
            if start is not None:
                return toks[start:start + k]
        return []
