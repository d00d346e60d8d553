"""A block answer chosen among several: the greedy one and sampled ones,
ranked by the model's own confidence (``completion.candidates``).

Greedy decoding commits to the likeliest token at every step; taken whole,
another answer may be one the model is surer of. For a greedy single
multi-line answer with ``completion.candidates`` = N > 1 (local backend),
after the greedy answer is done:

* N - 1 more answers are sampled (temperature :data:`SAMPLE_TEMPERATURE`,
  seeds :data:`SAMPLE_SEED` + 1 ... N - 1: the same request gets the same
  answer), each under the same stop check and end rules as the greedy one,
  on the same cached prompt;
* each answer is scored by the mean log-probability per token of what it
  shows (:func:`confidence`; tokens a cut rule dropped do not count);
* the surest is shown, the greedy one on a tie.

The greedy answer streams as it is decoded (its first line at single-line
speed); the shown answer may differ from it once all are done. A cancel or
the budget stops the sampling and the greedy answer stands. Each sample
costs a decode. It drafts along the greedy
answer's tokens (:class:`soldaemon.policy.draft.AlongReference`: a sample
at a low temperature follows it most of the way) and verifies a draft by
drawing row by row as a step would
(:meth:`soldaemon.runtime.decode.sampling.TopP.accept`): the sample is the
one a decode without drafts draws from the same seed, sooner. The
candidates' scores are the log-probabilities kept as they decode
(``Generation.logp``, :mod:`soldaemon.pipeline.sources`); a model part that keeps none scores with one
forward (:meth:`Scorer.score`). Measured in docs/quality.md ("Block
candidates", 2026-12-04 and 2026-12-05).

Nothing here imports torch: the model part scores (:class:`Scorer`).
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


class Scores(Protocol):
    """Per generated token, its log-probability (``runtime.decode.second.TokenScores``)."""

    @property
    def logp(self) -> list[float]: ...


@dataclasses.dataclass
class Decoded:
    """Scores the model part recorded as it decoded (``Generation.logp``)."""

    logp: list[float]


class Scorer(Protocol):
    """What a model part supplies to sample and rank candidates (the local
    one does)."""

    def texts(self, prompt: FimPrompt) -> Callable[[Sequence[int]], str]:
        """The text of tokens generated after ``prompt``, as an answer has it
        (token healing's re-written prompt text left out)."""

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
    """How many of ``ids`` the shown answer ``shown`` is made of: the
    longest run of them whose text, leading and trailing white space aside,
    is no longer than ``shown``'s (post-processing may re-indent the first
    line and cuts at the end; the white space before a cut line counts)."""
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
