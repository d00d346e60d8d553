"""The embedded model's parts are located through their distributions' file
lists and never imported (issue 26, finding 6): a part package whose
``__init__`` runs code must not run before (or instead of) the sha256 check.
Run in a fresh interpreter with a fake part installed on its path."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def install_fake_part(site: Path, dist: str, version: str, payload: bytes, marker: Path) -> None:
    """A distribution as pip leaves it: the package, its data chunk, and a
    ``.dist-info`` whose RECORD lists both."""
    module = dist.replace("-", "_")
    (site / module / "data").mkdir(parents=True)
    (site / module / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\n")
    (site / module / "data" / "part01.bin").write_bytes(payload)
    info = site / f"{module}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "RECORD").write_text(f"{module}/__init__.py,,\n{module}/data/part01.bin,,\n"
                                 f"{info.name}/METADATA,,\n{info.name}/RECORD,,\n")


def test_parts_are_found_without_importing_them(tmp_path: Path) -> None:
    payload = os.urandom(4096)
    marker = tmp_path / "part-code-ran"
    site = tmp_path / "site"
    install_fake_part(site, "soldaemon-test-part1", "1.0", payload, marker)
    probe = f"""
import dataclasses, sys
from pathlib import Path
from soldaemon.weights.embedded import QWEN25_CODER_05B, assemble_gguf, find_parts
model = dataclasses.replace(QWEN25_CODER_05B, packages=("soldaemon-test-part1",), version="1.0",
                            size={len(payload)}, sha256="{hashlib.sha256(payload).hexdigest()}")
print(find_parts(model)[0])
out = assemble_gguf(Path({str(tmp_path / "model.gguf")!r}), model, progress=False)
print(out.stat().st_size)
wrong = dataclasses.replace(model, version="2.0")       # another version than pinned: missing
try:
    find_parts(wrong)
except Exception as exc:
    print(type(exc).__name__)
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), str(site), os.environ.get("PYTHONPATH", "")) if p)}
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert not marker.exists(), "a part package's __init__ ran"
    lines = out.stdout.split()
    assert lines[0] == str(site / "soldaemon_test_part1" / "data" / "part01.bin")
    assert lines[1:] == [str(len(payload)), "ModelPartsMissing"]
