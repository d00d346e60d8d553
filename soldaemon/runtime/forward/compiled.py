"""The decoder layer under ``torch.compile`` (inductor), kept only where measured faster: at load,
before warm-up, :func:`choose_layer` times decode steps through graphs of the eager and compiled
layer and :func:`decide` keeps the faster. The choice is recorded under
``cache_dir()/layer-compile`` per device, torch and model shapes. Off on a CPU by default: the
kernel plan's products do not fuse, and the compile costs a start tens of seconds."""

from __future__ import annotations

import json
import logging
import os
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from soldaemon import paths
from soldaemon.runtime.forward.kernels import write_json
from soldaemon.runtime.forward.layer import decoder_layer
from soldaemon.runtime.forward.timing import timed

if TYPE_CHECKING:
    from soldaemon.runtime.forward.cudagraph import GraphDecoder

log = logging.getLogger("soldaemon.compile")

MIN_GAIN = 0.03        # the compiled step's median must be this share faster to be kept
STEPS = 20             # timed decode steps per variant
RECOMPILE_LIMIT = 64   # inductor variants per function: windows x row buckets
# "on" / "off" / "auto" (the default): what choose_layer does when not told;
# for runs that must bound their start (scripts/gpu_check.sh), not a setting
ENV_OVERRIDE = "SOLDAEMON_LAYER_COMPILE"


@dataclass(frozen=True)
class CompileChoice:
    """Whether the decoder layer runs compiled, and why (ms: medians of steps through graphs)."""

    compiled: bool
    eager_ms: float | None        # ms a step, eager layer
    compiled_ms: float | None     # ms a step, compiled layer
    compile_s: float | None       # s: compile + capture of the first graph
    reason: str
    reused: bool = False          # read from the record, not measured now


def decide(eager_ms: Sequence[float], compiled_ms: Sequence[float], compile_s: float | None, *,
           min_gain: float = MIN_GAIN) -> CompileChoice:
    """Keep the compiled layer when its median step is at least ``min_gain`` faster. Pure."""
    if not eager_ms or not compiled_ms:
        return CompileChoice(False, None, None, compile_s, "no timings")
    e, c = statistics.median(eager_ms), statistics.median(compiled_ms)
    if c <= e * (1 - min_gain):
        return CompileChoice(True, e, c, compile_s, f"compiled {c:.3f} ms vs eager {e:.3f} ms a step: kept")
    return CompileChoice(False, e, c, compile_s,
                         f"compiled {c:.3f} ms vs eager {e:.3f} ms a step: not {min_gain:.0%} faster, dropped")


def compile_layer() -> Callable[..., torch.Tensor]:
    """:func:`~.layer.decoder_layer` under inductor's default mode (no CUDA graphs of its own: ours
    capture it). Compiles lazily per shape, in the capture's warm-up runs."""
    import torch._dynamo.config as dynamo_config

    # one variant per (window, rows) the graphs capture: more than the default 8
    if getattr(dynamo_config, "recompile_limit", RECOMPILE_LIMIT) < RECOMPILE_LIMIT:
        dynamo_config.recompile_limit = RECOMPILE_LIMIT
    return torch.compile(decoder_layer, backend="inductor", mode="default")


def record_key(device: torch.device, shape_key: str) -> str:
    """The record's file name: the device's name, torch's version and ``shape_key``."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    raw = f"{name}-torch{torch.__version__}-{shape_key}"
    return "".join(ch if ch.isalnum() or ch in "-._" else "_" for ch in raw)


def record_path(key: str, root: Path | None = None) -> Path:
    return (root or paths.cache_dir()) / "layer-compile" / f"{key}.json"


def load_choice(path: Path) -> CompileChoice | None:
    """The recorded choice, or None (none yet, or unreadable)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        return CompileChoice(**{**doc, "reused": True})
    except (OSError, ValueError, TypeError):
        return None


def save_choice(path: Path, choice: CompileChoice) -> None:
    """Write the record atomically (a reader sees the old or the new one)."""
    write_json(path, {**asdict(choice), "reused": False}, indent=2)


