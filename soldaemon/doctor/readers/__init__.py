"""Reading the machine for the doctor (no judging): :mod:`.nvml`, :mod:`.host`,
data types in :mod:`.readings`. Readings are frozen and JSON-able; an unreported value is
``None`` with the reason in ``notes``; only a wholly unusable source raises
:class:`ProbeUnavailable`. Read-only: nothing here changes a GPU setting. The NVML module is
injectable, so tests replay recorded readings."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from soldaemon.errors import ProbeUnavailable

# Re-exported; read_gpus and read_machine look these names up here, so tests patch them here.
from soldaemon.doctor.readers.host import parse_cpuinfo, read_cache, read_cpu, read_cuda_view, read_torch
from soldaemon.doctor.readers.nvml import load_nvml, read_nvml
from soldaemon.doctor.readers.readings import (CacheReading, CpuReading, CudaDevice, CudaView, DaemonReading, GpuProbe,
                                               GpuProcess, GpuReading, MachineReading, TorchReading)


def read_gpus(nvml_loader: Callable[[], Any] | None = None) -> GpuProbe:
    """Every GPU NVML sees. Never raises: a failed read leaves its reason in the result."""
    try:
        gpus = read_nvml((nvml_loader or load_nvml)())
    except ProbeUnavailable as exc:
        return GpuProbe(source=None, gpus=(), nvml_error=str(exc))
    if not gpus:
        return GpuProbe(source=None, gpus=(), nvml_error="no devices")
    return GpuProbe(source="nvml", gpus=tuple(gpus))


def read_machine(*, cache_root: Path | None = None, device: str | None = None) -> MachineReading:
    """Everything the doctor judges but the daemon (:func:`soldaemon.doctor.daemon.probe_running_daemon`
    reads that); ``device`` is the configured ``device.device``. Never raises."""
    gpu = read_gpus()
    return MachineReading(
        gpu=gpu,
        cpu=read_cpu(),
        torch=read_torch(),
        cache=read_cache(cache_root),
        daemon=None,
        cuda_view=read_cuda_view(device) if gpu.gpus else None,
    )
