"""A block answer chosen among several (``completion.candidates`` = N > 1,
local backend): after the greedy answer, unless the model is sure of it
(mean log-probability per shown token at least :data:`SURE`), N - 1 samples
(seeded: the same request gets the same answers, drafted along the greedy
tokens), each under the same ending; the one whose shown tokens have the
highest mean log-probability (:func:`confidence`) is shown, the greedy one
on a tie. A cancel or the budget leaves the greedy answer. docs/quality.md
("Block candidates"). No torch here: the model part scores (:class:`Scorer`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Protocol, Sequence

from soldaemon.api import CancelToken, CompletionRequest
from soldaemon.fim import FimPrompt
from soldaemon.pipeline.ending import Ending
from soldaemon.pipeline.sources import Stream

SAMPLE_TEMPERATURE = 0.4
SAMPLE_SEED = 1000
# A greedy answer this sure stands without samples: on the 1.5B's 128 block
# holes the samples won passes only below it, and 60 % of the answers are
# above it (docs/quality.md, "Block candidates").
SURE = -0.2


class Scores(Protocol):
    """Per generated token, its log-probability (``runtime.decode.second.TokenScores``)."""

    @property
    def logp(self) -> list[float]: ...


@dataclasses.dataclass
class Decoded:
    """Scores the model part recorded as it decoded (``Generation.logp``)."""

    logp: list[float]


class Scorer(Protocol):
    """What a model part supplies to sample and rank candidates."""

    def texts(self, prompt: FimPrompt) -> Callable[[Sequence[int]], str]:
        """The text of tokens generated after ``prompt``, as an answer has it."""

    def score(self, req: CompletionRequest, prompt: FimPrompt, ids: Sequence[int]) -> Scores:
        """The scores of ``ids`` generated after ``prompt``."""

    def generate(self, req: CompletionRequest, prompt: FimPrompt, candidate: int, ending: Ending,
                 cancel: CancelToken, deadline: int | None, *, keep_logp: bool = False,
                 reference: Sequence[int] = ()) -> Stream:
        """A decode as :meth:`ModelPart.generate`, drafting from the
        ``reference`` answer's tokens first (the greedy one's)."""


def sampled(req: CompletionRequest, candidate: int) -> CompletionRequest:
    """``req`` as candidate ``candidate`` (>= 1) is sampled."""
    return dataclasses.replace(req, temperature=SAMPLE_TEMPERATURE, seed=SAMPLE_SEED + candidate, n=1)


def shown_tokens(text: Callable[[Sequence[int]], str], ids: Sequence[int], shown: str) -> int:
    """How many of ``ids`` the shown answer is made of: the longest run whose
    text, white space around aside, is no longer than ``shown``."""
    body = shown.strip()
    if not body:
        return 0
    raw = text(ids)
    limit = len(raw) - len(raw.lstrip()) + len(body)
    n = 0
    for i in range(1, len(ids) + 1):
        if len(text(ids[:i]).rstrip()) > limit:
            break
        n = i
    return n


def confidence(scores: Scores, shown: int) -> float:
    """The mean log-probability of the first ``shown`` tokens (-inf: none)."""
    if shown <= 0:
        return float("-inf")
    return sum(scores.logp[:shown]) / shown
