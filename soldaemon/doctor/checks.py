"""``soldaemon doctor``: judge machine readings and print the verdicts.

Reading lives in :mod:`soldaemon.doctor.readers`; the judges here are pure (no I/O). The doctor
never runs a fix or changes a GPU setting: a ``fix`` is a command for the user to run.
Verdicts: ok; info (nothing to do); warn (works, slower or fragile); fail (cannot work as is).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import asdict, dataclass, replace
from typing import Any, Iterable, Literal, Sequence

from soldaemon.doctor import readers
from soldaemon.doctor import gpu_state
from soldaemon.doctor.daemon import daemon_report, probe_running_daemon, served_health
from soldaemon.doctor.plan import model_report, plan_report
from soldaemon.doctor.readers import (CacheReading, CpuReading, DaemonReading, GpuReading, MachineReading,
                                      TorchReading)
from soldaemon.weights.embedded import EMBEDDED_MODELS

Verdict = Literal["ok", "info", "warn", "fail"]
VERDICTS: tuple[Verdict, ...] = ("ok", "info", "warn", "fail")

GiB = 1024 ** 3
MiB = 1024 ** 2

# GPU memory the embedded model needs with its KV cache and the CUDA context.
MODEL_GPU_BYTES = 2 * GiB
# Available RAM below which the CPU path and the model conversion fail / are tight.
RAM_FAIL_BYTES = 3 * GiB // 2
RAM_WARN_BYTES = 4 * GiB
# Disk the first-start conversion needs in the cache folder.
CONVERT_DISK_BYTES = 3 * GiB
# Fewer logical cores than this makes CPU-only completions slow.
CPU_MIN_CORES = 4
FAST_PATH_CC = (8, 0)
DEFAULT_PORT = 8765                     # the daemon's, for --port

# NVML clock event ("throttle") reason bits: idle, software power cap, then the slowdowns.
REASON_GPU_IDLE = 0x1
REASON_SW_POWER_CAP = 0x4
_SLOWDOWNS = {
    0x8: "hardware slowdown",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "power brake",
}

# PyTorch wheel index tags, oldest first; a fix suggests the newest the driver can run.
TORCH_CUDA_TAGS: tuple[tuple[int, int], ...] = (
    (11, 8), (12, 1), (12, 4), (12, 6), (12, 8), (12, 9), (13, 0))


@dataclass(frozen=True)
class Check:
    """One verdict. ``name`` is a stable id ("gpu0.persistence"); ``cost``, ``fix`` (a command
    for the user) and ``facts`` (figures for ``--json``) are ``None`` when there are none."""

    name: str
    verdict: Verdict
    detail: str
    cost: str | None = None
    fix: str | None = None
    facts: dict[str, Any] | None = None


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GiB:.1f} GiB"


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / MiB:.0f} MiB"


def _version(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    parts = text.split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None


def arch_name(cc: tuple[int, int]) -> str:
    """The architecture family of a CUDA compute capability."""
    major, minor = cc
    if major >= 10:
        return "Blackwell"
    if major == 9:
        return "Hopper"
    if major == 8:
        return "Ada Lovelace" if minor >= 9 else "Ampere"
    if major == 7:
        return "Turing" if minor >= 5 else "Volta"
    return {6: "Pascal", 5: "Maxwell", 3: "Kepler"}.get(major, "unknown architecture")


def torch_install_fix(driver_cuda: str | None) -> str | None:
    """Pip command for the newest torch CUDA build not above the driver's CUDA, else the newest
    of the same major (minor-version compatibility); ``None`` if none fits."""
    drv = _version(driver_cuda)
    tags = [t for t in TORCH_CUDA_TAGS if drv is None or t <= drv]
    if not tags and drv is not None:
        tags = [t for t in TORCH_CUDA_TAGS if t[0] == drv[0]]
    if not tags:
        return None
    major, minor = tags[-1]
    return (f"pip install --force-reinstall torch --index-url "
            f"https://download.pytorch.org/whl/cu{major}{minor}")


def _driver_fix(driver_cuda: str | None) -> str:
    pip = torch_install_fix(driver_cuda)
    return "upgrade the NVIDIA driver" + (f", or: {pip}" if pip else "")


def _lspci_fix(r: GpuReading) -> str:
    bus = r.pci_bus_id or ""
    short = bus.split(":", 1)[1] if bus.count(":") == 2 else bus
    sel = f" -s {short}" if short else " -d 10de:"
    return f"sudo lspci -vv{sel} | grep -E 'LnkCap|LnkSta'"


def judge(
    reading: GpuReading,
    torch_cuda_version: str | None,
    *,
    torch_version: str | None = "unknown",
    include_driver: bool = True,
    own_pid: int | None = None,
    visible_devices: str | None = None,
) -> list[Check]:
    """All checks for one GPU. ``torch_cuda_version``: ``None`` for a CPU build;
    ``torch_version``: ``None`` when torch is not importable; ``include_driver`` adds the
    once-per-machine CUDA check; ``own_pid`` is not an "other process"."""
    p = f"gpu{reading.index}"
    if reading.name == "(unreadable)":
        why = "; ".join(reading.notes) or "no handle"
        return [Check(p, "fail", f"cannot read this GPU ({why})",
                      cost="the daemon cannot use it",
                      fix="nvidia-smi -q  (then check `sudo dmesg | grep -i xid` and reboot)")]
    checks = [_judge_arch(p, reading)]
    if include_driver:
        checks.append(_judge_cuda(reading, torch_cuda_version, torch_version))
    others = [x for x in reading.processes or () if x.pid != own_pid and x.kind == "compute"]
    checks += [
        Check(f"{p}.persistence", **gpu_state.persistence_line(reading)),
        _judge_ecc(p, reading),
        _judge_pcie(p, reading),
        _judge_clocks(p, reading),
        _judge_memory(p, reading),
        _judge_processes(p, reading, own_pid),
        Check(f"{p}.mig", **gpu_state.mig_line(reading, visible_devices)),
        Check(f"{p}.compute_mode", **gpu_state.compute_mode_line(reading, len(others))),
        Check(f"{p}.power", **gpu_state.power_line(reading)),
        Check(f"{p}.temperature", **gpu_state.temperature_line(reading)),
    ]
    return checks


def _judge_arch(p: str, r: GpuReading) -> Check:
    cc = r.compute_capability
    if cc is None:
        return Check(p, "warn", f"{r.name}, compute capability not reported: assuming safe mode",
                     cost="the fast path (compute capability >= 8.0) stays off until the daemon can tell",
                     fix="python -c 'import torch; print(torch.cuda.get_device_capability())'")
    label = f"{r.name}, compute {cc[0]}.{cc[1]} ({arch_name(cc)})"
    if cc >= FAST_PATH_CC:
        return Check(p, "ok", f"{label}: fast path")
    if cc < (5, 0):
        return Check(p, "fail", f"{label}: PyTorch ships no kernels for compute capability below 5.0",
                     cost="the daemon cannot use this GPU and runs on the CPU")
    why = ("safe mode: no native bf16 before Ampere (compute capability 8.0), "
           "so the model runs in fp16, off the fast path")
    fix = None
    if cc < (7, 5):
        why += "; recent PyTorch CUDA builds may ship no kernels for it at all"
        fix = "python -c 'import torch; print(torch.cuda.get_arch_list())'"
    return Check(p, "warn", f"{label}: {why}",
                 cost="slower prefill and decode than the fast path: higher time to first token",
                 fix=fix)


def _judge_cuda(r: GpuReading, torch_cuda: str | None, torch_version: str | None) -> Check:
    drv = r.cuda_driver_version
    head = f"driver {r.driver_version or '?'} supports CUDA {drv or '?'}"
    if torch_version is None:
        return Check("cuda", "fail", f"{head}; torch is not importable",
                     cost="no inference at all", fix=torch_install_fix(drv) or _driver_fix(drv))
    if torch_cuda is None:
        return Check("cuda", "warn", f"{head}; torch {torch_version} is CPU-only; install a CUDA build",
                     cost="the GPU sits unused: completions run on the CPU",
                     fix=torch_install_fix(drv) or _driver_fix(drv))
    run_v, drv_v = _version(torch_cuda), _version(drv)
    tail = f"torch {torch_version} uses CUDA {torch_cuda}"
    if run_v is None or drv_v is None:
        return Check("cuda", "info", f"{head}; {tail}; cannot compare the versions")
    if run_v[0] > drv_v[0]:
        return Check("cuda", "fail", f"{head}; {tail}: the runtime is newer than the driver supports",
                     cost="CUDA initialisation fails: the daemon falls back to the CPU",
                     fix=_driver_fix(drv))
    if run_v > drv_v:
        return Check("cuda", "warn",
                     f"{head}; {tail}: newer than the driver; CUDA minor-version compatibility "
                     "usually lets it run, but kernels compiled at load time (PTX) fail",
                     cost="some kernels may fail to load; a driver upgrade removes the risk",
                     fix=_driver_fix(drv))
    return Check("cuda", "ok", f"{head}; {tail}: compatible")


def _judge_ecc(p: str, r: GpuReading) -> Check:
    n = f"{p}.ecc"
    reset = f"sudo nvidia-smi -r -i {r.index}   (when no process uses the GPU), or reboot"
    if r.remap_failure:
        return Check(n, "fail", "ECC row remapping has failed: this GPU's memory has more bad rows than it can repair",
                     cost="uncorrectable memory errors will keep killing the processes that hit them",
                     fix="nvidia-smi -q -d ROW_REMAPPER,ECC   (then ask the vendor about a replacement)")
    if r.ecc_enabled is None:
        return Check(n, "info", "ECC not supported or not reported (usual on consumer GPUs)")
    if r.remap_pending or r.retired_pages_pending:
        what = "row remapping" if r.remap_pending else "page retirement"
        errs = f"; {r.ecc_uncorrected_volatile} uncorrected errors since the driver loaded" \
            if r.ecc_uncorrected_volatile else ""
        return Check(n, "warn", f"ECC on; a {what} is pending until the GPU is reset{errs}",
                     cost="the bad memory stays in use until the reset: another uncorrected error "
                          "would kill the process that hits it",
                     fix=reset)
    if r.ecc_uncorrected_volatile:
        return Check(n, "warn", f"ECC on; {r.ecc_uncorrected_volatile} uncorrected errors since the driver loaded",
                     cost="each one killed the process that hit it; more may follow",
                     fix="nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER")
    if r.ecc_pending is not None and r.ecc_pending != r.ecc_enabled:
        state = "on" if r.ecc_enabled else "off"
        after = "on" if r.ecc_pending else "off"
        return Check(n, "warn", f"ECC {state} now, {after} after the next GPU reset (a change is pending)",
                     cost="the memory size and bandwidth change at the next reset",
                     fix=reset)
    if not r.ecc_enabled:
        return Check(n, "info", "ECC off: no memory error correction (fine for completions)")
    return Check(n, "ok", "ECC on, no uncorrected errors")


def _judge_pcie(p: str, r: GpuReading) -> Check:
    n = f"{p}.pcie"
    gc, gm, wc, wm = r.pcie_gen_current, r.pcie_gen_max, r.pcie_width_current, r.pcie_width_max
    if gc is None or gm is None or wc is None or wm is None:
        return Check(n, "info", "PCIe link not reported")
    link = f"PCIe Gen{gc} x{wc} (max Gen{gm} x{wm})"
    cost = "the weights (and any host-to-GPU copies) move slower: longer model load; " \
           "per-token traffic is small"
    if wc < wm:
        return Check(n, "warn", f"{link}: the link trained narrower than the card allows "
                     "(a x8 slot, a riser, lanes shared by BIOS bifurcation)",
                     cost=cost, fix=_lspci_fix(r) + "   (then move the card to a full-width slot)")
    if gc < gm:
        idle = " the GPU is idle now;" if (r.clock_event_reasons or 0) & REASON_GPU_IDLE else ""
        return Check(n, "warn", f"{link}: NVML reports the current link, which many cards drop to a "
                     f"lower generation at idle to save power;{idle} check it under load",
                     cost="none if it rises under load; otherwise " + cost,
                     fix="nvidia-smi --query-gpu=pcie.link.gen.current,pcie.link.gen.max --format=csv -lms 500"
                         "   (while a completion runs; Ctrl-C to stop)")
    if r.pcie_gen_gpu_max is not None and r.pcie_gen_gpu_max > gm:
        return Check(n, "warn", f"{link}: the card supports Gen{r.pcie_gen_gpu_max}, the slot or platform "
                     f"limits it to Gen{gm}", cost=cost, fix=_lspci_fix(r))
    return Check(n, "ok", link)


def _judge_clocks(p: str, r: GpuReading) -> Check:
    n = f"{p}.clocks"
    if r.sm_clock_mhz is None or r.sm_clock_max_mhz is None:
        return Check(n, "info", "clocks not reported")
    text = f"SM {r.sm_clock_mhz}/{r.sm_clock_max_mhz} MHz"
    if r.mem_clock_mhz is not None and r.mem_clock_max_mhz is not None:
        text += f", memory {r.mem_clock_mhz}/{r.mem_clock_max_mhz} MHz"
    reasons = r.clock_event_reasons
    if reasons is None:
        return Check(n, "ok", f"{text} (clock limit reasons not reported)")
    slow = [label for bit, label in _SLOWDOWNS.items() if reasons & bit]
    if slow:
        return Check(n, "warn", f"{text}: clocks held down by {', '.join(slow)}",
                     cost="prefill and decode run slower until the cause clears "
                          "(cooling, airflow, power cables, power limit)",
                     fix="nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER")
    state = []
    if reasons & REASON_GPU_IDLE:
        state.append("idle, clocks rise under load")
    if reasons & REASON_SW_POWER_CAP:
        state.append("at its power cap")
    return Check(n, "ok", text + (f" ({'; '.join(state)})" if state else ""))


def _judge_memory(p: str, r: GpuReading) -> Check:
    n, needed = f"{p}.memory", MODEL_GPU_BYTES
    free, total = r.memory_free_bytes, r.memory_total_bytes
    if free is None or total is None:
        return Check(n, "info", "GPU memory not reported")
    text = f"{_gib(free)} free of {_gib(total)}"
    if free < needed:
        return Check(n, "fail", f"{text}: the model needs about {_gib(needed)}",
                     cost="the model does not fit: the daemon runs on the CPU or fails with out-of-memory",
                     fix="nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv"
                         "   (free memory by stopping processes you own)")
    if free < 2 * needed:
        return Check(n, "warn", f"{text}: little room beyond the model's ~{_gib(needed)}",
                     cost="long contexts or several candidates may run out of memory",
                     fix="nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv")
    return Check(n, "ok", text)


def _judge_processes(p: str, r: GpuReading, own_pid: int | None) -> Check:
    n = f"{p}.processes"
    if r.processes is None:
        return Check(n, "info", "processes on this GPU cannot be listed (permissions or a container)")
    others = [x for x in r.processes if x.pid != own_pid]
    compute = [x for x in others if x.kind == "compute"]
    graphics = [x for x in others if x.kind == "graphics"]

    def fmt(xs: Sequence[readers.GpuProcess]) -> str:
        return ", ".join(f"{x.name or '?'} (pid {x.pid}, {_mib(x.used_bytes)})" for x in xs)

    if compute:
        return Check(n, "warn", f"{len(compute)} other compute process(es): {fmt(compute)}",
                     cost="they share the GPU's cores and memory bandwidth: time to first token "
                          "varies with their load",
                     fix="nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv")
    if graphics:
        return Check(n, "ok", f"display only: {fmt(graphics)}")
    return Check(n, "ok", "no other processes")


def judge_torch(t: TorchReading, has_gpu: bool) -> Check:
    if t.version is None:
        return Check("torch", "fail", f"torch is not importable ({t.error})",
                     cost="no inference at all", fix="pip install torch")
    if t.cuda is None:
        return Check("torch", "ok", f"torch {t.version} (CPU build)")
    extra = "" if has_gpu else "; unused without a GPU"
    return Check("torch", "ok", f"torch {t.version} (CUDA {t.cuda} build{extra})")


def judge_cpu(c: CpuReading, has_gpu: bool) -> list[Check]:
    """Cores, RAM and vector extensions; the core count is judged only without a GPU."""
    out: list[Check] = []
    cores = f"{c.logical_cores or '?'} logical / {c.physical_cores or '?'} physical cores"
    if c.model:
        cores += f", {c.model}"
    if not has_gpu and c.logical_cores is not None and c.logical_cores < CPU_MIN_CORES:
        out.append(Check("cpu.cores", "warn", f"{cores}: few cores for CPU inference",
                         cost="completions run on these cores: expect them to be slow"))
    else:
        out.append(Check("cpu.cores", "ok", cores))

    avail, total = c.ram_available_bytes, c.ram_total_bytes
    ram = f"RAM {_gib(avail)} available of {_gib(total)}"
    if avail is None:
        out.append(Check("cpu.ram", "info", "RAM not reported"))
    elif avail < RAM_FAIL_BYTES:
        out.append(Check("cpu.ram", "fail", f"{ram}: the model conversion and the CPU path need ~{_gib(RAM_FAIL_BYTES)}",
                         cost="loading or converting the model fails with out-of-memory",
                         fix="free -h   (close memory-hungry programs)"))
    elif avail < RAM_WARN_BYTES:
        out.append(Check("cpu.ram", "warn", f"{ram}: tight",
                         cost="the system may swap while the model loads",
                         fix="free -h   (close memory-hungry programs)"))
    else:
        out.append(Check("cpu.ram", "ok", ram))

    flags = c.vector_flags
    if flags is None:
        out.append(Check("cpu.vector", "info", f"{c.arch}: vector extensions not read on this platform"))
    elif c.arch in {"x86_64", "AMD64", "i686", "x86"}:
        have = set(flags)
        shown = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")
                 if f in have]
        missing = [f for f in ("avx512f", "amx_bf16") if f not in have]
        text = ", ".join(shown) or "none of avx2/avx512/amx"
        if missing:
            text += f" (no {', no '.join(missing)})"
        if "avx2" not in have:
            out.append(Check("cpu.vector", "warn", f"{text}: no avx2",
                             cost="torch falls back to slow generic kernels on the CPU path"))
        else:
            out.append(Check("cpu.vector", "ok", text))
    else:
        text = ", ".join(flags) or "no SIMD flags reported"
        verdict: Verdict = "ok" if "asimd" in flags else "info"
        out.append(Check("cpu.vector", verdict, f"{c.arch}: {text}"))
    return out


def judge_cache(c: CacheReading) -> Check:
    if not c.models:
        low = c.disk_free_bytes is not None and c.disk_free_bytes < CONVERT_DISK_BYTES
        text = f"no converted model in {c.path}: first start will convert the embedded model (~80 s)"
        if low:
            return Check("model_cache", "warn", f"{text}; only {_gib(c.disk_free_bytes)} free there",
                         cost="the conversion may run out of disk",
                         fix=f"df -h {c.path}   (or point SOLDAEMON_CACHE_DIR at a larger disk)")
        return Check("model_cache", "info", text)
    total = sum(m.size_bytes for m in c.models)
    names = ", ".join(m.name for m in c.models)
    return Check("model_cache", "ok", f"{len(c.models)} converted model(s), {_gib(total)} in {c.path}: {names}")


def judge_daemon(d: DaemonReading) -> Check:
    return Check("daemon", **daemon_report(d))


def judge_machine(m: MachineReading, *, own_pid: int | None = None, layers: int | None = None,
                  threads: int | None = None, model_path: str | None = None, precision: str = "auto",
                  speculative: bool = True, blocked_copy: bool = True) -> list[Check]:
    """All checks, GPU first (``cuda_device``, then per GPU); without a GPU one ``gpu`` info
    check. ``precision``, ``speculative``, ``blocked_copy`` are the config's."""
    checks: list[Check] = []
    has_gpu = bool(m.gpu.gpus)
    if has_gpu:
        view = m.cuda_view
        if view is not None:
            checks.append(Check("cuda_device", **gpu_state.cuda_device_line(view, m.gpu.gpus)))
        for i, g in enumerate(m.gpu.gpus):
            checks += judge(g, m.torch.cuda, torch_version=m.torch.version, include_driver=i == 0,
                            own_pid=own_pid, visible_devices=view.visible_devices if view is not None else None)
    else:
        checks.append(Check("gpu", "info", f"no NVIDIA GPU found (NVML: {m.gpu.nvml_error or 'no devices'}) "
                            "— running on CPU"))
    checks.append(judge_torch(m.torch, has_gpu))
    checks += judge_cpu(m.cpu, has_gpu)
    checks.append(judge_cache(m.cache))
    settings: dict[str, Any] = {"precision": precision, "speculative": speculative, "blocked_copy": blocked_copy}
    checks.append(Check("kernel_plan", **plan_report(m.cpu.vector_flags, layers=layers, threads=threads,
                                                     served=served_health(m.daemon), model_path=model_path,
                                                     **settings)))
    checks.append(Check("model_choice", **model_report(m.cpu.vector_flags, **settings)))
    if m.daemon is not None:
        checks.append(judge_daemon(m.daemon))
    return checks


