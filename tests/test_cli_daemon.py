"""The CLI with a daemon running: ``soldaemon stop`` ends a detached one,
``complete`` asks it (no model loaded, no progress bar), ``doctor``
recognises it; and a daemon an editor starts exits by itself, logs to a
rotated file and leaves the reason it could not start. Real processes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from lsp.launcher import DaemonLauncher
from soldaemon.discovery import pid_exists
from tests.fixtures.daemon import FAKE_ENGINE, REPO, Daemon, daemon_command, write_config

BAR = re.compile(r"\d+%\||it/s\]|s/it\]|Loading (weights|checkpoint)")


def alive(pid: int) -> bool:
    """Running (an exited process its parent has not reaped, a zombie, is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return pid_exists(pid)


def cli(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*daemon_command(), *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_stop_ends_a_detached_daemon(tmp_path: Path) -> None:
    state = tmp_path / "state"
    config = write_config(tmp_path / "sol_config.yaml")
    env = {**{k: v for k, v in os.environ.items() if "proxy" not in k.lower()},
           "SOLDAEMON_STATE_DIR": str(state), "SOLDAEMON_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": str(REPO)}
    # Detached as an editor leaves it: its own session, its parent gone (sh exits at once).
    argv = " ".join([*daemon_command(), "--config", str(config), "serve", "--engine", FAKE_ENGINE])
    subprocess.run(["sh", "-c", f"setsid {argv} > {tmp_path / 'out'} 2>&1 < /dev/null &"], env=env, check=True)
    record = state / "daemon.json"
    deadline = time.monotonic() + 60
    while not record.exists():
        assert time.monotonic() < deadline, (tmp_path / "out").read_text()
        time.sleep(0.1)
    pid = json.loads(record.read_text())["pid"]
    done = cli("stop", "--config", str(config), env=env)            # --config after the subcommand
    assert done.returncode == 0, done.stderr
    assert f"pid {pid}" in done.stdout
    assert not alive(pid) and not record.exists()
    again = cli("stop", "--config", str(config), env=env)
    assert again.returncode == 4, again.stderr                       # nothing to stop: "unavailable"


def test_complete_asks_the_running_daemon(start_daemon: Any, engine_args: list[str], tmp_path: Path) -> None:
    """The warm second call is answered by the daemon from its cache: no
    model load, no bar. The ratio against loading the model here (the same
    tiny model, the same run) shows what that saves."""
    daemon: Daemon = start_daemon(args=engine_args)
    src = tmp_path / "a.py"
    src.write_text("def add(a, b):\n    return \n")
    env = dict(daemon.env)
    config = str(daemon.state_dir.parent / "sol_config.yaml")
    times, outs = [], []
    for _ in range(2):
        t0 = time.perf_counter()
        out = cli("complete", f"{src}:2:12", "--config", config, env=env)
        times.append(time.perf_counter() - t0)
        outs.append(out)
        assert out.returncode == 0, out.stderr
        assert out.stderr.rstrip().endswith("| daemon"), out.stderr
        assert not BAR.search(out.stderr), out.stderr
    cached = re.search(r"prompt (\d+) tok \((\d+) cached\)", outs[1].stderr)
    assert cached and int(cached[2]) > 0 and int(cached[2]) >= int(cached[1]) - 1, outs[1].stderr
    assert daemon.stderr().count("kind=complete outcome=") >= 2        # both reached the daemon
    t0 = time.perf_counter()
    local = cli("complete", f"{src}:2:12", "--config", config, *engine_args, env=env)
    local_s = time.perf_counter() - t0
    assert local.returncode == 0 and "| loaded here" in local.stderr, local.stderr
    assert not BAR.search(local.stderr)                               # stderr is not a terminal
    print(f"\nsoldaemon complete: daemon (warm) {times[1]:.2f} s vs loading the tiny model here {local_s:.2f} s "
          f"= {times[1] / local_s:.2f}x (wall, CLI start-up included; loaded shared machine)")
    assert times[1] < local_s


def test_doctor_recognises_the_running_daemon(start_daemon: Any) -> None:
    daemon: Daemon = start_daemon(args=["--engine", FAKE_ENGINE])
    out = cli("doctor", "--json", "--config", str(daemon.state_dir.parent / "sol_config.yaml"), env=daemon.env)
    doc = json.loads(out.stdout)
    (check,) = [c for c in doc["checks"] if c["name"] == "daemon"]
    assert check["verdict"] == "ok", check
    assert f"pid {daemon.pid}" in check["detail"] and "soldaemon" in check["detail"]


def test_an_editor_started_daemon_idles_out_whatever_its_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                  ) -> None:
    """A custom command (what the docs recommend for a venv) gets the idle
    exit too, logs to a rotated daemon.log, and no progress bar."""
    state = tmp_path / "state"
    monkeypatch.setenv("SOLDAEMON_STATE_DIR", str(state))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    config = write_config(tmp_path / "sol_config.yaml")
    launcher = DaemonLauncher([*daemon_command(), "--config", str(config), "serve", "--engine", FAKE_ENGINE],
                              idle_exit_s=1.0)
    assert launcher.start()
    assert launcher.proc is not None
    code = launcher.proc.wait(60)
    assert code == 0, (state / "daemon.out").read_text()
    log = (state / "daemon.log").read_text()
    assert "server.idle_exit_s" in log and "model ready" in log
    assert "model ready in" in log and "{" not in log.split("model ready in", 1)[1].splitlines()[0]
    out = (state / "daemon.out").read_text()
    assert not BAR.search(log + out)
    assert "model ready" not in out            # the log is only in the rotated file


def test_a_daemon_that_cannot_start_says_why_to_the_editor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("SOLDAEMON_STATE_DIR", str(state))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    config = write_config(tmp_path / "sol_config.yaml", extra={"model": {"name": "no-such-model"}})
    launcher = DaemonLauncher([*daemon_command(), "--config", str(config), "serve"])
    assert launcher.start() and launcher.proc is not None
    launcher.proc.wait(60)
    why = launcher.check()
    assert why is not None and "could not start" in why and "no-such-model" in why, why
    error = json.loads((state / "last-error.json").read_text())
    assert error["code"] == "config" and error["exit_code"] == 2


def test_config_after_the_subcommand() -> None:
    from soldaemon.cli import build_parser

    args = build_parser().parse_args(["status", "--config", "x.yaml"])
    assert args.sub_config == "x.yaml"
    assert build_parser().parse_args(["--config", "y.yaml", "doctor"]).config == "y.yaml"


def test_the_daemon_log_is_rotated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import logging
    import logging.handlers

    from soldaemon.server import command

    root = logging.getLogger()
    saved = list(root.handlers)
    monkeypatch.setenv("SOLDAEMON_LOG_FILE", str(tmp_path / "daemon.log"))
    monkeypatch.setattr(command, "LOG_BYTES", 2000)
    for name in ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS"):   # set by _setup_logging: restored after
        monkeypatch.setenv(name, os.environ.get(name, "0"))
    try:
        command._setup_logging("info")
        (handler,) = root.handlers
        assert isinstance(handler, logging.handlers.RotatingFileHandler) and handler.maxBytes == 2000
        for i in range(100):
            logging.getLogger("soldaemon.server").info("line %d %s", i, "x" * 40)
        handler.close()
    finally:
        root.handlers[:] = saved
    assert (tmp_path / "daemon.log.1").exists() and (tmp_path / "daemon.log").stat().st_size <= 2000
    assert not (tmp_path / f"daemon.log.{command.LOG_BACKUPS + 1}").exists()


def test_doctor_kernel_plan_reads_the_configured_models_table(tmp_path: Path) -> None:
    """The 1.5B's table is the newest; a config naming the 0.5B (24 layers,
    2 threads) must read the 0.5B's, and one asking 4 threads finds none."""
    from soldaemon.doctor import plan as plan_check
    from soldaemon.policy.kernel_plan import PLAN_FORMAT

    tables = Path(__file__).parent / "data" / "kernel_tables"
    folder = tmp_path / "kernel-plans"
    folder.mkdir()
    def cache(name: str, as_name: str) -> None:    # as a daemon of this version caches it
        doc = json.loads((tables / name).read_text())
        (folder / as_name).write_text(json.dumps({**doc, "format": PLAN_FORMAT}))

    cache("zen4_avx512_bf16.json", "a.json")
    time.sleep(0.05)
    cache("zen4_avx512_bf16_1.5b.json", "b.json")     # newer
    flags = tuple(json.loads((tables / "zen4_avx512_bf16.json").read_text())["table"]["machine"]["cpu_flags"])
    newest = plan_check.plan_report(flags, root=tmp_path)
    for_05b = plan_check.plan_report(flags, root=tmp_path, layers=24, threads=2)
    assert newest["detail"] != for_05b["detail"]
    alone = plan_check.plan_report(flags, root=_only(tmp_path, "a.json"))

    def table_part(report: dict) -> tuple[str, str]:     # the plan, and what it was timed with
        return report["detail"].split(" — ")[0], report["detail"].split(" with torch ")[1]
    assert table_part(for_05b) == table_part(alone)
    none = plan_check.plan_report(flags, root=tmp_path, layers=24, threads=4)
    assert none["verdict"] == "info" and "with 4 threads" in none["detail"]


def _only(root: Path, name: str) -> Path:
    """A cache folder holding only ``kernel-plans/name`` of ``root``."""
    import shutil

    other = root / f"only-{name}"
    (other / "kernel-plans").mkdir(parents=True)
    shutil.copy(root / "kernel-plans" / name, other / "kernel-plans" / name)
    return other
