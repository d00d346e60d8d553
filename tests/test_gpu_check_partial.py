"""Issue 27.1/27.4: the device check cannot lose its report. Every step of
``scripts/gpu_check.sh`` writes its JSON into the out folder as it
finishes and the report is re-rendered after each step, so a run killed by
a time limit still leaves a summary of what ran, naming what is missing;
the check's own config ignores a user's ``device.cuda_graphs: false``, and
a run whose graph path did not run fails."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))


def _wait_for_steps(steps_tsv: Path, n: int, proc: subprocess.Popen, timeout_s: float = 240) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if steps_tsv.exists() and len(steps_tsv.read_text().splitlines()) >= n:
            return
        if proc.poll() is not None:
            raise AssertionError(f"the check ended (rc {proc.returncode}) before {n} steps")
        time.sleep(0.2)
    raise AssertionError(f"no {n} steps within {timeout_s} s")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_check_still_leaves_a_report_naming_the_missing_steps(tmp_path: Path, sig: int) -> None:
    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=sys.executable, TMPDIR=str(tmp_path))
    env.pop("OUT", None)
    proc = subprocess.Popen(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--cpu", "--out", str(out)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path,
                            start_new_session=True)
    try:
        _wait_for_steps(out / "steps" / "steps.tsv", 1, proc)
        time.sleep(1.0)                              # its report render after step 1 (well under a second)
        # as a device time limit does: the whole process group (SIGKILL: no trap runs)
        os.killpg(proc.pid, sig)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    result = json.loads((out / "gpu_check.json").read_text())
    summary = (out / "summary.md").read_text()
    assert result["steps"][0]["step"] == "env" and result["steps"][0]["rc"] == 0
    assert not result["ok"] and not result["complete"]
    assert {"pytest", "build-tiny", "latency-tiny", "memory-tiny", "doctor"} <= set(result["missing_steps"])
    assert "MISSING (did not run): " in summary and "latency-tiny" in summary and "env rc=0" in summary


def _report(work: Path, out: Path, *extra: str) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check_report.py"), "--work", str(work),
                           "--out", str(out), "--mode", "cuda", "--shapes", "0.5b", "1.5b", "--quiet", *extra],
                          capture_output=True, text=True, timeout=60)
    return proc.returncode, json.loads((out / "gpu_check.json").read_text())


def test_the_report_takes_partial_results_and_names_what_is_missing(tmp_path: Path) -> None:
    work, out = tmp_path / "steps", tmp_path / "out"
    work.mkdir()
    # the run was cut during latency-1.5b; the last line was half written
    (work / "steps.tsv").write_text("env\t0\t900\npytest\t0\t30000\nbuild-0.5b\t0\t9000\n"
                                    "latency-0.5b\t0\t50000\nmemory-0.5b\t0\t30000\nbuild-1.5b\t0\t")
    (work / "lat-0.5b.json").write_text(json.dumps({
        "failures": [], "summary": {"sol-graphs": {"ms_per_token_p50": 3.0}},
        "graphs": {"replays": 300, "verify_replays": 40},
        "attention": [{"position": 4096, "bucket": 4160, "eager_step_ms": 9.0, "graphs_step_ms": 3.0}]}))
    (work / "mem-0.5b.json").write_text(json.dumps({"rows": [], "failures": []}))
    planned = ["env", "pytest", "build-0.5b", "latency-0.5b", "memory-0.5b", "build-1.5b", "latency-1.5b",
               "memory-1.5b", "doctor"]
    rc, result = _report(work, out, "--planned", *planned, "--partial")
    assert rc == 1 and result["in_progress"] and not result["ok"]
    assert result["missing_steps"] == ["build-1.5b", "latency-1.5b", "memory-1.5b", "doctor"]
    assert result["failures"] == []                          # in progress: missing is not yet a failure
    assert result["shapes"]["0.5b"]["figures"]["graph_replays"] == 300
    assert result["shapes"]["0.5b"]["figures"]["attention"][0]["position"] == 4096
    assert "1.5b" not in result["shapes"]
    summary = (out / "summary.md").read_text()
    assert summary.startswith("# gpu_check (cuda): INCOMPLETE") and "latency-1.5b" in summary
    # the final render: what did not run is a failure
    rc, result = _report(work, out, "--planned", *planned)
    assert rc == 1 and "step latency-1.5b did not run" in result["failures"]


def test_the_check_ignores_a_user_config_that_turns_graphs_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from soldaemon.config import ENV_VAR, load_config

    user = tmp_path / "sol_config.yaml"
    user.write_text("device:\n  cuda_graphs: false\n")
    monkeypatch.setenv(ENV_VAR, str(user))
    assert load_config(None).device.cuda_graphs is False        # what the old check read
    import gpu_latency

    config = gpu_latency.check_config(["--device", "cpu"])
    assert config.device.cuda_graphs is True


def test_a_run_without_graph_replays_fails() -> None:
    import gpu_latency

    assert gpu_latency.graph_path_failures(None)

    class Graphs:                                                 # enabled, captured, never replayed
        enabled, failure, replays, verify_replays, verify_rows = True, None, 0, 0, (2, 4)

    assert len(gpu_latency.graph_path_failures(Graphs())) == 2    # type: ignore[arg-type]
    Graphs.replays, Graphs.verify_replays = 10, 3
    assert gpu_latency.graph_path_failures(Graphs()) == []       # type: ignore[arg-type]
    Graphs.enabled, Graphs.failure = False, "RuntimeError: capture failed"
    assert gpu_latency.graph_path_failures(Graphs())             # type: ignore[arg-type]