def worst(checks: Iterable[Check]) -> Verdict:
    """``fail`` if any check fails, else ``warn`` if any warns, else ``ok``."""
    verdicts = {c.verdict for c in checks}
    if "fail" in verdicts:
        return "fail"
    return "warn" if "warn" in verdicts else "ok"


def summarize(checks: Sequence[Check]) -> dict[str, Any]:
    """``{"status": worst verdict, "counts": {verdict: n}, "checks": [...]}`` (JSON-able)."""
    return {
        "status": worst(checks),
        "counts": {v: sum(1 for c in checks if c.verdict == v) for v in VERDICTS},
        "checks": [asdict(c) for c in checks],
    }


def format_human(checks: Sequence[Check]) -> str:
    """``[ ok ] name: detail`` per check with indented cost/fix lines, then a summary."""
    lines: list[str] = []
    for c in checks:
        if c.name == "gpu" and c.verdict == "info":
            lines.append(c.detail)
            continue
        lines.append(f"[{c.verdict:^4}] {c.name}: {c.detail}")
        if c.cost:
            lines.append(f"       cost: {c.cost}")
        if c.fix:
            lines.append(f"       fix:  {c.fix}")
    s = summarize(checks)
    counts = ", ".join(f"{s['counts'][v]} {v}" for v in ("fail", "warn", "ok", "info"))
    lines.append(f"status: {s['status']} ({counts})")
    return "\n".join(lines)


