"""The options of ``soldaemon serve`` and ``soldaemon status``, and the command line's config
overrides, kept apart so that building the CLI's parser imports neither the server nor the engine."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from soldaemon.config import Config

# (option's dest, config key) pairs: what a given option overrides
MODEL_OPTIONS = (("model", "model.path"), ("device", "device.device"), ("threads", "device.threads"))
SERVE_OPTIONS = MODEL_OPTIONS + (("host", "server.host"), ("port", "server.port"),
                                 ("allow_remote", "server.allow_remote"), ("idle_exit_s", "server.idle_exit_s"))


def with_options(config: Config, args: argparse.Namespace,
                 options: tuple[tuple[str, str], ...] = MODEL_OPTIONS) -> Config:
    """``config`` with the ``options`` given on the command line applied."""
    overrides = {key: getattr(args, arg) for arg, key in options if getattr(args, arg, None) is not None}
    return config.with_overrides(overrides, source="command line") if overrides else config


def add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="a local HF model directory or .gguf file (default: the embedded model)")
    parser.add_argument("--device", help="auto, cpu, cuda or cuda:N (default from config)")
    parser.add_argument("--threads", type=int, help="CPU threads for torch (default from config)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``soldaemon serve`` (``--config`` is the CLI's)."""
    parser.add_argument("--host", help="listen address (default from config: 127.0.0.1)")
    parser.add_argument("--port", type=int, help="TCP port; 0 picks a free one (default from config: 8765)")
    add_model_options(parser)
    parser.add_argument("--allow-remote", action="store_true", default=None,
                        help="allow listening on a non-loopback address")
    parser.add_argument("--idle-exit-s", type=float,
                        help="exit after this many seconds with no connection; 0: never (default from config: 0)")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    # For tests and development: MODULE:FACTORY, called with the Config, returning an Engine.
    parser.add_argument("--engine", help=argparse.SUPPRESS)


def add_status_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="the daemon's ws:// URL (default: the running daemon's, else from config)")
    parser.add_argument("--json", action="store_true", help="print the health document as JSON")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for an answer")
