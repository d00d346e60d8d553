"""The kernel plan: which linear kernel serves each phase (prompt, short forwards, output
layer), chosen from timings measured on this machine, since the fastest precision differs
per CPU and per phase (docs/kernels.md, "How it chooses"). Pure policy, no torch: the
measuring and the kernels are :mod:`soldaemon.runtime.forward.kernels`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping

# The cached tables' format: bump when a table's meaning or the kernels change (kernels.load_table
# drops a table of another format, so it is timed again). 5: ``blocks`` times the forward's four
# products per layer, q/k/v and gate/up each stacked.
PLAN_FORMAT = 5

# kernel → the storage it reads. int8: per-row float scales, bfloat16 activations; int8-dynamic:
# activations quantized per row, integer products; int4: groups of 32 along K, decoder layers only;
# int8-onednn: a oneDNN-prepacked weight, only ever KernelPlan.rows.
KERNELS: dict[str, str] = {
    "float32": "float32",
    "bfloat16": "bfloat16",
    "float16": "float16",
    "int8": "int8",
    "int8-dynamic": "int8",
    "int4": "int4",
    "int8-onednn": "int8-onednn",
}
# Kernels for the blocked second copy (KernelPlan.rows) → the twin whose bits they give (checked
# by runtime/forward/kernels.py before timing); prefill, short and head must all be that twin.
ROW_KERNELS: dict[str, str] = {"int8-onednn": "int8-dynamic"}
STORAGES = ("float32", "bfloat16", "float16", "int8", "int4")
# the output layer's (and so the embedding's) formats; an int4 plan keeps its output layer in int8
HEAD_STORAGES = ("float32", "bfloat16", "float16", "int8")
PRECISIONS = ("auto",) + STORAGES          # model.precision
PLAN_NOTE = ("ms: the fastest of N runs after a warm-up; blocks: one decoder layer's products "
             "(table.products: qkv, o, gate_up, down as the forward runs them); "
             "head: the output layer; rows: tokens in the forward")
SHORT_ROWS = (1, 2, 5, 9, 17)             # decode and verify sizes measured
PREFILL_ROWS = (64, 512)                  # prefill sizes measured (512: the session's chunk)
# The blocked second copy costs the int8 weights' memory again, so it is kept only when predicted
# this fraction faster for one-row steps and forwards of more rows alike (choose_plan), then
# confirmed on real decode steps at warm-up (steps_on_blocked_copy).
ROW_COPY_GAIN = 0.15
# Kernels whose k-row verify gives every row its decode step's bits (exact integer sums, a scale
# per row; scripts/spec_identity.py checks the answers). With speculation on, a CPU plan's short
# and head kernels come from these; the engine checks each at start (kernels.rows_alone).
EXACT_VERIFY = frozenset({"int8-dynamic", "int8-onednn"})

@dataclass(frozen=True)
class Quality:
    """One kernel against float32 on the same ``n`` holes: ``lost`` right with float32 only,
    ``won`` right with the kernel only; ``run`` names the measurement (docs/quality.md)."""

    lost: int
    won: int
    n: int
    run: str = ""

    @property
    def points(self) -> float:
        """Points lost against float32 (positive = worse)."""
        return 100.0 * (self.lost - self.won) / self.n if self.n else 0.0

    @property
    def p_worse(self) -> float:
        """One-sided sign test: the chance of ``lost`` or more losses among ``lost + won``
        holes that differ, were the kernel no worse than float32."""
        d = self.lost + self.won
        return sum(math.comb(d, i) for i in range(self.lost, d + 1)) / 2 ** d if d else 1.0

    def refused(self, limit: float, alpha: float) -> bool:
        """Worse by more than ``limit`` points and beyond chance (``p_worse < alpha``)."""
        return self.points > limit and self.p_worse < alpha

    def note(self) -> str:
        return (f"{self.points:+.1f} points against float32 on {self.n} holes "
                f"({self.lost} lost, {self.won} won, sign test p {self.p_worse:.2f})")


# Each kernel against float32 on the 0.5B (``soldaemon bench --quality``; docs/quality.md,
# "Precision and answers"). ``auto`` never chooses a kernel absent here (float16, int4) nor one
# :meth:`Quality.refused`; a point estimate alone is noise at these sizes.
QUALITY: dict[str, Quality] = {
    "float32": Quality(0, 0, 248, "the reference"),
    "bfloat16": Quality(2, 0, 248, "0.5B, 120 line + 128 block holes, 2026-12-02/03"),
    "int8": Quality(0, 1, 60, "0.5B, 60 holes, 2026-12-01 (the plan of 74df3e1)"),
    "int8-dynamic": Quality(4, 0, 248, "0.5B, rotated with the output layer, 120 line + 128 block holes, 2026-12-03"),
}
QUALITY["int8-onednn"] = QUALITY["int8-dynamic"]    # int8-dynamic's bits (ROW_KERNELS)
# Points of exact match / pass@1: keeps out kernels that break answers while leaving int8 its
# speed; wide enough that one more hole either way does not flip the plan on every machine
# (docs/kernels.md). model.precision: bfloat16 gives the float model's answers.
MAX_QUALITY_LOSS = 2.5
QUALITY_ALPHA = 0.05         # the sign test's level


def auto_kernels(quality: Mapping[str, Quality] = QUALITY, limit: float = MAX_QUALITY_LOSS,
                 alpha: float = QUALITY_ALPHA) -> frozenset[str]:
    """The kernels ``auto`` may choose: measured and not :meth:`Quality.refused`."""
    return frozenset(k for k, q in quality.items() if k in KERNELS and not q.refused(limit, alpha))


@dataclass(frozen=True)
class TimingTable:
    """Milliseconds measured on one machine for one model's shapes.

    ``blocks[kernel][rows]``: one decoder layer's products (``products``) on ``rows`` rows;
    ``head[kernel][rows]``: the output layer. A kernel this device cannot run is absent."""

    blocks: dict[str, dict[int, float]]
    head: dict[str, dict[int, float]]
    n_layers: int
    machine: dict[str, Any] = field(default_factory=dict)   # flags, torch, device: shown beside the plan
    load_1m: float | None = None      # the 1-minute load average as the timing began (None: not recorded)
    cores: int | None = None          # logical cores of the machine then
    measured_at: float | None = None  # when the timing began (Unix seconds)
    model: dict[str, int] = field(default_factory=dict)     # the shapes timed: layers, hidden, vocab
    replaced_load_1m: float | None = None   # the load of the table timed under load that this one replaced
    products: tuple[str, ...] = ()    # one layer's products timed in ``blocks`` (empty: not recorded)
    background: bool = False          # timed by a serving daemon in the background (measured_at: when)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "blocks": {k: {str(r): ms for r, ms in v.items()} for k, v in self.blocks.items()},
                "head": {k: {str(r): ms for r, ms in v.items()} for k, v in self.head.items()},
                "products": list(self.products)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TimingTable:
        """Raises ValueError on a malformed table; an older table's load is read from
        ``machine["load_avg_1m"]``."""
        try:
            machine = dict(d.get("machine") or {})
            load = d.get("load_1m") if d.get("load_1m") is not None else machine.get("load_avg_1m")
            return cls(
                blocks={str(k): {int(r): float(ms) for r, ms in v.items()} for k, v in d["blocks"].items()},
                head={str(k): {int(r): float(ms) for r, ms in v.items()} for k, v in d["head"].items()},
                n_layers=int(d["n_layers"]), machine=machine,
                load_1m=None if load is None else float(load),
                cores=None if d.get("cores") is None else int(d["cores"]),
                measured_at=None if d.get("measured_at") is None else float(d["measured_at"]),
                model={str(k): int(v) for k, v in (d.get("model") or {}).items()},
                replaced_load_1m=None if d.get("replaced_load_1m") is None else float(d["replaced_load_1m"]),
                products=tuple(str(p) for p in d.get("products") or ()), background=bool(d.get("background")))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed timing table: {exc!r}") from None

    def facts(self) -> dict[str, Any]:
        """How and when it was timed (what ``doctor`` shows beside the plan)."""
        return {"load_1m": self.load_1m, "cores": self.cores, "threads": self.threads,
                "measured_at": self.measured_at, "model": self.model, "replaced_load_1m": self.replaced_load_1m,
                "background": self.background, "timed_under_load": timed_under_load(self)}

    @property
    def threads(self) -> int:
        """The threads the kernels were timed with (1 when not recorded)."""
        return max(1, int(self.machine.get("threads") or 1))


# 1-minute load average per logical core: above BUSY a timing shared the cores with other work;
# at or below QUIET a new timing is worth taking. The gap keeps a machine hovering near one figure
# from re-timing at every start.
BUSY_LOAD_PER_CORE = 1.0
QUIET_LOAD_PER_CORE = 0.5


def timed_under_load(table: TimingTable) -> bool:
    """Its load was above BUSY_LOAD_PER_CORE per core (cores, else threads); False if unrecorded."""
    if table.load_1m is None:
        return False
    return table.load_1m > BUSY_LOAD_PER_CORE * (table.cores or table.threads)


def retime_reason(table: TimingTable, load_1m: float | None, cores: int) -> str | None:
    """Why to re-time ``table``: it was timed under load and the machine is quiet now
    (``load_1m`` at most QUIET_LOAD_PER_CORE per core; None: unknown). ``None``: keep it."""
    if not timed_under_load(table) or load_1m is None or load_1m > QUIET_LOAD_PER_CORE * max(1, cores):
        return None
    return (f"the cached timings were taken at load {table.load_1m:g} on {table.cores or table.threads} "
            f"cores; the machine is quiet now (load {load_1m:g} on {cores} cores)")


@dataclass(frozen=True)
class Workload:
    """What a plan is scored on: one cold completion at the default windows."""

    prompt_tokens: int = 1024
    decode_steps: int = 24
    verify_rows: int = 9         # a speculative verification: the token + an 8-token draft


@dataclass(frozen=True)
class KernelPlan:
    """The weights' storage and the kernel per phase. ``short`` serves every short forward, so
    a position gets the same bits alone or in a batch (reuse = recompute)."""

    storage: str                 # format of the decoder layers' weights (the one copy)
    prefill: str                 # kernel for prompt tokens
    short: str                   # kernel for decode steps, verification, the typed line
    head_storage: str            # format of the output layer (and the embedding)
    head: str                    # kernel for the output layer
    precision: str = "auto"      # what model.precision asked for
    rows: str | None = None      # kernel over a blocked second copy, for forwards of >1 row (ROW_KERNELS)
    cold_ms: float | None = None     # predicted: the workload's prompt, all layers + head (ms)
    step_ms: float | None = None     # predicted: one decode step (ms)
    verify_ms: float | None = None   # predicted: one verify forward of Workload.verify_rows (ms)
    reason: str = ""
    # a verify gives the decode steps' bits (choose_plan's ``exact``); None: not asked
    verify_exact: bool | None = None

    def __post_init__(self) -> None:
        for kernel, storage in ((self.prefill, self.storage), (self.short, self.storage),
                                (self.head, self.head_storage)):
            if KERNELS.get(kernel) != storage:
                raise ValueError(f"kernel {kernel!r} does not read {storage!r} weights")
        if self.rows is not None:
            twin = ROW_KERNELS.get(self.rows)
            if twin is None:
                raise ValueError(f"{self.rows!r} is not a kernel for the blocked copy")
            if not self.prefill == self.short == self.head == twin:
                raise ValueError(f"{self.rows!r} gives {twin!r}'s bits: prefill, decode and head must all be {twin!r}")

    @classmethod
    def uniform(cls, storage: str, reason: str = "") -> KernelPlan:
        """Every phase dense in ``storage``, a float dtype's name."""
        if storage not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"uniform plans are dense float formats, not {storage!r}")
        return cls(storage, storage, storage, storage, storage, precision=storage, reason=reason or "fixed")

    @property
    def kernels(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((self.prefill, self.short, self.head) + ((self.rows,) if self.rows else ())))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> KernelPlan:
        """Raises ValueError on a malformed plan."""
        try:
            return cls(**{k: d[k] for k in ("storage", "prefill", "short", "head_storage", "head")},
                       precision=str(d.get("precision", "auto")), cold_ms=d.get("cold_ms"),
                       step_ms=d.get("step_ms"), verify_ms=d.get("verify_ms"), reason=str(d.get("reason", "")),
                       rows=d.get("rows"), verify_exact=d.get("verify_exact"))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed kernel plan: {exc!r}") from None

    def describe(self) -> str:
        """One line for the log and ``doctor``."""
        pred = ""
        if self.cold_ms is not None and self.step_ms is not None:
            # the products alone: a real step adds norms, attention and dispatch
            pred = f"; kernels alone: 1k-token prefill {self.cold_ms:.0f} ms, step {self.step_ms:.1f} ms"
            if self.verify_ms is not None:
                pred += f", 9-row verify {self.verify_ms:.1f} ms"
        rows = f"; forwards of more rows {self.rows} (a blocked second copy)" if self.rows else ""
        return (f"weights {self.storage} (head {self.head_storage}); prefill {self.prefill}, decode/verify "
                f"{self.short}, head {self.head}{rows}{pred}")


