"""Reading GPUs through NVML: only ``nvmlInit``, ``nvmlShutdown``, ``nvmlSystemGet*`` and
``nvmlDeviceGet*`` are ever called."""

from __future__ import annotations

import re
from typing import Any

from soldaemon.errors import ProbeUnavailable
from soldaemon.doctor.readers.readings import ComputeMode, GpuProcess, GpuReading, MigSlice


_NVML_ALLOWED = re.compile(r"^nvml(Init|Shutdown|SystemGet\w+|DeviceGet\w+)$")


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class ReadOnlyNvml:
    """Calls a pynvml-like module, turning NVMLError into ``None`` plus a note; refuses (raises
    ValueError for) any function ``_NVML_ALLOWED`` does not match."""

    def __init__(self, module: Any) -> None:
        self.m = module
        err = getattr(module, "NVMLError", None)
        self.error: type[BaseException] = err if isinstance(err, type) else Exception

    def call(self, notes: list[str], fn_name: str, *args: Any) -> Any:
        if not _NVML_ALLOWED.match(fn_name):
            raise ValueError(f"refusing to call {fn_name}: doctor only reads")
        fn = getattr(self.m, fn_name, None)
        if fn is None:
            notes.append(f"{fn_name}: not in this pynvml")
            return None
        try:
            return fn(*args)
        except self.error as exc:
            notes.append(f"{fn_name}: {exc}")
            return None

    def const(self, name: str, default: int) -> int:
        value = getattr(self.m, name, default)
        return int(value) if isinstance(value, int) else default


def load_nvml() -> Any:
    """Import ``pynvml`` (package ``nvidia-ml-py``); :class:`ProbeUnavailable` if missing."""
    try:
        import pynvml
    except ImportError as exc:
        raise ProbeUnavailable(f"pynvml not importable ({exc})") from exc
    return pynvml


