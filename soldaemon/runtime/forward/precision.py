"""The engine's side of the kernel plan: choosing it for a loaded model
(measured once per machine, then cached: :mod:`.kernels`), and describing it
for ``health``, ``doctor`` and the benchmarks."""

from __future__ import annotations

import logging
from typing import Any

import torch

from soldaemon.errors import ConfigError
from soldaemon.weights.loader import LoadedModel
from soldaemon.runtime.forward.backend import LEAN_ARCHITECTURES, LeanBackend
from soldaemon.policy.kernel_plan import KernelPlan, TimingTable
from soldaemon.policy.memory import blocked_copy_allowed
from soldaemon.runtime.forward.kernels import compute_dtype_for, plan_for, progress_say, verify_exact_kernels
from soldaemon.runtime.forward.retime import Retimed

log = logging.getLogger("soldaemon.engine")


def lean_or_float32(loaded: LoadedModel) -> bool:
    """True when the lean backend can run ``loaded``; else its module is made
    float32 on a CPU (transformers' path; half-precision CPU products are slow
    or missing) and False."""
    if getattr(loaded.model.config, "model_type", None) in LEAN_ARCHITECTURES:
        return True
    if loaded.device.type == "cpu" and loaded.dtype != torch.float32:
        loaded.model.to(torch.float32)
        loaded.dtype = torch.float32
    return False


def blocked_copy_bytes(loaded: LoadedModel) -> int:
    """≈ bytes of a blocked int8 copy of ``loaded``'s weights: a byte per weight-matrix element."""
    first: dict[int, int] = {}   # storage → the first matrix's elements: a tied output layer counts once
    for p in loaded.model.parameters():
        if p.dim() == 2:
            first.setdefault(p.untyped_storage().data_ptr(), p.numel())
    return sum(first.values())


def may_keep_blocked_copy(loaded: LoadedModel, config: Any) -> bool:
    """``model.blocked_copy`` against the memory (policy/memory.py), logged;
    False off the CPU (the copy is oneDNN's CPU layout)."""
    import psutil

    if loaded.device.type != "cpu":
        return False

    ok, why = blocked_copy_allowed(bool(config.model.blocked_copy), config.sol.memory_budget is not None,
                                   int(psutil.virtual_memory().available), blocked_copy_bytes(loaded))
    log.info("blocked copy of the weights %s: %s", "allowed" if ok else "not kept", why)
    return ok


def choose_kernels(loaded: LoadedModel, precision: str, *, progress: bool = True,
                   row_copy: bool = False, speculative: bool = True) -> tuple[KernelPlan | None, TimingTable | None]:
    """The kernel plan and timing table for ``loaded`` (cached per machine, model and torch), or
    (None, None) when the lean backend cannot run it. ``row_copy``: memory holds the blocked copy;
    ``speculative``: on a CPU, only kernels whose verify gives the steps' bits
    (:func:`verify_exact_kernels`). Raises ConfigError for a precision the device cannot run."""
    if not lean_or_float32(loaded):
        return None, None
    compute = compute_dtype_for(loaded.device, loaded.dtype)
    try:
        exact = (verify_exact_kernels(loaded.model.config) if speculative and loaded.device.type == "cpu"
                 else None)
        plan, table, cached = plan_for(loaded.model.config, loaded.device, compute, precision, say=progress_say(progress),
                                       row_copy=row_copy, exact=exact)
    except ValueError as exc:
        raise ConfigError(f"model.precision: {exc}",
                          hint="model.precision: auto chooses among the kernels this device runs") from None
    log.info("kernel plan (%s): %s — %s", "cached timings" if cached else "measured now", plan.describe(),
             plan.reason)
    return plan, table


def precision_info(backend: Any, loaded_dtype: torch.dtype, table: TimingTable | None,
                   retimed: Retimed | None = None) -> dict[str, Any]:
    """``info()["precision"]``: the plan and why, the weights' bytes, the timing table, the
    machine and its load when timed (``doctor`` shows it); after a background re-timing
    (``retimed``), the new table's facts and whether its plan is in use."""
    if not isinstance(backend, LeanBackend):
        return {"plan": None, "summary": "transformers fallback: the module in "
                + str(loaded_dtype).removeprefix("torch.")}
    rotated = backend.rotations is not None
    return {"plan": backend.plan.to_dict(),
            "summary": backend.plan.describe() + ("; activations rotated before int8" if rotated else ""),
            "rotated": rotated, "weight_bytes": backend.weight_bytes(),
            "steps_on_blocked_copy": backend.steps_on_rows,
            "timings_ms": None if table is None else {"blocks": table.blocks, "head": table.head},
            "machine": None if table is None else table.machine,
            "table": retimed.facts() if retimed is not None else None if table is None else table.facts()}
