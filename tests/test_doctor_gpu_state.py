"""soldaemon doctor's GPU state: persistence with a display attached, MIG,
compute mode, power cap, temperature and which GPU the configured
``cuda:N`` is. Recorded readings of fake devices (tests/data/doctor, see
its README); a field a source does not report reads "unknown", never a
crash."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from soldaemon.doctor import checks as doctor
from soldaemon.doctor import gpu_state, readers
from soldaemon.doctor.checks import Check
from soldaemon.doctor.readers import CudaDevice, CudaView, GpuReading
from soldaemon.doctor.readers.host import _cuda_device
from tests.test_doctor import (DATA, TORCH_CU121, TORCH_CU124, by_name, closed_port, machine_checks, nvml,
                               nvml_readings, patch_machine, verdicts)

STATE_CHECKS = ("persistence", "mig", "compute_mode", "power", "temperature")


def torch_devices(recording: str) -> tuple[CudaDevice, ...]:
    """The recording's ``torch_devices`` (torch.cuda.get_device_properties
    of each cuda:N) through the reader's own conversion."""
    doc = json.loads((DATA / f"{recording}.json").read_text())
    return tuple(_cuda_device(i, SimpleNamespace(**p)) for i, p in enumerate(doc["torch_devices"]))


# ------------------------------------------------------------------- readers


def test_nvml_reads_the_state_fields() -> None:
    (rtx,) = nvml_readings("nvml_rtx4090_desktop")
    assert rtx.display_active is True and rtx.persistence_mode is False
    assert rtx.mig_enabled is None and rtx.mig_slices is None          # Not Supported on GeForce
    assert rtx.compute_mode == "Default"
    assert (rtx.power_limit_w, rtx.power_default_limit_w, rtx.power_max_limit_w) == (450.0, 450.0, 600.0)
    assert (rtx.temperature_c, rtx.temperature_slowdown_c) == (38, 88)
    (a100,) = nvml_readings("nvml_a100_failing")
    assert a100.compute_mode == "Prohibited" and a100.temperature_slowdown_c is None
    assert any("nvmlDeviceGetTemperatureThreshold: Insufficient Permissions" in n for n in a100.notes)


def test_nvml_lists_the_mig_slices_and_their_memory() -> None:
    (a100,) = nvml_readings("nvml_a100_mig")
    assert a100.mig_enabled is True
    assert a100.mig_slices is not None and len(a100.mig_slices) == 2      # 5 empty places skipped quietly
    assert a100.mig_slices[0].uuid == "MIG-1a2b3c4d-5e6f-5a7b-8c9d-0e1f2a3b4c5d"
    assert a100.mig_slices[0].memory_total_bytes == 42481549312
    assert not any("MigDeviceHandle" in n for n in a100.notes)


def test_old_binding_and_missing_fields_read_unknown() -> None:
    (k80,) = nvml_readings("nvml_k80_old")                               # none of the state functions
    assert (k80.display_active, k80.mig_enabled, k80.compute_mode, k80.power_limit_w, k80.temperature_c) == (
        None, None, None, None, None)
    got = verdicts(k80)
    for name in STATE_CHECKS[1:]:
        assert got[f"gpu0.{name}"].verdict == "info" and "unknown" in got[f"gpu0.{name}"].detail, name


def test_state_a_driver_does_not_report_is_unknown() -> None:
    (gtx,) = nvml_readings("nvml_gtx1080ti")
    assert gtx.display_active is False and gtx.mig_enabled is None and gtx.compute_mode == "Default"
    assert (gtx.power_limit_w, gtx.power_max_limit_w, gtx.temperature_c) == (250.0, 300.0, None)
    assert verdicts(gtx, TORCH_CU121)["gpu0.temperature"].detail == "temperature unknown (not reported)"
    (p100,) = nvml_readings("nvml_p100_old_driver")                      # an old driver's NVML lacks it
    assert p100.display_active is None and p100.name == "Tesla P100-PCIE-16GB"
    assert any(n.startswith("nvmlDeviceGetDisplayActive: ") for n in p100.notes)


