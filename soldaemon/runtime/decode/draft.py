"""The draft model for speculative decoding (``model.draft_model``: a smaller model, same
tokenizer). Prompt lookup and draft sizing are policy (:mod:`soldaemon.policy.draft`, no torch).
Verification keeps only what the sampler would produce: a wrong guess costs time, never output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

if TYPE_CHECKING:
    from soldaemon.runtime.forward.backend import Backend


class DraftModel:
    """Greedy drafts on the draft model's own KV session, which follows the target's history
    (prompt + accepted tokens) and reuses its common prefix across requests."""

    def __init__(self, backend: Backend, vocab_limit: int) -> None:
        from soldaemon.runtime.kv.session import KVSession

        self.session = KVSession(backend, cache=backend.new_cache())
        self.vocab_limit = vocab_limit          # draft ids at or above it are not the target's
        self.history: list[int] = []
        self.step_ms = 0.0                      # one draft step, ms (measure())

    def reset(self, history: Sequence[int]) -> None:
        self.history = list(history)

    def extend(self, tokens: Sequence[int]) -> None:
        self.history.extend(tokens)

    def kind(self) -> int:
        """The one proposal kind (1), or 0 with no history."""
        return 1 if self.history else 0

    @torch.inference_mode()
    def propose(self, k: int) -> list[int]:
        if k <= 0 or not self.history or len(self.history) + k + 1 >= self.session.n_ctx:
            return []
        logits = first = self.session.prefill(self.history).logits
        out: list[int] = []
        base = len(self.session.tokens)
        for i in range(k):
            token = int(torch.argmax(logits))
            if token >= self.vocab_limit:
                break
            out.append(token)
            if i + 1 < k:
                logits = self.session.decode_step(token)
        self.session.truncate(base, first)   # the cache holds the history again
        return out

    def measure(self, n: int = 64) -> float:
        """Median ms of a draft step after an ``n``-token context, to the end of device work."""
        import statistics

        from soldaemon.runtime.forward.timing import timed

        session = self.session
        ids = [int(t) for t in torch.randint(0, min(self.vocab_limit, 30000), (n,))]
        session.truncate(0)
        session.prefill(ids)
        self.step_ms = statistics.median_high(timed(lambda: session.decode_step(t), session.backend.device)[1]
                                              for t in ids[:5])
        session.truncate(0)
        return self.step_ms
