"""Find, verify, convert and load a model: an embedded model (:mod:`.embedded`), a ``.gguf``
file or a Hugging Face directory. A GGUF is converted once into ``cache_dir()/models/<key>/``,
renamed into place only when complete, with a marker of its files' hashes (:mod:`.integrity`);
a cache that no longer matches is rebuilt from its GGUF.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch

from soldaemon import paths
from soldaemon.errors import ModelError, ModelHashMismatch, OutOfMemory
from soldaemon.weights import integrity
from soldaemon.weights.cachelock import cache_lock, replace_dir
from soldaemon.weights.embedded import EmbeddedModel, assemble_gguf, resolve_model_name

log = logging.getLogger(__name__)

MARKER = integrity.MARKER
CACHE_FORMAT = 2           # bump when the converted layout changes (2: the marker records file hashes)
STORE_DTYPE = torch.float16  # dtype of the cached copy (halves disk and load time)


@dataclass
class LoadedModel:
    model: Any                 # a transformers PreTrainedModel, eval mode
    tokenizer: Any             # a transformers PreTrainedTokenizerFast
    name: str                  # shown in health, logs, the benchmark
    directory: Path            # the HF directory the weights were loaded from
    gguf_path: Path | None     # the GGUF file it came from, when there is one
    device: torch.device
    dtype: torch.dtype
    load_s: float              # wall time of this load, s


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ModelError(
            f"device '{name}' asked for, but torch sees no CUDA device "
            f"(torch {torch.__version__}, built for CUDA {torch.version.cuda})",
            hint="set device.device: cpu, or install a CUDA build of torch; `soldaemon doctor` tells more",
        )
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device, directory: Path | None = None) -> torch.dtype:
    """``auto``: the device's natural dtype; ``stored``: on a CPU the stored one (the backend
    packs it later, no float32 copy), on a GPU ``auto``."""
    if name == "stored":
        if device.type == "cpu" and directory is not None:
            stored = _stored_dtype_name(directory).removeprefix("torch.")
            return {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(stored, torch.float32)
        name = "auto"
    if name == "auto":
        if device.type == "cuda":
            # bf16 only where it is native (Ampere+); older cards run fp16
            return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
        return torch.float32  # CPUs without native bf16/fp16 math are fastest in fp32
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def prepare_model_dir(path: str | None, *, name: str | None = None,
                      progress: bool = True) -> tuple[Path, Path | None, str]:
    """``(hf_dir, gguf_path, name)`` of ``path``, else of the embedded model ``name``, a GGUF
    converted when needed. Raises ModelError."""
    if path is None:
        model = resolve_model_name(name)
        gguf = assemble_gguf(_embedded_gguf(model), model, progress=progress)
        return convert_gguf(gguf, _embedded_cache(model), progress=progress), gguf, model.name
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelError(f"model.path '{p}' does not exist", hint="point model.path at a Hugging Face model directory or a .gguf file")
    if p.is_dir():
        if not (p / "config.json").exists():
            raise ModelError(f"model.path '{p}' is a directory without config.json", hint="it must be a Hugging Face model directory (config.json, tokenizer, weights)")
        return p, None, p.name
    if p.suffix.lower() != ".gguf":
        raise ModelError(f"model.path '{p}' is neither a directory nor a .gguf file")
    return convert_gguf(p, paths.cache_dir() / "models" / _gguf_cache_name(p), progress=progress), p, p.stem


def _embedded_gguf(model: EmbeddedModel) -> Path:
    return paths.cache_dir() / "models" / "gguf" / f"{model.name}.gguf"


def _embedded_cache(model: EmbeddedModel) -> Path:
    """The converted copy's directory, keyed by the pinned hash."""
    return paths.cache_dir() / "models" / f"{model.name}-{model.sha256[:12]}"


