"""Finding the daemon, and starting one when configured to.

Finding it is :func:`soldaemon.discovery.find_daemon` (shared with
``soldaemon status``); :func:`resolve_target` applies sol-lsp's settings to
it and is re-run before every connection attempt, so that a daemon restarted
on another port is found again. sol-lsp reads no ``sol_config.yaml`` (no
YAML reader, no config code in its process): without a ``url`` setting it
trusts only the daemon's record, which every daemon writes once ready, so
a daemon is found where it really listens, and our token is never sent to
whatever else holds the configured port.

:class:`DaemonLauncher` starts ``soldaemon serve`` (an argv list, never a
shell) in its own session, detached, logging to ``daemon.log`` in the state
directory (which the daemon rotates; its raw output goes to ``daemon.out``):
the daemon is shared by every editor window and outlives the one that
started it (it exits by itself after ``idle_exit_s`` without a connection,
passed as ``SOLDAEMON_IDLE_EXIT_S`` whatever the command). A daemon that
cannot start leaves ``last-error.json`` in the state directory; its reason
becomes the launcher's message. It never blocks: the client keeps trying to connect while the
daemon prepares its model, for at most ``timeout_s``; meanwhile :meth:`DaemonLauncher.stage`
reads the daemon's first-start work (assembling, converting, timing the kernels) from the
``soldaemon: ...`` lines it prints to ``daemon.out``. A daemon the launcher starts takes a
free port when the configured one is held (``SOLDAEMON_PORT_FALLBACK``): clients find it
through its record, never its port.

Two sol-lsp starting at once start one daemon: the starter holds
``start.lock`` in the state directory (:class:`soldaemon.discovery.StartLock`)
from the spawn until the daemon answers or the start fails; the other one
sees the lock, starts nothing and keeps trying to connect.
"""

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
from soldaemon.discovery import Fallback, StartLock, Target, find_daemon, make_private_dir, read_daemon_record
from soldaemon.errors import ConfigError
from soldaemon.paths import state_dir

from lsp.settings import Settings

__all__ = ["DaemonLauncher", "Target", "default_daemon_command", "resolve_target"]

log = logging.getLogger("sol.lsp.launcher")


def resolve_target(settings: Settings) -> Target:
    """The daemon to connect to: ``url`` and ``token_file`` from the
    settings when given, else the running daemon's record's (the token file
    defaults to the state directory's). No fallback address: with no
    record, no daemon runs (one is starting, or none). Raises
    :class:`soldaemon.errors.Unavailable` when there is no record (and no
    ``url``) or no token file, and :class:`soldaemon.errors.ConfigError`
    for an unsafe record or token file."""
    return find_daemon(Fallback(), url=settings.url or None, token_path=settings.token_file)


STAGE_PREFIX = "soldaemon: "          # a daemon's progress line on its stdout (daemon.out)
STAGE_TAIL_BYTES = 4096                 # how much of daemon.out's end is read for it
LAST_ERROR_NAME = "last-error.json"    # written by `soldaemon serve` when it cannot start (server/command.py)
# the exit statuses of `soldaemon` (docs/doctor.md, "Exit codes")
EXIT_MEANINGS = {1: "an internal error", 2: "a configuration error", 3: "a model error (missing parts, "
                 "hash mismatch, out of memory)", 4: "the daemon was unavailable", 130: "it was interrupted"}


def daemon_log_path() -> Path:
    """The log of a daemon sol-lsp starts (rotated by the daemon itself)."""
    return state_dir() / "daemon.log"


def doctor_command(settings: Settings) -> list[str]:
    """``soldaemon [--config FILE] doctor`` run as ``python -I``: isolated
    (no current directory, script directory, ``$PYTHONPATH`` or user site on
    ``sys.path``), with the directory this soldaemon was imported from put
    first, so the doctor is this soldaemon whatever the environment says.
    :func:`run_doctor` runs it in the state directory."""
    root = str(Path(soldaemon.__file__).resolve().parent.parent)
    boot = f"import sys; sys.path.insert(0, {root!r}); from soldaemon.cli import main; sys.exit(main())"
    argv = [sys.executable, "-I", "-c", boot]
    if settings.config:
        argv += ["--config", str(Path(settings.config).expanduser().absolute())]
    return argv + ["doctor"]


async def run_doctor(settings: Settings, *, timeout_s: float = 120.0) -> tuple[list[str], str, int | None]:
    """Run :func:`doctor_command` with the private state directory as its
    current directory (never the project's) and stdin closed: ``(argv,
    output, exit status)``. Raises ``OSError`` when it cannot start and
    ``TimeoutError`` after ``timeout_s``."""
    import asyncio

    argv = doctor_command(settings)
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
    """The reason in ``last-error.json`` when it was written after
    ``since`` (wall-clock seconds), as one sentence; else ``None``."""
    try:
        data = json.loads((state_dir() / LAST_ERROR_NAME).read_text())
        if float(data.get("time", 0)) < since:
            return None
        hint = f" ({data['hint']})" if data.get("hint") else ""
        return f"{data['message']}{hint} [{data.get('code', '?')}]"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def default_daemon_command(settings: Settings) -> list[str]:
    """``soldaemon [--config FILE] serve --idle-exit-s N``: the console
    script next to this Python when installed, else ``python -I -m
    soldaemon.cli`` (see :func:`_module_command`). The launcher runs it
    with the state directory as its current directory, never the project's."""
    exe = shutil.which("soldaemon", path=str(Path(sys.executable).parent)) or shutil.which("soldaemon")
    argv = [exe] if exe else _module_command()
    if settings.config:      # absolute: the daemon runs in the state directory, not sol-lsp's cwd
        argv += ["--config", str(Path(settings.config).expanduser().absolute())]
    return argv + ["serve", "--idle-exit-s", f"{settings.daemon_idle_exit_s:g}"]


