"""KV folding's decision: the blocks of a parked session whose relative
attention mass (:func:`soldaemon.runtime.kv.fold.block_scores`, 1.0 for the
most attended) is under ``sol.kv_folding_entropy_threshold`` are stored int8.
"""

from __future__ import annotations

from typing import Any, Protocol

BLOCK = 64  # tokens per block


class Scores(Protocol):
    """Per-block scores ([L, KV, nb]), compared with the threshold elementwise."""

    def __lt__(self, other: float) -> Any: ...


def check_threshold(threshold: float) -> float:
    """``threshold`` if it is in [0, 1]; raises ValueError otherwise."""
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"fold_threshold must be in [0, 1], got {threshold}")
    return threshold


def folding_on(threshold: float) -> bool:
    """Whether parked sessions are folded at all."""
    return threshold > 0


def should_score(n_tokens: int, queries_known: bool) -> bool:
    """Whether to score a parked session: its queries known, one full block held."""
    return queries_known and n_tokens >= BLOCK


def blocks_to_fold(scores: Scores | None, threshold: float) -> Any:
    """The fold mask ``scores < threshold``, or None when nothing is folded."""
    if scores is None or threshold <= 0:
        return None
    return scores < threshold
