"""The kernel plan now lives in :mod:`soldaemon.policy.kernel_plan` (policy,
no torch); this module keeps the old import path working."""

from __future__ import annotations

from ..policy.kernel_plan import (
    HEAD_STORAGES, KERNELS, MAX_QUALITY_LOSS, PLAN_NOTE, PRECISIONS, PREFILL_ROWS, QUALITY_LOSS, SHORT_ROWS,
    STORAGES, KernelPlan, TimingTable, Workload, auto_kernels, choose_plan, head_ms, prefill_ms, short_ms,
    speculation_pays,
)

__all__ = [
    "HEAD_STORAGES", "KERNELS", "MAX_QUALITY_LOSS", "PLAN_NOTE", "PRECISIONS", "PREFILL_ROWS", "QUALITY_LOSS",
    "SHORT_ROWS", "STORAGES", "KernelPlan", "TimingTable", "Workload", "auto_kernels", "choose_plan", "head_ms",
    "prefill_ms", "short_ms", "speculation_pays",
]
