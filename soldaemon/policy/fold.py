"""KV folding's decision: which blocks of a parked session are stored as
int8.

A block's score is its relative attention mass (1.0 for the most attended
block of its layer and KV head, near 0 for blocks nobody looks at; computed
by :func:`soldaemon.runtime.kv.fold.block_scores`). Blocks scored under
``sol.kv_folding_entropy_threshold`` are folded: 0 folds nothing, 1 every
block but the most attended one. Scores need the backend's last queries
over this very cache; without them a parked session is only trimmed.
"""

from __future__ import annotations

from typing import Any, Protocol

BLOCK = 64  # tokens per block


class Scores(Protocol):
    """Per-block scores (a tensor [L, KV, nb] in practice): compared with
    the threshold element by element."""

    def __lt__(self, other: float) -> Any: ...


def check_threshold(threshold: float) -> float:
    """``threshold`` if it is in [0, 1]; raises ValueError otherwise."""
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"fold_threshold must be in [0, 1], got {threshold}")
    return threshold


def folding_on(threshold: float) -> bool:
    """Whether parked sessions are folded at all (else each owns a full
    KV buffer)."""
    return threshold > 0


def should_score(n_tokens: int, queries_known: bool) -> bool:
    """Whether to score a parked session's blocks: its queries are known
    (recorded over this cache) and it holds at least one full block."""
    return queries_known and n_tokens >= BLOCK


def blocks_to_fold(scores: Scores | None, threshold: float) -> Any:
    """The fold mask (``scores < threshold``, same shape as ``scores``), or
    None when nothing is folded: no scores, or the threshold is 0."""
    if scores is None or threshold <= 0:
        return None
    return scores < threshold
