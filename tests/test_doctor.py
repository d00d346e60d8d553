"""soldaemon doctor: readers replay recorded NVML readings of fake
devices (tests/data/doctor, see its README for provenance); judges are checked
for every verdict of every check; nothing may ever run a command that changes
a setting."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from soldaemon.doctor import readers
from soldaemon.doctor import checks as doctor
from soldaemon.doctor.checks import Check, judge, judge_machine
from soldaemon.errors import ProbeUnavailable
from soldaemon.doctor.readers import CacheReading, CpuReading, GpuProbe, GpuReading, MachineReading, TorchReading
from soldaemon.doctor.readers.nvml import ReadOnlyNvml

DATA = Path(__file__).parent / "data" / "doctor"
GiB = 1024 ** 3

# ------------------------------------------------------------------------ fakes


class FakeNvml:
    """Replays one nvml_*.json recording with pynvml's names, constants and
    error type. Records every function called."""

    NVMLError = pynvml.NVMLError
    NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
    NVML_CLOCK_MEM = pynvml.NVML_CLOCK_MEM
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC

    def __init__(self, recording: dict[str, Any] | None = None, *, init_error: int | None = None,
                 handle_error: dict[int, int] | None = None) -> None:
        rec = recording or {"system": {}, "devices": []}
        self._system: dict[str, Any] = rec.get("system", {})
        self._devices: list[dict[str, Any]] = rec.get("devices", [])
        self._names: dict[str, str] = rec.get("process_names", {})
        self._missing: set[str] = set(rec.get("missing_functions", []))
        self._init_error = init_error
        self._handle_error = handle_error or {}
        self.calls: list[str] = []
        self.shutdown = False

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("nvml") or name in self._missing:
            raise AttributeError(name)
        return lambda *args: self._call(name, args)

    def _raise_if_error(self, value: Any) -> Any:
        if isinstance(value, dict) and set(value) == {"error"}:
            raise pynvml.NVMLError(value["error"])
        return value

    def _call(self, name: str, args: tuple[Any, ...]) -> Any:
        self.calls.append(name)
        if name == "nvmlInit":
            if self._init_error is not None:
                raise pynvml.NVMLError(self._init_error)
            return None
        if name == "nvmlShutdown":
            self.shutdown = True
            return None
        if name == "nvmlDeviceGetCount":
            return len(self._devices)
        if name == "nvmlDeviceGetHandleByIndex":
            (index,) = args
            if index in self._handle_error:
                raise pynvml.NVMLError(self._handle_error[index])
            return ("handle", index)
        if name == "nvmlDeviceGetMigDeviceHandleByIndex":
            (handle, place) = args
            migs = self._devices[handle[1]].get("mig_devices", [])
            if place >= len(migs):
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
            return ("mig", handle[1], place)
        if name == "nvmlSystemGetProcessName":
            (pid,) = args
            if str(pid) not in self._names:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
            return self._names[str(pid)]
        if name.startswith("nvmlSystemGet"):
            if name not in self._system:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return self._raise_if_error(self._system[name])
        handle, rest = args[0], args[1:]
        assert isinstance(handle, tuple) and handle[0] in {"handle", "mig"}, handle
        device = self._devices[handle[1]]
        if handle[0] == "mig":
            device = device["mig_devices"][handle[2]]
        if name not in device:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        value = self._raise_if_error(device[name])
        if rest:
            value = self._raise_if_error(value[",".join(str(a) for a in rest)])
        if name in {"nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPciInfo"}:
            return SimpleNamespace(**value)
        if name.endswith("RunningProcesses"):
            return [SimpleNamespace(**p) for p in value]
        if isinstance(value, list):
            return tuple(value)
        return value


def nvml(name: str, **kw: Any) -> FakeNvml:
    return FakeNvml(json.loads((DATA / f"{name}.json").read_text()), **kw)


def nvml_readings(name: str) -> list[GpuReading]:
    fake = nvml(name)
    out = readers.read_nvml(fake)
    assert_read_only_nvml(fake)
    return out


def assert_read_only_nvml(fake: FakeNvml) -> None:
    assert fake.calls, "nothing was read"
    for name in fake.calls:
        assert name in {"nvmlInit", "nvmlShutdown"} or name.startswith(("nvmlSystemGet", "nvmlDeviceGet")), name
    assert fake.shutdown


def by_name(checks: list[Check]) -> dict[str, Check]:
    names = [c.name for c in checks]
    assert len(names) == len(set(names)), names
    return {c.name: c for c in checks}


TORCH_CU124 = ("2.5.1+cu124", "12.4")
TORCH_CU121 = ("2.5.1+cu121", "12.1")
TORCH_CU128 = ("2.7.1+cu128", "12.8")


def verdicts(reading: GpuReading, torch: tuple[str | None, str | None] = TORCH_CU124) -> dict[str, Check]:
    version, cuda = torch
    return by_name(judge(reading, cuda, torch_version=version))


# ------------------------------------------------------------------ NVML reader


def test_read_nvml_h200_fields() -> None:
    g0, g1 = nvml_readings("nvml_h200")
    assert g0.source == "nvml" and g0.name == "NVIDIA H200" and g0.index == 0
    assert g0.driver_version == "550.90.07" and g0.cuda_driver_version == "12.4"
    assert g0.compute_capability == (9, 0)
    assert g0.persistence_mode is True
    assert (g0.ecc_enabled, g0.ecc_pending, g0.ecc_uncorrected_volatile) == (True, True, 0)
    assert g0.retired_pages_pending is None                  # Not Supported on Hopper
    assert (g0.remap_pending, g0.remap_failure) == (False, False)
    assert (g0.pcie_gen_current, g0.pcie_gen_max, g0.pcie_gen_gpu_max) == (5, 5, 5)
    assert (g0.pcie_width_current, g0.pcie_width_max) == (16, 16)
    assert (g0.sm_clock_mhz, g0.sm_clock_max_mhz, g0.mem_clock_mhz) == (345, 1980, 3201)
    assert g0.clock_event_reasons == 1
    assert g0.memory_total_bytes == 143771 * 1024 * 1024
    assert g0.pci_bus_id == "00000000:19:00.0"
    assert g0.processes == ()
    assert any("nvmlDeviceGetRetiredPagesPendingStatus: Not Supported" in n for n in g0.notes)
    (p,) = g1.processes or ()
    assert (p.pid, p.name, p.kind, p.used_bytes) == (9001, "/usr/bin/python3", "compute", 122880 * 1024 * 1024)


def test_read_nvml_old_binding_falls_back_and_records_why() -> None:
    (g,) = nvml_readings("nvml_k80_old")
    assert g.cuda_driver_version == "11.4"
    assert g.clock_event_reasons == 1                         # via ...ThrottleReasons
    assert g.pcie_gen_gpu_max is None
    assert g.processes is None                                # both lists refused
    assert any("Insufficient Permissions" in n for n in g.notes)
    assert any("nvmlDeviceGetGpuMaxPcieLinkGeneration: not in this pynvml" in n for n in g.notes)


def test_read_nvml_decodes_bytes_from_old_bindings() -> None:
    rec = json.loads((DATA / "nvml_rtx4090_desktop.json").read_text())
    fake = FakeNvml(rec)
    real_call = fake._call

    def bytes_call(name: str, args: tuple[Any, ...]) -> Any:
        value = real_call(name, args)
        return value.encode() if isinstance(value, str) else value

    fake._call = bytes_call  # type: ignore[method-assign]
    (g,) = readers.read_nvml(fake)
    assert g.name == "NVIDIA GeForce RTX 4090" and g.driver_version == "560.35.03"
    assert g.processes and g.processes[0].name == "/usr/lib/xorg/Xorg"


@pytest.mark.parametrize("code,reason", [
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found"),
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"),
])
def test_read_nvml_init_failure_is_probe_unavailable(code: int, reason: str) -> None:
    fake = FakeNvml(init_error=code)
    with pytest.raises(ProbeUnavailable, match=reason):
        readers.read_nvml(fake)
    assert fake.calls == ["nvmlInit"]


def test_read_nvml_with_a_foreign_error_type() -> None:
    class OtherError(Exception):
        pass

    class Broken:
        NVMLError = OtherError

        def nvmlInit(self) -> None:
            raise OtherError("no driver here")

    with pytest.raises(ProbeUnavailable, match="no driver here"):
        readers.read_nvml(Broken())


def test_read_nvml_refuses_setters() -> None:
    api = ReadOnlyNvml(FakeNvml())
    for setter in ("nvmlDeviceSetPersistenceMode", "nvmlDeviceSetEccMode", "nvmlDeviceResetGpuLockedClocks",
                   "nvmlDeviceClearEccErrorCounts", "nvmlDeviceSetPowerManagementLimit"):
        with pytest.raises(ValueError, match="only reads"):
            api.call([], setter, ("handle", 0), 1)


def test_real_pynvml_on_this_machine_never_raises() -> None:
    probe = readers.read_gpus()
    if probe.source is None:
        assert probe.nvml_error
    else:                                           # a GPU machine: the readings are real
        assert probe.gpus


def test_doctor_run_end_to_end_only_reads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """``soldaemon doctor`` end to end calls only NVML's read functions, although its output is
    full of fix commands like ``nvidia-smi -pm 1``."""
    fake = nvml("nvml_h200")
    monkeypatch.setattr(readers, "load_nvml", lambda: fake)
    monkeypatch.setattr(readers, "read_torch", lambda: TorchReading(*TORCH_CU124))
    monkeypatch.setenv("SOLDAEMON_CACHE_DIR", str(tmp_path / "cache"))
    assert doctor.run(argparse.Namespace(json=False, port=closed_port())) == 0
    assert "[warn] gpu1.processes" in capsys.readouterr().out
    assert_read_only_nvml(fake)


# ------------------------------------------------------------ GPU verdicts


# (recording, torch, check, verdict, text in the detail)
RECORDED_VERDICTS = [
    # architecture
    ("nvml_h200", TORCH_CU124, "gpu0", "ok", "compute 9.0 (Hopper): fast path"),
    ("nvml_rtx4090_desktop", TORCH_CU124, "gpu0", "ok", "compute 8.9 (Ada Lovelace)"),
    ("nvml_a100_failing", TORCH_CU121, "gpu0", "ok", "compute 8.0 (Ampere)"),
    ("nvml_t4_degraded", TORCH_CU121, "gpu0", "warn", "Turing): safe mode: no native bf16 before Ampere"),
    ("nvml_gtx1080ti", TORCH_CU121, "gpu0", "warn", "may ship no kernels"),
    ("nvml_p100_old_driver", TORCH_CU121, "gpu0", "warn", "compute capability not reported"),
    ("nvml_k80_old", TORCH_CU121, "gpu0", "fail", "no kernels for compute capability below 5.0"),
    # driver vs torch's CUDA
    ("nvml_h200", TORCH_CU124, "cuda", "ok", "supports CUDA 12.4; torch 2.5.1+cu124 uses CUDA 12.4: compatible"),
    ("nvml_t4_degraded", TORCH_CU121, "cuda", "ok", "compatible"),
    ("nvml_rtx4090_desktop", TORCH_CU128, "cuda", "warn", "minor-version compatibility"),
    ("nvml_rtx4090_desktop", ("2.5.1+cpu", None), "cuda", "warn", "CPU-only; install a CUDA build"),
    ("nvml_k80_old", TORCH_CU121, "cuda", "fail", "runtime is newer than the driver supports"),
    ("nvml_p100_old_driver", TORCH_CU121, "cuda", "fail", "supports CUDA 10.1"),
    ("nvml_h200", (None, None), "cuda", "fail", "torch is not importable"),
    # persistence
    ("nvml_h200", TORCH_CU124, "gpu0.persistence", "ok", "on"),
    ("nvml_rtx4090_desktop", TORCH_CU124, "gpu0.persistence", "ok", "off; a display is attached"),
    ("nvml_t4_degraded", TORCH_CU121, "gpu0.persistence", "warn", "off (headless)"),
    ("nvml_gtx1080ti", TORCH_CU121, "gpu0.persistence", "warn", "off"),
    # ECC
    ("nvml_h200", TORCH_CU124, "gpu0.ecc", "ok", "no uncorrected errors"),
    ("nvml_p100_old_driver", TORCH_CU121, "gpu0.ecc", "ok", "ECC on"),
    ("nvml_rtx4090_desktop", TORCH_CU124, "gpu0.ecc", "info", "ECC off"),
    ("nvml_gtx1080ti", TORCH_CU121, "gpu0.ecc", "info", "not supported"),
    ("nvml_t4_degraded", TORCH_CU121, "gpu0.ecc", "warn", "page retirement is pending until the GPU is reset; 2 uncorrected"),
    ("nvml_a100_failing", TORCH_CU121, "gpu0.ecc", "fail", "row remapping has failed"),
    # PCIe
    ("nvml_h200", TORCH_CU124, "gpu0.pcie", "ok", "PCIe Gen5 x16 (max Gen5 x16)"),
    ("nvml_gtx1080ti", TORCH_CU121, "gpu0.pcie", "ok", "Gen3 x16"),
    ("nvml_rtx4090_desktop", TORCH_CU124, "gpu0.pcie", "warn", "drop to a lower generation at idle"),
    ("nvml_t4_degraded", TORCH_CU121, "gpu0.pcie", "warn", "PCIe Gen3 x8 (max Gen3 x16): the link trained narrower"),
    ("nvml_a100_failing", TORCH_CU121, "gpu0.pcie", "warn", "supports Gen4, the slot or platform limits it to Gen3"),
    # clocks
    ("nvml_h200", TORCH_CU124, "gpu0.clocks", "ok", "idle, clocks rise under load"),
    ("nvml_a100_failing", TORCH_CU121, "gpu0.clocks", "ok", "at its power cap"),
    ("nvml_k80_old", TORCH_CU121, "gpu0.clocks", "ok", "SM 324/875 MHz"),
    ("nvml_p100_old_driver", TORCH_CU121, "gpu0.clocks", "ok", "reasons not reported"),
    ("nvml_t4_degraded", TORCH_CU121, "gpu0.clocks", "warn", "software thermal slowdown, hardware thermal slowdown"),
    # memory
    ("nvml_h200", TORCH_CU124, "gpu0.memory", "ok", "139.8 GiB free of 140.4 GiB"),
    ("nvml_t4_degraded", TORCH_CU121, "gpu0.memory", "warn", "3.0 GiB free of 15.0 GiB: little room"),
    ("nvml_a100_failing", TORCH_CU121, "gpu0.memory", "fail", "0.7 GiB free of 40.0 GiB: the model needs"),
    # other processes
    ("nvml_h200", TORCH_CU124, "gpu0.processes", "ok", "no other processes"),
    ("nvml_rtx4090_desktop", TORCH_CU124, "gpu0.processes", "ok", "display only: /usr/lib/xorg/Xorg (pid 1843, 345 MiB)"),
    ("nvml_h200", TORCH_CU124, "gpu1.processes", "warn", "/usr/bin/python3 (pid 9001, 122880 MiB)"),
    ("nvml_t4_degraded", TORCH_CU121, "gpu0.processes", "warn", "python3 (pid 4242"),
    ("nvml_gtx1080ti", TORCH_CU121, "gpu0.processes", "warn", "ollama"),
    ("nvml_k80_old", TORCH_CU121, "gpu0.processes", "info", "cannot be listed"),
]


def machine_checks(recording: str, torch: tuple[str | None, str | None]) -> dict[str, Check]:
    readings = nvml_readings(recording)
    checks: list[Check] = []
    for i, r in enumerate(readings):
        checks += judge(r, torch[1], torch_version=torch[0], include_driver=i == 0)
    return by_name(checks)


@pytest.mark.parametrize("recording,torch,name,verdict,text", RECORDED_VERDICTS,
                         ids=[f"{r[0]}-{r[2]}-{r[3]}" for r in RECORDED_VERDICTS])
def test_recorded_verdicts(recording: str, torch: tuple[str | None, str | None], name: str,
                           verdict: str, text: str) -> None:
    c = machine_checks(recording, torch)[name]
    assert (c.verdict, text in c.detail) == (verdict, True), c
    if verdict in ("warn", "fail"):
        assert c.cost, c                                    # every problem says what it costs


def test_every_gpu_check_reaches_every_verdict_it_has() -> None:
    seen: dict[str, set[str]] = {}
    for recording, torch, name, verdict, _ in RECORDED_VERDICTS:
        seen.setdefault(name.split(".", 1)[-1] if "." in name else name.rstrip("0123456789"), set()).add(verdict)
    assert seen["gpu"] == {"ok", "warn", "fail"}
    assert seen["cuda"] == {"ok", "warn", "fail"}
    assert seen["ecc"] == {"ok", "info", "warn", "fail"}
    for name in ("persistence", "pcie", "clocks", "processes"):
        assert {"ok", "warn"} <= seen[name] or {"ok", "info"} <= seen[name], name
    assert seen["memory"] == {"ok", "warn", "fail"}


def test_fixes_are_the_commands_a_user_runs() -> None:
    t4 = machine_checks("nvml_t4_degraded", TORCH_CU121)
    assert t4["gpu0.persistence"].fix and t4["gpu0.persistence"].fix.startswith("sudo nvidia-smi -pm 1")
    assert t4["gpu0.ecc"].fix and t4["gpu0.ecc"].fix.startswith("sudo nvidia-smi -r -i 0")
    assert t4["gpu0.pcie"].fix and "lspci -vv -s 3B:00.0" in t4["gpu0.pcie"].fix
    k80 = machine_checks("nvml_k80_old", TORCH_CU121)
    assert k80["cuda"].fix and k80["cuda"].fix.endswith("https://download.pytorch.org/whl/cu118")
    cpu_only = machine_checks("nvml_rtx4090_desktop", ("2.5.1+cpu", None))
    assert cpu_only["cuda"].fix and cpu_only["cuda"].fix.endswith("/whl/cu126")
    gtx = machine_checks("nvml_gtx1080ti", TORCH_CU121)
    assert gtx["gpu0"].fix and "get_arch_list" in gtx["gpu0"].fix
    assert doctor.torch_install_fix("10.1") is None
    p100 = machine_checks("nvml_p100_old_driver", TORCH_CU121)
    assert p100["cuda"].fix == "upgrade the NVIDIA driver"
    assert doctor.torch_install_fix("12.4") and doctor.torch_install_fix("12.4").endswith("/cu124")  # type: ignore[union-attr]


def test_cuda_check_is_once_per_machine() -> None:
    names = list(machine_checks("nvml_h200", TORCH_CU124))
    assert names.count("cuda") == 1 and "gpu1" in names and "gpu1.memory" in names


# Verdicts no recording reaches: the recorded reading with one field changed.
def test_verdicts_for_unreported_fields() -> None:
    (h200, _) = nvml_readings("nvml_h200")
    blank = dataclasses.replace(
        h200, persistence_mode=None, pcie_gen_current=None, sm_clock_mhz=None,
        memory_free_bytes=None, processes=None, cuda_driver_version=None)
    got = verdicts(blank)
    assert got["gpu0.persistence"].verdict == "info" and "Windows" in got["gpu0.persistence"].detail
    assert got["gpu0.pcie"].verdict == "info"
    assert got["gpu0.clocks"].verdict == "info"
    assert got["gpu0.memory"].verdict == "info"
    assert got["gpu0.processes"].verdict == "info"
    assert got["cuda"].verdict == "info" and "cannot compare" in got["cuda"].detail


def test_ecc_pending_mode_change_and_errors_without_pending_retirement() -> None:
    (h200, _) = nvml_readings("nvml_h200")
    c = verdicts(dataclasses.replace(h200, ecc_pending=False))["gpu0.ecc"]
    assert c.verdict == "warn" and "off after the next GPU reset" in c.detail
    (t4,) = nvml_readings("nvml_t4_degraded")
    c = verdicts(dataclasses.replace(t4, retired_pages_pending=False))["gpu0.ecc"]
    assert c.verdict == "warn" and c.detail.startswith("ECC on; 2 uncorrected errors")
    c = verdicts(dataclasses.replace(h200, remap_pending=True))["gpu0.ecc"]
    assert c.verdict == "warn" and "row remapping is pending" in c.detail


def test_own_process_is_not_another_process() -> None:
    (t4,) = nvml_readings("nvml_t4_degraded")
    c = by_name(judge(t4, "12.1", torch_version="2.5.1", own_pid=4242))["gpu0.processes"]
    assert c.verdict == "ok"


def test_pcie_idle_note_needs_the_idle_reason() -> None:
    (rtx,) = nvml_readings("nvml_rtx4090_desktop")
    assert "the GPU is idle now" in verdicts(rtx)["gpu0.pcie"].detail
    busy = dataclasses.replace(rtx, clock_event_reasons=0)
    assert "the GPU is idle now" not in verdicts(busy)["gpu0.pcie"].detail
    assert verdicts(busy)["gpu0.pcie"].verdict == "warn"


def test_unreadable_gpu_fails() -> None:
    rec = json.loads((DATA / "nvml_h200.json").read_text())
    fake = FakeNvml(rec, handle_error={1: pynvml.NVML_ERROR_GPU_IS_LOST})
    g0, g1 = readers.read_nvml(fake)
    assert g0.name == "NVIDIA H200" and g1.name == "(unreadable)"
    checks = by_name(judge(g1, "12.4", torch_version="2.5.1", include_driver=False))
    assert list(checks) == ["gpu1"] and checks["gpu1"].verdict == "fail"
    assert "GPU is lost" in checks["gpu1"].detail


def test_judge_is_pure() -> None:
    (t4,) = nvml_readings("nvml_t4_degraded")
    assert judge(t4, "12.1", torch_version="x") == judge(t4, "12.1", torch_version="x")


def test_arch_names() -> None:
    assert [doctor.arch_name(cc) for cc in [(12, 0), (10, 0), (9, 0), (8, 9), (8, 6), (8, 0), (7, 5), (7, 0),
                                            (6, 1), (5, 2), (3, 7)]] == [
        "Blackwell", "Blackwell", "Hopper", "Ada Lovelace", "Ampere", "Ampere", "Turing", "Volta",
        "Pascal", "Maxwell", "Kepler"]


# --------------------------------------------------------------- no GPU at all


def no_gpu_probe() -> GpuProbe:
    return readers.read_gpus(lambda: FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))


def cpu(**kw: Any) -> CpuReading:
    base = dict(arch="x86_64", model="AMD EPYC", logical_cores=2, physical_cores=2,
                ram_total_bytes=24 * GiB, ram_available_bytes=22 * GiB,
                vector_flags=("avx", "avx2", "fma"), flags_source="/proc/cpuinfo")
    base.update(kw)
    return CpuReading(**base)  # type: ignore[arg-type]


EMPTY_CACHE = CacheReading(path="/tmp/none", exists=False, models=(), disk_free_bytes=100 * GiB)


def test_no_gpu_says_so_plainly_and_checks_what_applies() -> None:
    probe = no_gpu_probe()
    assert probe == GpuProbe(source=None, gpus=(), nvml_error="NVML Shared Library Not Found")
    m = MachineReading(gpu=probe, cpu=cpu(), torch=TorchReading("2.13.0+cpu", None), cache=EMPTY_CACHE,
                       daemon=None)
    checks = judge_machine(m)
    assert [c.name for c in checks] == ["gpu", "torch", "cpu.cores", "cpu.ram", "cpu.vector", "model_cache",
                                        "kernel_plan", "model_choice"]
    assert checks[0] == Check("gpu", "info", "no NVIDIA GPU found (NVML: NVML Shared Library Not Found) "
                                              "— running on CPU")
    text = doctor.format_human(checks)
    assert text.splitlines()[0] == checks[0].detail             # a plain line, no verdict tag
    assert not any(c.name.startswith("gpu0") or c.name == "cuda" for c in checks)


def test_no_gpu_when_nvml_loads_but_sees_none() -> None:
    assert readers.read_gpus(lambda: FakeNvml()) == GpuProbe(source=None, gpus=(), nvml_error="no devices")


def test_pynvml_missing_is_the_reason_given() -> None:
    def no_pynvml() -> Any:
        raise ProbeUnavailable("pynvml not importable (No module named 'pynvml')")

    probe = readers.read_gpus(no_pynvml)
    assert probe.source is None and probe.nvml_error and "pynvml" in probe.nvml_error


# ------------------------------------------------------------------------ CPU


@pytest.mark.parametrize("name,model,flags", [
    ("cpuinfo_epyc_2core.txt", "AMD EPYC", ("avx", "avx2", "fma")),
    ("cpuinfo_sapphire_rapids.txt", "Intel(R) Xeon(R) Platinum 8480+",
     ("avx", "avx2", "fma", "avx_vnni", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16",
      "amx_tile", "amx_bf16", "amx_int8")),
    ("cpuinfo_westmere_no_avx.txt", "Intel(R) Xeon(R) CPU           X5670  @ 2.93GHz", ()),
    ("cpuinfo_graviton3.txt", None, ("asimd", "asimddp", "i8mm", "bf16", "sve")),
])
def test_parse_cpuinfo(name: str, model: str | None, flags: tuple[str, ...]) -> None:
    assert readers.parse_cpuinfo((DATA / name).read_text()) == (model, flags)


def test_read_cpu_here() -> None:
    c = readers.read_cpu()
    assert c.logical_cores and c.logical_cores >= 1
    assert c.ram_total_bytes and c.ram_available_bytes is not None
    if Path("/proc/cpuinfo").exists():
        assert c.vector_flags is not None and c.flags_source == "/proc/cpuinfo"


def test_read_cpu_without_proc(tmp_path: Path) -> None:
    c = readers.read_cpu(str(tmp_path / "missing"))
    assert c.vector_flags is None and c.flags_source is None
    assert by_name(doctor.judge_cpu(c, has_gpu=False))["cpu.vector"].verdict == "info"


def test_cpu_verdicts() -> None:
    def j(c: CpuReading, has_gpu: bool = False) -> dict[str, Check]:
        return by_name(doctor.judge_cpu(c, has_gpu))

    assert j(cpu())["cpu.cores"].verdict == "warn"               # 2 cores, no GPU
    assert j(cpu(), has_gpu=True)["cpu.cores"].verdict == "ok"
    assert j(cpu(logical_cores=16))["cpu.cores"].verdict == "ok"
    assert j(cpu())["cpu.ram"].verdict == "ok"
    assert j(cpu(ram_available_bytes=3 * GiB))["cpu.ram"].verdict == "warn"
    assert j(cpu(ram_available_bytes=GiB))["cpu.ram"].verdict == "fail"
    assert j(cpu(ram_available_bytes=None))["cpu.ram"].verdict == "info"
    spr = readers.parse_cpuinfo((DATA / "cpuinfo_sapphire_rapids.txt").read_text())[1]
    c = j(cpu(vector_flags=spr))["cpu.vector"]
    assert c.verdict == "ok" and "amx_bf16" in c.detail and "(no" not in c.detail
    c = j(cpu())["cpu.vector"]
    assert c.verdict == "ok" and c.detail == "avx2, fma (no avx512f, no amx_bf16)"
    assert j(cpu(vector_flags=()))["cpu.vector"].verdict == "warn"
    arm = readers.parse_cpuinfo((DATA / "cpuinfo_graviton3.txt").read_text())[1]
    assert j(cpu(arch="aarch64", vector_flags=arm))["cpu.vector"].verdict == "ok"


def test_torch_verdicts() -> None:
    assert doctor.judge_torch(TorchReading(None, None, "ImportError: nope"), True).verdict == "fail"
    assert doctor.judge_torch(TorchReading("2.13.0+cpu", None), False).verdict == "ok"
    c = doctor.judge_torch(TorchReading("2.5.1+cu124", "12.4"), False)
    assert c.verdict == "ok" and "unused without a GPU" in c.detail


def test_read_torch_here() -> None:
    t = readers.read_torch()
    import torch
    assert t.version == torch.__version__ and t.cuda == torch.version.cuda


# ----------------------------------------------------------------- model cache


def test_cache_empty_and_missing(tmp_path: Path) -> None:
    r = readers.read_cache(tmp_path / "nope")
    assert (r.exists, r.models) == (False, ()) and r.disk_free_bytes
    c = doctor.judge_cache(r)
    assert c.verdict == "info" and "first start will convert the embedded model (~80 s)" in c.detail
    low = doctor.judge_cache(dataclasses.replace(r, disk_free_bytes=GiB))
    assert low.verdict == "warn" and low.fix


def test_cache_finds_converted_models(tmp_path: Path) -> None:
    model = tmp_path / "qwen2.5-coder-0.5b" / "bf16"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0" * 4096)
    sharded = tmp_path / "other"
    sharded.mkdir()
    (sharded / "config.json").write_text("{}")
    (sharded / "model.safetensors.index.json").write_text("{}")
    (tmp_path / "half-done").mkdir()
    (tmp_path / "half-done" / "model.safetensors").write_bytes(b"\0")   # no config: not a model
    r = readers.read_cache(tmp_path)
    assert [m.name for m in r.models] == ["other", "qwen2.5-coder-0.5b/bf16"]
    assert r.models[1].size_bytes == 4096 + 2
    c = doctor.judge_cache(r)
    assert c.verdict == "ok" and c.detail.startswith("2 converted model(s)")


def test_cache_default_is_paths_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOLDAEMON_CACHE_DIR", str(tmp_path))
    assert readers.read_cache().path == str(tmp_path)


# ---------------------------------------------------------------------- daemon


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_daemon_judge_verdicts() -> None:
    url = "http://127.0.0.1:8765/healthz"
    ok = readers.DaemonReading(url, True, 200, "{}")
    assert doctor.judge_daemon(ok) == Check("daemon", "ok", f"daemon answering at {url}")
    down = readers.DaemonReading(url, False, None, "Connection refused")
    c = doctor.judge_daemon(down)
    assert c.verdict == "info" and c.detail.startswith("no daemon answering")


def test_daemon_judge_both_statuses() -> None:
    ok = readers.DaemonReading("http://127.0.0.1:8765/healthz", True, 200, "{}")
    bad = readers.DaemonReading("http://127.0.0.1:8765/healthz", True, 404, "Not Found")
    assert doctor.judge_daemon(ok).verdict == "ok"
    assert doctor.judge_daemon(bad).verdict == "warn" and doctor.judge_daemon(bad).fix == "ss -ltnp 'sport = :8765'"


# ------------------------------------------------------------ output, CLI, run


def test_format_human_lines() -> None:
    checks = machine_checks("nvml_t4_degraded", TORCH_CU121)
    text = doctor.format_human(list(checks.values()))
    lines = text.splitlines()
    i = lines.index("[warn] gpu0.persistence: persistence mode off (headless)")
    assert lines[i + 1].startswith("       cost: ")
    assert lines[i + 2].startswith("       fix:  sudo nvidia-smi -pm 1")
    assert "[ ok ] cuda: " in text
    assert lines[-1].startswith("status: warn (0 fail, ")


def test_summarize_shape() -> None:
    checks = list(machine_checks("nvml_a100_failing", TORCH_CU121).values())
    s = doctor.summarize(checks)
    assert set(s) == {"status", "counts", "checks"} and s["status"] == "fail"
    assert set(s["counts"]) == {"ok", "info", "warn", "fail"} and sum(s["counts"].values()) == len(checks)
    assert set(s["checks"][0]) == {"name", "verdict", "detail", "cost", "fix", "facts"}
    json.dumps(s)
    assert doctor.worst([Check("a", "info", "x")]) == "ok"
    assert doctor.worst([Check("a", "warn", "x"), Check("b", "ok", "y")]) == "warn"


def patch_machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, recording: str | None,
                  torch: tuple[str | None, str | None] = TORCH_CU121) -> None:
    """Route doctor.run's readers to recordings (``None``: no NVML)."""
    if recording is None:
        monkeypatch.setattr(readers, "load_nvml",
                            lambda: FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    else:
        monkeypatch.setattr(readers, "load_nvml", lambda: nvml(recording))
    monkeypatch.setattr(readers, "read_torch", lambda: TorchReading(*torch))
    monkeypatch.setattr(readers, "read_cpu", lambda: cpu())
    monkeypatch.setenv("SOLDAEMON_CACHE_DIR", str(tmp_path / "cache"))


def test_run_json_shape_and_exit_codes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    port = closed_port()
    patch_machine(monkeypatch, tmp_path, "nvml_a100_failing")
    assert doctor.run(argparse.Namespace(json=True, port=port)) == 1
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"schema", "status", "counts", "checks", "reading"}
    assert doc["schema"] == 1 and doc["status"] == "fail"
    assert set(doc["reading"]) == {"gpu", "cpu", "torch", "cache", "daemon", "cuda_view"}
    assert doc["reading"]["cuda_view"]["device"] == "cuda:0"
    assert doc["reading"]["gpu"]["source"] == "nvml"
    assert doc["reading"]["gpu"]["gpus"][0]["name"] == "NVIDIA A100-PCIE-40GB"
    assert doc["reading"]["daemon"]["reachable"] is False
    assert {c["name"]: c["verdict"] for c in doc["checks"]}["gpu0.ecc"] == "fail"

    patch_machine(monkeypatch, tmp_path, "nvml_t4_degraded")
    assert doctor.run(argparse.Namespace(json=False, port=port)) == 0      # warnings only
    assert "[warn] gpu0.clocks" in capsys.readouterr().out


