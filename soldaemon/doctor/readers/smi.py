"""Reading GPUs through ``nvidia-smi``: only the argv lists in
:data:`READ_ONLY_ARGVS`, without a shell, with a timeout."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import replace
from typing import Any

from soldaemon.errors import CommandFailed, ProbeUnavailable
from soldaemon.doctor.readers.readings import ComputeMode, GpuProcess, GpuReading, Runner


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
# Older drivers reject a whole query over one unknown field ("... is not a valid field to
# query"); the retry uses only these.
SMI_CORE_FIELDS: tuple[str, ...] = (
    "index", "name", "uuid", "pci.bus_id", "driver_version", "persistence_mode",
    "ecc.mode.current", "pcie.link.gen.current", "pcie.link.gen.max",
    "pcie.link.width.current", "pcie.link.width.max",
    "clocks.sm", "clocks.max.sm", "memory.total", "memory.free", "memory.used",
)
SMI_APP_FIELDS: tuple[str, ...] = ("gpu_uuid", "pid", "used_gpu_memory", "process_name")
# A query of its own, so a driver that rejects one of these fields leaves only these unknown.
SMI_STATE_FIELDS: tuple[str, ...] = (
    "index", "display_active", "mig.mode.current", "compute_mode", "enforced.power.limit",
    "power.default_limit", "power.max_limit", "temperature.gpu",
)

SMI_QUERY_ARGV: tuple[str, ...] = (
    "nvidia-smi", "--query-gpu=" + ",".join(SMI_FIELDS), "--format=csv,noheader,nounits")
SMI_CORE_ARGV: tuple[str, ...] = (
    "nvidia-smi", "--query-gpu=" + ",".join(SMI_CORE_FIELDS), "--format=csv,noheader,nounits")
SMI_APPS_ARGV: tuple[str, ...] = (
    "nvidia-smi", "--query-compute-apps=" + ",".join(SMI_APP_FIELDS), "--format=csv,noheader,nounits")
SMI_STATE_ARGV: tuple[str, ...] = (
    "nvidia-smi", "--query-gpu=" + ",".join(SMI_STATE_FIELDS), "--format=csv,noheader,nounits")
SMI_BANNER_ARGV: tuple[str, ...] = ("nvidia-smi",)   # the summary table: "CUDA Version: 12.4"

READ_ONLY_ARGVS: frozenset[tuple[str, ...]] = frozenset(
    {SMI_QUERY_ARGV, SMI_CORE_ARGV, SMI_APPS_ARGV, SMI_STATE_ARGV, SMI_BANNER_ARGV})

_NA = {"", "n/a", "[n/a]", "not supported", "[not supported]", "unknown error",
       "[unknown error]", "insufficient permissions", "[insufficient permissions]",
       "not available", "[not available]"}


def run_nvidia_smi(argv: list[str], *, timeout_s: float = 5.0) -> str:
    """Run one of :data:`READ_ONLY_ARGVS` without a shell and return stdout. Only absolute
    ``PATH`` entries are searched, so a project's own ``./nvidia-smi`` never runs.
    Raises ``ValueError`` for any other argv, ``FileNotFoundError`` if not found, and
    :class:`CommandFailed` on a non-zero exit or after ``timeout_s``."""
    if tuple(argv) not in READ_ONLY_ARGVS:
        raise ValueError(f"refusing to run {argv!r}: doctor runs only read-only queries")
    search = [p for p in os.environ.get("PATH", os.defpath).split(os.pathsep) if os.path.isabs(p)]
    exe = shutil.which(argv[0], path=os.pathsep.join(search))
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
    """Read every GPU through ``run`` (argv from :data:`READ_ONLY_ARGVS` in, stdout out).
    Raises :class:`ProbeUnavailable` when ``nvidia-smi`` is missing or fails; ``[]`` for no GPU."""
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

    states = _read_smi_state(run, notes)
    readings: list[GpuReading] = []
    for line in out.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(fields):
            raise ProbeUnavailable(f"unexpected nvidia-smi output: {line!r}")
        row = {f: _smi_value(c) for f, c in zip(fields, cells)}
        reading = _smi_row(row, cuda, apps, tuple(notes))
        readings.append(replace(reading, **states.get(reading.index, {})))
    return readings


_SMI_COMPUTE_MODES: dict[str, ComputeMode] = {
    "default": "Default", "exclusive_thread": "Exclusive_Thread", "prohibited": "Prohibited",
    "exclusive_process": "Exclusive_Process"}


def _smi_watts(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        return None


def _read_smi_state(run: Runner, notes: list[str]) -> dict[int, dict[str, Any]]:
    """:class:`GpuReading` state fields per GPU index; ``{}`` (reason in ``notes``) on failure."""
    try:
        out = run(list(SMI_STATE_ARGV))
    except (CommandFailed, OSError) as exc:
        notes.append(f"nvidia-smi state: {_first_line(str(exc))}")
        return {}
    states: dict[int, dict[str, Any]] = {}
    for line in out.splitlines():
        cells = [_smi_value(c) for c in line.split(",")]
        if not line.strip() or len(cells) != len(SMI_STATE_FIELDS) or _smi_int(cells[0]) is None:
            if line.strip():
                notes.append(f"nvidia-smi state: unparsed line {line!r}")
            continue
        row = dict(zip(SMI_STATE_FIELDS, cells))
        mode = row["compute_mode"]
        temp = _smi_int(row["temperature.gpu"])
        states[int(cells[0] or 0)] = {
            "display_active": _smi_bool(row["display_active"]),
            "mig_enabled": _smi_bool(row["mig.mode.current"]),
            "compute_mode": _SMI_COMPUTE_MODES.get(mode.lower()) if mode else None,
            "power_limit_w": _smi_watts(row["enforced.power.limit"]),
            "power_default_limit_w": _smi_watts(row["power.default_limit"]),
            "power_max_limit_w": _smi_watts(row["power.max_limit"]),
            "temperature_c": temp,
        }
    return states


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