def test_torch_properties_in_nvml_spelling() -> None:
    d = _cuda_device(0, SimpleNamespace(name="X", uuid="5b1c9e7a-2f04", pci_domain_id=0, pci_bus_id=0x3B,
                                        pci_device_id=0))
    assert (d.uuid, d.pci_bus_id) == ("GPU-5b1c9e7a-2f04", "00000000:3B:00.0")
    old = _cuda_device(1, SimpleNamespace(name="Y"))                      # a torch without these fields
    assert (old.index, old.uuid, old.pci_bus_id) == (1, None, None)


def test_read_cuda_view_does_not_import_torch_or_start_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    view = readers.read_cuda_view("auto")
    assert view == CudaView(device="cuda:0", visible_devices="1", device_order=None, torch_devices=None)
    assert readers.read_cuda_view("cuda:1").device == "cuda:1"


# --------------------------------------------------------------- verdicts

# (recording, torch, check, verdict, text in the detail)
STATE_VERDICTS = [
    ("nvml_rtx4090_desktop", TORCH_CU124, "gpu0.persistence", "ok", "a display is attached"),
    ("nvml_h200", TORCH_CU124, "gpu0.persistence", "ok", "persistence mode on"),
    ("nvml_t4_degraded", TORCH_CU121, "gpu0.persistence", "warn", "off (headless)"),
    ("nvml_h200", TORCH_CU124, "gpu0.mig", "ok", "MIG off: the daemon sees the whole GPU"),
    ("nvml_rtx4090_desktop", TORCH_CU124, "gpu0.mig", "info", "MIG mode unknown"),
    ("nvml_a100_mig", TORCH_CU124, "gpu0.mig", "warn", "CUDA_VISIBLE_DEVICES must name a MIG UUID"),
    ("nvml_h200", TORCH_CU124, "gpu1.compute_mode", "ok", "Default"),
    ("nvml_desktop_two_gpus", TORCH_CU124, "gpu1.compute_mode", "warn", "Exclusive_Process: one compute process"),
    ("nvml_a100_failing", TORCH_CU121, "gpu0.compute_mode", "fail", "Prohibited"),
    ("nvml_h200", TORCH_CU124, "gpu0.power", "ok", "power limit 700 W (default 700 W, max 700 W)"),
    ("nvml_a100_failing", TORCH_CU121, "gpu0.power", "warn",
     "power limit 150 W (default 250 W, max 250 W): capped at 60% of the default"),
    ("nvml_h200", TORCH_CU124, "gpu1.temperature", "ok", "61 °C, slowdown at 87 °C"),
    ("nvml_t4_degraded", TORCH_CU121, "gpu0.temperature", "warn", "88 °C, slowdown at 90 °C: near"),
    ("nvml_a100_failing", TORCH_CU121, "gpu0.temperature", "ok", "52 °C (slowdown threshold unknown)"),
]


@pytest.mark.parametrize("recording,torch,name,verdict,text", STATE_VERDICTS,
                         ids=[f"{r[0]}-{r[2]}-{r[3]}" for r in STATE_VERDICTS])
def test_recorded_state_verdicts(recording: str, torch: tuple[str | None, str | None], name: str,
                                 verdict: str, text: str) -> None:
    c = machine_checks(recording, torch)[name]
    assert (c.verdict, text in c.detail) == (verdict, True), c
    if verdict in ("warn", "fail"):
        assert c.cost and c.fix, c
    assert c.facts is not None


def test_persistence_off_warns_on_a_headless_gpu_only() -> None:
    (rtx,) = nvml_readings("nvml_rtx4090_desktop")
    assert verdicts(rtx)["gpu0.persistence"].verdict == "ok"
    for display in (False, None):                       # headless, or not reported
        c = verdicts(dataclasses.replace(rtx, display_active=display))["gpu0.persistence"]
        assert c.verdict == "warn" and c.fix and c.fix.startswith("sudo nvidia-smi -pm 1")


