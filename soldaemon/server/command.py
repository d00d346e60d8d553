"""``soldaemon serve``: start-up and shutdown (:func:`serve`), and the
command's options and entry point (:func:`run`, wired by :mod:`soldaemon.cli`).

The protocol is docs/protocol.md; security is :mod:`soldaemon.auth`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from websockets.asyncio.server import serve as ws_serve

from soldaemon import __version__, statefiles
from soldaemon.api import Engine
from soldaemon.auth import check_bind, load_or_create_token
from soldaemon.discovery import ws_url
from soldaemon.errors import AddressInUse, ModelError, SolError, Unavailable
from soldaemon.server.daemon import Daemon
from soldaemon.server.gate import gated_connection
from soldaemon.handshake import HandshakeGate
from soldaemon.server.engine_choice import engine_loader, overridden
from soldaemon.server.settings import ServerSettings

if TYPE_CHECKING:
    from soldaemon.config import Config

log = logging.getLogger("soldaemon.server")


async def serve(settings: ServerSettings, load: Callable[[], Engine], model_label: str,
                *, ready_out: Any = None) -> int:
    """Run the daemon until SIGTERM/SIGINT; return the exit status.

    Order: check the bind address, create/read the token, bind the port
    (a taken port fails at once, before the slow model load), load the model
    on the worker thread, print the ready line, serve, drain. Raises
    :class:`SolError` for start-up problems."""
    check_bind(settings.host, settings.allow_remote)
    statefiles.ensure_state_dir()
    token = load_or_create_token(settings.token_path)
    loop = asyncio.get_running_loop()
    daemon = Daemon(settings, token, model_label, loop)
    # The machine checks of `soldaemon doctor` (GPU persistence mode, ECC,
    # driver/CUDA match, PCIe link, CPU): logged once, reported in health.
    from soldaemon import doctor

    checks = doctor.startup_checks()
    doctor.log_checks(checks, log)
    daemon.machine = doctor.summarize(checks)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        server = await ws_serve(
            daemon.handler, settings.host, settings.port,
            process_request=daemon.process_request, max_size=settings.max_message_bytes,
            compression=None, server_header=f"soldaemon/{__version__}", max_queue=64,
            open_timeout=settings.handshake_timeout_s,
            create_connection=gated_connection(
                HandshakeGate(settings.max_handshakes, settings.max_handshakes_per_peer),
                lambda peer: daemon.refusals.refused("too many handshakes in progress; closed the oldest", peer)),
        )
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
        if not loading.done():
            log.info("interrupted while preparing the model")
            loading.cancel()
            stopping.cancel()
            return 130
        stopping.cancel()
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
              file=ready_out or sys.stdout, flush=True)
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


def _setup_logging(level: str) -> None:
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("soldaemon").setLevel(level.upper())


def run(args: argparse.Namespace, config: Config) -> int:
    """``soldaemon serve``. Returns the exit status; raises :class:`SolError`
    for start-up problems (the CLI maps them to messages and exit codes)."""
    _setup_logging(getattr(args, "log_level", "info") or "info")
    config = overridden(config, args)
    load, label = engine_loader(args, config)
    return asyncio.run(serve(ServerSettings.from_config(config.server), load, label))