def _at(row_ms: Mapping[int, float], rows: int) -> float:
    """ms at ``rows``, linear between measured sizes; inf when nothing was measured."""
    if not row_ms:
        return float("inf")
    sizes = sorted(row_ms)
    if rows in row_ms:
        return row_ms[rows]
    if rows <= sizes[0]:
        return row_ms[sizes[0]]
    if rows >= sizes[-1]:
        return row_ms[sizes[-1]] * rows / sizes[-1]
    lo = max(s for s in sizes if s < rows)
    hi = min(s for s in sizes if s > rows)
    f = (rows - lo) / (hi - lo)
    return row_ms[lo] + f * (row_ms[hi] - row_ms[lo])


def prefill_ms(table: TimingTable, kernel: str, tokens: int) -> float:
    """Predicted ms of all layers over ``tokens`` in chunks of the largest size measured."""
    rows = table.blocks.get(kernel, {})
    if not rows:
        return float("inf")
    chunk = max(r for r in rows)
    full, rest = divmod(tokens, chunk)
    return table.n_layers * (full * rows[chunk] + (_at(rows, rest) if rest else 0.0))


def short_ms(table: TimingTable, kernel: str, rows: int) -> float:
    """Predicted ms of all decoder layers over a short forward of ``rows``."""
    return table.n_layers * _at(table.blocks.get(kernel, {}), rows)


