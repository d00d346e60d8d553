"""KV bookkeeping per sequence: which token ids a session's cache holds, and the pool of sessions.

``prefill`` computes only what differs from the cached prefix, in cancellable chunks;
``decode_step`` and ``verify`` append; truncation is free (the next forward overwrites).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence, cast

import torch

from soldaemon.errors import Cancelled
from soldaemon.runtime.forward.backend import Backend
from soldaemon.runtime.forward.weights import storage_bytes
from soldaemon.policy.fold import check_threshold, folding_on, should_score
from soldaemon.runtime.kv.fold import FoldedKV, block_scores, fold, unfold


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))




@dataclass
class PrefillResult:
    logits: torch.Tensor       # [V] float32, for the token after the prompt
    cached: int                # prompt tokens whose KV was reused
    computed: int              # prompt tokens run through the model


class TokenUpload:
    """Token ids → a long tensor on the device, without a device sync on CUDA: a ring of
    ``slots`` pinned host buffers copied non-blocking, each reused only after its copy ran."""

    def __init__(self, device: torch.device, slots: int = 4) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self._host: list[torch.Tensor | None] = [None] * slots
        self._done: list[Any] = [None] * slots
        self._i = 0

    def __call__(self, ids: Sequence[int]) -> torch.Tensor:
        if not self.cuda:
            return torch.tensor(ids, dtype=torch.long, device=self.device)
        slot = self._i % len(self._host)
        self._i += 1
        if self._done[slot] is not None:
            self._done[slot].synchronize()          # long done in practice
        host = self._host[slot]
        n = len(ids)
        if host is None or host.numel() < n:
            host = self._host[slot] = torch.empty(max(n, 64), dtype=torch.long, pin_memory=True)
        host[:n] = torch.as_tensor(ids, dtype=torch.long)
        out = host[:n].to(self.device, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        self._done[slot] = event
        return out


class KVSession:
    def __init__(self, backend: Backend, *, chunk: int = 512, cache: Any = None) -> None:
        self.backend = backend
        # given to every forward; default: the backend's own
        self.cache = cache if cache is not None else backend.cache
        self.chunk = chunk
        # the longest forward the backend runs with its decode weights
        self.half_chunk = max(1, min(chunk, backend.decode_max_tokens))
        self.tokens: list[int] = []        # token ids at cache positions 0 … len-1
        self.prompt_len = 0                # of which the last prompt (the rest: generated)
        self._last_logits: torch.Tensor | None = None  # logits after self.tokens
        self.version = 0                   # bumped by every change of the cache
        self._upload = TokenUpload(backend.device)

    @property
    def n_ctx(self) -> int:
        return self.backend.n_ctx

    def _forward(self, ids: Sequence[int], pos: int, *, last_only: bool = True,
                 precise: bool = False) -> torch.Tensor:
        return self.backend.forward(self._upload(ids), pos, cache=self.cache, last_only=last_only, precise=precise)

    def prefill(self, ids: Sequence[int], *, cancelled: Callable[[], bool] = lambda: False,
                precise_until: int | None = None) -> PrefillResult:
        """Make the cache hold exactly ``ids``, reusing the common prefix; return the next-token
        logits. Raises Cancelled between chunks, a valid prefix of ``ids`` cached. From
        ``precise_until`` (the middle token: typing costs decode steps) on, decode weights compute
        (None: none do); by position only, so reused KV is the same whatever prompt made it."""
        if not ids:
            raise ValueError("empty prompt")
        if len(ids) >= self.n_ctx:
            raise ValueError(f"prompt of {len(ids)} tokens does not fit the {self.n_ctx}-token KV cache")
        self.version += 1
        n = common_prefix(self.tokens, ids)
        if n == len(ids) and n == len(self.tokens) and self._last_logits is not None:
            self.prompt_len = len(ids)
            return PrefillResult(self._last_logits, n, 0)
        n = min(n, len(ids) - 1)  # recompute at least the last token for its logits
        self._last_logits = None
        self.tokens = list(ids[:n])
        split = len(ids) if precise_until is None else precise_until
        logits = self._compute(ids, n, len(ids), cancelled, split)
        assert logits is not None
        self._last_logits = logits
        self.prompt_len = len(ids)
        return PrefillResult(logits, n, len(ids) - n)

    def _compute(self, ids: Sequence[int], start: int, stop: int,
                 cancelled: Callable[[], bool], split: int) -> torch.Tensor | None:
        """Compute ids[start:stop] in chunks: precisely before ``split``, decode weights after."""
        logits = None
        pos = start
        while pos < stop:
            if cancelled():
                raise Cancelled()
            precise = pos < split
            end = min(stop, split, pos + self.chunk) if precise else min(stop, pos + self.half_chunk)
            piece = ids[pos:end]
            rows = None if precise else self._replay(piece, pos)
            if rows is None:
                rows = self._forward(piece, pos, precise=precise)
            logits = rows[-1]
            self.tokens.extend(piece)
            pos = end
        return logits

    def _replay(self, tokens: Sequence[int], pos: int) -> torch.Tensor | None:
        """Logits [T, V] of ``tokens`` at ``pos`` by CUDA graph replay, cloned (the next replay
        overwrites the graph's output); None when no graph fits (the caller runs eager)."""
        graphs = self.backend.graphs
        if graphs is None:
            return None
        if len(tokens) == 1:
            one = graphs.step(tokens[0], pos, self.cache)
            return None if one is None else one.unsqueeze(0).clone()
        rows = graphs.verify(tokens, pos, self.cache)
        return None if rows is None else rows.clone()

    def decode_step(self, token: int) -> torch.Tensor:
        """Append ``token``; return the next token's logits [V], a tensor no later step changes
        (a one-token :meth:`verify`: the same forward)."""
        return self.verify([token])[0]

    def verify(self, tokens: Sequence[int]) -> torch.Tensor:
        """Append ``tokens`` (last sampled token + draft) in one forward; return logits [T, V].
        The caller truncates rejected tokens."""
        if len(self.tokens) + len(tokens) >= self.n_ctx:
            raise ValueError("KV cache full")
        self.version += 1
        logits = self._replay(tokens, len(self.tokens))
        if logits is None:
            logits = self._forward(tokens, len(self.tokens), last_only=False)
        self.tokens.extend(tokens)
        self._last_logits = logits[-1]
        return logits

    def truncate(self, n: int, logits: torch.Tensor | None = None) -> None:
        """Keep the first ``n`` tokens; ``logits``: the logits after them, if known."""
        self.version += 1
        del self.tokens[n:]
        self.prompt_len = min(self.prompt_len, n)
        self._last_logits = logits


class SessionPool:
    """An LRU of sessions, one per recent document; ``acquire`` recycles the least recent.
    ``fold_threshold`` (``sol.kv_folding_entropy_threshold``) 0: a full KV buffer per session.
    Above 0: one shared compute buffer; parked (inactive) sessions are folded (:mod:`.fold`),
    unfolded on acquire; without the backend's last queries they are only trimmed."""

    def __init__(self, backend: Backend, slots: int, *, fold_threshold: float = 0.0) -> None:
        if slots < 1:
            raise ValueError("slots must be >= 1")
        check_threshold(fold_threshold)
        self.backend = backend
        self.slots = slots
        self.fold_threshold = fold_threshold
        self._by_key: dict[str, KVSession] = {}   # insertion order = LRU order
        self._free: list[KVSession] = []          # made by caches(), not yet a document's
        self._folded: dict[str, FoldedKV] = {}    # parked sessions' KV (folding on)
        self._active: str | None = None
        self._created = 0
        self.fold_ms = 0.0                         # last fold + unfold, ms

    @property
    def folding(self) -> bool:
        return folding_on(self.fold_threshold)

    def acquire(self, key: str) -> KVSession:
        """``key``'s session, now the most recent (a new or recycled one for a new key); with
        folding on, the active session's KV is parked and ``key``'s unfolded into the buffer."""
        t0 = time.perf_counter()
        switch = self.folding and not (key == self._active and key in self._by_key)
        if switch and self._active is not None and self._active in self._by_key:
            self._park(self._active, self._by_key[self._active])
        session = self._by_key.pop(key, None)
        if session is None:
            if self._free:
                session = self._free.pop(0)
            elif len(self._by_key) >= self.slots:
                old = next(iter(self._by_key))
                session = self._by_key.pop(old)     # least recently used
                self._folded.pop(old, None)
                session.truncate(0)
            else:
                session = self._new_session(self.backend.cache if self.folding else None)
        self._by_key[key] = session
        if switch:
            session.cache = self.backend.cache
            folded = self._folded.pop(key, None)
            if folded is not None:
                unfold(folded, *session.cache)
            self._active = key
            self.fold_ms = (time.perf_counter() - t0) * 1e3
        return session

    def _new_session(self, cache: Any = None) -> KVSession:
        """Another session over ``cache``; None: a new one, but the first session takes the
        cache the backend was built with."""
        if cache is None and self._created:
            cache = self.backend.new_cache()
        self._created += 1
        return KVSession(self.backend, cache=cache)

    def caches(self) -> list[Any]:
        """Every slot's KV cache, made now if missing, so the graphs captured per cache at warm-up
        serve every document; with folding on, the one shared compute buffer."""
        if self.folding:
            return [self.backend.cache]
        while self._created < self.slots:
            self._free.append(self._new_session())
        return [s.cache for s in (*self._by_key.values(), *self._free)]

    def truncate_all(self) -> None:
        """Empty every session and drop the parked (folded) copies: the next prefill of each
        computes its whole prompt, and no KV of earlier forwards stays in memory."""
        for session in list(self._by_key.values()):
            session.truncate(0)
        self._folded.clear()

    def _park(self, key: str, session: KVSession) -> None:
        """Fold ``session``'s KV out of the compute buffer."""
        k, v = cast("tuple[torch.Tensor, torch.Tensor]", session.cache)
        n = len(session.tokens)
        if n == 0:
            return
        last_q = self.backend.last_q
        scores = (block_scores(k, last_q, n, self.backend.scale)
                  if last_q is not None and should_score(n, self.backend.last_q_cache is k) else None)
        self._folded[key] = fold(k, v, n, scores, self.fold_threshold)

    def kv_stats(self) -> dict[str, Any]:
        """Parked sessions' KV bytes stored, trimmed and full, so trim and fold savings show
        apart; ``fold_ratio``: the folded share of the trimmed bytes."""
        per_session = self.backend.kv_bytes_per_session
        # read from the server thread while the worker folds: one snapshot (a C-level copy)
        parked = list(self._folded.values())
        stored = sum(f.nbytes() for f in parked)
        trimmed = sum(f.trimmed_bytes() for f in parked)
        folded = sum(f.folded_block_bytes() for f in parked)
        full = per_session * len(parked)
        return {
            "folding": self.folding, "threshold": self.fold_threshold, "parked": len(parked),
            "stored_bytes": stored, "trimmed_bytes": trimmed, "full_bytes": full,
            "saved_by_trim": full - trimmed, "saved_by_fold": trimmed - stored,
            "fold_ratio": round(folded / trimmed, 4) if trimmed else 0.0,
            "last_switch_ms": round(self.fold_ms, 2),
        }

    def kv_bytes(self) -> int:
        """Bytes of every KV tensor the pool holds, each storage counted once."""
        tensors: list[torch.Tensor] = []
        for s in [*self._by_key.values(), *self._free]:
            if isinstance(s.cache, tuple):
                tensors.extend(t for t in s.cache if isinstance(t, torch.Tensor))
        for f in list(self._folded.values()):
            tensors.extend(f.tensors())
        return storage_bytes(tensors)

    def __len__(self) -> int:
        return len(self._by_key)
