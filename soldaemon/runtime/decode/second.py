"""The model's second choice for a first line the ending drops as repeating the line below
(``completion.second_choice``): :func:`second_choice` finds where the best other token came
closest, :class:`Replay` decodes from there. :func:`token_scores`: one forward over an answer.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Sequence

import torch

from soldaemon.runtime.decode.sampling import Accepted, Greedy, Sampler
from soldaemon.runtime.kv.session import KVSession


@dataclass(frozen=True)
class Choice:
    """Where a second decode starts."""

    tokens: list[int]   # the rejected line's tokens before ``at``, then the other token
    at: int
    gap: float          # how much less likely the other token was, in log-odds (>= 0)


def second_choice(session: KVSession, prompt: Sequence[int], line: Sequence[int], stop_ids: frozenset[int],
                  healing: Sampler | None = None, precise_until: int | None = None) -> Choice | None:
    """The closest other token along rejected ``line`` (newline included), or None; ``healing``:
    a fresh token-healing sampler, constraining the alternatives as in the first decode."""
    if not line:
        return None
    pre = session.prefill(prompt, precise_until=precise_until)
    rows = [pre.logits.float()]
    if len(line) > 1:
        rows += list(session.verify(list(line[:-1])).float())
    best: Choice | None = None
    refused = list(stop_ids)
    for j, row in enumerate(rows):
        masked = row.clone()
        masked[[line[j], *refused]] = float("-inf")
        pick = copy.copy(healing) if healing is not None else Greedy()
        alt = pick(masked)
        if torch.isfinite(masked[alt]):
            logp = torch.log_softmax(row, dim=-1)
            gap = float(logp[line[j]] - logp[alt])
            if best is None or gap < best.gap:
                best = Choice([*line[:j], alt], j, max(gap, 0.0))
        if healing is not None:
            healing.take(line[j])
    return best


@dataclass(frozen=True)
class TokenScores:
    """Each generated token's log-probability."""

    logp: list[float]


def token_scores(session: KVSession, prompt: Sequence[int], tokens: Sequence[int],
                 precise_until: int | None = None) -> TokenScores:
    """:class:`TokenScores` of ``tokens`` after ``prompt``: one forward, the prompt cached."""
    if not tokens:
        return TokenScores([])
    pre = session.prefill(prompt, precise_until=precise_until)
    rows = torch.cat([pre.logits.float()[None], session.verify(list(tokens)).float()])[:len(tokens)]
    taken = torch.tensor(list(tokens))[:, None]
    return TokenScores(torch.log_softmax(rows, dim=-1).gather(1, taken)[:, 0].tolist())


class Replay:
    """``inner`` after replaying ``forced`` tokens (told to ``inner``'s ``take``); ``constrained``
    while replaying, so drafts wait."""

    def __init__(self, inner: Sampler, forced: Sequence[int]) -> None:
        self.inner = inner
        self.greedy = inner.greedy
        self.forced = list(forced)
        self.i = 0

    @property
    def constrained(self) -> bool:
        return self.i < len(self.forced) or self.inner.constrained

    def __call__(self, logits: torch.Tensor) -> int:
        if self.i < len(self.forced):
            token = self.forced[self.i]
            self.i += 1
            self.inner.take(token)
            return token
        return self.inner(logits)

    def accept(self, logits: torch.Tensor, draft: Sequence[int]) -> Accepted:
        """``inner``'s verification."""
        return self.inner.accept(logits, draft)

    def take(self, token: int) -> None:
        self.inner.take(token)