def head_ms(table: TimingTable, kernel: str, rows: int) -> float:
    return _at(table.head.get(kernel, {}), rows)


def choose_plan(table: TimingTable, precision: str = "auto", *, allowed: frozenset[str] | None = None,
                workload: Workload = Workload(), row_copy: bool = True,
                exact: frozenset[str] | None = EXACT_VERIFY) -> KernelPlan:
    """The plan with the least predicted cold completion for ``workload`` on ``table``'s machine.

    ``precision`` ``auto``: any storage, kernels from ``allowed`` (default :func:`auto_kernels`);
    a storage name: that storage's fastest kernels. ``row_copy``: memory may hold the blocked copy.
    ``exact`` (speculation on): a CPU plan's short and head kernels come from it, else the plan
    says ``verify_exact=False``; None or a GPU table: any kernel. Raises ValueError for an unknown
    precision or when no measured kernel is left."""
    if exact is None or table.machine.get("device", "cpu") != "cpu":
        return _choose(table, precision, allowed, workload, row_copy, None)
    try:
        return replace(_choose(table, precision, allowed, workload, row_copy, exact), verify_exact=True)
    except ValueError:
        plan = _choose(table, precision, allowed, workload, row_copy, None)
        return replace(plan, verify_exact=False, reason=plan.reason + (
            f"; no measured kernel for {precision!r} gives a verify the decode steps' bits here "
            f"({', '.join(sorted(exact)) or 'none'})"))


