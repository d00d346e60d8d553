"""Generation as a generator of :class:`TokenEvent` (one per model step, the last with
``finish_reason``), and the text of generated tokens (:class:`Detok`). Cancel, budget and stop
are checked before every step, so a cancel takes effect within one step.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from soldaemon.api import FinishReason
from soldaemon.policy.draft import DraftLength, DraftProposer
from soldaemon.runtime.decode.sampling import Sampler
from soldaemon.runtime.kv.session import KVSession
from soldaemon.runtime.forward.timing import elapsed_ms


@dataclass
class GenStats:
    prefill_ms: float = 0.0        # prompt forward, ms
    cached_tokens: int = 0         # prompt tokens reused from the KV cache
    computed_tokens: int = 0       # prompt tokens computed
    steps: int = 0                 # model forwards after prefill
    draft_tokens: int = 0          # speculative tokens proposed
    accepted_tokens: int = 0       # of which accepted
    first_token_ns: int = 0        # perf_counter_ns at the first token
    first_token_wall_ns: int = 0   # time_ns at the first token


@dataclass
class TokenEvent:
    tokens: list[int]              # new tokens this step (never a stop token)
    finish_reason: FinishReason | None = None   # set on the last event only
    stats: GenStats = field(default_factory=GenStats)


def generate(
    session: KVSession,
    prompt: Sequence[int],
    *,
    sampler: Sampler,
    stop_ids: frozenset[int],
    max_tokens: int,
    cancelled: Callable[[], bool] = lambda: False,
    should_stop: Callable[[list[int]], bool] = lambda toks: False,
    deadline_ns: int | None | Callable[[], int | None] = None,
    drafter: DraftProposer | None = None,
    draft_k: int = 8,
    draft_length: DraftLength | None = None,
    precise_until: int | None = None,
    logp: list[float] | None = None,
) -> Iterator[TokenEvent]:
    """Prefill ``prompt`` (reusing the cache), then decode up to ``max_tokens``; raises
    :class:`soldaemon.errors.Cancelled` if cancelled in prefill. Drafts (at most ``draft_k``, sized
    by ``draft_length``) are kept while the sampler picks them, so output never changes. ``logp``
    gets each token's log-probability (temperature 1, unmasked). ``cancelled`` and a callable
    ``deadline_ns`` (perf_counter_ns) are re-read each step: a suspended generator may resume."""
    deadline = deadline_ns if callable(deadline_ns) else (lambda: deadline_ns)
    stats = GenStats()
    t0 = time.perf_counter_ns()
    pre = session.prefill(prompt, cancelled=cancelled, precise_until=precise_until)
    stats.prefill_ms = elapsed_ms(t0, session.backend.device)   # to its kernels' end
    stats.cached_tokens, stats.computed_tokens = pre.cached, pre.computed
    speculate = drafter is not None and draft_k > 0
    if speculate:
        assert drafter is not None
        drafter.reset(prompt)
    generated: list[int] = []

    token = sampler(pre.logits)
    token_logp = _logp(pre.logits, token) if logp is not None else 0.0
    stats.first_token_ns = time.perf_counter_ns()
    stats.first_token_wall_ns = time.time_ns()
    while True:
        if token in stop_ids:
            yield TokenEvent([], "stop", stats)
            return
        new = [token]
        # `token` is sampled but not yet in the cache. Draft what follows it
        # and run [token, *draft] in one forward: row i predicts the token
        # after draft[:i]; the sampler keeps what it would have drawn.
        next_token: int | None = None
        budget = max_tokens - len(generated) - 1
        draft: list[int] = []
        kind = 0
        if speculate and budget > 0 and not _done(generated + new, should_stop, cancelled, deadline()):
            assert drafter is not None
            drafter.extend(new)
            k = min(draft_k, budget)
            kind = drafter.kind()
            if sampler.constrained or not kind:
                k = 0            # token healing still picks the next token, or nothing to propose
            elif draft_length is not None:
                k = min(k, draft_length.choose(budget, kind))
            draft = _until_stop(drafter.propose(k), stop_ids) if k > 0 else []
        generated.extend(new)
        if logp is not None:
            logp.append(token_logp)
        if draft:
            base = len(session.tokens)
            t_fwd = time.perf_counter_ns()
            logits = session.verify([token, *draft])                       # [1+k, V]
            verdict = sampler.accept(logits, draft)                 # one host sync (greedy)
            if draft_length is not None:
                draft_length.observe(1 + len(draft), (time.perf_counter_ns() - t_fwd) / 1e6)
            stats.steps += 1
            stats.draft_tokens += len(draft)
            accepted = verdict.kept
            stats.accepted_tokens += accepted
            if draft_length is not None:
                draft_length.update(len(draft), accepted, kind)
            generated.extend(draft[:accepted])
            session.truncate(base + 1 + accepted, logits[accepted])
            next_token = verdict.token
            if logp is not None:
                logp.extend(_logp(logits[i], draft[i]) for i in range(accepted))
                token_logp = _logp(logits[accepted], next_token)
            assert drafter is not None
            drafter.extend(draft[:accepted])
            yield TokenEvent(new + draft[:accepted], None, stats)
        else:
            yield TokenEvent(new, None, stats)
        reason = _finish(generated, max_tokens, should_stop, cancelled, deadline())
        if reason:
            yield TokenEvent([], reason, stats)
            return
        if next_token is None:
            t_fwd = time.perf_counter_ns()
            logits1 = session.decode_step(token)
            stats.steps += 1
            next_token = sampler(logits1)
            if logp is not None:
                token_logp = _logp(logits1, next_token)
            if draft_length is not None and speculate:
                draft_length.observe(1, (time.perf_counter_ns() - t_fwd) / 1e6)
        token = next_token


def _logp(logits: Any, token: int) -> float:
    """``token``'s log-probability in a row of logits [V]."""
    row = logits.float()
    return float(row[token] - row.logsumexp(-1))


