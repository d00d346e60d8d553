"""``soldaemon doctor``'s judgement of GPU state: persistence, MIG, compute mode, power cap,
temperature, and which reported GPU the configured ``cuda:N`` is.

Pure: each line is a :class:`soldaemon.doctor.checks.Check`'s keyword arguments without its
name. A missing reading (``None``) is judged ``info``; nothing here raises for one.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from soldaemon.doctor import line as _line
from soldaemon.doctor.readers import CudaView, GpuReading

GiB = 1024 ** 3

# An enforced power limit under this share of the default (or max) limit is a cap.
POWER_CAP_SHARE = 0.85
# Within this many degrees C of the slowdown threshold is "near" it.
TEMPERATURE_MARGIN_C = 5


def _gib(n: int | None) -> str:
    return "unknown memory" if n is None else f"{n / GiB:.1f} GiB"


def _w(x: float | None) -> str:
    return "unknown" if x is None else f"{x:.0f} W"


def persistence_line(r: GpuReading) -> dict[str, Any]:
    """On, or off with a display attached (the display server keeps the driver loaded): ok.
    Off on a headless GPU or with the display unknown: warn."""
    facts = {"persistence_mode": r.persistence_mode, "display_active": r.display_active}
    if r.persistence_mode is None:
        return _line("info", "persistence mode unknown (not reported; Windows has none)", facts=facts)
    if r.persistence_mode:
        return _line("ok", "persistence mode on", facts=facts)
    if r.display_active:
        return _line("ok", "persistence mode off; a display is attached, so the display server keeps "
                     "the driver loaded", facts=facts)
    headless = "headless" if r.display_active is False else "no display reported"
    return _line("warn", f"persistence mode off ({headless})",
                 cost="whenever no process holds the GPU the driver tears its state down: "
                      "the next start (daemon restart, first request after one) pays the "
                      "re-initialisation, typically a second or more",
                 fix="sudo nvidia-smi -pm 1   (lasting: sudo systemctl enable --now nvidia-persistenced)",
                 facts=facts)


def _visible(visible_devices: str | None) -> list[str]:
    return [e.strip() for e in (visible_devices or "").split(",") if e.strip()]


def mig_line(r: GpuReading, visible_devices: str | None) -> dict[str, Any]:
    """MIG on: lists the slices and warns unless ``CUDA_VISIBLE_DEVICES`` names one by its
    MIG UUID (the daemon sees one slice only)."""
    slices = r.mig_slices or ()
    facts = {"mig_enabled": r.mig_enabled,
             "mig_slices": [{"uuid": s.uuid, "memory_total_bytes": s.memory_total_bytes} for s in slices]}
    if r.mig_enabled is None:
        return _line("info", "MIG mode unknown (not reported; most GPUs have no MIG)", facts=facts)
    if not r.mig_enabled:
        return _line("ok", "MIG off: the daemon sees the whole GPU", facts=facts)
    listed = ", ".join(f"{s.uuid or '?'} ({_gib(s.memory_total_bytes)})" for s in slices) \
        if r.mig_slices is not None else "slices unknown"
    named = [s for s in slices for e in _visible(visible_devices)
             if e.startswith("MIG-") and s.uuid and s.uuid.startswith(e)]
    if named:
        s = named[0]
        return _line("info", f"MIG on: the daemon sees the MIG slice {s.uuid} named by CUDA_VISIBLE_DEVICES, "
                     f"with {_gib(s.memory_total_bytes)} of the GPU's memory (slices: {listed})", facts=facts)
    example = slices[0].uuid if slices and slices[0].uuid else "MIG-<uuid from nvidia-smi -L>"
    return _line("warn", f"MIG on: the daemon sees one MIG slice, not the whole GPU, with only that slice's "
                 f"memory; CUDA_VISIBLE_DEVICES must name a MIG UUID (slices: {listed or 'none configured'})",
                 cost="without a MIG UUID in CUDA_VISIBLE_DEVICES the daemon gets whichever slice CUDA "
                      "lists first (or none): its memory and cores, not the GPU's",
                 fix=f"export CUDA_VISIBLE_DEVICES={example}   (nvidia-smi -L lists the slices)",
                 facts=facts)


def compute_mode_line(r: GpuReading, other_compute: int) -> dict[str, Any]:
    """Default: ok; Prohibited: fail; exclusive: warn, or fail when any of ``other_compute``
    (other compute processes seen) holds the GPU, since the daemon's CUDA start then fails."""
    mode = r.compute_mode
    facts = {"compute_mode": mode}
    fix = f"sudo nvidia-smi -c DEFAULT -i {r.index}   (the administrator's choice; the doctor changes nothing)"
    if mode is None:
        return _line("info", "compute mode unknown (not reported)", facts=facts)
    if mode == "Default":
        return _line("ok", "compute mode Default: shared by any process", facts=facts)
    if mode == "Prohibited":
        return _line("fail", "compute mode Prohibited: no process may use this GPU for compute",
                     cost="the daemon cannot create a CUDA context here and runs on the CPU", fix=fix, facts=facts)
    if other_compute:
        return _line("fail", f"compute mode {mode}: one compute process at a time, and "
                     f"{other_compute} other already holds this GPU",
                     cost="the daemon's CUDA start fails while that process runs: it falls back to the CPU",
                     fix=fix, facts=facts)
    return _line("warn", f"compute mode {mode}: one compute process at a time",
                 cost="while the daemon runs nothing else can use this GPU for compute (a benchmark, a "
                      "notebook), and the daemon cannot start while something else holds it",
                 fix=fix, facts=facts)


