"""``soldaemon doctor``'s kernel-plan and model-choice checks: the plan the
daemon chose (or will choose) on this machine, and which embedded model
``model.name: auto`` serves, from the timing tables it cached at start-up
(``cache_dir()/kernel-plans``). Reads files only: no torch, no model."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from soldaemon import paths
from soldaemon.policy.model_choice import LatencyBudget, ModelFigures, choose_model
from soldaemon.weights.embedded import EMBEDDED_MODELS, is_installed
from soldaemon.policy.kernel_plan import TimingTable, choose_plan

_RELEVANT = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8", "asimd")


def read_tables(root: Path | None = None) -> list[tuple[Path, TimingTable]]:
    """Every cached timing table that parses, newest first."""
    folder = (root or paths.cache_dir()) / "kernel-plans"
    out: list[tuple[float, Path, TimingTable]] = []
    for f in folder.glob("*.json") if folder.is_dir() else ():
        try:
            table = TimingTable.from_dict(json.loads(f.read_text())["table"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        out.append((f.stat().st_mtime, f, table))
    return [(f, t) for _, f, t in sorted(out, key=lambda x: x[0], reverse=True)]


def plan_report(cpu_flags: tuple[str, ...] | None, root: Path | None = None, *,
                layers: int | None = None, threads: int | None = None) -> dict[str, Any]:
    """(verdict, detail, fix) for the newest table measured on a CPU with
    these flags -- of a model with ``layers`` layers and timed with
    ``threads`` threads when given (the configured model and thread count:
    a table of another model or thread count says nothing about this one);
    an ``info`` line when none was measured yet."""
    relevant = _RELEVANT
    mine = sorted(f for f in (cpu_flags or ()) if f in relevant)
    for path, table in read_tables(root):
        theirs = sorted(f for f in table.machine.get("cpu_flags", []) if f in relevant)
        if table.machine.get("device") == "cpu" and cpu_flags is not None and theirs != mine:
            continue
        if layers is not None and table.n_layers != layers:
            continue
        if threads is not None and table.machine.get("device") == "cpu" and table.machine.get("threads") != threads:
            continue
        plan = choose_plan(table)
        load = table.machine.get("load_avg_1m")
        busy = load is not None and load > 1.5 * max(1, int(table.machine.get("threads") or 1))
        detail = (f"{plan.describe()} — measured with torch {table.machine.get('torch')}, "
                  f"{table.machine.get('threads')} threads on {table.machine.get('cpu') or table.machine.get('gpu')}"
                  f" (flags: {', '.join(theirs) or 'none'})")
        if busy:
            return {"verdict": "warn", "detail": detail + f"; the machine was busy (load {load}) while measuring",
                    "cost": "timings taken under load may pick a slower plan",
                    "fix": f"rm {path}   (the next start measures again)"}
        return {"verdict": "ok", "detail": detail, "cost": None, "fix": None}
    which = (f" for this model ({layers} layers)" if layers is not None else "") + \
        (f" with {threads} threads" if threads is not None else "")
    return {"verdict": "info", "detail": f"no kernel plan measured yet on this machine{which}: the daemon's "
            "first start times the linear kernels on the model's shapes (about half a minute) and caches "
            "the result", "cost": None, "fix": None}


def _table_for(layers: int, cpu_flags: tuple[str, ...] | None, root: Path | None) -> TimingTable | None:
    """The newest cached table of a model with ``layers`` layers measured on
    this CPU, preferring one timed with a thread per core (the daemon's
    default)."""
    mine = sorted(f for f in (cpu_flags or ()) if f in _RELEVANT)
    found = []
    for _path, table in read_tables(root):
        theirs = sorted(f for f in table.machine.get("cpu_flags", []) if f in _RELEVANT)
        if table.n_layers == layers and (table.machine.get("device") != "cpu" or cpu_flags is None or theirs == mine):
            found.append(table)
    cores = os.cpu_count()
    return next((t for t in found if t.machine.get("threads") == cores), found[0] if found else None)


def model_report(cpu_flags: tuple[str, ...] | None, budget: LatencyBudget | None = None,
                 root: Path | None = None) -> dict[str, Any]:
    """Which embedded model ``model.name: auto`` serves here, by the cached
    timings of each installed one (memory aside: the daemon checks it)."""
    figures, untimed = [], []
    for name, model in EMBEDDED_MODELS.items():
        if model.shapes is None or not is_installed(model):
            continue
        table = _table_for(model.shapes.layers, cpu_flags, root)
        if table is None:
            untimed.append(name)
            continue
        plan = choose_plan(table)
        figures.append(ModelFigures(name, model.size, float(plan.cold_ms or float("inf")),
                                    float(plan.step_ms or float("inf"))))
    if not figures:
        return {"verdict": "info", "detail": "model.name auto: decided at the daemon's first start (no kernel "
                "timings of an installed embedded model cached yet)", "cost": None, "fix": None}
    choice = choose_model(figures, budget)
    detail = f"model.name auto serves {choice.name}: {choice.reason}"
    if untimed:
        detail += f"; not timed yet: {', '.join(untimed)} (the next start times it)"
    return {"verdict": "ok", "detail": detail, "cost": None, "fix": None}