def test_run_without_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                         capsys: pytest.CaptureFixture[str]) -> None:
    patch_machine(monkeypatch, tmp_path, None, torch=("2.13.0+cpu", None))
    assert doctor.main(["--port", str(closed_port())]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "no NVIDIA GPU found (NVML: NVML Shared Library Not Found) — running on CPU"
    assert any(line.startswith("[warn] cpu.cores: 2 logical") for line in out)
    assert any(line.startswith("[info] daemon: no daemon answering") for line in out)
    assert doctor.main(["--json", "--port", str(closed_port())]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["checks"][0]["name"] == "gpu" and doc["reading"]["gpu"]["gpus"] == []


def test_add_arguments_defaults() -> None:
    p = argparse.ArgumentParser()
    doctor.add_arguments(p)
    assert vars(p.parse_args([])) == {"json": False, "port": 8765}
    assert vars(p.parse_args(["--json", "--port", "9000"])) == {"json": True, "port": 9000}


def test_startup_checks_skip_the_daemon_probe(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    patch_machine(monkeypatch, tmp_path, "nvml_h200", torch=TORCH_CU124)
    monkeypatch.setattr(doctor, "probe_running_daemon", lambda *a, **k: pytest.fail("probed the daemon"))
    checks = doctor.startup_checks()
    names = [c.name for c in checks]
    assert "daemon" not in names and "gpu0.persistence" in names and "model_cache" in names
    json.dumps(doctor.summarize(checks))


def test_startup_checks_never_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(**_: Any) -> MachineReading:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(readers, "read_machine", boom)
    assert doctor.startup_checks() == [
        Check("doctor", "warn", "start-up checks failed: RuntimeError: disk on fire")]


def test_startup_checks_are_fast_here() -> None:
    import torch  # noqa: F401  (the daemon has imported it by the time it checks)
    doctor.startup_checks()
    t0 = time.monotonic()
    checks = doctor.startup_checks()
    elapsed = time.monotonic() - t0
    # Without a GPU it is pure file reading; with one, nvmlInit on a GPU without
    # persistence mode may itself take a while, so only bound it loosely there.
    assert elapsed < (1.0 if checks[0].name == "gpu" else 5.0), elapsed


def test_log_checks_levels(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="soldaemon.doctor.checks")
    doctor.log_checks([Check("a", "ok", "fine"), Check("b", "warn", "meh", fix="do x"),
                       Check("c", "fail", "bad"), Check("d", "info", "fyi")])
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "doctor ok a: fine"), (logging.WARNING, "doctor warn b: meh (fix: do x)"),
        (logging.ERROR, "doctor fail c: bad"), (logging.INFO, "doctor info d: fyi")]


def test_python_dash_m_runs_here() -> None:
    import subprocess

    done = subprocess.run([sys.executable, "-m", "soldaemon.doctor.checks", "--json", "--port", str(closed_port())],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode in (0, 1), done.stderr
    doc = json.loads(done.stdout)
    assert doc["schema"] == 1 and doc["checks"]


def test_daemon_health_reports_the_startup_checks(start_daemon, engine_args) -> None:
    """The daemon runs the doctor's checks at start-up and reports them in
    GET /healthz (and the log)."""
    import json

    daemon = start_daemon(args=engine_args)
    status, raw = daemon.http_get("/healthz")
    assert status == 200
    machine = json.loads(raw)["machine"]
    assert machine["status"] in ("ok", "warn", "fail", "info")
    names = {c["name"] for c in machine["checks"]}
    assert any(n.startswith("cpu.") for n in names)
    # the table its plan came from, with its load and age: what doctor shows of a running daemon
    from soldaemon.doctor.plan import plan_report

    health = json.loads(raw)
    table = health["engine"]["precision"]["table"]
    assert table["cores"] == os.cpu_count() and table["measured_at"] > time.time() - 3600
    assert table["model"]["layers"] == 4                       # the tiny model's own shapes
    report = plan_report(None, served=health)
    assert report["facts"]["source"] == "daemon" and "in use by the running daemon" in report["detail"]


# ------------------------------------------------------------- the kernel plan's table


def _plan_table(folder: Path, name: str, *, layers: int, load: float, age_s: float,
                flags: list[str], fmt: int | None = None) -> Path:
    """A recorded 0.5B table (tests/data/kernel_tables) as a cache file, with
    ``layers``, the load it was timed at and its age."""
    from soldaemon.policy.kernel_plan import PLAN_FORMAT

    doc = json.loads((Path(__file__).parent / "data" / "kernel_tables" / "avx2_only.json").read_text())
    doc["format"] = PLAN_FORMAT if fmt is None else fmt
    table = doc["table"]
    table.update(n_layers=layers, load_1m=load, cores=2, measured_at=time.time() - age_s)
    table["machine"] = {**table["machine"], "cpu_flags": flags}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(doc))
    return path


def test_doctor_json_shows_the_tables_load_and_age_never_the_tiny_models(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The 0.5B's table, timed 3 h ago at load 7.99 on 2 cores (warn: the
    next quiet start re-times it); a newer table of the tiny model (4
    layers, the test suite's) in the same cache is never the one shown."""
    patch_machine(monkeypatch, tmp_path, None, torch=("2.13.0+cpu", None))
    plans = tmp_path / "cache" / "kernel-plans"
    real = _plan_table(plans, "half.json", layers=24, load=7.99, age_s=3 * 3600, flags=["avx2", "fma"])
    _plan_table(plans, "tiny.json", layers=4, load=0.1, age_s=10, flags=["avx2", "fma"])
    # newer, but of an older format: the daemon times it again, so it is not the one in use
    _plan_table(plans, "older.json", layers=24, load=0.1, age_s=60, flags=["avx2", "fma"], fmt=4)
    assert doctor.main(["--json", "--port", str(closed_port())]) == 0
    check = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}["kernel_plan"]
    facts = check["facts"]
    assert facts["file"] == str(real) and facts["source"] == "cache"
    assert (facts["load_1m"], facts["cores"], facts["timed_under_load"]) == (7.99, 2, True)
    assert abs(facts["age_s"] - 3 * 3600) < 60 and facts["why"]
    assert check["verdict"] == "warn" and "timed 3 h ago at load 7.99 on 2 cores" in check["detail"]


def test_doctor_shows_the_plan_the_running_daemon_serves_with(tmp_path: Path) -> None:
    """With a daemon running, its own plan and table are the ones in use,
    whatever else the cache holds."""
    from soldaemon.doctor.plan import plan_report
    from soldaemon.policy.kernel_plan import TimingTable, choose_plan

    _plan_table(tmp_path / "kernel-plans", "tiny.json", layers=4, load=0.1, age_s=10, flags=["avx2"])
    doc = json.loads((Path(__file__).parent / "data" / "kernel_tables" / "zen4_avx512_bf16.json").read_text())
    table = dataclasses.replace(TimingTable.from_dict(doc["table"]), load_1m=0.2, cores=2,
                                measured_at=time.time() - 600, replaced_load_1m=12.0)
    plan = choose_plan(table)
    health = {"daemon": "0.1", "state": "ready", "model": "qwen2.5-coder-0.5b",
              "engine": {"precision": {"plan": plan.to_dict(), "table": table.facts()}}}
    report = plan_report(("avx2",), root=tmp_path, served=health)
    assert report["verdict"] == "ok" and report["facts"]["source"] == "daemon"
    assert report["detail"].startswith(plan.describe())
    assert "in use by the running daemon (qwen2.5-coder-0.5b), timed 10 min ago at load 0.2 on 2 cores, " \
           "re-timed on a quiet start (the table it replaced: load 12)" in report["detail"]
    assert report["facts"]["why"].startswith("in use by the running daemon: fastest measured")
    assert plan_report(("avx2",), root=tmp_path, served={"daemon": "0.1", "state": "ready"})["verdict"] == "info"
    # a model of the user's own (model.path), no daemon running: no other model's table stands in for it
    _plan_table(tmp_path / "kernel-plans", "half.json", layers=24, load=0.1, age_s=10, flags=["avx2"])
    assert plan_report(("avx2",), root=tmp_path)["facts"]["file"].endswith("half.json")
    own = plan_report(("avx2",), root=tmp_path, model_path="/models/mine.gguf")
    assert own["verdict"] == "info" and own["facts"] is None and "/models/mine.gguf" in own["detail"]


def test_doctor_shows_the_plan_the_configured_precision_and_speculation_give(tmp_path: Path) -> None:
    """Without a daemon, the plan shown for a cached table is the one a
    start with the config's ``model.precision`` and ``completion.speculative``
    would choose: on the AVX2 + oneDNN recording speculation keeps the
    decode on int8-dynamic (row-exact), where the free choice is weight-only
    int8."""
    from soldaemon.doctor.plan import plan_report, would_choose
    from soldaemon.policy.kernel_plan import PLAN_FORMAT, TimingTable

    doc = json.loads((Path(__file__).parent / "data" / "kernel_tables" / "avx2_only_onednn.json").read_text())
    doc["format"] = PLAN_FORMAT
    doc["table"].update(load_1m=0.1, cores=2, measured_at=time.time() - 60)
    flags = list(doc["table"]["machine"]["cpu_flags"])
    (tmp_path / "kernel-plans").mkdir()
    (tmp_path / "kernel-plans" / "onednn.json").write_text(json.dumps(doc))
    table = TimingTable.from_dict(doc["table"])
    layers = int(doc["table"]["n_layers"])
    shown = {}
    for precision, speculative in (("auto", True), ("auto", False), ("float32", True)):
        plan = would_choose(table, precision, speculative)
        assert plan is not None
        report = plan_report(tuple(flags), root=tmp_path, layers=layers, precision=precision,
                             speculative=speculative)
        assert report["detail"].startswith(plan.describe()), (precision, speculative)
        shown[precision, speculative] = plan
    assert shown["auto", True].short == "int8-dynamic" and shown["auto", True].verify_exact
    assert shown["auto", False].short == "int8"
    assert shown["float32", True].storage == "float32"


def test_doctor_shows_the_plan_without_the_blocked_copy_when_the_config_turns_it_off(tmp_path: Path) -> None:
    """On the Zen 4 + oneDNN recording a start keeps a blocked copy for
    forwards of several rows; with ``model.blocked_copy: false`` it keeps
    one layout, and doctor shows that plan."""
    from soldaemon.doctor.plan import plan_report, would_choose
    from soldaemon.policy.kernel_plan import PLAN_FORMAT, TimingTable

    doc = json.loads((Path(__file__).parent / "data" / "kernel_tables" / "zen4_avx512_onednn.json").read_text())
    doc["format"] = PLAN_FORMAT
    doc["table"].update(load_1m=0.1, cores=2, measured_at=time.time() - 60)
    (tmp_path / "kernel-plans").mkdir()
    (tmp_path / "kernel-plans" / "zen4.json").write_text(json.dumps(doc))
    table = TimingTable.from_dict(doc["table"])
    flags, layers = tuple(doc["table"]["machine"]["cpu_flags"]), int(doc["table"]["n_layers"])
    kept, one = would_choose(table), would_choose(table, blocked_copy=False)
    assert kept is not None and one is not None
    assert kept.rows == "int8-onednn" and one.rows is None
    for plan, copy in ((kept, True), (one, False)):
        report = plan_report(flags, root=tmp_path, layers=layers, blocked_copy=copy)
        assert report["detail"].startswith(plan.describe())
    assert plan_report(flags, root=tmp_path, layers=layers)["detail"] != \
        plan_report(flags, root=tmp_path, layers=layers, blocked_copy=False)["detail"]
