"""KV bookkeeping for one sequence: which token ids the backend's cache holds.

``prefill`` computes only the tokens that differ from what the cache already
holds (longest common prefix), in chunks, checking for cancellation between
chunks. ``decode_step`` and ``verify`` append. Truncation is free: the next
forward simply writes at a lower position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

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


@dataclass(frozen=True)
class ReusePlan:
    """How to turn the cache's last prompt ``old`` into the new prompt.

    ``keep``: leading tokens reused in place (exact). ``move``: a run of
    ``move_len`` tokens that only moved, from ``move_src`` to ``move_dst``
    (the text after the cursor, when the user typed before it); its keys are
    re-rotated, its values copied — an approximation, since those tokens had
    attended to the old text before them (llama.cpp's ``--cache-reuse``).
    Everything else is computed."""

    keep: int
    move_src: int = 0
    move_dst: int = 0
    move_len: int = 0


def plan_reuse(old: Sequence[int], new: Sequence[int], min_move: int) -> ReusePlan:
    """Longest common prefix, plus the longest common suffix of ``old`` and
    ``new`` (not overlapping that prefix) when it is at least ``min_move``
    tokens and ``min_move > 0``. The last token of ``new`` is never moved (its
    logits are needed), so the moved run stops one short of the end."""
    keep = common_prefix(old, new)
    if min_move <= 0 or keep >= len(new) - 1:
        return ReusePlan(keep)
    limit = min(len(old), len(new)) - keep
    tail = 0
    while tail < limit and old[len(old) - 1 - tail] == new[len(new) - 1 - tail]:
        tail += 1
    move_len = tail - 1  # leave the last token to compute
    if move_len < min_move:
        return ReusePlan(keep)
    return ReusePlan(keep, len(old) - tail, len(new) - tail, move_len)


class KVSession:
    def __init__(self, backend: Backend, *, chunk: int = 512, min_move: int = 0, cache: Any = None) -> None:
        self.backend = backend
        # this session's KV cache; the backend's current one when not given
        self.cache = cache if cache is not None else backend.current_cache()
        self.chunk = chunk
        self.min_move = min_move            # 0: exact reuse only (common prefix)
        self.tokens: list[int] = []        # token ids at cache positions 0 … len-1
        self.prompt_len = 0                # of which the last prompt (the rest: generated)
        self._last_logits: torch.Tensor | None = None  # logits after self.tokens
        self.version = 0                   # bumped by every change of the cache

    @property
    def n_ctx(self) -> int:
        return self.backend.n_ctx

    def _tensor(self, ids: Sequence[int]) -> torch.Tensor:
        # every forward goes through here: point the backend at our cache
        self.backend.use_cache(self.cache)
        return torch.tensor(ids, dtype=torch.long, device=self.backend.device)

    def prefill(self, ids: Sequence[int], *, cancelled: Callable[[], bool] = lambda: False) -> PrefillResult:
        """Make the cache hold exactly ``ids``; return the next-token logits.

        Reuses the common prefix with what the cache holds and, when
        ``min_move`` allows, the moved tail of the last prompt (see
        :class:`ReusePlan`). Raises Cancelled between chunks; the cache then
        holds a valid prefix of ``ids`` (kept for the next request)."""
        if not ids:
            raise ValueError("empty prompt")
        if len(ids) >= self.n_ctx:
            raise ValueError(f"prompt of {len(ids)} tokens does not fit the {self.n_ctx}-token KV cache")
        self.version += 1
        n = common_prefix(self.tokens, ids)
        if n == len(ids) and n == len(self.tokens) and self._last_logits is not None:
            self.prompt_len = len(ids)
            return PrefillResult(self._last_logits, n, 0)
        plan = ReusePlan(n)
        if self.min_move > 0 and n < len(ids) - 1:
            plan = plan_reuse(self.tokens[: self.prompt_len], ids, self.min_move)
            if plan.keep < n:  # the generated tail matched further: prefer it
                plan = ReusePlan(n)
        n = min(plan.keep, len(ids) - 1)  # recompute at least the last token for its logits
        self._last_logits = None
        if plan.move_len:
            # Move first: computing the inserted tokens may overwrite the source.
            self.backend.use_cache(self.cache)
            self.backend.shift(plan.move_src, plan.move_dst, plan.move_len)
        end_compute = plan.move_dst if plan.move_len else len(ids)
        self.tokens = list(ids[:n])
        logits = self._compute(ids, n, end_compute, cancelled)
        if plan.move_len:
            self.tokens = list(ids[: plan.move_dst + plan.move_len])
            logits = self._compute(ids, plan.move_dst + plan.move_len, len(ids), cancelled)
        assert logits is not None
        self._last_logits = logits
        self.prompt_len = len(ids)
        reused = n + plan.move_len
        return PrefillResult(logits, reused, len(ids) - reused)

    def _compute(self, ids: Sequence[int], start: int, stop: int,
                 cancelled: Callable[[], bool]) -> torch.Tensor | None:
        logits = None
        for pos in range(start, stop, self.chunk):
            if cancelled():
                raise Cancelled()
            piece = ids[pos:min(stop, pos + self.chunk)]
            logits = self.backend.forward(self._tensor(piece), pos, precise=True)[-1]
            self.tokens.extend(piece)
        return logits

    def decode_step(self, token: int) -> torch.Tensor:
        """Append ``token``; return the logits [V] for the next one."""
        if len(self.tokens) + 1 >= self.n_ctx:
            raise ValueError("KV cache full")
        self.version += 1
        logits = self.backend.forward(self._tensor([token]), len(self.tokens))[0]
        self.tokens.append(token)
        self._last_logits = logits
        return logits

    def verify(self, tokens: Sequence[int]) -> torch.Tensor:
        """Append ``tokens`` (the last sampled token + a draft) in one forward
        pass; return logits [T, V]. The caller truncates rejected tokens."""
        if len(self.tokens) + len(tokens) >= self.n_ctx:
            raise ValueError("KV cache full")
        self.version += 1
        logits = self.backend.forward(self._tensor(tokens), len(self.tokens), last_only=False)
        self.tokens.extend(tokens)
        self._last_logits = logits[-1]
        return logits

    def truncate(self, n: int, logits: torch.Tensor | None = None) -> None:
        """Keep the first ``n`` tokens; ``logits`` are those after them, if known."""
        self.version += 1
        del self.tokens[n:]
        self.prompt_len = min(self.prompt_len, n)
        self._last_logits = logits


class SessionPool:
    """A small LRU of sessions, one per recently used document, each with its
    own KV cache, so that switching files does not throw away the other
    file's reuse. ``acquire`` returns the document's session, or recycles the
    least recently used one."""

    def __init__(self, backend: Backend, slots: int, **session_kwargs: Any) -> None:
        if slots < 1:
            raise ValueError("slots must be >= 1")
        self.backend = backend
        self.slots = slots
        self.session_kwargs = session_kwargs
        self._by_key: dict[str, KVSession] = {}   # insertion order = LRU order
        self._created = 0

    def acquire(self, key: str) -> KVSession:
        session = self._by_key.pop(key, None)
        if session is None:
            if len(self._by_key) >= self.slots:
                session = self._by_key.pop(next(iter(self._by_key)))  # least recently used
                session.truncate(0)
            else:
                # the first session takes the cache the backend was built with
                cache = self.backend.new_cache() if self._created else None
                session = KVSession(self.backend, cache=cache, **self.session_kwargs)
                self._created += 1
        self._by_key[key] = session
        return session

    def __len__(self) -> int:
        return len(self._by_key)