def _gguf_cache_name(p: Path) -> str:
    """The cache directory name of a user's GGUF (keyed by path, size, mtime)."""
    st = p.stat()
    key = hashlib.sha256(f"{p.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return f"{p.stem}-{key}"


def tokenizer_dir(path: str | None, *, name: str | None = None, progress: bool = True) -> tuple[Path, str]:
    """A directory holding a model source's tokenizer, and its name, without converting the
    weights (a GGUF's tokenizer alone is cached once). Raises ModelError."""
    root = paths.cache_dir() / "models"
    if path is None:
        model = resolve_model_name(name)
        gguf = assemble_gguf(_embedded_gguf(model), model, progress=progress)
        converted = _embedded_cache(model)
        if _usable(converted):
            return converted, model.name
        return _gguf_tokenizer(gguf, root / "tokenizers" / converted.name), model.name
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelError(f"tokenizer path '{p}' does not exist",
                         hint="point it at a Hugging Face model or tokenizer directory, or a .gguf file")
    if p.is_dir():
        return p, p.name
    if p.suffix.lower() != ".gguf":
        raise ModelError(f"tokenizer path '{p}' is neither a directory nor a .gguf file")
    key = _gguf_cache_name(p)
    if _usable(root / key):
        return root / key, p.stem
    return _gguf_tokenizer(p, root / "tokenizers" / key), p.stem


def _gguf_tokenizer(gguf: Path, dest: Path) -> Path:
    """The tokenizer of ``gguf`` saved to ``dest`` atomically (once)."""
    if _usable(dest):
        return dest
    with cache_lock(dest, exclusive=True):
        if _usable(dest):           # another process wrote it while we waited
            return dest
        import transformers

        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        log.info("reading the tokenizer of %s (once)", gguf.name)
        try:
            try:
                tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            except (ValueError, OSError, KeyError, RuntimeError) as exc:
                raise ModelError(f"cannot read the tokenizer of GGUF '{gguf}': {exc}") from None
            tmp.mkdir(parents=True)
            tok.save_pretrained(str(tmp))
            integrity.write_marker(tmp, {"format": CACHE_FORMAT, "source": gguf.name, "tokenizer_only": True})
            replace_dir(tmp, dest)
            integrity.fsync(dest.parent)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def load_tokenizer(path: str | None, *, name: str | None = None, progress: bool = True) -> tuple[Any, str]:
    """The tokenizer of a model source (:func:`tokenizer_dir`) and its name. Raises ModelError."""
    import transformers

    directory, shown = tokenizer_dir(path, name=name, progress=progress)
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(directory))
    except (ValueError, OSError, KeyError) as exc:
        raise ModelError(f"cannot load a tokenizer from '{directory}': {exc}",
                         hint="it needs tokenizer.json or the tokenizer files of a Hugging Face model") from None
    return tok, shown


def is_complete(directory: Path) -> bool:
    try:
        return json.loads((directory / MARKER).read_text()).get("format") == CACHE_FORMAT
    except (OSError, ValueError):
        return False


def _marker_text(directory: Path) -> str | None:
    try:
        return (directory / MARKER).read_text()
    except OSError:
        return None


def _usable(directory: Path) -> bool:
    """Complete, and its files match the marker's sizes and sampled hashes."""
    return is_complete(directory) and integrity.quick_check(directory) is None


def convert_gguf(gguf: Path, dest: Path, *, progress: bool = True) -> Path:
    """De-quantize ``gguf`` into a safetensors copy at ``dest``, atomically and under its cache
    lock; a ``dest`` that matches its marker is kept."""
    with cache_lock(dest, exclusive=True):
        if is_complete(dest):
            problem = integrity.quick_check(dest)
            if problem is None:
                return dest
            log.error("the model cache %s is corrupt (%s); rebuilding it from %s", dest, problem, gguf.name)
            shutil.rmtree(dest, ignore_errors=True)
        elif dest.exists():
            log.warning("removing incomplete model cache %s", dest)
            shutil.rmtree(dest, ignore_errors=True)
        import transformers

        if not progress:
            transformers.utils.logging.disable_progress_bar()
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        t0 = time.perf_counter()
        log.info("converting %s to a cached safetensors copy (once; about a minute)", gguf.name)
        if progress:
            print(f"soldaemon: converting {gguf.name} once into {dest} (about a minute)…", flush=True)
        try:
            try:
                tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
                model = transformers.AutoModelForCausalLM.from_pretrained(
                    str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
                )
            except (ValueError, OSError, KeyError, RuntimeError) as exc:
                raise ModelError(
                    f"cannot read GGUF '{gguf}': {exc}",
                    hint="transformers must support its architecture and quantization; a Hugging Face model directory always works",
                ) from None
            # plain tensors now: without the GGUF quantizer it saves as an ordinary checkpoint
            model.hf_quantizer = None  # type: ignore[assignment]
            model.config.__dict__.pop("quantization_config", None)
            model.to(STORE_DTYPE)  # type: ignore[arg-type]
            model.config.dtype = STORE_DTYPE
            tmp.mkdir(parents=True)
            model.save_pretrained(str(tmp))
            tok.save_pretrained(str(tmp))
            integrity.write_marker(tmp, {"format": CACHE_FORMAT, "source": gguf.name,
                                         "seconds": round(time.perf_counter() - t0, 1)})
            replace_dir(tmp, dest)
            integrity.fsync(dest.parent)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log.info("converted in %.1f s", time.perf_counter() - t0)
        return dest


