"""The converted model cache cannot serve garbage: a real converted cache
(the tiny model standing in for a GGUF's weights) is corrupted the ways a
disk or a user does it — bytes overwritten in place at the same size, a
truncated file — and loading either rebuilds it from the GGUF or, with no
GGUF to rebuild from, refuses with a clear error, in-process and through a
real ``soldaemon serve``."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from soldaemon.errors import ModelHashMismatch
from soldaemon.weights import integrity, loader
from soldaemon_bench.tiny import build_tiny_model
from tests.fixtures.daemon import spawn


@pytest.fixture
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def gguf(tmp_path: Path, tiny: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A stand-in GGUF: transformers' GGUF reading returns the tiny model
    (every other load is real). Counts the conversions."""
    import transformers

    real_model = transformers.AutoModelForCausalLM.from_pretrained.__func__  # type: ignore[attr-defined]
    real_tok = transformers.AutoTokenizer.from_pretrained.__func__  # type: ignore[attr-defined]
    seen = {"conversions": 0}

    def model_from(cls: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        if kwargs.pop("gguf_file", None):
            seen["conversions"] += 1
            return real_model(cls, str(tiny), *args, **kwargs)
        return real_model(cls, name, *args, **kwargs)

    def tok_from(cls: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        if kwargs.pop("gguf_file", None):
            return real_tok(cls, str(tiny), *args, **kwargs)
        return real_tok(cls, name, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(model_from))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", classmethod(tok_from))
    monkeypatch.setenv("SOLDAEMON_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF")
    return {"path": path, "seen": seen}


def _cache_of(gguf_path: Path) -> Path:
    return loader.paths.cache_dir() / "models" / loader._gguf_cache_name(gguf_path)


def _weights(model: Any) -> torch.Tensor:
    return model.model.embed_tokens.weight.detach().float().clone()


def _overwrite_data(path: Path) -> None:
    """Random bytes over the tensor data, keeping the header and the size:
    safetensors loads it without complaint."""
    header = 8 + int.from_bytes(path.read_bytes()[:8], "little")
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(header)
        f.write(os.urandom(size - header))


def test_marker_records_every_file(gguf: dict[str, Any]) -> None:
    dest = loader.convert_gguf(gguf["path"], _cache_of(gguf["path"]), progress=False)
    files = integrity.recorded_files(dest)
    assert files is not None and "model.safetensors" in files and "config.json" in files
    rec = files["model.safetensors"]
    assert rec["size"] == (dest / "model.safetensors").stat().st_size
    assert rec["sha256"] == integrity.full_digest(dest / "model.safetensors")
    assert integrity.quick_check(dest) is None and integrity.full_check(dest) is None


@pytest.mark.parametrize("damage", ["overwrite", "truncate"])
def test_corrupt_cache_is_reported_and_rebuilt(gguf: dict[str, Any], tiny: Path, damage: str,
                                               caplog: pytest.LogCaptureFixture) -> None:
    good = _weights(loader.load_model(str(gguf["path"]), device="cpu", dtype="float32", progress=False).model)
    weights = _cache_of(gguf["path"]) / "model.safetensors"
    if damage == "overwrite":
        _overwrite_data(weights)
    else:
        os.truncate(weights, weights.stat().st_size // 2)
    with caplog.at_level(logging.ERROR, logger="soldaemon.weights.loader"):
        loaded = loader.load_model(str(gguf["path"]), device="cpu", dtype="float32", progress=False)
    assert torch.equal(_weights(loaded.model), good)
    assert gguf["seen"]["conversions"] == 2
    assert any("corrupt" in r.getMessage() and "rebuilding" in r.getMessage() for r in caplog.records)
    assert integrity.full_check(loaded.directory) is None


def test_a_change_the_samples_miss_is_caught_by_the_full_hash(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    blob = d / "model.safetensors"
    size = 16 * 1024 * 1024
    blob.write_bytes(os.urandom(size))
    integrity.write_marker(d, {"format": loader.CACHE_FORMAT})
    with open(blob, "r+b") as f:          # one byte between two sampled blocks
        step = (size - 2 * integrity.SAMPLE_EDGE) // integrity.SAMPLE_BLOCKS
        f.seek(integrity.SAMPLE_EDGE + integrity.SAMPLE_BLOCK + (step - integrity.SAMPLE_BLOCK) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert integrity.quick_check(d) is None
    assert integrity.full_check(d) == "model.safetensors differs from the recorded sha256"


def test_corrupt_cache_without_its_gguf_is_refused(gguf: dict[str, Any]) -> None:
    dest = loader.convert_gguf(gguf["path"], _cache_of(gguf["path"]), progress=False)
    _overwrite_data(dest / "model.safetensors")
    with pytest.raises(ModelHashMismatch, match="corrupt"):
        loader.load_model(str(dest), device="cpu", progress=False)


def test_daemon_refuses_a_corrupt_cache_with_a_hint(gguf: dict[str, Any], tmp_path: Path) -> None:
    """A real ``soldaemon serve`` on a corrupted copy of a converted cache:
    no ready line, exit status 3 (model), the cause and the fix, no
    traceback."""
    dest = loader.convert_gguf(gguf["path"], _cache_of(gguf["path"]), progress=False)
    copy = tmp_path / "corrupt-copy"
    shutil.copytree(dest, copy)
    _overwrite_data(copy / "model.safetensors")
    out = spawn(tmp_path / "d", args=["--model", str(copy)], expect_ready=False)
    assert not isinstance(out, type(None)) and hasattr(out, "returncode")
    assert out.returncode == 3, (out.stdout, out.stderr)   # type: ignore[union-attr]
    assert "soldaemon ready" not in out.stdout              # type: ignore[union-attr]
    assert "is corrupt" in out.stderr and "delete" in out.stderr    # type: ignore[union-attr]
    assert "Traceback" not in out.stderr                    # type: ignore[union-attr]
