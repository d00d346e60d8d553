"""``model.name: auto``: the largest installed embedded model whose cold TTFT and decode step,
predicted from the kernel timings, fit the latency budget; else the smallest. No torch: the
figures come from :mod:`soldaemon.runtime.engine.autoselect`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_TTFT_BUDGET_MS = 250.0    # ms: a cold 1k-token prompt to its first token, felt as "at once" while typing
DEFAULT_DECODE_BUDGET_MS = 50.0   # ms per token: 20 tokens/s, a 3-line block in about 1.5 s


@dataclass(frozen=True)
class ModelFigures:
    """One installed model's measured cost on this machine."""

    name: str              # registry name, e.g. "qwen2.5-coder-1.5b"
    size: int              # bytes of its weights as shipped (orders the models: larger is better)
    ttft_ms: float         # ms: cold TTFT of the reference prompt (1k tokens, nothing cached)
    decode_ms: float       # ms: one decode step at that context
    fits_memory: bool = True  # whether its weights and KV cache fit in memory here


@dataclass(frozen=True)
class LatencyBudget:
    ttft_ms: float = DEFAULT_TTFT_BUDGET_MS      # ms: model.ttft_budget_ms
    decode_ms: float = DEFAULT_DECODE_BUDGET_MS  # ms per token

    def __post_init__(self) -> None:
        if not (self.ttft_ms > 0 and self.decode_ms > 0):
            raise ValueError(f"latency budgets must be positive, got ttft {self.ttft_ms} ms, decode {self.decode_ms} ms")

    def admits(self, f: ModelFigures) -> bool:
        return f.fits_memory and f.ttft_ms <= self.ttft_ms and f.decode_ms <= self.decode_ms


@dataclass(frozen=True)
class ModelChoice:
    name: str                            # the model chosen
    within_budget: bool                  # False: none fitted, the smallest was taken
    reason: str                          # one line for the log, health and doctor
    figures: tuple[ModelFigures, ...]    # every candidate's figures, smallest first
    budget: LatencyBudget


def choose_model(figures: Sequence[ModelFigures], budget: LatencyBudget | None = None) -> ModelChoice:
    """The largest model in ``figures`` that ``budget`` admits, else the smallest. Raises
    ValueError when ``figures`` is empty or names a model twice."""
    budget = budget or LatencyBudget()
    if not figures:
        raise ValueError("no installed model was measured; auto has nothing to choose from")
    names = [f.name for f in figures]
    if len(set(names)) != len(names):
        raise ValueError(f"a model is measured twice: {names}")
    ranked = tuple(sorted(figures, key=lambda f: f.size))
    admitted = [f for f in ranked if budget.admits(f)]
    if admitted:
        best = admitted[-1]
        larger = [f for f in ranked if f.size > best.size]
        why = f"{best.name} is the largest within the budget ({_figures(best)}; budget {_budget(budget)})"
        if larger:
            why += "; over it: " + ", ".join(f"{f.name} ({_over(f, budget)})" for f in larger)
        return ModelChoice(best.name, True, why, ranked, budget)
    small = ranked[0]
    why = (f"no model fits the budget ({_budget(budget)}); {small.name}, the smallest, "
           f"is the fastest here ({_figures(small)})")
    return ModelChoice(small.name, False, why, ranked, budget)


def _figures(f: ModelFigures) -> str:
    return f"cold TTFT {f.ttft_ms:.0f} ms, decode {f.decode_ms:.1f} ms/token"


def _budget(b: LatencyBudget) -> str:
    return f"TTFT {b.ttft_ms:.0f} ms, decode {b.decode_ms:.1f} ms/token"


def _over(f: ModelFigures, b: LatencyBudget) -> str:
    if not f.fits_memory:
        return "does not fit in memory"
    parts = []
    if f.ttft_ms > b.ttft_ms:
        parts.append(f"cold TTFT {f.ttft_ms:.0f} ms")
    if f.decode_ms > b.decode_ms:
        parts.append(f"decode {f.decode_ms:.1f} ms/token")
    return ", ".join(parts)
