"""``soldaemon doctor``'s kernel-plan and model-choice checks, from the running daemon's health
document or the timing tables cached in ``cache_dir()/kernel-plans``.
Reads files only: no torch, no model."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Mapping

from soldaemon import paths
from soldaemon.doctor import line
from soldaemon.policy.model_choice import LatencyBudget, ModelChoice, ModelFigures, choose_model
from soldaemon.weights.embedded import EMBEDDED_MODELS, is_installed
from soldaemon.policy.kernel_plan import EXACT_VERIFY, PLAN_FORMAT, KernelPlan, TimingTable, choose_plan

_RELEVANT = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8", "asimd")


def read_tables(root: Path | None = None) -> list[tuple[Path, TimingTable]]:
    """Every cached timing table that parses and has this version's format, newest first."""
    folder = (root or paths.cache_dir()) / "kernel-plans"
    out: list[tuple[float, Path, TimingTable]] = []
    for f in folder.glob("*.json") if folder.is_dir() else ():
        try:
            doc = json.loads(f.read_text())
            if doc.get("format") != PLAN_FORMAT:
                continue
            table = TimingTable.from_dict(doc["table"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        out.append((f.stat().st_mtime, f, table))
    return [(f, t) for _, f, t in sorted(out, key=lambda x: x[0], reverse=True)]


def plan_report(cpu_flags: tuple[str, ...] | None, root: Path | None = None, *,
                layers: int | None = None, threads: int | None = None, served: Mapping[str, Any] | None = None,
                model_path: str | None = None, now: float | None = None, precision: str = "auto",
                speculative: bool = True, blocked_copy: bool = True) -> dict[str, Any]:
    """The ``kernel_plan`` line (verdict, detail, cost, fix, facts): the plan in ``served`` (the
    daemon's health document) if any, else what the daemon would choose from the newest cached
    table for this CPU's flags, the model (``layers``, else auto's choice, else any embedded
    model, never a test model's) and ``threads``. ``info`` for a ``model_path`` or no table."""
    now = time.time() if now is None else now
    in_use = _served_plan(served, now)
    if in_use is not None:
        return in_use
    if model_path is not None and layers is None:
        return line("info", f"model.path {model_path}: its kernel table is the daemon's to time "
                    "at its start; doctor shows the plan in use while the daemon runs")
    why = "the configured model's"
    if layers is None:
        choice = _auto_choice(cpu_flags, None, root, precision, speculative, blocked_copy)[0]
        shape = EMBEDDED_MODELS[choice.name].shapes if choice is not None else None
        layers = shape.layers if shape is not None else None
        why = f"model.name auto's choice ({choice.name})" if choice is not None else "an embedded model's"
    for path, table in _tables_for_cpu(cpu_flags, root):
        if not (table.n_layers == layers if layers is not None else _embedded(table)):
            continue
        if threads is not None and table.machine.get("device") == "cpu" and table.machine.get("threads") != threads:
            continue
        plan = would_choose(table, precision, speculative, blocked_copy)
        if plan is None:
            return line("warn", f"model.precision {precision}: no kernel of the cached table {path} runs it here",
                        fix="model.precision: auto")
        measured = table.measured_at or path.stat().st_mtime
        facts = {"source": "cache", "file": str(path), "age_s": round(max(0.0, now - measured)),
                 **table.facts(), "why": f"the newest table of {why} shapes on this CPU"}
        detail = (f"{plan.describe()} — {why} table, timed {_age(now - measured)} ago{_load(table.facts())} "
                  f"with torch {table.machine.get('torch')}, {table.machine.get('threads')} threads on "
                  f"{table.machine.get('cpu') or table.machine.get('gpu')} "
                  f"(flags: {', '.join(_relevant(table.machine.get('cpu_flags'))) or 'none'})")
        return _judged(detail, facts, path)
    which = (f" for this model ({layers} layers)" if layers is not None else "") + \
        (f" with {threads} threads" if threads is not None else "")
    return line("info", f"no kernel plan measured yet on this machine{which}: the daemon's first start times "
                "the linear kernels on the model's shapes (about half a minute) and caches the result")


def _served_plan(health: Mapping[str, Any] | None, now: float) -> dict[str, Any] | None:
    """The ``kernel_plan`` line for the plan in a health document; ``None`` when it has none
    (no daemon, a transformers fallback, a remote engine)."""
    engine = (health or {}).get("engine")
    if not isinstance(engine, dict):
        return None
    precision = engine.get("precision")
    if not isinstance(precision, dict) or not isinstance(precision.get("plan"), dict):
        return None
    try:
        plan = KernelPlan.from_dict(precision["plan"])
    except ValueError:
        return None
    raw = precision.get("table")
    table: dict[str, Any] = raw if isinstance(raw, dict) else {}
    model = (health or {}).get("model") or engine.get("model") or "?"
    measured = table.get("measured_at")
    age_s = round(max(0.0, now - measured)) if isinstance(measured, (int, float)) else None
    age = f", timed {_age(age_s)} ago" if age_s is not None else ""
    facts = {"source": "daemon", "model": model, "age_s": age_s,
             **table, "why": f"in use by the running daemon: {plan.reason}"}
    detail = f"{plan.describe()} — in use by the running daemon ({model}){age}{_load(table)}"
    return _judged(detail, facts, None)


def _judged(detail: str, facts: dict[str, Any], path: Path | None) -> dict[str, Any]:
    """ok, or warn for a table timed under load."""
    if facts.get("timed_under_load"):
        fix = ("start the daemon again when the machine is quiet: it times the kernels again then"
               + (f" (or rm {path})" if path is not None else ""))
        return line("warn", detail + "; the machine was busy while timing",
                    cost="timings taken under load may pick a slower plan", fix=fix, facts=facts)
    return line("ok", detail, facts=facts)


def _load(facts: Mapping[str, Any]) -> str:
    load, cores = facts.get("load_1m"), facts.get("cores")
    if load is None:
        return ""
    replaced = facts.get("replaced_load_1m")
    was = f" (the table it replaced: load {replaced:g})" if replaced is not None else ""
    again = f", re-timed on a quiet start{was}" if was else ""
    if facts.get("background"):     # re-timed while serving (runtime/forward/retime.py)
        at = time.strftime("%Y-%m-%d %H:%M", time.localtime(facts.get("measured_at") or 0))
        again = f", re-timed in the background at {at}{was}"
        if facts.get("swapped_in"):
            again += "; it gave another plan, swapped in while serving"
        elif not facts.get("plan_in_use", True):
            why = f" ({facts['not_swapped']})" if facts.get("not_swapped") else ""
            again += f"; it gives another plan, used from the next start{why}: {facts.get('retimed_plan')}"
    return f" at load {load:g}" + (f" on {cores} cores" if cores else "") + again


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def _relevant(flags: Any) -> list[str]:
    return sorted(f for f in (flags or ()) if f in _RELEVANT)


def _tables_for_cpu(cpu_flags: tuple[str, ...] | None, root: Path | None) -> list[tuple[Path, TimingTable]]:
    """:func:`read_tables` less the CPU tables timed on a CPU with other :data:`_RELEVANT` flags."""
    mine = _relevant(cpu_flags)
    return [(path, table) for path, table in read_tables(root)
            if table.machine.get("device") != "cpu" or cpu_flags is None
            or _relevant(table.machine.get("cpu_flags")) == mine]


def _embedded(table: TimingTable) -> bool:
    """The table has an embedded model's layers (and width and vocabulary where recorded)."""
    for model in EMBEDDED_MODELS.values():
        shape = model.shapes
        if shape is None or table.n_layers != shape.layers:
            continue
        if table.model.get("hidden", shape.hidden) == shape.hidden and \
                table.model.get("vocab", shape.vocab) == shape.vocab:
            return True
    return False


def _table_for(layers: int, cpu_flags: tuple[str, ...] | None, root: Path | None) -> TimingTable | None:
    """The newest cached table for ``layers`` on this CPU, preferring one timed with a thread
    per core (the daemon's default)."""
    found = [table for _path, table in _tables_for_cpu(cpu_flags, root) if table.n_layers == layers]
    cores = os.cpu_count()
    return next((t for t in found if t.machine.get("threads") == cores), found[0] if found else None)


def would_choose(table: TimingTable, precision: str = "auto", speculative: bool = True,
                 blocked_copy: bool = True) -> KernelPlan | None:
    """The plan a daemon with these settings would choose from ``table``; ``None`` when no kernel
    runs ``precision``. Assumes every :data:`EXACT_VERIFY` check passes and the copy fits in
    memory (the daemon checks both at start)."""
    try:
        return choose_plan(table, precision, exact=EXACT_VERIFY if speculative else None, row_copy=blocked_copy)
    except ValueError:
        return None


def _auto_choice(cpu_flags: tuple[str, ...] | None, budget: LatencyBudget | None, root: Path | None,
                 precision: str = "auto", speculative: bool = True,
                 blocked_copy: bool = True) -> tuple[ModelChoice | None, list[str]]:
    """(auto's choice among installed embedded models by cached timings, or ``None``; the
    installed ones not timed yet)."""
    figures, untimed = [], []
    for name, model in EMBEDDED_MODELS.items():
        if model.shapes is None or not is_installed(model):
            continue
        table = _table_for(model.shapes.layers, cpu_flags, root)
        if table is None:
            untimed.append(name)
            continue
        plan = would_choose(table, precision, speculative, blocked_copy)
        if plan is None:
            continue
        figures.append(ModelFigures(name, model.size, float(plan.cold_ms or float("inf")),
                                    float(plan.step_ms or float("inf"))))
    return (choose_model(figures, budget) if figures else None), untimed


def model_report(cpu_flags: tuple[str, ...] | None, budget: LatencyBudget | None = None,
                 root: Path | None = None, precision: str = "auto", speculative: bool = True,
                 blocked_copy: bool = True) -> dict[str, Any]:
    """The ``model_choice`` line: which embedded model ``model.name: auto`` serves here, by
    cached timings (memory is the daemon's to check)."""
    choice, untimed = _auto_choice(cpu_flags, budget, root, precision, speculative, blocked_copy)
    if choice is None:
        return line("info", "model.name auto: decided at the daemon's first start (no kernel "
                    "timings of an installed embedded model cached yet)")
    detail = f"model.name auto serves {choice.name}: {choice.reason}"
    if untimed:
        detail += f"; not timed yet: {', '.join(untimed)} (the next start times it)"
    return line("ok", detail)
