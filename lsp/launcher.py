"""Finding the daemon, and starting one when configured to. sol-lsp reads no
``sol_config.yaml``: without a ``url`` setting it trusts only a ready daemon's record, so its
token never goes to whatever else holds a port. :class:`DaemonLauncher` starts ``soldaemon
serve`` detached, shared by every window; ``start.lock`` lets one sol-lsp start it."""

from __future__ import annotations

import json
import logging
import os
import shutil
import site
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import soldaemon
from soldaemon.discovery import StartLock, Target, find_daemon, make_private_dir, read_daemon_record
from soldaemon.errors import ConfigError
from soldaemon.paths import state_dir

from lsp.settings import Settings

__all__ = ["DaemonLauncher", "Target", "default_daemon_command", "resolve_target"]

log = logging.getLogger("sol.lsp.launcher")


def resolve_target(settings: Settings) -> Target:
    """``url`` and ``token_file`` from the settings, else the running daemon's record. Raises
    :class:`Unavailable` with no record or token file, :class:`ConfigError` for an unsafe one."""
    return find_daemon(url=settings.url or None, token_path=settings.token_file)


STAGE_PREFIX = "soldaemon: "          # a daemon's progress line on its stdout (daemon.out)
STAGE_TAIL_BYTES = 4096                 # how much of daemon.out's end is read for it
LAST_ERROR_NAME = "last-error.json"    # written by `soldaemon serve` when it cannot start (server/command.py)
# the exit statuses of `soldaemon` (docs/doctor.md, "Exit codes")
EXIT_MEANINGS = {1: "an internal error", 2: "a configuration error", 3: "a model error (missing parts, "
                 "hash mismatch, out of memory)", 4: "the daemon was unavailable", 130: "it was interrupted"}


def daemon_log_path() -> Path:
    """The log of a daemon sol-lsp starts (rotated by the daemon itself)."""
    return state_dir() / "daemon.log"


async def run_doctor(settings: Settings, *, timeout_s: float = 120.0) -> tuple[list[str], str, int | None]:
    """Run ``soldaemon [--config FILE] doctor`` as ``python -I`` with this soldaemon first on
    ``sys.path``, in the private state directory, stdin closed: ``(argv, output, exit status)``.
    Raises ``OSError`` or ``TimeoutError``."""
    import asyncio

    root = str(Path(soldaemon.__file__).resolve().parent.parent)
    boot = f"import sys; sys.path.insert(0, {root!r}); from soldaemon.cli import main; sys.exit(main())"
    argv = [sys.executable, "-I", "-c", boot]
    if settings.config:
        argv += ["--config", str(Path(settings.config).expanduser().absolute())]
    argv.append("doctor")
    directory = make_private_dir(state_dir())
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL, cwd=directory,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    return argv, out.decode(errors="replace"), proc.returncode


def read_last_error(since: float) -> str | None:
    """The reason in ``last-error.json`` written after ``since`` (wall clock), or None."""
    try:
        data = json.loads((state_dir() / LAST_ERROR_NAME).read_text())
        if float(data.get("time", 0)) < since:
            return None
        hint = f" ({data['hint']})" if data.get("hint") else ""
        return f"{data['message']}{hint} [{data.get('code', '?')}]"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def default_daemon_command(settings: Settings) -> list[str]:
    """``soldaemon [--config FILE] serve --idle-exit-s N``: the console script next to this
    Python, else :func:`_module_command`."""
    exe = shutil.which("soldaemon", path=str(Path(sys.executable).parent)) or shutil.which("soldaemon")
    argv = [exe] if exe else _module_command()
    if settings.config:      # absolute: the daemon runs in the state directory, not sol-lsp's cwd
        argv += ["--config", str(Path(settings.config).expanduser().absolute())]
    return argv + ["serve", "--idle-exit-s", f"{settings.daemon_idle_exit_s:g}"]


def _module_command() -> list[str]:
    """``python -m soldaemon.cli`` that never imports a project's code: ``-I`` when installed in
    site-packages, else ``-P`` (no cwd on ``sys.path``)."""
    here = Path(soldaemon.__file__).resolve().parent
    sites = [Path(p).resolve() for p in site.getsitepackages()]
    if any(here.is_relative_to(p) for p in sites):
        return [sys.executable, "-I", "-m", "soldaemon.cli"]
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", "soldaemon.cli"]
    return [sys.executable, "-m", "soldaemon.cli"]      # 3.10: the cwd (the state directory) is the guard


