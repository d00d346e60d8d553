"""Linear kernels, their weight formats ("storages"), and the start-up timing the kernel plan
(:mod:`soldaemon.policy.kernel_plan`) is chosen from. A kernel multiplies x [T, K] by a weight
[N, K] in its storage into [T, N] in x's dtype, each row of x on its own. :func:`plan_for` caches
the timing table per machine, model shapes, torch and threads (``cache_dir()/kernel-plans``); a
table timed under load is timed again once the machine is quiet."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import platform
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from soldaemon import paths
from soldaemon.runtime.forward.timing import timed
from soldaemon.policy.kernel_plan import (EXACT_VERIFY, HEAD_STORAGES, KERNELS, PLAN_FORMAT, PREFILL_ROWS, ROW_KERNELS,
                                          SHORT_ROWS, KernelPlan, TimingTable, choose_plan, retime_reason)

log = logging.getLogger("soldaemon.kernels")

_DENSE = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}



# -- formats and kernels ----------------------------------------------------


def pack(storage: str, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``w [N, K]`` (any float dtype) in ``storage``: (weight, scale or None); int8 is symmetric,
    one float32 scale a row (``w ≈ q * s[:, None]``). A dense weight in that dtype is not copied."""
    if storage in _DENSE:
        return w.to(_DENSE[storage]).contiguous(), None
    if storage == "int8":
        wf = w.to(torch.float32)
        s = wf.abs().amax(dim=1).clamp(min=1e-12) / 127.0            # [N]
        q = torch.round(wf / s[:, None]).clamp_(-127, 127).to(torch.int8)
        return q.contiguous(), s
    if storage == "int4":
        return _pack_int4(w)
    if storage == "int8-onednn":
        q, scale = pack("int8", w)
        return blocked(q), scale
    raise ValueError(f"unknown weight storage {storage!r}")


@functools.cache
def onednn_int8_exact() -> bool:
    """Whether oneDNN's int8 product runs here with ``torch._int_mm``'s integers, checked once on
    full-range values (a CPU without VNNI pairs products in 16 bits and can saturate)."""
    op = getattr(torch.ops, "onednn", None)
    if op is None or not hasattr(op, "qlinear_prepack") or not torch.backends.mkldnn.is_available():
        return False
    gen = torch.Generator().manual_seed(0)
    w = torch.randint(-127, 128, (48, 320), generator=gen, dtype=torch.int8)
    w[0] = 127
    w[1] = -127
    x = torch.randint(-127, 128, (5, 320), generator=gen, dtype=torch.int8)
    x[0] = 127
    x[1] = -127
    try:
        got = op.qlinear_pointwise((x.to(torch.int16) + 128).to(torch.uint8), 1.0, 128,
                                   op.qlinear_prepack(w, None), torch.ones(48), torch.zeros(48, dtype=torch.int64),
                                   None, 1.0, 0, torch.float32, "none", [], "")
    except (RuntimeError, NotImplementedError, TypeError, AttributeError):
        return False
    return torch.equal(got, torch._int_mm(x, w.t()).to(torch.float32))


@functools.cache
def rows_alone(kernel: str, n: int, k: int, rows: int = 9) -> bool:
    """Whether ``kernel`` gives each row of a ``rows``-row product by an ``[n, k]`` weight the bits
    of that row alone, here: what makes a speculative verify equal the decode steps
    (docs/kernels.md, "Speculation and the kernels")."""
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(n, k, generator=gen) * 0.02
    x = torch.randn(rows, k, generator=gen)
    fn = KERNEL_FNS[kernel]
    pw, ps = pack(kernel if kernel in ROW_COPIES else KERNELS[kernel], w)
    full = fn(x, pw, None, ps)
    return all(torch.equal(full[i:i + 1], fn(x[i:i + 1], pw, None, ps)) for i in range(rows))


