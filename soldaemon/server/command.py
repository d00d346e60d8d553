"""``soldaemon serve``: start-up and shutdown (:func:`serve`) and the entry point (:func:`run`).
The protocol is docs/protocol.md; security is :mod:`soldaemon.server.auth`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import json
import logging
import logging.handlers
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from websockets.asyncio.server import serve as ws_serve

from soldaemon import __version__
from soldaemon.server import statefiles
from soldaemon.api import Engine
from soldaemon.server.auth import check_bind, load_or_create_token
from soldaemon.discovery import ws_url
from soldaemon.errors import AddressInUse, ConfigError, ModelError, OutOfMemory, SolError, Unavailable
from soldaemon.server.daemon import Daemon
from soldaemon.server.gate import gated_connection
from soldaemon.server.handshake import HandshakeGate
from soldaemon.server.arguments import SERVE_OPTIONS, with_options
from soldaemon.server.engine_loader import engine_loader
from soldaemon.server.settings import ServerSettings

if TYPE_CHECKING:
    from soldaemon.config import Config

log = logging.getLogger("soldaemon.server")


async def serve(settings: ServerSettings, load: Callable[[], Engine], model_label: str, *,
                port_fallback: bool = False) -> int:
    """Run the daemon until SIGTERM/SIGINT; return the exit status. The port is bound before
    the slow model load so a taken port fails at once (``port_fallback`` takes a free one
    instead; the record names it). Raises :class:`SolError` for start-up problems."""
    check_bind(settings.host, settings.allow_remote)
    statefiles.ensure_state_dir()
    token = load_or_create_token(settings.token_path)
    loop = asyncio.get_running_loop()
    daemon = Daemon(settings, token, model_label, loop)
    # `soldaemon doctor`'s machine checks: logged once, reported in health.
    from soldaemon.doctor import checks as doctor

    checks = doctor.startup_checks()
    doctor.log_checks(checks, log)
    daemon.machine = doctor.summarize(checks)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def listen(port: int) -> Any:
        return ws_serve(
            daemon.handler, settings.host, port,
            process_request=daemon.process_request, max_size=settings.limits.max_message_bytes,
            compression=None, server_header=f"soldaemon/{__version__}", max_queue=64,
            open_timeout=settings.handshake_timeout_s,
            create_connection=gated_connection(
                HandshakeGate(settings.max_handshakes, settings.max_handshakes_per_peer),
                lambda peer: daemon.refusals.refused("too many handshakes in progress; closed the oldest", peer)),
        )

    try:
        try:
            server = await listen(settings.port)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or not port_fallback or settings.port == 0:
                raise
            log.warning("port %d on %s is already in use; listening on a free port instead "
                        "(clients find it through the daemon's record)", settings.port, settings.host)
            server = await listen(0)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise AddressInUse(
                f"port {settings.port} on {settings.host} is already in use",
                hint="another soldaemon may be running (soldaemon status); or choose another port "
                     "with --port N or server.port (0 picks a free one)") from None
        raise Unavailable(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}") from None
    daemon_file: Path | None = None
    try:
        port = server.sockets[0].getsockname()[1]  # type: ignore[index]
        url = ws_url(settings.host, port)
        log.info("listening on %s; preparing the model (%s)", url, model_label)
        loading = asyncio.ensure_future(daemon.load(load))
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not loading.done():
            log.info("interrupted while preparing the model")
            loading.cancel()
            return 130
        try:
            loading.result()
        except SolError:
            raise
        except Exception as exc:  # a loader bug: the log gets the traceback, the user a clean error
            log.error("model preparation failed", exc_info=exc)
            raise ModelError(f"could not prepare the model ({model_label}): {type(exc).__name__}: {exc}",
                             hint="see the log above; run with --log-level debug for more") from None
        daemon_file = statefiles.write_daemon_record(url, settings.token_path)
        info = daemon.engine_info
        print(f"soldaemon ready on {url} model={info.get('model', model_label)} "
              f"device={info.get('device', '?')} token file: {settings.token_path}",
              flush=True)
        idle_exit = asyncio.ensure_future(daemon.exit_when_unused(stop))
        try:
            await stop.wait()
        finally:
            idle_exit.cancel()
        log.info("shutting down")
        await daemon.drain(server)
        return 0
    finally:
        server.close()  # idempotent: a no-op after drain
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(server.wait_closed(), 2.0)
        daemon.worker.stop(timeout=2.0)
        daemon.refusals.flush()
        if daemon_file is not None:
            statefiles.remove_daemon_record(daemon_file)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


LOG_BYTES = 5 * 1024 * 1024     # daemon.log is rotated at this size ...
LOG_BACKUPS = 3                 # ... keeping daemon.log.1 .. .3
LAST_ERROR_NAME = "last-error.json"   # lsp/launcher.py reads it (same name)


def _setup_logging(level: str) -> None:
    """Log to stderr, or to ``SOLDAEMON_LOG_FILE`` (set by sol-lsp) rotated; progress bars off
    where nobody watches a terminal."""
    root = logging.getLogger()
    layout = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    log_file = os.environ.get("SOLDAEMON_LOG_FILE")
    if log_file:
        for old in list(root.handlers):     # the CLI's stderr handler: daemon.out must not grow with the log
            root.removeHandler(old)
        handler: logging.Handler = logging.handlers.RotatingFileHandler(
            log_file, maxBytes=LOG_BYTES, backupCount=LOG_BACKUPS, encoding="utf-8")
        handler.setFormatter(logging.Formatter(layout))
        root.addHandler(handler)
    elif not root.handlers:
        logging.basicConfig(stream=sys.stderr, format=layout)
    logging.getLogger("soldaemon").setLevel(level.upper())
    if log_file or not sys.stderr.isatty():
        os.environ["TQDM_DISABLE"] = "1"
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"


def write_last_error(exc: SolError) -> None:
    """Write ``last-error.json`` (why this start failed) for the editor that started the
    daemon. Never raises."""
    with contextlib.suppress(Exception):
        statefiles.write_private(statefiles.ensure_state_dir() / LAST_ERROR_NAME, json.dumps(
            {"time": time.time(), "pid": os.getpid(), "code": exc.code, "message": exc.message,
             "hint": exc.hint, "exit_code": exc.exit_code}))


def _as_sol_error(exc: BaseException) -> SolError | None:
    """``exc`` as a :class:`SolError` the user can act on (untyped out-of-memory becomes
    :class:`OutOfMemory`), or ``None``."""
    untyped_oom = isinstance(exc, MemoryError) or "out of memory" in str(exc).lower()
    if isinstance(exc, SolError) and not (type(exc) is ModelError and untyped_oom):
        return exc
    if untyped_oom:
        return OutOfMemory(f"out of memory while preparing the model: {exc}",
                           hint="close other programs using the GPU/RAM, or choose a smaller model (model.name)")
    return None


def run(args: argparse.Namespace, config: Config) -> int:
    """``soldaemon serve``: returns the exit status; raises :class:`SolError` for start-up
    problems. ``SOLDAEMON_IDLE_EXIT_S`` stands in for an absent ``--idle-exit-s`` and
    ``SOLDAEMON_PORT_FALLBACK=1`` lets a held ``server.port`` give way (sol-lsp sets both)."""
    _setup_logging(getattr(args, "log_level", "info") or "info")
    env_idle = os.environ.get("SOLDAEMON_IDLE_EXIT_S")
    if getattr(args, "idle_exit_s", None) is None and env_idle:
        try:
            args.idle_exit_s = float(env_idle)
        except ValueError:
            raise ConfigError(f"SOLDAEMON_IDLE_EXIT_S: expected seconds, got {env_idle!r}") from None
    try:
        config = with_options(config, args, SERVE_OPTIONS)
        load, label = engine_loader(args, config)
        fallback = os.environ.get("SOLDAEMON_PORT_FALLBACK", "") == "1"
        return asyncio.run(serve(ServerSettings.from_config(config.server, config.completion), load, label,
                                 port_fallback=fallback))
    except (SolError, MemoryError, RuntimeError) as exc:
        typed = _as_sol_error(exc)
        if typed is None:
            raise
        log.error("cannot start: %s%s", typed.message, f" ({typed.hint})" if typed.hint else "")
        raise typed from None   # the CLI writes it to last-error.json and exits with its code