def read_nvml(nvml: Any) -> list[GpuReading]:
    """Read every GPU through ``nvml`` (``pynvml`` or a fake). Raises :class:`ProbeUnavailable`
    when ``nvmlInit`` or the device count fails; ``[]`` when the driver sees no GPU."""
    api = ReadOnlyNvml(nvml)
    try:
        nvml.nvmlInit()
    except api.error as exc:
        raise ProbeUnavailable(str(exc)) from exc
    try:
        sys_notes: list[str] = []
        driver = api.call(sys_notes, "nvmlSystemGetDriverVersion")
        cuda = api.call(sys_notes, "nvmlSystemGetCudaDriverVersion")
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except api.error as exc:
            raise ProbeUnavailable(str(exc)) from exc
        driver_s = _text(driver) if driver is not None else None
        # NVML's CUDA version integer is major * 1000 + minor * 10: "12.4".
        cuda_s = f"{cuda // 1000}.{(cuda % 1000) // 10}" if isinstance(cuda, int) and cuda > 0 else None
        return [_read_nvml_device(api, i, driver_s, cuda_s, tuple(sys_notes)) for i in range(count)]
    finally:
        try:
            nvml.nvmlShutdown()
        except api.error:
            pass


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _read_nvml_device(
    api: ReadOnlyNvml, index: int, driver: str | None, cuda: str | None, sys_notes: tuple[str, ...]
) -> GpuReading:
    notes: list[str] = list(sys_notes)
    handle = api.call(notes, "nvmlDeviceGetHandleByIndex", index)
    if handle is None:
        return GpuReading(index=index, name="(unreadable)", source="nvml",
                          driver_version=driver, cuda_driver_version=cuda, notes=tuple(notes))

    def get(fn: str, *args: Any) -> Any:
        return api.call(notes, fn, handle, *args)

    name = get("nvmlDeviceGetName")
    uuid = get("nvmlDeviceGetUUID")
    pci = get("nvmlDeviceGetPciInfo")
    bus_id = getattr(pci, "busId", None) if pci is not None else None
    cc = get("nvmlDeviceGetCudaComputeCapability")
    enabled = api.const("NVML_FEATURE_ENABLED", 1)
    pm = get("nvmlDeviceGetPersistenceMode")

    ecc = get("nvmlDeviceGetEccMode")
    ecc_cur = ecc_pend = None
    uncorrected = retired = remap_pending = remap_failure = None
    if isinstance(ecc, (tuple, list)) and len(ecc) == 2:
        ecc_cur, ecc_pend = ecc[0] == enabled, ecc[1] == enabled
    if ecc_cur:
        uncorrected = _int_or_none(get(
            "nvmlDeviceGetTotalEccErrors",
            api.const("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
            api.const("NVML_VOLATILE_ECC", 0),
        ))
        rp = get("nvmlDeviceGetRetiredPagesPendingStatus")
        retired = None if rp is None else rp == enabled
        rows = get("nvmlDeviceGetRemappedRows")
        if isinstance(rows, (tuple, list)) and len(rows) == 4:
            remap_pending, remap_failure = bool(rows[2]), bool(rows[3])

    sm = api.const("NVML_CLOCK_SM", 1)
    mem = api.const("NVML_CLOCK_MEM", 2)
    if getattr(api.m, "nvmlDeviceGetCurrentClocksEventReasons", None) is not None:
        reasons = get("nvmlDeviceGetCurrentClocksEventReasons")
    else:
        reasons = get("nvmlDeviceGetCurrentClocksThrottleReasons")
    meminfo = get("nvmlDeviceGetMemoryInfo")

    return GpuReading(
        index=index,
        name=_text(name) if name is not None else "(unknown)",
        source="nvml",
        uuid=_text(uuid) if uuid is not None else None,
        pci_bus_id=_text(bus_id) if bus_id is not None else None,
        driver_version=driver,
        cuda_driver_version=cuda,
        compute_capability=(int(cc[0]), int(cc[1])) if isinstance(cc, (tuple, list)) else None,
        persistence_mode=None if pm is None else pm == enabled,
        ecc_enabled=ecc_cur,
        ecc_pending=ecc_pend,
        ecc_uncorrected_volatile=uncorrected,
        retired_pages_pending=retired,
        remap_pending=remap_pending,
        remap_failure=remap_failure,
        pcie_gen_current=_int_or_none(get("nvmlDeviceGetCurrPcieLinkGeneration")),
        pcie_gen_max=_int_or_none(get("nvmlDeviceGetMaxPcieLinkGeneration")),
        pcie_gen_gpu_max=_int_or_none(get("nvmlDeviceGetGpuMaxPcieLinkGeneration")),
        pcie_width_current=_int_or_none(get("nvmlDeviceGetCurrPcieLinkWidth")),
        pcie_width_max=_int_or_none(get("nvmlDeviceGetMaxPcieLinkWidth")),
        sm_clock_mhz=_int_or_none(get("nvmlDeviceGetClockInfo", sm)),
        sm_clock_max_mhz=_int_or_none(get("nvmlDeviceGetMaxClockInfo", sm)),
        mem_clock_mhz=_int_or_none(get("nvmlDeviceGetClockInfo", mem)),
        mem_clock_max_mhz=_int_or_none(get("nvmlDeviceGetMaxClockInfo", mem)),
        clock_event_reasons=_int_or_none(reasons),
        memory_total_bytes=_int_or_none(getattr(meminfo, "total", None)),
        memory_free_bytes=_int_or_none(getattr(meminfo, "free", None)),
        memory_used_bytes=_int_or_none(getattr(meminfo, "used", None)),
        processes=_read_nvml_processes(api, notes, handle),
        **_read_nvml_state(api, notes, handle),
        notes=tuple(notes),
    )


# nvmlComputeMode_t, by value.
_COMPUTE_MODES: dict[int, ComputeMode] = {
    0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}


def _watts(milliwatts: Any) -> float | None:
    v = _int_or_none(milliwatts)
    return None if v is None else v / 1000.0


def _read_nvml_state(api: ReadOnlyNvml, notes: list[str], handle: Any) -> dict[str, Any]:
    """The :class:`GpuReading` display, MIG, compute-mode, power and temperature fields."""
    def get(fn: str, *args: Any) -> Any:
        return api.call(notes, fn, handle, *args)

    enabled = api.const("NVML_FEATURE_ENABLED", 1)
    display = get("nvmlDeviceGetDisplayActive")
    mig = get("nvmlDeviceGetMigMode")
    mig_on = bool(mig[0] == api.const("NVML_DEVICE_MIG_ENABLE", 1)) \
        if isinstance(mig, (tuple, list)) and len(mig) == 2 else None
    mode = get("nvmlDeviceGetComputeMode")
    limits = get("nvmlDeviceGetPowerManagementLimitConstraints")
    return {
        "display_active": None if display is None else display == enabled,
        "mig_enabled": mig_on,
        "mig_slices": _read_mig_slices(api, notes, handle) if mig_on else None,
        "compute_mode": _COMPUTE_MODES.get(mode) if isinstance(mode, int) else None,
        "power_limit_w": _watts(get("nvmlDeviceGetEnforcedPowerLimit")),
        "power_default_limit_w": _watts(get("nvmlDeviceGetPowerManagementDefaultLimit")),
        "power_max_limit_w": _watts(limits[1]) if isinstance(limits, (tuple, list)) and len(limits) == 2 else None,
        "temperature_c": _int_or_none(get("nvmlDeviceGetTemperature", api.const("NVML_TEMPERATURE_GPU", 0))),
        "temperature_slowdown_c": _int_or_none(get(
            "nvmlDeviceGetTemperatureThreshold", api.const("NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", 1))),
    }


def _read_mig_slices(api: ReadOnlyNvml, notes: list[str], handle: Any) -> tuple[MigSlice, ...] | None:
    """The MIG devices of a GPU in MIG mode; ``None`` when they cannot be listed."""
    count = _int_or_none(api.call(notes, "nvmlDeviceGetMaxMigDeviceCount", handle))
    if count is None:
        return None
    slices: list[MigSlice] = []
    for i in range(count):
        mig = api.call([], "nvmlDeviceGetMigDeviceHandleByIndex", handle, i)   # NotFound: an empty place
        if mig is None:
            continue
        uuid = api.call(notes, "nvmlDeviceGetUUID", mig)
        meminfo = api.call(notes, "nvmlDeviceGetMemoryInfo", mig)
        slices.append(MigSlice(uuid=_text(uuid) if uuid is not None else None,
                               memory_total_bytes=_int_or_none(getattr(meminfo, "total", None))))
    return tuple(slices)


def _read_nvml_processes(api: ReadOnlyNvml, notes: list[str], handle: Any) -> tuple[GpuProcess, ...] | None:
    found: dict[int, GpuProcess] = {}
    listed = False
    for kind, fn in (("compute", "nvmlDeviceGetComputeRunningProcesses"),
                     ("graphics", "nvmlDeviceGetGraphicsRunningProcesses")):
        procs = api.call(notes, fn, handle)
        if procs is None:
            continue
        listed = True
        for p in procs:
            pid = int(p.pid)
            if pid in found:                    # "C+G": count it once, as compute
                continue
            pname = api.call([], "nvmlSystemGetProcessName", pid)
            found[pid] = GpuProcess(
                pid=pid,
                name=_text(pname) if pname else None,
                used_bytes=_int_or_none(getattr(p, "usedGpuMemory", None)),
                kind="compute" if kind == "compute" else "graphics",
            )
    return tuple(found.values()) if listed else None
