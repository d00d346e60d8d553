"""Reading the machine for the doctor (no judging): :mod:`.nvml`, :mod:`.smi`, :mod:`.host`,
data types in :mod:`.readings`. Readings are frozen and JSON-able; an unreported value is
``None`` with the reason in ``notes``; only a wholly unusable source raises
:class:`ProbeUnavailable`. Read-only: nothing here changes a GPU setting. The NVML module and
the ``nvidia-smi`` runner are injectable, so tests replay recorded readings."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from soldaemon.errors import ProbeUnavailable

# Re-exported; read_gpus and read_machine look these names up here, so tests patch them here.
from soldaemon.doctor.readers.host import (DEFAULT_PORT, VECTOR_FLAGS, parse_cpuinfo, read_cache,
                                           read_cpu, read_cuda_view, read_torch)
from soldaemon.doctor.readers.nvml import cuda_version_from_int, load_nvml, read_nvml
from soldaemon.doctor.readers.readings import (CachedModel, CacheReading, ComputeMode, CpuReading, CudaDevice, CudaView,
                                               DaemonReading, GpuProbe, GpuProcess, GpuReading, GpuSource,
                                               MachineReading, MigSlice, Runner, TorchReading)
from soldaemon.doctor.readers.smi import (READ_ONLY_ARGVS, SMI_APP_FIELDS, SMI_APPS_ARGV, SMI_BANNER_ARGV,
                                          SMI_CORE_ARGV, SMI_CORE_FIELDS, SMI_FIELDS, SMI_QUERY_ARGV, SMI_STATE_ARGV,
                                          SMI_STATE_FIELDS, read_nvidia_smi, run_nvidia_smi)


def read_gpus(nvml_loader: Callable[[], Any] | None = None, run: Runner | None = None) -> GpuProbe:
    """NVML first, ``nvidia-smi`` as the fallback. Never raises: a failed source leaves its
    reason in the result."""
    loader = nvml_loader if nvml_loader is not None else load_nvml
    runner = run if run is not None else run_nvidia_smi
    nvml_error: str
    try:
        gpus = read_nvml(loader())
        if gpus:
            return GpuProbe(source="nvml", gpus=tuple(gpus))
        nvml_error = "no devices"
    except ProbeUnavailable as exc:
        nvml_error = str(exc)
    try:
        gpus = read_nvidia_smi(runner)
        if gpus:
            return GpuProbe(source="nvidia-smi", gpus=tuple(gpus), nvml_error=nvml_error)
        smi_error = "no devices"
    except ProbeUnavailable as exc:
        smi_error = str(exc)
    return GpuProbe(source=None, gpus=(), nvml_error=nvml_error, smi_error=smi_error)


def read_machine(
    *,
    nvml_loader: Callable[[], Any] | None = None,
    run: Runner | None = None,
    cache_root: Path | None = None,
    torch_reader: Callable[[], TorchReading] | None = None,
    cpu_reader: Callable[[], CpuReading] | None = None,
    device: str | None = None,
) -> MachineReading:
    """Everything the doctor judges but the daemon (:func:`soldaemon.doctor.daemon.probe_running_daemon`
    reads that); ``device`` is the configured ``device.device``. Never raises."""
    gpu = read_gpus(nvml_loader, run)
    return MachineReading(
        gpu=gpu,
        cpu=(cpu_reader or read_cpu)(),
        torch=(torch_reader or read_torch)(),
        cache=read_cache(cache_root),
        daemon=None,
        cuda_view=read_cuda_view(device) if gpu.gpus else None,
    )