def power_line(r: GpuReading) -> dict[str, Any]:
    """Warn when the enforced power limit is under :data:`POWER_CAP_SHARE` of the default
    (else the max) limit."""
    cap, default, most = r.power_limit_w, r.power_default_limit_w, r.power_max_limit_w
    facts = {"power_limit_w": cap, "power_default_limit_w": default, "power_max_limit_w": most}
    if cap is None:
        return _line("info", "power limit unknown (not reported)", facts=facts)
    ref = default if default is not None else most
    text = f"power limit {_w(cap)} (default {_w(default)}, max {_w(most)})"
    if ref is None:
        return _line("info", f"{text}: no default to compare with", facts=facts)
    if cap < POWER_CAP_SHARE * ref:
        which = "default" if default is not None else "max"
        return _line("warn", f"{text}: capped at {cap / ref:.0%} of the {which}",
                     cost="under load the GPU lowers its clocks to stay under the cap: prefill and decode "
                          "run slower than the card can",
                     fix=f"nvidia-smi -q -d POWER   (the administrator may raise it: "
                         f"sudo nvidia-smi -pl {ref:.0f} -i {r.index})",
                     facts=facts)
    return _line("ok", text, facts=facts)


def temperature_line(r: GpuReading) -> dict[str, Any]:
    """Warn at or within :data:`TEMPERATURE_MARGIN_C` of the slowdown threshold."""
    t, slow = r.temperature_c, r.temperature_slowdown_c
    facts = {"temperature_c": t, "temperature_slowdown_c": slow}
    if t is None:
        return _line("info", "temperature unknown (not reported)", facts=facts)
    if slow is None:
        return _line("ok", f"{t} °C (slowdown threshold unknown)", facts=facts)
    text = f"{t} °C, slowdown at {slow} °C"
    if t >= slow - TEMPERATURE_MARGIN_C:
        where = "at" if t >= slow else "near"
        return _line("warn", f"{text}: {where} the slowdown threshold",
                     cost="at the threshold the GPU lowers its clocks: decode slows down until it cools",
                     fix="nvidia-smi -q -d TEMPERATURE,PERFORMANCE   (then cooling: airflow, fans, dust)",
                     facts=facts)
    return _line("ok", text, facts=facts)


def _cuda_index(device: str) -> int | None:
    m = re.fullmatch(r"cuda(?::(\d+))?", device.strip())
    return None if m is None else int(m.group(1) or 0)


def _by_uuid(gpus: Sequence[GpuReading], uuid: str) -> GpuReading | None:
    """The GPU whose UUID, or a MIG slice's, starts with ``uuid`` (CUDA accepts a prefix)."""
    u = uuid.lower()
    for g in gpus:
        ids = [g.uuid] + [s.uuid for s in g.mig_slices or ()]
        if any(i and i.lower().startswith(u) for i in ids):
            return g
    return None


