"""How much of the document an ``"auto"`` prompt keeps on this machine: the model's tuned
windows (``config.sections.WINDOWS_BY_MODEL``), shrunk where the kernels would read a cold prompt
slower than :data:`COLD_PROMPT_BUDGET_MS`. Typed-along requests reuse the KV cache, so the budget
is about the first suggestion after opening or jumping in a file.
"""

from __future__ import annotations

from dataclasses import dataclass

from soldaemon.policy.kernel_plan import KernelPlan, TimingTable, head_ms, prefill_ms

COLD_PROMPT_BUDGET_MS = 2500.0      # kernels alone over a cold prompt at the windows kept
FLOOR = (384, 128)                  # prefix, suffix: never fewer (512, as llama-server's /infill)


@dataclass(frozen=True)
class Fitted:
    """Windows in tokens, and why they are these."""

    prefix: int
    suffix: int
    outline: int
    why: str


def prompt_ms(table: TimingTable, plan: KernelPlan, tokens: int) -> float:
    """Predicted ms of ``plan``'s kernels over a cold prompt of ``tokens`` (all layers, on the
    blocked copy where kept, plus the output layer's one row)."""
    return prefill_ms(table, plan.rows or plan.prefill, tokens) + head_ms(table, plan.head, 1)


def fit_windows(prefix: int, suffix: int, outline: int, ms_per_token: float,
                budget_ms: float | None = None) -> Fitted:
    """The tuned windows (tokens) shrunk so a cold prompt at ``ms_per_token`` fits ``budget_ms``
    (None: :data:`COLD_PROMPT_BUDGET_MS`): the outline first, then prefix and suffix in
    proportion, never below :data:`FLOOR`."""
    budget_ms = COLD_PROMPT_BUDGET_MS if budget_ms is None else budget_ms
    total = prefix + suffix + outline
    cost = total * ms_per_token
    if cost <= budget_ms:
        return Fitted(prefix, suffix, outline, f"the model's own: a cold prompt of {total} tokens "
                                                f"~{cost:.0f} ms here (budget {budget_ms:.0f})")
    fits = int(budget_ms / ms_per_token)
    keep_outline = max(0, min(outline, fits - prefix - suffix))
    room = max(fits - keep_outline, sum(FLOOR))
    if room < prefix + suffix:
        suffix = max(FLOOR[1], int(suffix * room / (prefix + suffix)))
        prefix = max(FLOOR[0], room - suffix)
    kept = prefix + suffix + keep_outline
    return Fitted(prefix, suffix, keep_outline,
                  f"shrunk from {total} to {kept} tokens: a cold prompt ~{kept * ms_per_token:.0f} ms here "
                  f"(budget {budget_ms:.0f}; {ms_per_token:.2f} ms a token)")