def time_steps(graphs: GraphDecoder, steps: int, *, cache: Any = None) -> list[float]:
    """ms of each of ``steps`` decode steps through ``graphs`` (a first, capturing step untimed).
    Raises RuntimeError when a step does not replay a graph."""
    out: list[float] = []
    for i in range(steps + 1):
        replayed, ms = timed(lambda: graphs.step(1, i % 8, cache), graphs.device)
        if replayed is None:
            raise RuntimeError(f"no graph replayed ({graphs.failure or 'graphs off'})")
        if i:
            out.append(ms)
    return out


def shape_key(backend: Any) -> str:
    """The model's shapes, weight format and decode kernel, for :func:`record_key`."""
    plan = backend.plan
    return (f"L{len(backend.layers)}-H{backend.n_heads}-KV{backend.n_kv}-hd{backend.head_dim}-"
            f"{str(backend.dtype).removeprefix('torch.')}-{plan.storage}-{plan.short}")


def measure(graphs: GraphDecoder, *, steps: int = STEPS,
            compiler: Callable[[], Callable[..., torch.Tensor]] = compile_layer) -> CompileChoice:
    """Before warm-up (``graphs`` not sealed): time ``steps`` decode steps eager, then compiled,
    through the same graphs over a scratch KV cache; leaves ``graphs`` on the faster layer with no
    graph captured. Never raises: a failed compile, graphs that do not replay, or no memory for
    the scratch cache keep the eager layer, the reason said."""
    backend = graphs.b
    layer: Callable[..., torch.Tensor] = decoder_layer
    eager: list[float] = []
    try:
        scratch = backend.new_cache()
        eager = time_steps(graphs, steps, cache=scratch)
        graphs.use_layer(compiler())
        first, ms = timed(lambda: graphs.step(1, 0, scratch), graphs.device)   # compile + first capture
        if first is None:
            raise RuntimeError(f"no graph with the compiled layer ({graphs.failure})")
        compile_s = ms / 1e3
        compiled_ms = time_steps(graphs, steps, cache=scratch)
    except Exception as exc:                          # inductor's errors have no common base; OOM
        what = "compile failed" if eager else "eager steps failed"
        return CompileChoice(False, statistics.median(eager) if eager else None, None, None,
                             f"{what}: {type(exc).__name__}: {exc}".splitlines()[0][:200])
    else:
        choice = decide(eager, compiled_ms, compile_s)
        if choice.compiled:
            layer = graphs.layer
        return choice
    finally:
        graphs.use_layer(layer)


def choose_layer(graphs: GraphDecoder, *, force: bool | None = None, root: Path | None = None,
                 steps: int = STEPS, on_cpu: bool = False) -> CompileChoice:
    """At load, before :meth:`~.cudagraph.GraphDecoder.warm_up`: the layer the graphs run.
    ``force`` True/False: compiled / eager unmeasured; None: :data:`ENV_OVERRIDE`, else off on a
    CPU (unless ``on_cpu``), else the recorded choice, or :func:`measure` and record it. Logged."""
    if force is None:
        force = {"on": True, "off": False}.get(os.environ.get(ENV_OVERRIDE, "auto").strip().lower())
    if force is False or not graphs.usable():
        return CompileChoice(False, None, None, None, "off" if force is False else "no graphs")
    if force is None and graphs.device.type != "cuda" and not on_cpu:
        return CompileChoice(False, None, None, None, "off on a CPU (the kernel plan's products do not fuse)")
    path = record_path(record_key(graphs.device, shape_key(graphs.b)), root)
    recorded = load_choice(path) if force is None else None
    if recorded is not None:
        if recorded.compiled:
            graphs.use_layer(compile_layer())
        log.info("layer compile: %s (recorded: %s)", "on" if recorded.compiled else "off", recorded.reason)
        return recorded
    if force:
        graphs.use_layer(compile_layer())
        return CompileChoice(True, None, None, None, "forced on")
    choice = measure(graphs, steps=steps)
    log.info("layer compile: %s; %s; compile and first capture %.1f s", "on" if choice.compiled else "off",
             choice.reason, choice.compile_s or 0.0)
    if choice.eager_ms is None:                      # nothing measured (no memory, no graphs): ask again next start
        return choice
    try:
        save_choice(path, choice)
    except OSError as exc:
        log.warning("layer compile: the choice is not recorded (%s)", exc)
    return choice