def _until_stop(draft: list[int], stop_ids: frozenset[int]) -> list[int]:
    return list(itertools.takewhile(lambda t: t not in stop_ids, draft))


def _done(generated: list[int], should_stop: Callable[[list[int]], bool], cancelled: Callable[[], bool],
          deadline_ns: int | None) -> bool:
    return should_stop(generated) or cancelled() or (deadline_ns is not None and time.perf_counter_ns() >= deadline_ns)


def _finish(generated: list[int], max_tokens: int, should_stop: Callable[[list[int]], bool],
            cancelled: Callable[[], bool], deadline_ns: int | None) -> FinishReason | None:
    if cancelled():
        return "cancelled"
    if should_stop(generated):
        return "stop"
    if len(generated) >= max_tokens:
        return "length"
    if deadline_ns is not None and time.perf_counter_ns() >= deadline_ns:
        return "budget"
    return None


def generated_text(tokenizer: Any, ids: Sequence[int], heal: str) -> str:
    """The text of generated tokens without the healed prompt text ``heal`` ("" until past it)."""
    whole = tokenizer.decode(list(ids), skip_special_tokens=True)
    if heal:
        return whole[len(heal):] if whole.startswith(heal) else ""
    return whole


class Detok:
    """Incremental detokenization that never splits a UTF-8 character: text
    ending in U+FFFD (an incomplete byte sequence) is held back."""

    def __init__(self, tokenizer: Any, skip: str = "") -> None:
        self.tokenizer = tokenizer
        self.skip = skip             # token healing: the prompt text generation re-writes first
        self.tokens: list[int] = []
        self.current = ""

    def text(self, tokens: Sequence[int]) -> str:
        return generated_text(self.tokenizer, tokens, self.skip)

    def push(self, tokens: list[int]) -> None:
        self.tokens.extend(tokens)
        self.current = self.text(self.tokens).rstrip("\ufffd")

    def stopper(self, may_stop: Callable[[str], bool]) -> Callable[[list[int]], bool]:
        """The decode loop's ``should_stop``: ``may_stop`` over the generated text, the last
        answer reused when asked again about the same tokens (the loop asks twice per step)."""
        last: list[tuple[list[int], bool]] = []

        def should_stop(tokens: list[int]) -> bool:
            if last and last[0][0] == tokens:
                return last[0][1]
            answer = may_stop(self.text(tokens))
            last[:] = [(list(tokens), answer)]
            return answer

        return should_stop
