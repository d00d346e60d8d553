"""What the readers return: frozen, JSON-able data; ``None`` for a value
the source did not report, the reason in ``notes``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class GpuProcess:
    """A process holding a context on a GPU; ``used_bytes`` is ``None`` where the driver does
    not say (Windows WDDM, some containers)."""

    pid: int
    name: str | None
    used_bytes: int | None
    kind: Literal["compute", "graphics"]


ComputeMode = Literal["Default", "Exclusive_Thread", "Prohibited", "Exclusive_Process"]


@dataclass(frozen=True)
class MigSlice:
    """One MIG device (a slice of a GPU in MIG mode)."""

    uuid: str | None                          # "MIG-..."; what CUDA_VISIBLE_DEVICES names
    memory_total_bytes: int | None


@dataclass(frozen=True)
class CudaDevice:
    """One device as torch numbers it (``cuda:N``); ``None`` where torch does not report a field."""

    index: int                                # N of cuda:N
    name: str
    uuid: str | None                          # "GPU-..." / "MIG-..." as NVML writes it
    pci_bus_id: str | None                    # "00000000:01:00.0" as NVML writes it


@dataclass(frozen=True)
class CudaView:
    """What decides which NVML GPU the configured ``cuda:N`` is."""

    device: str                               # "cuda:0"; config device.device ("auto" reads as cuda:0)
    visible_devices: str | None               # CUDA_VISIBLE_DEVICES; None: unset
    device_order: str | None                  # CUDA_DEVICE_ORDER; None: unset (FASTEST_FIRST)
    torch_devices: tuple[CudaDevice, ...] | None = None   # None: CUDA not initialised here


@dataclass(frozen=True)
class GpuReading:
    """One GPU as the driver reports it; ``None``: not reported (``notes`` says why)."""

    index: int
    name: str
    source: Literal["nvml"]
    uuid: str | None = None
    pci_bus_id: str | None = None
    driver_version: str | None = None         # "550.90.07"
    cuda_driver_version: str | None = None    # newest CUDA the driver supports, "12.4"
    compute_capability: tuple[int, int] | None = None
    persistence_mode: bool | None = None
    ecc_enabled: bool | None = None           # current mode; None: no ECC on this GPU
    ecc_pending: bool | None = None           # mode after the next reboot
    ecc_uncorrected_volatile: int | None = None   # since the driver loaded
    retired_pages_pending: bool | None = None # pre-Ampere page retirement
    remap_pending: bool | None = None         # Ampere+ row remapping
    remap_failure: bool | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None           # GPU and platform together
    pcie_gen_gpu_max: int | None = None       # the GPU alone
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    mem_clock_mhz: int | None = None
    mem_clock_max_mhz: int | None = None
    clock_event_reasons: int | None = None    # NVML bit mask (nvmlClocksEventReason*)
    memory_total_bytes: int | None = None
    memory_free_bytes: int | None = None
    memory_used_bytes: int | None = None
    processes: tuple[GpuProcess, ...] | None = None   # None: could not list
    display_active: bool | None = None        # a display is driven by this GPU now
    mig_enabled: bool | None = None           # MIG mode (current); None: no MIG on this GPU
    mig_slices: tuple[MigSlice, ...] | None = None    # None: not read (MIG off)
    compute_mode: ComputeMode | None = None
    power_limit_w: float | None = None        # the enforced limit; W
    power_default_limit_w: float | None = None    # the board's default; W
    power_max_limit_w: float | None = None    # the most it may be set to; W
    temperature_c: int | None = None          # GPU core; degrees C
    temperature_slowdown_c: int | None = None # where the GPU starts to slow down; degrees C
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class GpuProbe:
    """What NVML found; ``source`` is ``None`` when it found no GPU, and ``nvml_error`` says why."""

    source: Literal["nvml"] | None
    gpus: tuple[GpuReading, ...]
    nvml_error: str | None = None


@dataclass(frozen=True)
class CpuReading:
    arch: str                                  # platform.machine(): "x86_64", "aarch64"
    model: str | None
    logical_cores: int | None
    physical_cores: int | None
    ram_total_bytes: int | None
    ram_available_bytes: int | None
    vector_flags: tuple[str, ...] | None       # None: not read on this platform
    flags_source: str | None                   # "/proc/cpuinfo"


@dataclass(frozen=True)
class TorchReading:
    version: str | None                        # None: torch not importable
    cuda: str | None                           # torch.version.cuda; None: CPU build
    error: str | None = None


@dataclass(frozen=True)
class CachedModel:
    name: str                                  # path relative to the cache root
    size_bytes: int


@dataclass(frozen=True)
class CacheReading:
    path: str
    exists: bool
    models: tuple[CachedModel, ...]
    disk_free_bytes: int | None


@dataclass(frozen=True)
class DaemonReading:
    url: str
    reachable: bool                            # something answered HTTP
    status: int | None                         # HTTP status, None if no answer
    detail: str                                # body excerpt or the error


@dataclass(frozen=True)
class MachineReading:
    gpu: GpuProbe
    cpu: CpuReading
    torch: TorchReading
    cache: CacheReading
    daemon: DaemonReading | None               # None: not probed (start-up)
    cuda_view: CudaView | None = None          # None: no GPU
