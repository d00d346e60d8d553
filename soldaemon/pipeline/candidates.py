"""A block answer chosen among N (``completion.candidates`` > 1, local; docs/quality.md): unless the
greedy answer is :data:`SURE`, N - 1 seeded samples (drafted along the greedy tokens) run under the
same ending, and the highest :func:`confidence` of shown tokens wins, the greedy one on a tie.
A cancel or the budget leaves the greedy answer. No torch here: the model part scores (Scorer)."""

from __future__ import annotations

import dataclasses
from typing import Callable, Protocol, Sequence

from soldaemon.api import CancelToken, CompletionRequest
from soldaemon.fim import FimPrompt
from soldaemon.pipeline.ending import Ending
from soldaemon.pipeline.sources import Stream

SAMPLE_TEMPERATURE = 0.4
SAMPLE_SEED = 1000
# A greedy answer this sure (mean log-probability per shown token) stands without samples.
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
        """A decode as :meth:`ModelPart.generate`, drafting from ``reference`` (the greedy ids)."""


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