def verify_exact_kernels(cfg: Any) -> frozenset[str]:
    """The :data:`~soldaemon.policy.kernel_plan.EXACT_VERIFY` kernels that give every row its
    one-row bits here, on the model's layer shapes and output width at a verify's and a prompt
    chunk's rows: what a plan with speculation on may decode and verify with."""
    head = (min(int(cfg.vocab_size), 8192), int(cfg.hidden_size), 9)
    checks = tuple([(n, k, rows) for n, k in packed_shapes(cfg) for rows in (9, 64)] + [head])
    return _exact_over(checks, torch.get_num_threads())


@functools.lru_cache(maxsize=8)
def _exact_over(checks: tuple[tuple[int, int, int], ...], _threads: int) -> frozenset[str]:
    """:func:`verify_exact_kernels` over ``checks``, once per process and thread count."""
    out = set()
    for kernel in EXACT_VERIFY:
        try:
            if all(rows_alone(kernel, n, k, rows) for n, k, rows in checks):
                out.add(kernel)
        except RuntimeError:        # int8-onednn where oneDNN's product is not exact (or absent)
            continue
    return frozenset(out)


def blocked(q: torch.Tensor) -> torch.Tensor:
    """An int8 weight [N, K] in oneDNN's blocked layout (opaque: only ``int8-onednn`` reads it).
    Raises RuntimeError off the CPU or where oneDNN is not exact (:func:`onednn_int8_exact`)."""
    if q.device.type != "cpu" or not onednn_int8_exact():
        raise RuntimeError("oneDNN's int8 product is not exact here (or not a CPU)")
    return torch.ops.onednn.qlinear_prepack(q, None)


INT4_GROUP = 32


def _pack_int4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit groups of INT4_GROUP along K, in torch's CPU int4
    layout: (packed uint8 [N, K/2], scales and zeros [K/G, N, 2] bfloat16),
    w ≈ (q - 8) * scale + zero. Raises ValueError when K is not a multiple
    of the group, RuntimeError off the CPU."""
    n, k = w.shape
    if k % INT4_GROUP:
        raise ValueError(f"int4 needs K divisible by {INT4_GROUP}, got {k}")
    wg = w.to(torch.float32).reshape(n, k // INT4_GROUP, INT4_GROUP)
    lo, hi = wg.amin(-1), wg.amax(-1)                                 # [N, K/G]
    scale = ((hi - lo) / 15.0).clamp(min=1e-12)
    q = torch.round((wg - lo[..., None]) / scale[..., None]).clamp_(0, 15).to(torch.int32).reshape(n, k)
    zero = lo + 8.0 * scale
    sz = torch.stack((scale, zero), dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)   # [K/G, N, 2]
    return torch._convert_weight_to_int4pack_for_cpu(q, 2), sz


class Kernel:
    """A linear kernel in two steps: ``prepare`` the activations once (cast, or quantize per row),
    then ``multiply`` them by any number of weights in its storage. Calling it does both."""

    def prepare(self, x: torch.Tensor) -> Any:
        raise NotImplementedError

    def multiply(self, p: Any, w: torch.Tensor, b: torch.Tensor | None, s: torch.Tensor | None,
                 out_dtype: torch.dtype) -> torch.Tensor:
        raise NotImplementedError

    def __call__(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
                 s: torch.Tensor | None) -> torch.Tensor:
        return self.multiply(self.prepare(x), w, b, s, x.dtype)


def _finish(y: torch.Tensor, out_dtype: torch.dtype, b: torch.Tensor | None) -> torch.Tensor:
    """A product's result in the activations' dtype, plus the bias."""
    y = y if y.dtype == out_dtype else y.to(out_dtype)
    return y if b is None else y.add_(b)     # y is the product's own new tensor


class Dense(Kernel):
    """A dense product in ``dt``; the result back in the activations' dtype."""

    def __init__(self, dt: torch.dtype) -> None:
        self.dt = dt

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        return x if x.dtype == self.dt else x.to(self.dt)

    def multiply(self, p: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, s: torch.Tensor | None,
                 out_dtype: torch.dtype) -> torch.Tensor:
        return _finish(F.linear(p, w), out_dtype, b)