def _choose(table: TimingTable, precision: str, allowed: frozenset[str] | None, workload: Workload,
            row_copy: bool, exact: frozenset[str] | None) -> KernelPlan:
    """choose_plan's search; ``exact``: the short and head kernels allowed (None: any)."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r} (expected one of {', '.join(PRECISIONS)})")
    usable = (set(KERNELS) if precision != "auto" else set(allowed if allowed is not None else auto_kernels()))
    storages = [precision] if precision != "auto" else list(STORAGES)
    v = workload.verify_rows

    def best(kernels: list[str], cost: Any) -> str | None:
        scored = [(cost(k), k) for k in kernels]
        scored = [(c, k) for c, k in scored if c != float("inf")]
        return min(scored)[1] if scored else None

    def kernels_of(storage: str, measured: Mapping[str, Any]) -> list[str]:
        return [k for k, s in KERNELS.items() if s == storage and k in usable and measured.get(k)]

    def exact_of(kernels: list[str]) -> list[str]:
        return kernels if exact is None else [k for k in kernels if k in exact]

    # an int4 plan's head is int8
    head_choices = []
    for hs in dict.fromkeys(h if h in HEAD_STORAGES else "int8" for h in storages):
        hk = best(exact_of(kernels_of(hs, table.head)), lambda k: head_ms(table, k, 1) + head_ms(table, k, v))
        if hk is not None:
            head_choices.append((head_ms(table, hk, 1) + head_ms(table, hk, v), hs, hk))
    if not head_choices:
        raise ValueError(f"no measured output-layer kernel for precision {precision!r}")
    _, head_storage, head = min(head_choices)

    candidates = []
    for s in storages:
        ks = kernels_of(s, table.blocks)
        pre = best(ks, lambda k: prefill_ms(table, k, workload.prompt_tokens))
        sh = best(exact_of(ks), lambda k: short_ms(table, k, 1) + short_ms(table, k, v))
        if pre is None or sh is None:
            continue
        cold = prefill_ms(table, pre, workload.prompt_tokens) + head_ms(table, head, 1)
        step = short_ms(table, sh, 1) + head_ms(table, head, 1)
        verify = short_ms(table, sh, v) + head_ms(table, head, v)
        candidates.append((cold + workload.decode_steps * step, s, pre, sh, cold, step, verify))
    if not candidates:
        raise ValueError(f"no measured decoder-layer kernel for precision {precision!r}")
    total, storage, pre, sh, cold, step, verify = min(candidates)
    others = ", ".join(f"{c[1]} {c[0]:.0f} ms" for c in sorted(candidates) if c[1] != storage)
    reason = (f"{'fastest measured' if precision == 'auto' else 'model.precision: ' + precision}: "
              f"a cold completion ({workload.prompt_tokens} prompt tokens + {workload.decode_steps} steps) "
              f"predicted {total:.0f} ms" + (f" (vs {others})" if others else ""))
    rows = None
    for rk, twin in ROW_KERNELS.items() if row_copy else ():
        if rk not in usable or not exact_of([rk]) or not table.blocks.get(rk) or not table.head.get(rk) \
                or not pre == sh == head == twin:
            continue
        # a prompt keeps only its last row's logits: the head runs one row, on the one copy
        r_cold = prefill_ms(table, rk, workload.prompt_tokens) + head_ms(table, head, 1)
        r_verify = short_ms(table, rk, v) + head_ms(table, rk, v)
        r_step = short_ms(table, rk, 1) + head_ms(table, rk, 1)
        figures = (f"prompt {r_cold:.0f} vs {cold:.0f} ms, {v}-row verify {r_verify:.1f} vs {verify:.1f} ms, "
                   f"step {r_step:.1f} vs {step:.1f} ms")
        keep = 1.0 - ROW_COPY_GAIN
        if r_cold <= keep * cold and r_verify <= keep * verify and r_step <= keep * step:
            reason += (f"; with a blocked second copy ({rk}, {ROW_COPY_GAIN:.0%} faster or more for steps and "
                       f"forwards of more rows) {r_cold + workload.decode_steps * step:.0f} ms: {figures}")
            rows, cold, verify = rk, r_cold, r_verify
            break
        reason += f"; one copy of the weights ({rk} not {ROW_COPY_GAIN:.0%} faster throughout: {figures})"
    # each record once (int8-onednn shares int8-dynamic's)
    records = {QUALITY[k]: k for k in (pre, sh, head, rows) if k in QUALITY and k != "float32"}
    if records:
        reason += "; quality: " + ", ".join(f"{k} {q.note()}" for q, k in records.items())
    return KernelPlan(storage, pre, sh, head_storage, head, precision=precision, cold_ms=round(cold, 2),
                      step_ms=round(step, 3), verify_ms=round(verify, 3), reason=reason, rows=rows)


def steps_on_blocked_copy(one_copy_ms: list[float], blocked_ms: list[float], prompt_saved_ms: float = 0.0,
                          steps: int = Workload.decode_steps) -> bool:
    """Whether every forward should read the blocked copy (else the engine drops it), from real
    decode steps timed both ways in alternating rounds (one median per round; >= 3; the table
    times one layer cache-hot) and the prompt time the copy saves (predicted for the
    :class:`Workload`'s prompt): True when the workload's cold completion, its prompt and
    ``steps`` steps, is no slower on it. With nothing saved its steps must be faster in median
    and in most rounds."""
    if len(one_copy_ms) < 3 or len(one_copy_ms) != len(blocked_ms):
        return False
    mid = len(one_copy_ms) // 2
    plain, blocked = sorted(one_copy_ms)[mid], sorted(blocked_ms)[mid]
    if prompt_saved_ms > 0:
        return steps * (blocked - plain) <= prompt_saved_ms
    wins = sum(b < a for a, b in zip(one_copy_ms, blocked_ms))
    return blocked <= plain and 2 * wins > len(one_copy_ms)
