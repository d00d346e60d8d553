"""Reading the machine: GPUs (NVML, ``nvidia-smi``), CPU, torch, the model
cache, a running daemon. Pure reading, no judging (see :mod:`soldaemon.doctor.checks`).

One module per source: :mod:`.nvml`, :mod:`.smi` (``nvidia-smi``),
:mod:`.host` (CPU, torch, model cache, daemon); the data they return is
:mod:`.readings`. Here: :func:`read_gpus` and :func:`read_machine`, which
put them together.

Contracts:

- Every reader returns frozen, JSON-able data (:class:`GpuReading`,
  :class:`MachineReading`, ...). A value the source did not report is ``None``;
  why it is missing goes into ``notes``. Readers never raise for a field that
  cannot be read, only :class:`ProbeUnavailable` when the whole source is
  unusable (no NVML library, no ``nvidia-smi``, no driver).
- Read-only. :func:`read_nvml` calls only ``nvmlInit``, ``nvmlShutdown``,
  ``nvmlSystemGet*`` and ``nvmlDeviceGet*``. :func:`read_nvidia_smi` passes its
  runner only the argv lists in :data:`READ_ONLY_ARGVS`, and the real runner
  (:func:`run_nvidia_smi`) refuses anything else, runs without a shell and
  with a timeout. Nothing here changes a GPU setting; the doctor prints the
  commands that would, for the user to run.
- Injectable: :func:`read_nvml` takes the ``pynvml`` module as a parameter and
  :func:`read_nvidia_smi` takes the command runner, so tests replay recorded
  readings from fake devices.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from soldaemon.errors import ProbeUnavailable

# Re-exported: callers and tests use ``readers.<name>``. read_gpus and
# read_machine below look the readers up here, so patching
# ``readers.read_torch`` (or load_nvml, run_nvidia_smi, read_cpu,
# probe_daemon) changes what they call.
from soldaemon.doctor.readers.host import (DEFAULT_PORT, VECTOR_FLAGS, parse_cpuinfo, probe_daemon, read_cache,
                                           read_cpu, read_cuda_view, read_torch)
from soldaemon.doctor.readers.nvml import cuda_version_from_int, load_nvml, read_nvml
from soldaemon.doctor.readers.readings import (CachedModel, CacheReading, ComputeMode, CpuReading, CudaDevice, CudaView,
                                               DaemonReading, GpuProbe, GpuProcess, GpuReading, GpuSource,
                                               MachineReading, MigSlice, Runner, TorchReading)
from soldaemon.doctor.readers.smi import (READ_ONLY_ARGVS, SMI_APP_FIELDS, SMI_APPS_ARGV, SMI_BANNER_ARGV,
                                          SMI_CORE_ARGV, SMI_CORE_FIELDS, SMI_FIELDS, SMI_QUERY_ARGV, SMI_STATE_ARGV,
                                          SMI_STATE_FIELDS, read_nvidia_smi, run_nvidia_smi)


def read_gpus(nvml_loader: Callable[[], Any] | None = None, run: Runner | None = None) -> GpuProbe:
    """NVML first, ``nvidia-smi`` as the fallback. Never raises: a source
    that fails leaves its reason in the result."""
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
    port: int | None = DEFAULT_PORT,
    nvml_loader: Callable[[], Any] | None = None,
    run: Runner | None = None,
    cache_root: Path | None = None,
    torch_reader: Callable[[], TorchReading] | None = None,
    cpu_reader: Callable[[], CpuReading] | None = None,
    device: str | None = None,
) -> MachineReading:
    """Everything the doctor judges. ``port=None`` skips the daemon probe
    (start-up: the daemon is the one starting); ``device`` is the
    configured ``device.device``. Never raises."""
    gpu = read_gpus(nvml_loader, run)
    return MachineReading(
        gpu=gpu,
        cpu=(cpu_reader or read_cpu)(),
        torch=(torch_reader or read_torch)(),
        cache=read_cache(cache_root),
        daemon=probe_daemon(port) if port is not None else None,
        cuda_view=read_cuda_view(device) if gpu.gpus else None,
    )