class WeightOnly(Kernel):
    """Quantized weights, bfloat16 activations: ``product(x_bf16, w, s)`` is
    torch's weight-only product for the storage (int8 rows, int4 groups)."""

    def __init__(self, product: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        self.product = product

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16)

    def multiply(self, p: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, s: torch.Tensor | None,
                 out_dtype: torch.dtype) -> torch.Tensor:
        assert s is not None
        return _finish(self.product(p, w, s), out_dtype, b)


class Int8Dynamic(Kernel):
    """Activations quantized per row (symmetric int8), exact int32 products, then both scales:
    y = (xq @ wq^T) * sx * sw."""

    @staticmethod
    def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row as whole numbers in [-127, 127] (still float32) and its scale [T, 1]."""
        xf = x.to(torch.float32)
        # abs().amax(), not an inf-norm: the same scales, and torch's inf-norm is slow on a CPU
        sx = xf.abs().amax(dim=-1, keepdim=True).clamp_(min=1e-12).div_(127.0)   # [T, 1]
        return torch.mul(xf, 1.0 / sx).round_(), sx

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, sx = self.quantize(x)
        return q.to(torch.int8), sx                                          # [T, K]

    def multiply(self, p: tuple[torch.Tensor, torch.Tensor], w: torch.Tensor, b: torch.Tensor | None,
                 s: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
        assert s is not None
        xq, sx = p
        return _finish(torch.mul(torch._int_mm(xq, w.t()), s).mul_(sx), out_dtype, b)   # [T, N]


class OneDNNInt8(Int8Dynamic):
    """``int8-dynamic``'s products, bit for bit, on a blocked weight (:func:`blocked`): the int8
    activations offset by 128 (oneDNN's unsigned input), without ``_int_mm``'s re-layout of the
    weight on every call of more than one row."""

    def __init__(self) -> None:
        self._zeros: dict[int, torch.Tensor] = {}       # N → the weights' zero points (all 0)

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, sx = self.quantize(x)
        # q + 128 as wrapping bytes: float q + 128 cast to uint8 gives the same, much slower
        return q.to(torch.int8).view(torch.uint8).add_(128), sx

    def multiply(self, p: tuple[torch.Tensor, torch.Tensor], w: torch.Tensor, b: torch.Tensor | None,
                 s: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
        assert s is not None
        xu, sx = p
        n = s.shape[0]
        zeros = self._zeros.get(n)
        if zeros is None:
            zeros = self._zeros[n] = torch.zeros(n, dtype=torch.int64)
        y = torch.ops.onednn.qlinear_pointwise(xu, 1.0, 128, w, s, zeros, None, 1.0, 0, torch.float32, "none", [], "")
        return _finish(y.mul_(sx), out_dtype, b)


# KernelPlan.rows kernel → how its copy of an int8 weight [N, K] is made
ROW_COPIES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"int8-onednn": blocked}

KERNEL_FNS: dict[str, Kernel] = {
    "float32": Dense(torch.float32),
    "bfloat16": Dense(torch.bfloat16),
    "float16": Dense(torch.float16),
    "int8": WeightOnly(lambda x, w, s: torch._weight_int8pack_mm(x, w, s.to(torch.bfloat16))),
    "int8-dynamic": Int8Dynamic(),
    "int4": WeightOnly(lambda x, w, s: torch._weight_int4pack_mm_for_cpu(x, w, INT4_GROUP, s)),
    "int8-onednn": OneDNNInt8(),
}


def embed_rows(ids: torch.Tensor, w: torch.Tensor, s: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """Embedding lookup from a packed table: [T] ids → [T, D] in ``dtype``."""
    x = F.embedding(ids, w).to(dtype)
    return x if s is None else x * s[ids, None].to(dtype)


# -- measurement -------------------------------------------------------------


def monotone(row_ms: dict[int, float]) -> dict[int, float]:
    """Each entry lowered to the least time at its row count or above (fewer rows never cost
    more): undoes a timing another process pre-empted."""
    out: dict[int, float] = {}
    best = float("inf")
    for rows in sorted(row_ms, reverse=True):
        best = min(best, row_ms[rows])
        out[rows] = best
    return dict(sorted(out.items()))


def layer_shapes(cfg: Any) -> list[tuple[int, int]]:
    """(N, K) of one decoder layer's seven products: q, k, v, o, gate, up,
    down (the model's own; the forward multiplies :func:`packed_shapes`)."""
    d = int(cfg.hidden_size)
    heads = int(cfg.num_attention_heads)
    hd = int(getattr(cfg, "head_dim", None) or d // heads)
    kv = int(cfg.num_key_value_heads) * hd
    f = int(cfg.intermediate_size)
    return [(heads * hd, d), (kv, d), (kv, d), (d, heads * hd), (f, d), (f, d), (d, f)]


# one layer's products as the forward runs them, in packed_shapes' order (TimingTable.blocks)
PACKED_PRODUCTS = ("qkv", "o", "gate_up", "down")


def packed_shapes(cfg: Any) -> list[tuple[int, int]]:
    """(N, K) of one decoder layer's four products as the forward
    multiplies them (:data:`PACKED_PRODUCTS`): q, k and v stacked
    ``[(H+2KV)*hd, D]``, o, gate and up stacked ``[2F, D]``, down."""
    q, k, v, o, gate, up, down = layer_shapes(cfg)
    return [(q[0] + k[0] + v[0], q[1]), o, (gate[0] + up[0], gate[1]), down]


def machine_load() -> tuple[float | None, int]:
    """(1-minute load average or ``None`` where the OS has none, logical cores)."""
    try:
        load: float | None = round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        load = None
    return load, os.cpu_count() or 1


def measure_table(cfg: Any, device: torch.device, compute_dtype: torch.dtype, *,
                  kernels: tuple[str, ...] = tuple(KERNELS), short_rows: tuple[int, ...] = SHORT_ROWS,
                  prefill_rows: tuple[int, ...] = PREFILL_ROWS, repeats: int = 5,
                  say: Callable[[str], None] = lambda _s: None,
                  load: Callable[[], tuple[float | None, int]] = machine_load,
                  turn: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext) -> TimingTable:
    """Time each kernel on random weights: a layer's :func:`packed_shapes` at every row count, the
    output layer at the short ones; ``repeats`` interleaved rounds (a burst of other work hits all
    kernels alike), the fastest kept. Kernels that fail here are left out. ``load()`` is recorded
    as timing begins; ``turn()`` is held around each piece (a daemon's generation lock)."""
    load_1m, cores = load()
    started = time.time()
    gen = torch.Generator(device="cpu").manual_seed(0)
    vocab, d = int(cfg.vocab_size), int(cfg.hidden_size)
    shapes = packed_shapes(cfg)
    dense_layer = [(torch.randn(n, k, generator=gen) * 0.02).to(device) for n, k in shapes]
    w_head = (torch.randn(vocab, d, generator=gen) * 0.02).to(device)
    inputs = {rows: {k: torch.randn(rows, k, generator=gen).to(device, compute_dtype) for _, k in shapes}
              for rows in tuple(short_rows) + tuple(prefill_rows)}
    jobs: list[tuple[str, str, int, Callable[[], Any]]] = []     # (part, kernel, rows, run)
    packs: dict[str, tuple[list[tuple[torch.Tensor, torch.Tensor | None]], tuple[Any, Any]]] = {}
    for kernel in kernels:
        fn, storage = KERNEL_FNS[kernel], KERNELS[kernel]
        try:
            with turn():
                if storage not in packs:      # kernels reading one storage share its packed weights
                    head_pack = (pack(storage, w_head) if storage in HEAD_STORAGES or storage in ROW_KERNELS
                                 else (None, None))
                    packs[storage] = ([pack(storage, w) for w in dense_layer], head_pack)
                packed, (hw, hs) = packs[storage]
                # can it run here? at the most rows measured: torch._int_mm (int8-dynamic)
                # needs more than 16 rows on CUDA, and a 1-row probe would rule it out
                probe = max(inputs)
                fn(inputs[probe][shapes[0][1]], packed[0][0], None, packed[0][1])
                if hw is not None:
                    fn(inputs[probe][d], hw, None, hs)
        except (RuntimeError, NotImplementedError, TypeError, ValueError, AttributeError) as exc:
            say(f"kernel {kernel}: not available here ({str(exc).splitlines()[0][:120]})")
            continue

        def layer(xs: dict[int, torch.Tensor], fn: Kernel = fn, packed: list = packed) -> None:
            # as the forward runs them: qkv, o, gate_up, down, each on its own input
            for (_, k), (w, s) in zip(shapes, packed):
                fn(xs[k], w, None, s)

        for rows, xs in inputs.items():
            jobs.append(("blocks", kernel, rows, functools.partial(layer, xs)))
        for rows in short_rows if hw is not None else ():
            jobs.append(("head", kernel, rows, functools.partial(fn, inputs[rows][d], hw, None, hs)))
    best: dict[tuple[str, str, int], float] = {}
    failed: set[str] = set()
    for round_ in range(repeats + 1):              # round 0 warms up (first-touch, packing caches)
        for part, kernel, rows, run in jobs:
            if kernel in failed:
                continue
            try:
                with turn():
                    ms = timed(run, device)[1]
            except (RuntimeError, NotImplementedError, TypeError) as exc:
                say(f"kernel {kernel} failed at {rows} rows: {str(exc).splitlines()[0][:120]}")
                failed.add(kernel)
                continue
            if round_:
                key = (part, kernel, rows)
                best[key] = min(best.get(key, float("inf")), ms)
    jobs.clear()
    packs.clear()
    blocks: dict[str, dict[int, float]] = {}
    head: dict[str, dict[int, float]] = {}
    for (part, kernel, rows), ms in best.items():
        if kernel not in failed:
            (blocks if part == "blocks" else head).setdefault(kernel, {})[rows] = round(ms, 4)
    blocks = {k: monotone(v) for k, v in blocks.items()}
    head = {k: monotone(v) for k, v in head.items() if k in blocks}     # none for int4 (decoder layers only)
    return TimingTable(blocks, head, int(cfg.num_hidden_layers), machine_info(device), load_1m=load_1m,
                       cores=cores, measured_at=round(started, 1),
                       model={"layers": int(cfg.num_hidden_layers), "hidden": d, "vocab": vocab},
                       products=PACKED_PRODUCTS)


def cpu_flags() -> list[str]:
    """The CPU features that decide which kernels are fast (from
    /proc/cpuinfo; empty where it cannot be read)."""
    wanted = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16",
              "avx_vnni", "amx_tile", "amx_int8", "amx_bf16", "asimd", "sve", "i8mm", "bf16")
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return []
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            have = set(line.split(":", 1)[1].split())
            return [f for f in wanted if f in have]
    return []


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's name with family, model and stepping from /proc/cpuinfo (or ``cpuinfo``): VMs of
    different CPU generations can share a name and flags, and a table does not carry over."""
    try:
        fields: dict[str, str] = {}
        text = Path("/proc/cpuinfo").read_text(errors="replace") if cpuinfo is None else cpuinfo
        for line in text.splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "cpu family", "model", "stepping") and key not in fields:
                fields[key] = value.strip()
            elif not line.strip() and fields:
                break                            # the first processor's block is enough
        if "model name" in fields:
            ids = " ".join(f"{k.removeprefix('cpu ')} {fields[k]}" for k in ("cpu family", "model", "stepping")
                           if k in fields)
            return fields["model name"] + (f" ({ids})" if ids else "")
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(device: torch.device) -> dict[str, Any]:
    """What the table was measured on: shown beside every plan, and part of the cache key."""
    info: dict[str, Any] = {"torch": torch.__version__, "device": device.type, "threads": torch.get_num_threads(),
                            "cpu": cpu_model(), "cpu_flags": cpu_flags()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
    return info


def plan_key(cfg: Any, device: torch.device, compute_dtype: torch.dtype) -> str:
    """The plan cache's key: machine (CPU model and flags, GPU), torch
    version, threads, compute dtype and the model's shapes."""
    shapes = {"layers": int(cfg.num_hidden_layers), "shapes": layer_shapes(cfg), "vocab": int(cfg.vocab_size)}
    blob = json.dumps({"format": PLAN_FORMAT, "machine": machine_info(device), "dtype": str(compute_dtype),
                       "model": shapes}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def _plan_file(key: str) -> Path:
    return paths.cache_dir() / "kernel-plans" / f"{key}.json"


def load_table(key: str) -> TimingTable | None:
    """The cached table for ``key``, or None (absent or damaged)."""
    try:
        data = json.loads(_plan_file(key).read_text())
        if data.get("format") != PLAN_FORMAT:
            return None
        return TimingTable.from_dict(data["table"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_json(path: Path, doc: Any, indent: int = 1) -> None:
    """Write ``doc`` to ``path`` atomically (a reader sees the old or the new file, never half
    of one); raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=indent), encoding="utf-8")
    os.replace(tmp, path)


def save_table(key: str, table: TimingTable) -> None:
    """Write the table atomically (a crash never leaves half a file)."""
    try:
        write_json(_plan_file(key), {"format": PLAN_FORMAT, "table": table.to_dict()})
    except OSError as exc:
        log.warning("cannot cache the kernel timings (%s); they will be measured again next start", exc)


def progress_say(progress: bool) -> Callable[[str], None]:
    """Where start-up's measuring says what it does: the console (``progress``), else the log."""
    return (lambda m: print(f"soldaemon: {m}", flush=True)) if progress else (lambda m: log.info("%s", m))


def plan_for(cfg: Any, device: torch.device, compute_dtype: torch.dtype, precision: str = "auto", *,
             say: Callable[[str], None] = lambda _s: None, row_copy: bool = True,
             load: Callable[[], tuple[float | None, int]] = machine_load,
             exact: frozenset[str] | None = EXACT_VERIFY) -> tuple[KernelPlan, TimingTable, bool]:
    """(plan, table, cached) for ``cfg`` on ``device``, from the cached table unless a CPU table
    was timed under load and the machine is quiet now (``load()``), else timed and cached now.
    ``row_copy``: memory holds the blocked copy; ``exact``: the kernels a verify may use (None:
    speculation off). Raises ValueError for a bad precision or when nothing could be measured."""
    key = plan_key(cfg, device, compute_dtype)
    table = load_table(key)
    why = retime_reason(table, *load()) if table is not None and device.type == "cpu" else None
    if table is None or why is not None:
        t0 = time.perf_counter()
        say(f"timing the linear kernels again: {why}…" if why else
            "measuring the linear kernels on this machine (once)…")
        fresh = measure_table(cfg, device, compute_dtype, say=say, load=load)
        if table is not None:
            fresh = dataclasses.replace(fresh, replaced_load_1m=table.load_1m)
        log.info("kernel timings measured in %.1f s", time.perf_counter() - t0)
        save_table(key, fresh)
        return choose_plan(fresh, precision, row_copy=row_copy, exact=exact), fresh, False
    return choose_plan(table, precision, row_copy=row_copy, exact=exact), table, True


def compute_dtype_for(device: torch.device, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype of the residual stream, norms, attention and KV cache: float32
    on a CPU (cheap next to the products; keeps norms and softmax exact),
    the model's own on a GPU."""
    return torch.float32 if device.type == "cpu" else model_dtype