def test_mig_named_by_cuda_visible_devices_says_the_slices_memory() -> None:
    (a100,) = nvml_readings("nvml_a100_mig")
    c = by_name(doctor.judge(a100, "12.4", torch_version="2.5.1",
                             visible_devices="MIG-1a2b3c4d"))["gpu0.mig"]          # a unique prefix
    assert c.verdict == "info" and "MIG-1a2b3c4d-5e6f-5a7b-8c9d-0e1f2a3b4c5d" in c.detail
    assert "39.6 GiB of the GPU's memory" in c.detail
    warn = verdicts(a100)["gpu0.mig"]
    assert warn.fix == "export CUDA_VISIBLE_DEVICES=MIG-1a2b3c4d-5e6f-5a7b-8c9d-0e1f2a3b4c5d   (nvidia-smi -L lists the slices)"
    assert "39.6 GiB" in warn.detail


def test_exclusive_compute_mode_with_another_process_fails_and_the_fix_is_the_admins() -> None:
    (t4,) = nvml_readings("nvml_t4_degraded")                           # python3 pid 4242 computes on it
    c = verdicts(dataclasses.replace(t4, compute_mode="Exclusive_Process"))["gpu0.compute_mode"]
    assert c.verdict == "fail" and "1 other already holds this GPU" in c.detail
    assert c.fix == "sudo nvidia-smi -c DEFAULT -i 0   (the administrator's choice; the doctor changes nothing)"
    own = by_name(doctor.judge(dataclasses.replace(t4, compute_mode="Exclusive_Process"), "12.1",
                               torch_version="2.5.1", own_pid=4242))["gpu0.compute_mode"]
    assert own.verdict == "warn"                         # the daemon itself is not "another" process


def test_temperature_at_the_threshold() -> None:
    (t4,) = nvml_readings("nvml_t4_degraded")
    c = verdicts(dataclasses.replace(t4, temperature_c=91))["gpu0.temperature"]
    assert c.verdict == "warn" and "91 °C, slowdown at 90 °C: at the slowdown threshold" in c.detail
    assert verdicts(dataclasses.replace(t4, temperature_c=84))["gpu0.temperature"].verdict == "ok"


def test_power_against_the_max_when_no_default() -> None:
    (a100,) = nvml_readings("nvml_a100_failing")
    c = verdicts(dataclasses.replace(a100, power_default_limit_w=None), TORCH_CU121)["gpu0.power"]
    assert c.verdict == "warn" and "of the max" in c.detail
    c = verdicts(dataclasses.replace(a100, power_default_limit_w=None, power_max_limit_w=None),
                 TORCH_CU121)["gpu0.power"]
    assert c.verdict == "info"


# ------------------------------------------------------ cuda:N and NVML's gpuK


def two_gpus() -> list[GpuReading]:
    return nvml_readings("nvml_desktop_two_gpus")


def view(**kw: Any) -> CudaView:
    base: dict[str, Any] = dict(device="cuda:0", visible_devices=None, device_order=None, torch_devices=None)
    return CudaView(**{**base, **kw})


def test_torch_says_cuda0_is_the_4090_which_nvml_calls_gpu1() -> None:
    gpus = two_gpus()
    line = gpu_state.cuda_device_line(view(torch_devices=torch_devices("nvml_desktop_two_gpus")), gpus)
    assert line["verdict"] == "warn"
    assert line["detail"].startswith("cuda:0 is gpu1 (NVIDIA GeForce RTX 4090, 00000000:02:00.0; by UUID, from torch)")
    assert line["fix"].startswith("export CUDA_DEVICE_ORDER=PCI_BUS_ID")
    assert line["facts"]["nvml_index"] == 1


def test_torch_match_by_pci_bus_id_when_no_uuid() -> None:
    devs = tuple(dataclasses.replace(d, uuid=None) for d in torch_devices("nvml_desktop_two_gpus"))
    g, how = gpu_state.resolve_cuda_device(view(device="cuda:1", torch_devices=devs), two_gpus())
    assert g is not None and g.index == 0 and how == "by PCI bus id, from torch"


def test_without_torch_mixed_gpus_are_unknown_until_pci_order() -> None:
    gpus = two_gpus()
    line = gpu_state.cuda_device_line(view(), gpus)
    assert line["verdict"] == "warn" and "fastest first" in line["detail"] and line["facts"]["nvml_index"] is None
    line = gpu_state.cuda_device_line(view(device_order="PCI_BUS_ID"), gpus)
    assert line["verdict"] == "ok" and line["detail"].startswith("cuda:0 is gpu0 (NVIDIA GeForce RTX 3060")


