"""Reading the machine: GPUs (NVML, ``nvidia-smi``), CPU, torch, the model
cache, a running daemon. Pure reading, no judging (see :mod:`soldaemon.doctor`).

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

import os
import platform
import re
import shutil
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

from soldaemon import paths
from soldaemon.errors import CommandFailed, ProbeUnavailable

GpuSource = Literal["nvml", "nvidia-smi"]
Runner = Callable[[list[str]], str]






# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class GpuProcess:
    """A process holding a context on a GPU. ``used_bytes`` is ``None`` where
    the driver does not say (Windows WDDM, some containers)."""

    pid: int
    name: str | None
    used_bytes: int | None
    kind: Literal["compute", "graphics"]


@dataclass(frozen=True)
class GpuReading:
    """One GPU as the driver reports it. ``None`` = not reported (see
    ``notes`` for why: "Not Supported", "Insufficient Permissions", ...)."""

    index: int
    name: str
    source: GpuSource
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
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class GpuProbe:
    """What the GPU readers found. ``source`` is ``None`` when neither worked
    or no GPU exists; ``nvml_error`` / ``smi_error`` say why (``None`` for a
    source that was not needed)."""

    source: GpuSource | None
    gpus: tuple[GpuReading, ...]
    nvml_error: str | None = None
    smi_error: str | None = None


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


# --------------------------------------------------------------------------- NVML

_NVML_ALLOWED = re.compile(r"^nvml(Init|Shutdown|SystemGet\w+|DeviceGet\w+)$")


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def cuda_version_from_int(value: int) -> str:
    """NVML's CUDA version integer (``major * 1000 + minor * 10``) as "12.4"."""
    return f"{value // 1000}.{(value % 1000) // 10}"


class _Nvml:
    """Calls into a pynvml-like module, turning NVMLError into ``None`` plus a
    note. Refuses any function that is not a read (see ``_NVML_ALLOWED``)."""

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
    """Import ``pynvml`` (package ``nvidia-ml-py``). Raises
    :class:`ProbeUnavailable` if it is not installed."""
    try:
        import pynvml
    except ImportError as exc:
        raise ProbeUnavailable(f"pynvml not importable ({exc})") from exc
    return pynvml


def read_nvml(nvml: Any) -> list[GpuReading]:
    """Read every GPU through ``nvml`` (the ``pynvml`` module or a fake with
    the same functions). Raises :class:`ProbeUnavailable` when ``nvmlInit``
    or the device count fails; returns ``[]`` when the driver sees no GPU."""
    api = _Nvml(nvml)
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
        cuda_s = cuda_version_from_int(int(cuda)) if isinstance(cuda, int) and cuda > 0 else None
        return [_read_nvml_device(api, i, driver_s, cuda_s, tuple(sys_notes)) for i in range(count)]
    finally:
        try:
            nvml.nvmlShutdown()
        except api.error:
            pass


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _read_nvml_device(
    api: _Nvml, index: int, driver: str | None, cuda: str | None, sys_notes: tuple[str, ...]
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
        notes=tuple(notes),
    )


def _read_nvml_processes(api: _Nvml, notes: list[str], handle: Any) -> tuple[GpuProcess, ...] | None:
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


# --------------------------------------------------------------------- nvidia-smi

SMI_FIELDS: tuple[str, ...] = (
    "index", "name", "uuid", "pci.bus_id", "driver_version", "compute_cap",
    "persistence_mode", "ecc.mode.current", "ecc.mode.pending",
    "ecc.errors.uncorrected.volatile.total", "retired_pages.pending",
    "remapped_rows.pending", "remapped_rows.failure",
    "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.gen.gpumax",
    "pcie.link.width.current", "pcie.link.width.max",
    "clocks.sm", "clocks.max.sm", "clocks.mem", "clocks.max.mem",
    "clocks_throttle_reasons.active",
    "memory.total", "memory.free", "memory.used",
)
# Older drivers reject the whole query if one field is unknown
# ("Field ... is not a valid field to query"), so retry with fields every
# driver of the last decade knows.
SMI_CORE_FIELDS: tuple[str, ...] = (
    "index", "name", "uuid", "pci.bus_id", "driver_version", "persistence_mode",
    "ecc.mode.current", "pcie.link.gen.current", "pcie.link.gen.max",
    "pcie.link.width.current", "pcie.link.width.max",
    "clocks.sm", "clocks.max.sm", "memory.total", "memory.free", "memory.used",
)
SMI_APP_FIELDS: tuple[str, ...] = ("gpu_uuid", "pid", "used_gpu_memory", "process_name")

SMI_QUERY_ARGV: tuple[str, ...] = (
    "nvidia-smi", "--query-gpu=" + ",".join(SMI_FIELDS), "--format=csv,noheader,nounits")