def log_checks(checks: Sequence[Check], log: logging.Logger | None = None) -> None:
    """Log each check: fail at ERROR, warn at WARNING, the rest at INFO."""
    log = log or logging.getLogger("soldaemon.doctor.checks")
    levels = {"fail": logging.ERROR, "warn": logging.WARNING}
    for c in checks:
        msg = f"doctor {c.verdict} {c.name}: {c.detail}"
        if c.fix:
            msg += f" (fix: {c.fix})"
        log.log(levels.get(c.verdict, logging.INFO), msg)


def startup_checks() -> list[Check]:
    """The doctor's checks minus the daemon probe, for the daemon's start and ``health``.
    Never raises."""
    try:
        machine = readers.read_machine()
        return judge_machine(machine, own_pid=os.getpid())
    except Exception as exc:                      # health must never take the daemon down
        return [Check("doctor", "warn", f"start-up checks failed: {type(exc).__name__}: {exc}")]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help="with no daemon found: the port to check for another program "
                             f"(default {DEFAULT_PORT})")


def _configured(config: Any) -> dict[str, Any]:
    """:func:`judge_machine`'s settings from ``config`` (its defaults without one); ``layers``
    stays ``None`` where the config does not fix the model (a model path, ``model.name: auto``)."""
    if config is None:
        return {}
    model = None if config.model.path else EMBEDDED_MODELS.get(config.model.name)
    return {"layers": model.shapes.layers if model is not None and model.shapes is not None else None,
            "threads": config.device.threads, "model_path": str(config.model.path) if config.model.path else None,
            "precision": config.model.precision, "speculative": config.completion.speculative,
            "blocked_copy": config.model.blocked_copy}


def run(args: argparse.Namespace, config: Any = None) -> int:
    """Read the machine, judge, print; 1 if any check fails, else 0."""
    machine = readers.read_machine(device=config.device.device if config is not None else None)
    machine = replace(machine, daemon=probe_running_daemon(config, args.port))
    checks = judge_machine(machine, own_pid=os.getpid(), **_configured(config))
    if args.json:
        doc = {"schema": 1, **summarize(checks), "reading": asdict(machine)}
        print(json.dumps(doc, indent=2))
    else:
        print(format_human(checks))
    return 1 if worst(checks) == "fail" else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="soldaemon doctor",
                                     description="Check this machine's readiness for soldaemon.")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
