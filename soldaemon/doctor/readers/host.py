"""Reading the CPU, torch (without importing it), the model cache and a running daemon."""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import os
import platform
import shutil
import sys
from pathlib import Path

from soldaemon import paths
from soldaemon.doctor.readers.readings import (CacheReading, CachedModel, CpuReading, CudaDevice, CudaView,
                                               TorchReading)


# The vector extensions that matter to torch's CPU kernels, x86 then Arm.
VECTOR_FLAGS: tuple[str, ...] = (
    "avx", "avx2", "fma", "avx_vnni", "avx512f", "avx512bw", "avx512_vnni",
    "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8",
    "asimd", "asimddp", "i8mm", "bf16", "sve", "sve2",
)


def parse_cpuinfo(text: str) -> tuple[str | None, tuple[str, ...]]:
    """(CPU model, :data:`VECTOR_FLAGS` present) from ``/proc/cpuinfo`` text; the first CPU
    counts."""
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
    """Cores, RAM and vector extensions (``None`` where there is no ``/proc/cpuinfo``)."""
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


def read_torch() -> TorchReading:
    """torch's version and CUDA build, parsed from ``torch/version.py`` so the doctor skips
    torch's slow import; from the module when it is already imported or that file is
    unreadable. Does not initialise CUDA."""
    if "torch" not in sys.modules:
        try:
            spec = importlib.util.find_spec("torch")   # a top-level name: finds, does not import
        except (ImportError, ValueError) as exc:
            return TorchReading(version=None, cuda=None, error=f"{type(exc).__name__}: {exc}")
        if spec is None:
            return TorchReading(version=None, cuda=None, error="ModuleNotFoundError: No module named 'torch'")
        fields = _version_fields(spec)
        if fields is not None:
            return TorchReading(version=fields.get("__version__"), cuda=fields.get("cuda"))
    try:
        import torch
    except Exception as exc:                     # ImportError, or a broken install
        return TorchReading(version=None, cuda=None, error=f"{type(exc).__name__}: {exc}")
    version = getattr(torch, "__version__", None)
    cuda = getattr(getattr(torch, "version", None), "cuda", None)
    return TorchReading(version=str(version) if version else None,
                        cuda=str(cuda) if cuda else None)


def _version_fields(spec: importlib.machinery.ModuleSpec) -> dict[str, str] | None:
    """``__version__`` and ``cuda`` from torch's generated ``version.py``, or ``None``."""
    for folder in spec.submodule_search_locations or ():
        try:
            tree = ast.parse((Path(folder) / "version.py").read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            continue
        found: dict[str, str] = {}
        for node in tree.body:
            target = node.target if isinstance(node, ast.AnnAssign) else (
                node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
            value = getattr(node, "value", None)
            if isinstance(target, ast.Name) and target.id in ("__version__", "cuda") \
                    and isinstance(value, ast.Constant) and isinstance(value.value, str) and value.value:
                found[target.id] = value.value
        if "__version__" in found:
            return found
    return None


def read_cuda_view(device: str | None = None) -> CudaView:
    """The configured device (``None``, "auto", "cuda" mean "cuda:0"), CUDA's ordering
    environment, and torch's devices if this process already initialised CUDA.
    Never imports torch or initialises CUDA."""
    dev = "cuda:0" if device is None or device in ("auto", "cuda") else device
    return CudaView(device=dev, visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
                    device_order=os.environ.get("CUDA_DEVICE_ORDER"), torch_devices=_torch_cuda_devices())


def _torch_cuda_devices() -> tuple[CudaDevice, ...] | None:
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return None
        return tuple(_cuda_device(i, torch.cuda.get_device_properties(i))
                     for i in range(torch.cuda.device_count()))
    except Exception:                            # a broken CUDA state: the view stays the environment's
        return None


def _cuda_device(index: int, props: object) -> CudaDevice:
    """Device properties in NVML's spelling ("GPU-" UUID, "0000DDDD:BB:DD.0" bus id); fields an
    old torch does not report stay ``None``."""
    uuid = getattr(props, "uuid", None)
    uuid_s = str(uuid) if uuid is not None else None
    if uuid_s and not uuid_s.startswith(("GPU-", "MIG-")):
        uuid_s = "GPU-" + uuid_s
    dom, bus, dev = (getattr(props, f"pci_{k}_id", None) for k in ("domain", "bus", "device"))
    pci = f"{dom:08X}:{bus:02X}:{dev:02X}.0" if all(isinstance(v, int) for v in (dom, bus, dev)) else None
    return CudaDevice(index=index, name=str(getattr(props, "name", "?")), uuid=uuid_s, pci_bus_id=pci)


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
    """Converted models (folders with ``config.json`` and safetensors) at most ``max_depth``
    below ``root`` (default :func:`paths.cache_dir`), and the free disk space there."""
    root = root if root is not None else paths.cache_dir()
    models: list[CachedModel] = []
    for here, dirs, _files in os.walk(root):          # does not enter symlinked folders
        folder = Path(here)
        depth = len(folder.relative_to(root).parts)
        if depth > 0 and _is_model_dir(folder):
            models.append(CachedModel(name=folder.relative_to(root).as_posix(), size_bytes=_dir_size(folder)))
            dirs.clear()
        elif depth >= max_depth:
            dirs.clear()
    probe = root
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    try:
        free: int | None = shutil.disk_usage(probe).free
    except OSError:
        free = None
    return CacheReading(path=str(root), exists=root.is_dir(),
                        models=tuple(sorted(models, key=lambda m: m.name)), disk_free_bytes=free)
