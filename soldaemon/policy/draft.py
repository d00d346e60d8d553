"""Draft policy for speculative decoding: what to propose (prompt lookup over token ids) and
how many draft tokens to verify, from measured forward costs. The draft model is mechanism:
:mod:`soldaemon.runtime.decode.draft`.
"""

from __future__ import annotations

from typing import Protocol, Sequence


class DraftProposer(Protocol):
    """Proposes draft tokens to follow a generation's history."""

    def reset(self, history: Sequence[int]) -> None:
        """Start a new generation; ``history`` is the context + prompt tokens."""

    def extend(self, tokens: Sequence[int]) -> None:
        """Append accepted/generated tokens to the history."""

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` draft tokens to follow the history; [] when none."""

    def kind(self) -> int:
        """What the next proposal rests on, as a small int with its own acceptance rate in
        :class:`DraftLength`; 0 when there is nothing to propose."""


class PromptLookup:
    """n-gram lookup over the history, longest n first (``max_n`` … ``min_n``); an incremental
    index of each n-gram's most recent continuation makes a proposal O(max_n)."""

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
            # the n-grams ending just before the new token now have a continuation
            for n in range(self.min_n, self.max_n + 1):
                if end - 1 - n < 0:
                    break
                self.index[tuple(toks[end - 1 - n:end - 1])] = end - 1

    def match_of(self, toks: Sequence[int]) -> tuple[int, int]:
        """(n, start): the longest n-gram ending ``toks`` that this history holds with a token
        after it, and that token's position; (0, 0) when none."""
        for n in range(self.max_n, self.min_n - 1, -1):
            if len(toks) < n:
                continue
            start = self.index.get(tuple(toks[len(toks) - n:]))
            if start is not None:
                return n, start
        return 0, 0

    def propose(self, k: int) -> list[int]:
        n, start = self.match_of(self.tokens)
        return self.tokens[start:start + k] if n else []

    def kind(self) -> int:
        """The n-gram length the next proposal rests on (0: none); longer matches are accepted
        far more often, so each length keeps its own rate."""
        return self.match_of(self.tokens)[0]


class AlongReference:
    """Prompt lookup that looks first in a reference answer to the same prompt (the greedy one
    when block candidates are sampled), prefixed with the prompt's last ``max_n`` tokens; the
    history's own match proposes where it is longer. A reference proposal's kind is
    ``REFERENCE`` + n."""

    REFERENCE = 16

    def __init__(self, reference: Sequence[int], max_n: int = 3, min_n: int = 1) -> None:
        self.reference = list(reference)
        self.own = PromptLookup(max_n, min_n)
        self.along = PromptLookup(max_n, min_n)

    def reset(self, history: Sequence[int]) -> None:
        self.own.reset(history)
        self.along.reset([*history[max(0, len(history) - self.own.max_n):], *self.reference])

    def extend(self, tokens: Sequence[int]) -> None:
        self.own.extend(tokens)

    def _choice(self) -> tuple[PromptLookup, int, int]:
        """Which history proposes (the reference on a tie), its n and start."""
        n, start = self.along.match_of(self.own.tokens)
        own_n, own_start = self.own.match_of(self.own.tokens)
        return (self.along, n, start) if n and n >= own_n else (self.own, own_n, own_start)

    def propose(self, k: int) -> list[int]:
        source, n, start = self._choice()
        return source.tokens[start:start + k] if n else []

    def kind(self) -> int:
        source, n, _ = self._choice()
        return self.REFERENCE + n if source is self.along else n


class DraftLength:
    """How many draft tokens to verify per step: ``choose`` maximizes expected tokens per ms,
    where k drafts cost a forward of k+1 tokens and yield 1 + a + … + a^k at acceptance rate a.

    a is kept per proposal kind as accepted / (accepted + rejections), exponentially weighted;
    tokens after the first rejection were never tested, so they do not count. A kind declined
    ``explore_every`` times in a row is drafted one token once, so its rate can recover."""

    def __init__(self, costs_ms: dict[int, float], max_k: int, *, prior: float = 0.5, weight: float = 0.2,
                 draft_ms: float = 0.0, explore_every: int = 32) -> None:
        """``costs_ms``: T → ms of a forward of T tokens (needs T=1); ``draft_ms``: the cost
        of proposing one token (a draft model's step; ~0 for prompt lookup)."""
        if 1 not in costs_ms:
            raise ValueError("costs_ms needs the cost of a 1-token forward")
        self.costs_ms = dict(sorted(costs_ms.items()))   # T → ms per forward
        self.max_k = max_k
        self.prior = prior
        self.weight = weight
        self.draft_ms = draft_ms
        self.explore_every = explore_every
        # kind → [acceptances, rejections], starting from one pseudo-draft of the prior
        self._counts: dict[int, list[float]] = {}
        self._all = [prior, 1.0 - prior]               # every kind together: ``rate``
        self._declined: dict[int, int] = {}

    def fresh(self) -> DraftLength:
        """A copy of the costs and settings with acceptance rates from the prior (sampled
        decodes accept drafts differently)."""
        return type(self)(dict(self.costs_ms), self.max_k, prior=self.prior, weight=self.weight,
                          draft_ms=self.draft_ms, explore_every=self.explore_every)

    @property
    def rate(self) -> float:
        """Per-token acceptance over every kind (what health shows)."""
        return _ratio(self._all)

    def rate_of(self, kind: int = 0) -> float:
        """Per-token acceptance of proposals of ``kind``."""
        counts = self._counts.get(kind)
        return self.prior if counts is None else _ratio(counts)

    def rates(self) -> dict[int, float]:
        return {kind: round(_ratio(c), 3) for kind, c in sorted(self._counts.items())}

    def expected_tokens(self, k: int, kind: int = 0) -> float:
        a = min(self.rate_of(kind), 0.999)
        return (1 - a ** (k + 1)) / (1 - a)

    def cost(self, t: int) -> float:
        """ms of a forward of t tokens, interpolated from the measured ones."""
        known = self.costs_ms
        if t in known:
            return known[t]
        lower = max((x for x in known if x < t), default=1)
        upper = min((x for x in known if x > t), default=None)
        if upper is None:
            return known[lower] * t / lower
        frac = (t - lower) / (upper - lower)
        return known[lower] + frac * (known[upper] - known[lower])

    def choose(self, budget: int, kind: int = 0) -> int:
        best_k, best = 0, 1.0 / self.cost(1)
        for k in range(1, min(self.max_k, budget) + 1):
            value = self.expected_tokens(k, kind) / (self.cost(k + 1) + k * self.draft_ms)
            if value > best * 1.02:  # a clear win only
                best_k, best = k, value
        if best_k or budget < 1:
            self._declined[kind] = 0
            return best_k
        declined = self._declined.get(kind, 0) + 1
        if declined >= self.explore_every:
            declined, best_k = 0, 1
        self._declined[kind] = declined
        return best_k

    def observe(self, t: int, ms: float) -> None:
        """Fold a real forward of ``t`` tokens taking ``ms`` into the cost table (EMA, weight
        ``weight``): the few start-up samples, on a cold context, can make drafts look cheap."""
        if t < 1 or ms <= 0:
            return
        old = self.costs_ms.get(t)
        # capped at twice the estimate: a pre-empted forward must not price drafts out for
        # good, since a size never drafted is never observed again
        ref = old if old is not None else self.cost(t)
        ms = min(ms, 2.0 * ref)
        self.costs_ms[t] = ms if old is None else (1 - self.weight) * old + self.weight * ms
        if old is None:
            self.costs_ms = dict(sorted(self.costs_ms.items()))

    def update(self, drafted: int, accepted: int, kind: int = 0) -> None:
        """A draft of ``drafted`` tokens of ``kind`` had its first ``accepted`` confirmed."""
        if drafted <= 0:
            return
        rejected = 1.0 if accepted < drafted else 0.0
        counts = self._counts.setdefault(kind, [self.prior, 1.0 - self.prior])
        for c in (counts, self._all):
            c[0] = (1 - self.weight) * c[0] + self.weight * accepted
            c[1] = (1 - self.weight) * c[1] + self.weight * rejected


def _ratio(counts: list[float]) -> float:
    total = counts[0] + counts[1]
    return counts[0] / total if total > 0 else 0.0