def resolve_cuda_device(view: CudaView, gpus: Sequence[GpuReading]) -> tuple[GpuReading | None, str]:
    """Which NVML GPU ``view.device`` is, and how that was decided (or why it cannot be).
    Uses torch's UUID / bus id when known, else ``CUDA_VISIBLE_DEVICES``: NVML numbers by
    PCI bus id, CUDA fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or all GPUs match."""
    n = _cuda_index(view.device)
    if n is None:
        return None, f"device {view.device!r} is not a CUDA device"
    if view.torch_devices is not None:
        if n >= len(view.torch_devices):
            return None, f"torch sees {len(view.torch_devices)} CUDA device(s), no {view.device}"
        d = view.torch_devices[n]
        if d.uuid:
            g = _by_uuid(gpus, d.uuid)
            if g is not None:
                return g, "by UUID, from torch"
        if d.pci_bus_id:
            for g in gpus:
                if g.pci_bus_id and g.pci_bus_id.lower() == d.pci_bus_id.lower():
                    return g, "by PCI bus id, from torch"
        return None, f"torch's {view.device} ({d.name}) matches no GPU NVML lists"
    pci_order = (view.device_order or "").upper() == "PCI_BUS_ID" or len({g.name for g in gpus}) <= 1
    entries = _visible(view.visible_devices) if view.visible_devices is not None else None
    if entries is None:
        if n >= len(gpus):
            return None, f"NVML lists {len(gpus)} GPU(s), no {view.device}"
        if pci_order:
            return gpus[n], "CUDA and NVML both number by PCI bus id"
        return None, "CUDA numbers these different GPUs fastest first and NVML by PCI bus id"
    if n >= len(entries):
        return None, f"CUDA_VISIBLE_DEVICES={view.visible_devices} leaves no {view.device}"
    entry = entries[n]
    if entry.upper().startswith(("GPU-", "MIG-")):
        g = _by_uuid(gpus, entry)
        return (g, f"CUDA_VISIBLE_DEVICES names {entry}") if g else (None, f"no GPU has the UUID {entry}")
    if entry.isdigit() and pci_order:
        k = int(entry)
        if k < len(gpus):
            return gpus[k], f"CUDA_VISIBLE_DEVICES={view.visible_devices}"
        return None, f"CUDA_VISIBLE_DEVICES names device {k}; NVML lists {len(gpus)} GPU(s)"
    return None, (f"CUDA_VISIBLE_DEVICES={view.visible_devices} counts in CUDA's fastest-first order, "
                  "NVML by PCI bus id")


def cuda_device_line(view: CudaView, gpus: Sequence[GpuReading]) -> dict[str, Any]:
    """Which ``gpuK`` lines are the configured ``cuda:N``. ok: K == N; info: K != N explained
    by ``CUDA_VISIBLE_DEVICES``; warn: K != N otherwise, or no way to tell."""
    g, how = resolve_cuda_device(view, gpus)
    n = _cuda_index(view.device)
    facts = {"device": view.device, "nvml_index": g.index if g else None,
             "pci_bus_id": g.pci_bus_id if g else None, "uuid": g.uuid if g else None, "how": how,
             "cuda_visible_devices": view.visible_devices, "cuda_device_order": view.device_order}
    order_fix = "export CUDA_DEVICE_ORDER=PCI_BUS_ID   (then cuda:N is gpuN of this report)"
    if n is None:
        return _line("info", f"{how}: no GPU used", facts=facts)
    if g is None:
        return _line("warn", f"{view.device} is unknown among the GPUs below: {how}",
                     cost="the gpuN lines below may describe another GPU than the daemon's",
                     fix=order_fix if view.visible_devices is None else "nvidia-smi -L   (UUIDs for CUDA_VISIBLE_DEVICES)",
                     facts=facts)
    which = f"{view.device} is gpu{g.index} ({g.name}, {g.pci_bus_id or 'bus id unknown'}; {how})"
    if g.index == n:
        return _line("ok", which, facts=facts)
    if view.visible_devices is not None:
        return _line("info", f"{which}: read the gpu{g.index} lines for the daemon's GPU", facts=facts)
    return _line("warn", f"{which}: the gpu{n} lines are another GPU's",
                 cost=f"the readings a reader takes for {view.device} (gpu{n}) are of the wrong GPU",
                 fix=order_fix, facts=facts)
