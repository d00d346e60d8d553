"""Which engine ``soldaemon serve`` loads: a test factory (``--engine``), the remote engine
(its local fallback is built here: ``remote/`` never imports the runtime), or the local torch
runtime, imported only when loaded on the worker thread."""

from __future__ import annotations

import argparse
import importlib
from typing import TYPE_CHECKING, Callable

from soldaemon.api import Engine
from soldaemon.errors import ModelError

if TYPE_CHECKING:
    from soldaemon.config import Config


def engine_loader(args: argparse.Namespace, config: Config) -> tuple[Callable[[], Engine], str]:
    """``(loader, label)``: the engine's loader (run later, on the worker thread), its log label."""
    spec = getattr(args, "engine", None)
    if spec:
        module_name, _, attr = spec.partition(":")
        factory = getattr(importlib.import_module(module_name), attr or "make_engine")
        return (lambda: factory(config)), spec

    def load(progress: bool = True) -> Engine:
        try:
            from soldaemon.runtime.engine.local import load_engine
        except ImportError as exc:
            raise ModelError(f"the inference engine is not available: {exc}") from None
        return load_engine(config, progress=progress)

    if config.backend.kind == "remote":
        from soldaemon.remote.endpoint import Endpoint
        from soldaemon.remote.engine import load_remote_engine

        shown = Endpoint.parse(config.backend.url or "").shown
        # the fallback loads on a background thread: no progress bars
        return (lambda: load_remote_engine(config, local=lambda: load(progress=False))), f"remote engine at {shown}"

    mc = config.model
    return load, str(mc.path) if mc.path else (f"embedded {mc.name}" if mc.name != "auto" else
                                               "embedded model, chosen by model.name auto")