class DaemonLauncher:
    """Starts ``soldaemon serve`` (an argv, never a shell) in its own session in the private
    state directory, at most one at a time; a failed start is retried after ``cooldown_s``."""

    cooldown_s = 60.0

    def __init__(self, argv: Sequence[str], *, timeout_s: float = 180.0, log_path: Path | None = None,
                 lock: StartLock | None = None, idle_exit_s: float | None = None) -> None:
        if not argv:
            raise ValueError("empty daemon command")
        self.argv = list(argv)
        self.timeout_s = timeout_s
        self.log_path = log_path
        self.idle_exit_s = idle_exit_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.started_wall = 0.0
        self.error: str | None = None
        self._lock = lock

    @property
    def lock(self) -> StartLock:
        if self._lock is None:              # resolved late: it follows SOLDAEMON_STATE_DIR
            self._lock = StartLock()
        return self._lock

    @property
    def other_starting(self) -> bool:
        """Whether another sol-lsp holds the start lock."""
        try:
            return self.lock.busy()
        except (ConfigError, OSError):
            return False

    @property
    def starting(self) -> bool:
        """Whether a daemon we started is alive and within ``timeout_s``."""
        return (self.proc is not None and self.proc.poll() is None
                and time.monotonic() - self.started_at < self.timeout_s)

    def check(self) -> str | None:
        """Why the daemon we started is not coming, or None while it may."""
        if self.proc is None:
            return None
        code = self.proc.poll()
        where = f"; see {self.log_path}" if self.log_path else ""
        if code is not None:
            self.lock.release()
            reason = read_last_error(self.started_wall - 1.0)
            if reason is not None:
                return f"the daemon could not start: {reason}{where}"
            meaning = f" ({EXIT_MEANINGS[code]})" if code in EXIT_MEANINGS else ""
            return f"the daemon started by sol-lsp exited with status {code}{meaning}{where}"
        if time.monotonic() - self.started_at >= self.timeout_s:
            self.lock.release()
            return f"the daemon started by sol-lsp was not ready within {self.timeout_s:.0f} s{where}"
        return None

    def stage(self) -> str | None:
        """What a starting daemon (any window's) is doing: the last ``soldaemon: ...`` line of
        ``daemon.out``, or None."""
        out_path = (self.log_path or daemon_log_path()).with_suffix(".out")
        try:
            with open(out_path, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - STAGE_TAIL_BYTES))
                tail = f.read().decode("utf-8", "replace")
        except OSError:
            return None
        lines = [ln.strip() for ln in tail.splitlines()
                 if ln.startswith(STAGE_PREFIX) and not ln.startswith(STAGE_PREFIX + "error")]
        return lines[-1][len(STAGE_PREFIX):][:200] if lines else None

    def ready(self) -> None:
        """Forget the process after a connection (the daemon lives on); a restart still waits
        ``cooldown_s``."""
        self.proc = None
        self.error = None
        self.lock.release()

    def start(self) -> bool:
        """Spawn the daemon unless ours is still coming or the cooldown runs; True when spawned now.
        A failure is kept in ``error``, never raised."""
        if self.proc is not None and self.proc.poll() is None:
            return False  # ours is alive: still preparing, or too slow (then check() says so)
        if self.started_at and time.monotonic() - self.started_at < self.cooldown_s:
            return False  # a start failed recently
        log_path = self.log_path = self.log_path or daemon_log_path()
        t0 = time.perf_counter()
        try:
            make_private_dir(log_path.parent)   # a planted daemon.log link must not be followed
            if not self.lock.acquire():
                log.info("another sol-lsp is starting the daemon; waiting for it")
                return False
            if read_daemon_record() is not None:     # one became ready since our failed attempt
                self.lock.release()
                return False
            # daemon.log is the daemon's (it rotates it); daemon.out holds what it prints outside it
            out_path = log_path.with_suffix(".out")
            env = dict(os.environ, SOLDAEMON_LOG_FILE=str(log_path), SOLDAEMON_PORT_FALLBACK="1")
            if self.idle_exit_s is not None:
                env["SOLDAEMON_IDLE_EXIT_S"] = f"{self.idle_exit_s:g}"
            nofollow = getattr(os, "O_NOFOLLOW", 0)
            # a planted link at daemon.log fails here (O_NOFOLLOW), not in the daemon
            os.close(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | nofollow, 0o600))
            fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | nofollow, 0o600)
            self.started_wall = time.time()
            try:
                # cwd: the private state directory, never the project's
                self.proc = subprocess.Popen(
                    self.argv, stdin=subprocess.DEVNULL, stdout=fd, stderr=subprocess.STDOUT,
                    cwd=log_path.parent, start_new_session=True, close_fds=True, env=env)
            finally:
                os.close(fd)
        except (ConfigError, OSError) as exc:
            self.lock.release()
            self.error = (f"cannot start the daemon: {exc.message} ({exc.hint})" if isinstance(exc, ConfigError)
                          else f"cannot start the daemon ({self.argv[0]}): {exc.strerror or exc}")
            log.error("%s", self.error)
            self.started_at = time.monotonic()
            return False
        self.started_at = time.monotonic()
        self.error = None
        log.info("started the daemon: pid %d, argv %s, log %s (spawn %.1f ms)", self.proc.pid,
                 self.argv, log_path, (time.perf_counter() - t0) * 1000)
        return True