SMI_CORE_ARGV: tuple[str, ...] = (
    "nvidia-smi", "--query-gpu=" + ",".join(SMI_CORE_FIELDS), "--format=csv,noheader,nounits")
SMI_APPS_ARGV: tuple[str, ...] = (
    "nvidia-smi", "--query-compute-apps=" + ",".join(SMI_APP_FIELDS), "--format=csv,noheader,nounits")
SMI_BANNER_ARGV: tuple[str, ...] = ("nvidia-smi",)   # the summary table: "CUDA Version: 12.4"

READ_ONLY_ARGVS: frozenset[tuple[str, ...]] = frozenset(
    {SMI_QUERY_ARGV, SMI_CORE_ARGV, SMI_APPS_ARGV, SMI_BANNER_ARGV})

_NA = {"", "n/a", "[n/a]", "not supported", "[not supported]", "unknown error",
       "[unknown error]", "insufficient permissions", "[insufficient permissions]",
       "not available", "[not available]"}


def run_nvidia_smi(argv: list[str], *, timeout_s: float = 5.0) -> str:
    """Run one of :data:`READ_ONLY_ARGVS` (never a shell) and return stdout.

    Raises ``ValueError`` for any other argv, ``FileNotFoundError`` if
    ``nvidia-smi`` is not on ``PATH``, :class:`CommandFailed` on a non-zero
    exit or after ``timeout_s``."""
    if tuple(argv) not in READ_ONLY_ARGVS:
        raise ValueError(f"refusing to run {argv!r}: doctor runs only read-only queries")
    exe = shutil.which(argv[0])
    if exe is None:
        raise FileNotFoundError(argv[0])
    try:
        done = subprocess.run([exe, *argv[1:]], capture_output=True, text=True,
                              timeout=timeout_s, check=False, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise CommandFailed(None, f"timed out after {timeout_s:g} s") from exc
    if done.returncode != 0:
        raise CommandFailed(done.returncode, (done.stdout or "") + (done.stderr or ""))
    return done.stdout


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


def _smi_value(raw: str) -> str | None:
    value = raw.strip()
    return None if value.lower() in _NA else value


def _smi_int(raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        return int(float(raw))
    except ValueError:
        return None


def _smi_bool(raw: str | None) -> bool | None:
    if raw is None:
        return None
    v = raw.lower()
    if v in {"enabled", "yes", "true", "1", "on"}:
        return True
    if v in {"disabled", "no", "false", "0", "off"}:
        return False
    return None


def _smi_mib(raw: str | None) -> int | None:
    v = _smi_int(raw)
    return None if v is None else v * 1024 * 1024


def read_nvidia_smi(run: Runner) -> list[GpuReading]:
    """Read every GPU by running ``nvidia-smi`` through ``run`` (argv in,
    stdout out; it raises on failure). ``run`` only ever receives argv lists
    from :data:`READ_ONLY_ARGVS`. Raises :class:`ProbeUnavailable` when
    ``nvidia-smi`` is missing or fails; returns ``[]`` for no GPU."""
    notes: list[str] = []
    fields = SMI_FIELDS
    try:
        try:
            out = run(list(SMI_QUERY_ARGV))
        except CommandFailed as exc:
            if "valid field" not in str(exc).lower():
                raise
            notes.append(f"nvidia-smi: {_first_line(str(exc))}; using the basic field set")
            fields = SMI_CORE_FIELDS
            out = run(list(SMI_CORE_ARGV))
    except FileNotFoundError as exc:
        raise ProbeUnavailable("not found") from exc
    except CommandFailed as exc:
        if exc.returncode == 6 or "no devices were found" in str(exc).lower():
            return []
        raise ProbeUnavailable(_first_line(str(exc))) from exc
    except OSError as exc:
        raise ProbeUnavailable(str(exc)) from exc

    cuda: str | None = None
    try:
        m = re.search(r"CUDA Version\s*:\s*([0-9]+\.[0-9]+)", run(list(SMI_BANNER_ARGV)))
        cuda = m.group(1) if m else None
        if m is None:
            notes.append("nvidia-smi: no CUDA version in the summary table")
    except (CommandFailed, OSError) as exc:
        notes.append(f"nvidia-smi summary: {_first_line(str(exc))}")

    apps: dict[str, list[GpuProcess]] | None = {}
    try:
        for line in run(list(SMI_APPS_ARGV)).splitlines():
            if not line.strip():
                continue
            parts = [p.strip() for p in line.split(",", len(SMI_APP_FIELDS) - 1)]
            if len(parts) != len(SMI_APP_FIELDS) or _smi_int(parts[1]) is None:
                notes.append(f"nvidia-smi apps: unparsed line {line!r}")
                continue
            assert apps is not None
            apps.setdefault(parts[0], []).append(GpuProcess(
                pid=int(parts[1]), name=_smi_value(parts[3]),
                used_bytes=_smi_mib(_smi_value(parts[2])), kind="compute"))
    except (CommandFailed, OSError) as exc:
        notes.append(f"nvidia-smi apps: {_first_line(str(exc))}")
        apps = None

    readings: list[GpuReading] = []
    for line in out.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(fields):
            raise ProbeUnavailable(f"unexpected nvidia-smi output: {line!r}")
        row = {f: _smi_value(c) for f, c in zip(fields, cells)}
        readings.append(_smi_row(row, cuda, apps, tuple(notes)))
    return readings


def _smi_row(row: dict[str, str | None], cuda: str | None,
             apps: dict[str, list[GpuProcess]] | None, notes: tuple[str, ...]) -> GpuReading:
    g = row.get
    cc_raw = g("compute_cap")
    cc: tuple[int, int] | None = None
    if cc_raw and re.fullmatch(r"\d+\.\d+", cc_raw):
        major, minor = cc_raw.split(".")
        cc = (int(major), int(minor))
    reasons_raw = g("clocks_throttle_reasons.active")
    reasons: int | None = None
    if reasons_raw:
        try:
            reasons = int(reasons_raw, 16)
        except ValueError:
            reasons = None
    uuid = g("uuid")
    ecc = _smi_bool(g("ecc.mode.current"))
    return GpuReading(
        index=_smi_int(g("index")) or 0,
        name=g("name") or "(unknown)",
        source="nvidia-smi",
        uuid=uuid,
        pci_bus_id=g("pci.bus_id"),
        driver_version=g("driver_version"),
        cuda_driver_version=cuda,
        compute_capability=cc,
        persistence_mode=_smi_bool(g("persistence_mode")),
        ecc_enabled=ecc,
        ecc_pending=_smi_bool(g("ecc.mode.pending")),
        ecc_uncorrected_volatile=_smi_int(g("ecc.errors.uncorrected.volatile.total")) if ecc else None,
        retired_pages_pending=_smi_bool(g("retired_pages.pending")) if ecc else None,
        remap_pending=_smi_bool(g("remapped_rows.pending")) if ecc else None,
        remap_failure=_smi_bool(g("remapped_rows.failure")) if ecc else None,
        pcie_gen_current=_smi_int(g("pcie.link.gen.current")),
        pcie_gen_max=_smi_int(g("pcie.link.gen.max")),
        pcie_gen_gpu_max=_smi_int(g("pcie.link.gen.gpumax")),
        pcie_width_current=_smi_int(g("pcie.link.width.current")),
        pcie_width_max=_smi_int(g("pcie.link.width.max")),
        sm_clock_mhz=_smi_int(g("clocks.sm")),
        sm_clock_max_mhz=_smi_int(g("clocks.max.sm")),
        mem_clock_mhz=_smi_int(g("clocks.mem")),
        mem_clock_max_mhz=_smi_int(g("clocks.max.mem")),
        clock_event_reasons=reasons,
        memory_total_bytes=_smi_mib(g("memory.total")),
        memory_free_bytes=_smi_mib(g("memory.free")),
        memory_used_bytes=_smi_mib(g("memory.used")),
        processes=None if apps is None else tuple(apps.get(uuid or "", [])),
        notes=notes,
    )


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


# ---------------------------------------------------------------------------- CPU

# The vector extensions that matter to torch's CPU kernels, x86 then Arm.
VECTOR_FLAGS: tuple[str, ...] = (
    "avx", "avx2", "fma", "avx_vnni", "avx512f", "avx512bw", "avx512_vnni",
    "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8",
    "asimd", "asimddp", "i8mm", "bf16", "sve", "sve2",
)


def parse_cpuinfo(text: str) -> tuple[str | None, tuple[str, ...]]:
    """The CPU model and the :data:`VECTOR_FLAGS` present, from the text of
    ``/proc/cpuinfo`` (x86 "flags", Arm "Features"; the first CPU counts)."""
    model: str | None = None
    flags: set[str] = set()
    seen_flags = False
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip().lower()
        if model is None and key in {"model name", "cpu model", "hardware"}:
            model = value.strip() or None
        elif not seen_flags and key in {"flags", "features"}:
            flags = set(value.split())
            seen_flags = True
    return model, tuple(f for f in VECTOR_FLAGS if f in flags)


def read_cpu(cpuinfo_path: str = "/proc/cpuinfo") -> CpuReading:
    """Cores, RAM (psutil) and vector extensions (``/proc/cpuinfo`` where it
    exists; elsewhere ``vector_flags`` is ``None``)."""
    import psutil

    model: str | None = None
    flags: tuple[str, ...] | None = None
    source: str | None = None
    try:
        with open(cpuinfo_path, encoding="utf-8", errors="replace") as fh:
            model, flags = parse_cpuinfo(fh.read())
        source = cpuinfo_path
    except OSError:
        pass
    if model is None:
        model = platform.processor() or None
    total: int | None = None
    avail: int | None = None
    try:
        vm = psutil.virtual_memory()
        total, avail = int(vm.total), int(vm.available)
    except Exception:                            # psutil raises per-platform types
        pass
    physical = psutil.cpu_count(logical=False)
    return CpuReading(
        arch=platform.machine() or "unknown",
        model=model,
        logical_cores=os.cpu_count(),
        physical_cores=int(physical) if physical else None,
        ram_total_bytes=total,
        ram_available_bytes=avail,
        vector_flags=flags,
        flags_source=source,
    )


# -------------------------------------------------------------------------- torch


def read_torch() -> TorchReading:
    """torch's version and the CUDA runtime it was built for. Imports torch
    (about a second the first time; the daemon imports it anyway). Does not
    initialise CUDA."""
    try:
        import torch
    except Exception as exc:                     # ImportError, or a broken install
        return TorchReading(version=None, cuda=None, error=f"{type(exc).__name__}: {exc}")
    version = getattr(torch, "__version__", None)
    cuda = getattr(getattr(torch, "version", None), "cuda", None)
    return TorchReading(version=str(version) if version else None,
                        cuda=str(cuda) if cuda else None)


# -------------------------------------------------------------------- model cache


def _dir_size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += (Path(root) / f).stat().st_size
            except OSError:
                pass
    return total


def _is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and (
        (path / "model.safetensors").is_file() or (path / "model.safetensors.index.json").is_file())


def read_cache(root: Path | None = None, *, max_depth: int = 3) -> CacheReading:
    """Converted models under ``root`` (default :func:`paths.cache_dir`): any
    folder, at most ``max_depth`` below, holding ``config.json`` and
    ``model.safetensors`` (or its shard index); plus free disk space there."""
    root = root if root is not None else paths.cache_dir()
    models: list[CachedModel] = []
    if root.is_dir():
        stack: list[tuple[Path, int]] = [(root, 0)]
        while stack:
            here, depth = stack.pop()
            if depth > 0 and _is_model_dir(here):
                models.append(CachedModel(name=here.relative_to(root).as_posix(),
                                          size_bytes=_dir_size(here)))
                continue
            if depth >= max_depth:
                continue
            try:
                children = sorted(p for p in here.iterdir() if p.is_dir() and not p.is_symlink())
            except OSError:
                continue
            stack.extend((c, depth + 1) for c in reversed(children))
    probe = root
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    try:
        free: int | None = shutil.disk_usage(probe).free
    except OSError:
        free = None
    return CacheReading(path=str(root), exists=root.is_dir(),
                        models=tuple(sorted(models, key=lambda m: m.name)), disk_free_bytes=free)


# ------------------------------------------------------------------------- daemon

DEFAULT_PORT = 8765


def probe_daemon(port: int = DEFAULT_PORT, *, host: str = "127.0.0.1", timeout_s: float = 1.0) -> DaemonReading:
    """``GET http://host:port/healthz`` with a ``timeout_s`` timeout, ignoring
    proxy settings. Never raises."""
    url = f"http://{host}:{port}/healthz"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout_s) as resp:
            body = resp.read(2048).decode("utf-8", "replace")
            return DaemonReading(url=url, reachable=True, status=int(resp.status), detail=body.strip()[:200])
    except urllib.error.HTTPError as exc:
        return DaemonReading(url=url, reachable=True, status=int(exc.code), detail=str(exc.reason)[:200])
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return DaemonReading(url=url, reachable=False, status=None, detail=str(reason)[:200])


def read_machine(
    *,
    port: int | None = DEFAULT_PORT,
    nvml_loader: Callable[[], Any] | None = None,
    run: Runner | None = None,
    cache_root: Path | None = None,
    torch_reader: Callable[[], TorchReading] | None = None,
    cpu_reader: Callable[[], CpuReading] | None = None,
) -> MachineReading:
    """Everything the doctor judges. ``port=None`` skips the daemon probe
    (start-up: the daemon is the one starting). Never raises."""
    return MachineReading(
        gpu=read_gpus(nvml_loader, run),
        cpu=(cpu_reader or read_cpu)(),
        torch=(torch_reader or read_torch)(),
        cache=read_cache(cache_root),
        daemon=probe_daemon(port) if port is not None else None,
    )