def check_memory(directory: Path, device: torch.device, dtype: torch.dtype) -> None:
    """Raise OutOfMemory when the weights in ``dtype`` cannot fit."""
    files = list(directory.glob("*.safetensors")) or list(directory.glob("*.bin"))
    stored = sum(f.stat().st_size for f in files)
    if not stored:
        return
    stored_itemsize = 4 if "32" in _stored_dtype_name(directory) else 2
    need = stored // stored_itemsize * torch.empty((), dtype=dtype).element_size()
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        where = f"GPU {device}"
    else:
        free = psutil.virtual_memory().available
        where = "RAM"
    if need * 1.15 > free:
        raise OutOfMemory(
            f"the model needs about {need / 2**30:.1f} GiB in {str(dtype).removeprefix('torch.')} "
            f"but only {free / 2**30:.1f} GiB of {where} is free",
            hint="close other programs, choose a smaller precision (model.precision: int8) or a smaller model, "
            "or set sol.memory_budget to offload layers",
        )


def _stored_dtype_name(directory: Path) -> str:
    try:
        cfg = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return "float32"
    return str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32")


def load_model(path: str | None = None, *, name: str | None = None, device: str = "auto",
               dtype: str = "auto", progress: bool = True) -> LoadedModel:
    """Prepare and load a model with its tokenizer (sources as :func:`prepare_model_dir`). A
    converted cache is verified while loading; a corrupt one is rebuilt from its GGUF once, else
    :class:`ModelHashMismatch` is raised."""
    t0 = time.perf_counter()
    dev = resolve_device(device)
    directory, gguf, shown = prepare_model_dir(path, name=name, progress=progress)
    dt = resolve_dtype(dtype, dev, directory)
    if gguf is None:                     # the user's own directory: no cache to guard
        model, tok = _load_verified(directory, dev, dt, progress)
        return LoadedModel(model, tok, shown, directory, gguf, dev, dt, time.perf_counter() - t0)
    try:
        with cache_lock(directory, exclusive=False):     # no rebuild removes what we read
            marker = _marker_text(directory)
            model, tok = _load_verified(directory, dev, dt, progress)
    except ModelHashMismatch as exc:
        log.error("%s; rebuilding it from %s", exc.message, gguf.name)
        with cache_lock(directory, exclusive=True):
            if _marker_text(directory) == marker:        # nobody rebuilt it while we waited
                shutil.rmtree(directory, ignore_errors=True)
            directory, gguf, shown = prepare_model_dir(path, name=name, progress=progress)
            model, tok = _load_verified(directory, dev, dt, progress)
    return LoadedModel(model, tok, shown, directory, gguf, dev, dt, time.perf_counter() - t0)


def _load_verified(directory: Path, dev: torch.device, dt: torch.dtype, progress: bool) -> tuple[Any, Any]:
    """Weights and tokenizer from ``directory``, checked; raises ModelError (ModelHashMismatch
    on a cache that does not match its marker)."""
    import transformers
    from safetensors import SafetensorError

    full = None
    if integrity.recorded_files(directory) is not None:
        t_check = time.perf_counter()
        problem = integrity.quick_check(directory)
        if problem is not None:
            raise integrity.corrupt(directory, problem)
        log.info("model cache sizes and sampled hashes match (%.1f ms)", (time.perf_counter() - t_check) * 1000)
        full = integrity.start_full_check(directory)
    check_memory(directory, dev, dt)
    if not progress:
        transformers.utils.logging.disable_progress_bar()
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(directory))
        model = transformers.AutoModelForCausalLM.from_pretrained(str(directory), dtype=dt)
    except (ValueError, OSError, KeyError, SafetensorError) as exc:
        raise ModelError(f"cannot load model from '{directory}': {exc}",
                         hint="if it is a converted cache, delete it; the next start converts the model again"
                         ) from None
    if full is not None:
        t_wait = time.perf_counter()
        problem = full.result()
        if problem is not None:
            raise integrity.corrupt(directory, problem)
        log.info("model cache full sha256 matches (waited %.1f ms after loading)",
                 (time.perf_counter() - t_wait) * 1000)
    model.to(dev)  # type: ignore[arg-type]
    model.eval()
    model.requires_grad_(False)
    return model, tok