def _module_command() -> list[str]:
    """``python -m soldaemon.cli`` that never imports a project's code.

    ``-m`` puts the current directory first on ``sys.path``, so a cloned
    repository's ``soldaemon/`` package would run instead of ours. The
    launcher's cwd is the state directory; the interpreter is isolated too:
    ``-I`` when the installed package is in the interpreter's own
    site-packages (``-I`` also drops ``$PYTHONPATH`` and the user site), else
    ``-P`` (Python 3.11+: no cwd on ``sys.path``, while ``$PYTHONPATH`` and a
    ``pip --user`` install still import)."""
    here = Path(soldaemon.__file__).resolve().parent
    sites = [Path(p).resolve() for p in site.getsitepackages()]
    if any(here.is_relative_to(p) for p in sites):
        return [sys.executable, "-I", "-m", "soldaemon.cli"]
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", "soldaemon.cli"]
    return [sys.executable, "-m", "soldaemon.cli"]      # 3.10: the cwd (the state directory) is the guard


class DaemonLauncher:
    """Starts at most one daemon at a time; a failed start is retried only
    after ``cooldown_s``."""

    def __init__(self, argv: Sequence[str], *, timeout_s: float = 180.0, cooldown_s: float = 60.0,
                 log_path: Path | None = None, lock: StartLock | None = None,
                 idle_exit_s: float | None = None) -> None:
        if not argv:
            raise ValueError("empty daemon command")
        self.argv = list(argv)
        self.timeout_s = timeout_s
        self.cooldown_s = cooldown_s
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
        """Another sol-lsp holds the start lock: a daemon is on its way."""
        try:
            return self.lock.busy()
        except (ConfigError, OSError):
            return False

    @property
    def starting(self) -> bool:
        """A daemon we started is alive and still within its time to get ready."""
        return (self.proc is not None and self.proc.poll() is None
                and time.monotonic() - self.started_at < self.timeout_s)

    def check(self) -> str | None:
        """Why the daemon we started is not coming (exited, or too slow), or
        ``None`` while it may still come (or none was started)."""
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
        """What the daemon being started is doing, from the last
        ``soldaemon: ...`` line of ``daemon.out`` in the state directory
        (a start by another window too: the file is shared), or ``None``."""
        out_path = (self.log_path or state_dir() / "daemon.log").with_suffix(".out")
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
        """A connection succeeded: forget the process (the daemon lives on,
        detached). ``started_at`` stays, so a daemon that dies again is
        restarted at most once per ``cooldown_s``."""
        self.proc = None
        self.error = None
        self.lock.release()

    def start(self) -> bool:
        """Start the daemon unless one we started is still coming or the
        cooldown after a failed start runs. Returns True when a process was
        spawned now. Never raises: a spawn failure is kept in ``error``."""
        if self.proc is not None and self.proc.poll() is None:
            return False  # ours is alive: still preparing, or too slow (then check() says so)
        if self.started_at and time.monotonic() - self.started_at < self.cooldown_s:
            return False  # a start failed recently
        log_path = self.log_path or state_dir() / "daemon.log"
        self.log_path = log_path
        t0 = time.perf_counter()
        try:
            make_private_dir(log_path.parent)   # a planted daemon.log link must not be followed
            if not self.lock.acquire():
                log.info("another sol-lsp is starting the daemon; waiting for it")
                return False
            if read_daemon_record() is not None:     # one became ready since our failed attempt
                self.lock.release()
                return False
            # The daemon writes (and rotates) its own log; what it prints
            # outside its logging (a crash before that is set up) goes to
            # daemon.out, emptied at each start. Whatever command starts it,
            # the daemon exits after idle_exit_s unused (SOLDAEMON_IDLE_EXIT_S)
            # and listens on a free port when the configured one is held
            # (SOLDAEMON_PORT_FALLBACK; its record says where).
            out_path = log_path.with_suffix(".out")
            env = dict(os.environ, SOLDAEMON_LOG_FILE=str(log_path), SOLDAEMON_PORT_FALLBACK="1")
            if self.idle_exit_s is not None:
                env["SOLDAEMON_IDLE_EXIT_S"] = f"{self.idle_exit_s:g}"
            nofollow = getattr(os, "O_NOFOLLOW", 0)
            # daemon.log exists as a regular file of ours before the daemon opens it: a
            # planted link there fails here (O_NOFOLLOW) instead of being written through
            os.close(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | nofollow, 0o600))
            fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | nofollow, 0o600)
            self.started_wall = time.time()
            try:
                # cwd: the private state directory, never the project the editor
                # opened (a project's sol_config.yaml or soldaemon/ must not reach it)
                self.proc = subprocess.Popen(
                    self.argv, stdin=subprocess.DEVNULL, stdout=fd, stderr=subprocess.STDOUT,
                    cwd=log_path.parent, start_new_session=True, close_fds=True, env=env)
            finally:
                os.close(fd)
        except ConfigError as exc:
            self.lock.release()
            self.error = f"cannot start the daemon: {exc.message} ({exc.hint})"
            log.error("%s", self.error)
            self.started_at = time.monotonic()
            return False
        except OSError as exc:
            self.lock.release()
            self.error = f"cannot start the daemon ({self.argv[0]}): {exc.strerror or exc}"
            log.error("%s", self.error)
            self.started_at = time.monotonic()
            return False
        self.started_at = time.monotonic()
        self.error = None
        log.info("started the daemon: pid %d, argv %s, log %s (spawn %.1f ms)", self.proc.pid,
                 self.argv, log_path, (time.perf_counter() - t0) * 1000)
        return True