def test_cuda_visible_devices_explains_another_number() -> None:
    gpus = two_gpus()
    line = gpu_state.cuda_device_line(view(visible_devices="1", device_order="PCI_BUS_ID"), gpus)
    assert line["verdict"] == "info" and "cuda:0 is gpu1" in line["detail"]
    line = gpu_state.cuda_device_line(view(visible_devices="GPU-5b1c9e7a"), gpus)        # a UUID prefix
    assert line["verdict"] == "info" and "cuda:0 is gpu1" in line["detail"]
    line = gpu_state.cuda_device_line(view(device="cuda:1", visible_devices="GPU-5b1c9e7a"), gpus)
    assert line["verdict"] == "warn" and "leaves no cuda:1" in line["detail"]
    assert gpu_state.cuda_device_line(view(device="cpu"), gpus)["verdict"] == "info"


def test_identical_gpus_keep_pci_order() -> None:
    h200s = nvml_readings("nvml_h200")
    assert gpu_state.cuda_device_line(view(device="cuda:1"), h200s)["verdict"] == "ok"
    assert gpu_state.cuda_device_line(view(device="cuda:2"), h200s)["verdict"] == "warn"


def test_one_gpu_is_cuda0() -> None:
    (rtx,) = nvml_readings("nvml_rtx4090_desktop")
    line = gpu_state.cuda_device_line(view(), [rtx])
    assert line["verdict"] == "ok" and line["detail"].startswith("cuda:0 is gpu0 (NVIDIA GeForce RTX 4090")


# ------------------------------------------------------------- report, JSON


def test_json_has_every_reading_under_a_stable_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    patch_machine(monkeypatch, tmp_path, "nvml_desktop_two_gpus", torch=TORCH_CU124)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    doctor.run(argparse.Namespace(json=True, port=closed_port()))
    doc = json.loads(capsys.readouterr().out)
    names = [c["name"] for c in doc["checks"]]
    assert names[0] == "cuda_device"
    for i in (0, 1):
        for name in STATE_CHECKS:
            assert f"gpu{i}.{name}" in names
    g1 = doc["reading"]["gpu"]["gpus"][1]
    assert {k: g1[k] for k in ("display_active", "mig_enabled", "compute_mode", "power_limit_w",
                               "temperature_c", "temperature_slowdown_c")} == {
        "display_active": False, "mig_enabled": None, "compute_mode": "Exclusive_Process",
        "power_limit_w": 450.0, "temperature_c": 38, "temperature_slowdown_c": 88}
    assert doc["reading"]["cuda_view"] == {"device": "cuda:0", "visible_devices": None, "device_order": None,
                                           "torch_devices": None}
    facts = {c["name"]: c["facts"] for c in doc["checks"]}
    assert facts["gpu1.power"] == {"power_limit_w": 450.0, "power_default_limit_w": 450.0, "power_max_limit_w": 600.0}


def test_text_report_one_line_each() -> None:
    checks = list(machine_checks("nvml_desktop_two_gpus", TORCH_CU124).values())
    lines = doctor.format_human(checks).splitlines()
    for name in STATE_CHECKS:
        assert sum(line.startswith(("[", )) and f"] gpu0.{name}: " in line for line in lines) == 1, name
    assert "[ ok ] gpu0.persistence: persistence mode off; a display is attached" in "\n".join(lines)


def test_the_readers_still_only_read() -> None:
    fake = nvml("nvml_a100_mig")
    readers.read_nvml(fake)
    assert fake.calls and all(c in {"nvmlInit", "nvmlShutdown"} or c.startswith(("nvmlSystemGet", "nvmlDeviceGet"))
                              for c in fake.calls)
    assert "nvmlDeviceGetMigDeviceHandleByIndex" in fake.calls


def test_checks_have_a_verdict_each() -> None:
    for recording in ("nvml_a100_mig", "nvml_desktop_two_gpus", "nvml_k80_old"):
        for c in machine_checks(recording, TORCH_CU124).values():
            assert isinstance(c, Check) and c.verdict in doctor.VERDICTS
