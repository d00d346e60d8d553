"""The kernel plan: which linear kernel serves each phase, chosen from timings
measured on this machine. Pure policy: no torch here (the measuring and the
kernels themselves are :mod:`soldaemon.runtime.forward.kernels`), so it is tested over recorded tables.

Why measure: the same "2-core EPYC" has been AVX2-only (bfloat16 and float16
products slower than float32) and Zen 4 with AVX-512 BF16/VNNI (bfloat16 4x,
int8 with integer products 7x faster than float32). A fixed choice is wrong on
one of them, and one precision for every phase is wrong on both: a prefill
forward multiplies hundreds of rows (compute-bound), a decode step one row
(memory-bound), a speculative verification a handful.

What is chosen (one :class:`KernelPlan`):

- ``storage``: the one format the decoder layers' weights are kept in (no
  second copy beside it);
- ``prefill``: the kernel over that storage for prompt tokens (long forwards);
- ``short``: the kernel over that storage for decode steps, draft
  verification and the typed line after the middle token. One kernel for all
  short forwards, because the session computes a position with the same
  weights whether it ran alone or in a batch (reuse = recompute);
- ``head_storage`` / ``head``: the output layer (151,936 rows for Qwen2.5,
  unlike the blocks), whose storage also serves the embedding lookup;
- ``rows``: None (one layout for every forward: the default), or a kernel
  that reads a *second*, blocked copy of the int8 weights (layers and
  output layer) — kept only where it is measured at least ROW_COPY_GAIN
  faster for one-row steps *and* for forwards of more rows (prompts,
  verifications, the typed line), where ``torch._int_mm`` re-lays the
  weight out on every call (docs/kernels.md, "How it chooses": one copy by
  default). Only a kernel that gives its twin's bits (:data:`ROW_KERNELS`)
  may: a verify then still equals the decode steps bit for bit, and a
  prompt's logits do not change.

Kernels (``KERNELS``: kernel → storage it reads):

- ``float32``, ``bfloat16``, ``float16``: dense products in that dtype;
- ``int8``: int8 weights (one float scale per output row), activations cast
  to bfloat16, the weight-only int8 product;
- ``int8-dynamic``: the same int8 weights; activations quantized per row to
  int8 at run time, integer products, one rescale;
- ``int4``: 4-bit weights in groups of 32 along K (a bfloat16 scale and zero
  per group), bfloat16 activations, torch's int4 weight-only product (CPU).
  Decoder layers only; never measured for quality (not in QUALITY);
- ``int8-onednn``: ``int8-dynamic``'s integer products on a weight oneDNN
  laid out once for its kernel (``onednn.qlinear_prepack``); only as
  ``rows``, never the one storage (its single-row product is slower than
  ``_int_mm``'s in the forward, which reads every layer from memory).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping

# The cached tables' format. Bump when the table's meaning (or the kernels)
# change; a cached table of another format is timed again at the next start
# (runtime/forward/kernels.py: load_table drops it; doctor skips it).
# 5: ``blocks`` is one decoder layer's four products as the forward runs
# them, q/k/v and gate/up each one product over their stacked rows; 4 timed
# seven separate products.
PLAN_FORMAT = 5

KERNELS: dict[str, str] = {
    "float32": "float32",
    "bfloat16": "bfloat16",
    "float16": "float16",
    "int8": "int8",
    "int8-dynamic": "int8",
    "int4": "int4",
    "int8-onednn": "int8-onednn",
}
# Kernels for the blocked second copy (KernelPlan.rows) → the kernel whose
# bits they give (checked at run time before a kernel is measured:
# runtime/forward/kernels.py); the plan's prefill, decode and head kernels
# must all be that twin.
ROW_KERNELS: dict[str, str] = {"int8-onednn": "int8-dynamic"}
# formats the decoder layers (the one copy) can be kept in
STORAGES = ("float32", "bfloat16", "float16", "int8", "int4")
# formats the output layer (and so the embedding lookup) can be kept in; an
# int4 plan keeps its output layer in int8
HEAD_STORAGES = ("float32", "bfloat16", "float16", "int8")
PRECISIONS = ("auto",) + STORAGES          # model.precision
PLAN_NOTE = ("ms: the fastest of N runs after a warm-up; blocks: one decoder layer's products "
             "(table.products: qkv, o, gate_up, down as the forward runs them); "
             "head: the output layer; rows: tokens in the forward")
SHORT_ROWS = (1, 2, 5, 9, 17)             # decode and verify sizes measured
PREFILL_ROWS = (64, 512)                  # prefill sizes measured (512: the session's chunk)
# The blocked second copy costs the int8 weights' memory again (0.5B: +532 MB
# after load, 1,742 against 1,210 MB; docs/kernels.md). One layout serves
# every forward unless the copy is measured at least this much faster (a
# fraction of the one copy's time) for one-row steps and for forwards of
# more rows alike: the table's prediction first (choose_plan), then real
# decode steps at warm-up (steps_on_blocked_copy; the engine drops the copy
# when they are not).
ROW_COPY_GAIN = 0.15
# Kernels whose k-row verify gives every row the bits of that row's decode
# step: exact integer sums, a scale per row (docs/kernels.md, "Speculation
# and the kernels"). Measured on the real 0.5B (scripts/spec_identity.py):
# int8-dynamic kept every answer at draft lengths 1, 2, 4 and 8; bfloat16
# changed 3 of 16 although its products alone pass the row test up to 9
# rows. With speculation on, a CPU plan's decode/verify and output-layer
# kernels are chosen among these (choose_plan's ``exact``); the engine
# checks each on the model's shapes at start (kernels.rows_alone).
EXACT_VERIFY = frozenset({"int8-dynamic", "int8-onednn"})

@dataclass(frozen=True)
class Quality:
    """One kernel against float32 on the same holes, each hole right or not
    (exact match on line holes, its tests passed on block holes): ``lost``
    holes right with float32 only, ``won`` right with the kernel only, of
    ``n``; ``run`` names the measurement (docs/quality.md)."""

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
        """One-sided sign test over the holes that differ: the chance of at
        least ``lost`` losses among ``lost + won`` were the kernel no worse
        than float32 (each such hole a coin toss)."""
        d = self.lost + self.won
        return sum(math.comb(d, i) for i in range(self.lost, d + 1)) / 2 ** d if d else 1.0

    def refused(self, limit: float, alpha: float) -> bool:
        """Worse by more than ``limit`` points, and beyond what the holes
        that differ allow by chance (``p_worse < alpha``)."""
        return self.points > limit and self.p_worse < alpha

    def note(self) -> str:
        return (f"{self.points:+.1f} points against float32 on {self.n} holes "
                f"({self.lost} lost, {self.won} won, sign test p {self.p_worse:.2f})")


# Each kernel against float32 on the same holes, 0.5B (``soldaemon bench
# --quality --precisions ...``; docs/quality.md, "Precision and answers").
# ``auto`` never chooses a kernel never measured (absent) nor one refused
# (:meth:`Quality.refused`): worse by more than MAX_QUALITY_LOSS points *and*
# beyond chance on the holes that differ. A point estimate alone is noise at
# these sizes (one hole of 248 is 0.4 points).
# - bfloat16: 120 line holes, exact match (the float32 column of
#   docs/results/2026-12-02-line-120-0.5b-float32.json) plus 128 block holes,
#   pass@1 (docs/results/2026-12-03-block-128-0.5b-precisions.json). No hole won.
# - int8-dynamic (rotated, the output layer too; the plan int8-dynamic in
#   every phase): the same holes against the same float32 columns
#   (docs/results/2026-12-03-line-120-0.5b-output-layer-rotated.json and
#   2026-12-03-block-128-0.5b-output-layer-rotated.json): 3 line holes and
#   1 block hole lost, none won.
# - int8 (weight-only): only ever measured inside the plan of 2026-12-01 (74df3e1) (int8
#   decode, int8-dynamic prefill and head), 60 holes
#   (docs/results/2026-12-01-precision-60.json).
# float16 and int4 were not measured (float16's CPU products are the slowest),
# so auto never picks them; model.precision: float16 / int4 still can.
QUALITY: dict[str, Quality] = {
    "float32": Quality(0, 0, 248, "the reference"),
    "bfloat16": Quality(2, 0, 248, "0.5B, 120 line + 128 block holes, 2026-12-02/03"),
    "int8": Quality(0, 1, 60, "0.5B, 60 holes, 2026-12-01 (the plan of 74df3e1)"),
    "int8-dynamic": Quality(4, 0, 248, "0.5B, rotated with the output layer, 120 line + 128 block holes, 2026-12-03"),
}
QUALITY["int8-onednn"] = QUALITY["int8-dynamic"]    # int8-dynamic's bits (ROW_KERNELS)
# Points of exact match / pass@1. 2.5 since 2026-12-03, set after
# int8-dynamic measured +2.0 (p 0.03) above: at 1.0 ``auto`` would give up
# int8 on every CPU recorded in tests/data/kernel_tables for bfloat16 or
# float32 at 1.8-2.7x the decode step (up to 2.1x a cold completion). The
# limit keeps out kernels that break answers; a user who wants the float
# model's answers sets model.precision: bfloat16 (docs/kernels.md). Since
# the output layer is rotated too the record is +1.6 (p 0.06), inside even
# the old limit's chance; 2.5 is kept so that one more hole either way does
# not flip the plan on every machine.
MAX_QUALITY_LOSS = 2.5
QUALITY_ALPHA = 0.05         # the sign test's level


def auto_kernels(quality: Mapping[str, Quality] = QUALITY, limit: float = MAX_QUALITY_LOSS,
                 alpha: float = QUALITY_ALPHA) -> frozenset[str]:
    """The kernels ``auto`` may choose: measured against float32, and not
    shown worse than it by more than ``limit`` points (:meth:`Quality.refused`)."""
    return frozenset(k for k, q in quality.items() if k in KERNELS and not q.refused(limit, alpha))


@dataclass(frozen=True)
class TimingTable:
    """Milliseconds measured on one machine for one model's shapes.

    ``blocks[kernel][rows]``: the products of one decoder layer on ``rows``
    rows, as ``products`` names them (the forward's four: q/k/v stacked
    into one product, o, gate/up stacked, down; tables recorded before
    the packing name the seven apart); ``head[kernel][rows]``: the output
    layer. A kernel this device cannot run is absent. Beside the
    times, how busy the machine was when they were taken (a table timed
    under load is re-timed on a later, quiet start: :func:`retime_reason`)."""

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
        return {"blocks": {k: {str(r): ms for r, ms in v.items()} for k, v in self.blocks.items()},
                "head": {k: {str(r): ms for r, ms in v.items()} for k, v in self.head.items()},
                "n_layers": self.n_layers, "machine": self.machine, "load_1m": self.load_1m,
                "cores": self.cores, "measured_at": self.measured_at, "model": self.model,
                "replaced_load_1m": self.replaced_load_1m, "products": list(self.products),
                "background": self.background}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TimingTable:
        """Raises ValueError on a malformed table (a damaged cache file).
        A table recorded before the load had its own field keeps the load
        read after its timing (``machine["load_avg_1m"]``)."""
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


# How busy is too busy to time kernels, as a 1-minute load average per
# logical core: above BUSY the kernels' threads shared the cores with other
# work (the issue-58 bench: load 12 on 2 cores timed bfloat16 ahead of the
# quiet plan's int8); at or below QUIET a new timing is worth taking. The gap
# keeps a machine that hovers near one figure from re-timing at every start.
BUSY_LOAD_PER_CORE = 1.0
QUIET_LOAD_PER_CORE = 0.5


def timed_under_load(table: TimingTable) -> bool:
    """The table was timed while other work held the cores: its 1-minute
    load average was above BUSY_LOAD_PER_CORE per core (the cores recorded,
    else its thread count). False when no load was recorded."""
    if table.load_1m is None:
        return False
    return table.load_1m > BUSY_LOAD_PER_CORE * (table.cores or table.threads)


def retime_reason(table: TimingTable, load_1m: float | None, cores: int) -> str | None:
    """Why a cached ``table`` should be timed again now, with the machine
    at ``load_1m`` (its 1-minute load average; ``None``: unknown) on
    ``cores`` logical cores: it was timed under load and the machine is
    quiet now (at most QUIET_LOAD_PER_CORE per core). ``None``: keep it."""
    if not timed_under_load(table) or load_1m is None or load_1m > QUIET_LOAD_PER_CORE * max(1, cores):
        return None
    return (f"the cached timings were taken at load {table.load_1m:g} on {table.cores or table.threads} "
            f"cores; the machine is quiet now (load {load_1m:g} on {cores} cores)")


@dataclass(frozen=True)
class Workload:
    """What a plan is scored on: one cold completion at the daemon's default
    windows (a ~1k-token FIM prompt, two dozen tokens) plus the steps of
    typing along (short forwards)."""

    prompt_tokens: int = 1024
    decode_steps: int = 24
    verify_rows: int = 9         # a speculative verification: the token + an 8-token draft


@dataclass(frozen=True)
class KernelPlan:
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
    # whether a verify gives the decode steps' bits (decode/verify and head
    # kernels in choose_plan's ``exact``); None: not asked (speculation off,
    # or a GPU's float products)
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
        """Every phase dense in ``storage`` (a float dtype's name): the
        reference math of the model in that dtype."""
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
            # the products' measured times only: a real step adds norms,
            # attention and dispatch (docs/kernels.md)
            pred = f"; kernels alone: 1k-token prefill {self.cold_ms:.0f} ms, step {self.step_ms:.1f} ms"
            if self.verify_ms is not None:
                pred += f", 9-row verify {self.verify_ms:.1f} ms"
        rows = f"; forwards of more rows {self.rows} (a blocked second copy)" if self.rows else ""
        return (f"weights {self.storage} (head {self.head_storage}); prefill {self.prefill}, decode/verify "
                f"{self.short}, head {self.head}{rows}{pred}")


def _at(row_ms: Mapping[int, float], rows: int) -> float:
    """ms at ``rows``, linear between measured sizes (the first/last measured
    rate outside them); inf when nothing was measured."""
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
    """Predicted ms of all decoder layers over ``tokens`` prompt tokens in
    chunks of the largest prefill size measured."""
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
    """The fastest plan for ``workload`` on the machine ``table`` was measured on.

    ``precision`` ``auto``: any storage, kernels from ``allowed`` (default:
    :func:`auto_kernels`: measured against float32 and not shown worse
    by more than MAX_QUALITY_LOSS points); a storage name: that storage for the layers and the head, its
    fastest kernels. Per storage, ``prefill`` is the fastest kernel at the
    prefill size, ``short`` the fastest over a decode step plus a
    verification (equal weight: speculation makes both common), ``head``
    likewise; the storage with the least predicted time of one cold
    completion (prompt + decode steps) wins. Then, with ``row_copy`` (the
    engine's word that memory holds a second copy), a kernel of
    :data:`ROW_KERNELS` becomes ``rows`` when its twin runs every phase and
    it is predicted at least ROW_COPY_GAIN faster for the prompt, for a
    verification *and* for a decode step; otherwise one layout serves
    every forward.

    ``exact`` (speculation on; the default :data:`EXACT_VERIFY`): on a CPU,
    the decode/verify and output-layer kernels are chosen among these, so
    that speculation changes no answer; where no storage has one (a named
    float precision), the plan is chosen without them and says
    ``verify_exact=False`` (under ``auto`` the engine then decodes without
    speculation; a named precision keeps it, with a warning).
    ``None``: speculation off, every kernel may serve. A GPU table ignores
    it (its float products are not row-exact; ``verify_exact`` None).
    Raises ValueError for an unknown precision or when no measured kernel
    is left."""
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
    """choose_plan's search; ``exact``: the kernels the decode/verify and
    output-layer phases may use (None: any)."""
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

    # the head: its own storage (auto) or the asked one (int8 for an int4 plan)
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


# Decode steps move to the blocked copy (and the plain one is freed) when
# they are no slower there: the plan keeps the copy only where forwards of
# more rows are predicted ROW_COPY_GAIN faster on it, so reading it for
# every forward loses nothing. A 15 % margin here dropped the copy on the
# AMX Xeon, whose steps measure ~20 % faster on it, in two of three starts
# (the 0.5B's TTFT then 18 % slower on 128 block holes; docs/kernels.md).
STEP_COPY_MARGIN = 1.0


def steps_on_blocked_copy(one_copy_ms: list[float], blocked_ms: list[float],
                          margin: float = STEP_COPY_MARGIN) -> bool:
    """Whether one-row forwards (decode steps, the prompt's last row through
    the output layer) should read the blocked copy too, from real decode
    steps timed both ways in alternating rounds (each list: one median per
    round); when not, the engine drops the copy (one layout for every
    forward: the copy stays only where it pays for steps and forwards of
    more rows alike). The kernel plan's table cannot say: it times one layer
    cache-hot, and ranked oneDNN ahead at one row on Zen 4, where the real
    step, reading 24 layers from memory, was 17 % slower (docs/kernels.md);
    on an AMX Xeon the real step is ~20 % faster. The bits are the same
    either way (ROW_KERNELS), so only time decides. Needs >= 3 rounds each;
    the blocked copy wins when its median is at most ``margin`` times the
    one copy's and it is faster in most rounds (ties: the one copy)."""
    if len(one_copy_ms) < 3 or len(one_copy_ms) != len(blocked_ms):
        return False
    ordered = sorted(one_copy_ms), sorted(blocked_ms)
    mid = len(one_copy_ms) // 2
    wins = sum(b < a for a, b in zip(one_copy_ms, blocked_ms))
    return ordered[1][mid] <= margin * ordered[0][mid] and 2 * wins > len(one_copy_ms)
