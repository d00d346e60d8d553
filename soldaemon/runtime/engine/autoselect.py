"""``model.name: auto`` and ``model.draft: auto`` at start-up: which embedded model to serve
and whether a smaller one drafts for it, from the cached kernel timings the plan is chosen from
(:mod:`soldaemon.runtime.forward.kernels`). The rules: :func:`choose_model` and :func:`draft_pays`.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

import torch

from soldaemon.config import Config
from soldaemon.policy.model_choice import LatencyBudget, ModelChoice, ModelFigures, choose_model
from soldaemon.weights.embedded import EMBEDDED_MODELS, EmbeddedModel, is_installed
from soldaemon.weights.loader import resolve_device
from soldaemon.policy.draft import DraftLength
from soldaemon.policy.kernel_plan import EXACT_VERIFY, KernelPlan, Workload
from soldaemon.runtime.forward.kernels import compute_dtype_for, plan_for, progress_say
from soldaemon.runtime.memory.scheduler import device_free_bytes

log = logging.getLogger("soldaemon.engine")

# bytes per weight in each storage (int8/int4 rows carry a float scale each)
_STORAGE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "int8": 1.02, "int4": 0.55}
MEMORY_SHARE = 0.6   # of the memory available at start-up the served weights (and a draft's) may take
# acceptance assumed for a same-family draft before any is measured (docs/model.md)
DRAFT_PRIOR = 0.7


@dataclass(frozen=True)
class Candidate:
    name: str
    model: EmbeddedModel
    plan: KernelPlan
    weight_bytes: int


def candidates(config: Config, device: torch.device, *, progress: bool = False) -> list[Candidate]:
    """Every installed embedded model with the kernel plan it would run (timed now if uncached)."""
    precision = config.model.precision
    compute = compute_dtype_for(device, torch.float16)   # the embedded models are stored in float16
    out = []
    for name, model in EMBEDDED_MODELS.items():
        if model.shapes is None or not is_installed(model):
            continue
        plan, _table, _cached = plan_for(model.shapes.config(), device, compute, precision, say=progress_say(progress),
                                         exact=EXACT_VERIFY if config.completion.speculative else None)
        weight_bytes = int(model.shapes.weight_count() * _STORAGE_BYTES.get(plan.storage, 4.0))
        out.append(Candidate(name, model, plan, weight_bytes))
    return out


def _kv_bytes(config: Config, model: EmbeddedModel) -> int:
    assert model.shapes is not None
    return model.shapes.kv_bytes_per_token() * config.model.max_context * config.model.kv_sessions


def choose_embedded(config: Config, *, progress: bool = False) -> tuple[str, dict[str, Any] | None]:
    """The embedded model to load and, for ``model.name: auto``, what decided."""
    mc = config.model
    if mc.name != "auto":
        return mc.name, None
    device = resolve_device(config.device.device)
    found = candidates(config, device, progress=progress)
    if not found:
        return "auto", None          # nothing installed: the loader names what to install
    room = MEMORY_SHARE * device_free_bytes(device)[0]
    figures = [ModelFigures(c.name, c.model.size, float(c.plan.cold_ms or float("inf")),
                            float(c.plan.step_ms or float("inf")),
                            fits_memory=c.weight_bytes + _kv_bytes(config, c.model) <= room)
               for c in found]
    choice = choose_model(figures, LatencyBudget(mc.ttft_budget_ms, mc.decode_budget_ms))
    log.info("model.name auto: %s", choice.reason)
    return choice.name, describe(choice)


def describe(choice: ModelChoice) -> dict[str, Any]:
    return {"chosen": choice.name, "within_budget": choice.within_budget, "reason": choice.reason,
            "budget": asdict(choice.budget), "figures": [asdict(f) for f in choice.figures]}


def draft_pays(target: KernelPlan, draft: KernelPlan, max_k: int) -> bool:
    """Whether :class:`DraftLength`, at DRAFT_PRIOR and the plans' predicted costs, would draft
    at all for ``target`` with a model stepping at ``draft.step_ms``."""
    if not (target.step_ms and target.verify_ms and draft.step_ms):
        return False
    rows = Workload.verify_rows   # the verify size KernelPlan.verify_ms is predicted at
    costs = {1: target.step_ms, rows: target.verify_ms}
    for t in range(2, rows):   # linear between the two predicted sizes
        costs[t] = target.step_ms + (target.verify_ms - target.step_ms) * (t - 1) / (rows - 1)
    length = DraftLength(costs, min(max_k, rows - 1), prior=DRAFT_PRIOR, draft_ms=draft.step_ms)
    return length.choose(max_k) > 0


def choose_draft(config: Config, served: str, *, progress: bool = False) -> tuple[str | None, str]:
    """The embedded model that drafts for ``served`` (None: none) and why."""
    mc = config.model
    if mc.draft == "off" or mc.draft_model is not None or mc.path is not None or served not in EMBEDDED_MODELS:
        return None, "off" if mc.draft == "off" else "not an embedded model pair"
    if not config.completion.speculative:
        return None, "completion.speculative is off"
    device = resolve_device(config.device.device)
    found = {c.name: c for c in candidates(config, device, progress=progress)}
    target = found.get(served)
    smaller = [c for c in found.values() if target is not None and c.model.size < target.model.size]
    if mc.draft != "auto":
        pick = found.get(mc.draft)
        if pick is None or target is None or pick.name == served:
            return None, f"model.draft {mc.draft} is not installed or is the served model"
        return pick.name, f"model.draft: {mc.draft}"
    if target is None or not smaller:
        return None, "no smaller embedded model is installed"
    pick = min(smaller, key=lambda c: c.model.size)
    both = target.weight_bytes + pick.weight_bytes + _kv_bytes(config, target.model) + _kv_bytes(config, pick.model)
    if both > MEMORY_SHARE * device_free_bytes(device)[0]:
        return None, f"{served} and {pick.name} do not both fit in memory"
    if not draft_pays(target.plan, pick.plan, config.completion.draft_tokens):
        return None, (f"drafting with {pick.name} would not pay here (step {target.plan.step_ms:.1f} ms, "
                      f"verify {target.plan.verify_ms:.1f} ms, draft step {pick.plan.step_ms:.1f} ms)")
    return pick.name, f"{pick.name} drafts: the kernel plan predicts it pays"
