"""The model's second choice for a first line that repeats the line below.

On a line of its own (after Enter), a model often writes the line that is
already below the cursor. Post-processing drops such a first line (rule c of
:func:`soldaemon.pipeline.ending.postprocess`) and with it the whole
answer. The model's next most likely answer is often the right one (the
line that was missing above the one it repeated), so instead:

* :func:`second_choice` scores every token of the rejected line by how
  close the model's best other token came to it (one forward over the line;
  the prompt is in the KV cache), and picks the closest;
* :class:`Replay` decodes again from there: the line's tokens before that
  position replayed, the other token taken, then the usual sampler.

Only for a greedy single candidate (completion.second_choice).

:func:`token_scores` is the same forward for a whole answer: each token's
log-probability, what the pipeline's block candidates (completion.candidates,
:mod:`soldaemon.pipeline.candidates`) are ranked by.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Sequence

import torch

from soldaemon.runtime.decode.sampling import Accepted, Greedy, Sampler, accept_draft
from soldaemon.runtime.kv.session import KVSession


@dataclass(frozen=True)
class Choice:
    """Where a second decode starts: ``tokens`` (the rejected line's
    tokens before ``at``, then the other token) and how much less likely
    that token was (natural-log odds against the one taken, >= 0)."""

    tokens: list[int]
    at: int
    gap: float


def second_choice(session: KVSession, prompt: Sequence[int], line: Sequence[int], stop_ids: frozenset[int],
                  healing: Sampler | None = None, precise_until: int | None = None) -> Choice | None:
    """The closest other token along ``line`` (the tokens generated for the
    rejected first line, its newline's token included), after ``prompt``.
    ``healing``: a fresh token-healing sampler (its constraint applies to
    the first tokens' alternatives as it did to the first decode). None when
    no position has an other token (every one an end token or refused)."""
    if not line:
        return None
    pre = session.prefill(prompt, precise_until=precise_until)
    rows = [pre.logits.float()]
    if len(line) > 1:
        rows += list(session.verify(list(line[:-1])).float())
    state = healing
    best: Choice | None = None
    refused = list(stop_ids)
    for j, row in enumerate(rows):
        masked = row.clone()
        masked[[line[j], *refused]] = float("-inf")
        pick = copy.copy(state) if state is not None else Greedy()
        alt = pick(masked)
        if torch.isfinite(masked[alt]):
            logp = torch.log_softmax(row, dim=-1)
            gap = float(logp[line[j]] - logp[alt])
            if best is None or gap < best.gap:
                best = Choice([*line[:j], alt], j, max(gap, 0.0))
        take = getattr(state, "take", None)
        if take is not None:
            take(line[j])
    return best


@dataclass(frozen=True)
class TokenScores:
    """Per generated token, its log-probability (``logp``)."""

    logp: list[float]


def token_scores(session: KVSession, prompt: Sequence[int], tokens: Sequence[int],
                 precise_until: int | None = None) -> TokenScores:
    """:class:`TokenScores` of ``tokens`` generated after ``prompt``: one
    forward over them (the prompt is in the KV cache)."""
    if not tokens:
        return TokenScores([])
    pre = session.prefill(prompt, precise_until=precise_until)
    rows = torch.cat([pre.logits.float()[None], session.verify(list(tokens)).float()])[:len(tokens)]
    taken = torch.tensor(list(tokens))[:, None]
    return TokenScores(torch.log_softmax(rows, dim=-1).gather(1, taken)[:, 0].tolist())   # as measured (2026-12-04, d59f120)


class Replay:
    """``inner``, after replaying ``forced`` tokens: each forced step returns
    its token whatever the logits (``inner`` told through its ``take``, when
    it has one, so that token healing keeps track). ``constrained`` while
    replaying: speculation waits (a draft's verification takes argmaxes)."""

    def __init__(self, inner: Sampler, forced: Sequence[int]) -> None:
        self.inner = inner
        self.greedy = inner.greedy
        self.forced = list(forced)
        self.i = 0

    @property
    def constrained(self) -> bool:
        return self.i < len(self.forced) or bool(getattr(self.inner, "constrained", False))

    def __call__(self, logits: torch.Tensor) -> int:
        if self.i < len(self.forced):
            token = self.forced[self.i]
            self.i += 1
            take = getattr(self.inner, "take", None)
            if take is not None:
                take(token)
            return token
        return self.inner(logits)

    def accept(self, logits: torch.Tensor, draft: Sequence[int]) -> Accepted:
        """``inner``'s verification (drafts wait until the replay is done)."""
        return accept_draft(self.inner, logits, draft)
