"""The ``soldaemon`` command (``--config`` before or after the subcommand). Every
:class:`SolError` becomes one stderr message and its exit code (``--debug``: the traceback):
0 success; 1 internal error or a failing doctor check; 2 bad configuration or arguments;
3 a model error; 4 no daemon running or answering; 130 interrupted."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from soldaemon import __version__
from soldaemon.config import Config, load_config
from soldaemon.errors import BadRequest, SolError
from soldaemon.server import arguments as server   # light: each command's code is imported when it runs

if TYPE_CHECKING:
    from soldaemon.api import CompletionRequest, Delta, Done


def parse_location(spec: str) -> tuple[Path, int, int]:
    """``FILE:LINE:COL`` (1-based line and column) → (path, line, col)."""
    try:
        path, line, col = spec.rsplit(":", 2)
        ln, cl = int(line), int(col)
    except ValueError:
        raise BadRequest(f"'{spec}' is not FILE:LINE:COL", hint="e.g. soldaemon complete src/app.py:12:5") from None
    if ln < 1 or cl < 1:
        raise BadRequest(f"line and column are 1-based, got {ln}:{cl}")
    return Path(path), ln, cl


def split_at(text: str, line: int, col: int) -> tuple[str, str]:
    """Split ``text`` at 1-based ``line``/``col``; a column past the line's end means its end."""
    lines = text.split("\n")   # editors break at \n only
    if line > len(lines):
        raise BadRequest(f"line {line} is past the end of the file ({len(lines) - (lines[-1] == '')} lines)")
    offset = sum(len(ln) + 1 for ln in lines[: line - 1]) + min(col - 1, len(lines[line - 1].rstrip("\r")))
    return text[:offset], text[offset:]


def cmd_complete(args: argparse.Namespace, config: Config) -> int:
    """Complete on the running daemon; with a model loaded here when none answers, with
    ``--local`` or with a model option."""
    from soldaemon.api import CompletionRequest, Delta, Done

    path, line, col = parse_location(args.location)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadRequest(f"cannot read '{path}': {exc}") from None
    prefix, suffix = split_at(text, line, col)
    req = CompletionRequest(
        id="cli", prefix=prefix, suffix=suffix, uri=path.resolve().as_uri(),
        language=_LANGS.get(path.suffix.lower()), max_tokens=args.max_tokens or config.completion.max_tokens,
        multiline=args.multiline or config.completion.multiline, temperature=config.completion.temperature,
        top_p=config.completion.top_p,
    )

    def stream(ev: Delta) -> None:
        if args.stream:
            print(ev.text, end="", flush=True, file=sys.stderr)

    local = args.local or any(getattr(args, a, None) is not None for a, _ in server.MODEL_OPTIONS)
    done: Done | None = None if local else _complete_on_daemon(config, req, stream)
    where = "daemon"
    if done is None:
        done, where = _complete_here(server.with_options(config, args), req, stream,
                                     progress=not args.quiet and sys.stderr.isatty()), "loaded here"
    if args.stream:
        print(file=sys.stderr)
    print(done.items[0] if done.items else "")
    t = done.timings
    print(f"prompt {t.prompt_tokens} tok ({t.cached_tokens} cached) | prefill {t.prefill_ms:.0f} ms | "
          f"TTFT {t.ttft_ms:.0f} ms | {t.generated_tokens} tok at {t.tokens_per_s:.1f} tok/s | "
          f"finish {done.finish_reason} | {where}", file=sys.stderr)
    return 0


def _complete_on_daemon(config: Config, req: CompletionRequest, stream: Callable[[Delta], None]) -> Done | None:
    """The running daemon's answer, or None when none runs or answers. A secret file raises
    :class:`SecretDocument`; secrets in the text are redacted."""
    import asyncio

    from soldaemon.discovery import find_daemon
    from soldaemon.errors import Unavailable
    from soldaemon.privacy.rules import ContextPolicy, SecretDocument, describe, redact_request
    from soldaemon.client.commands import ask_complete

    try:
        target = find_daemon(config.server.fallback())
    except Unavailable:
        return None
    why = ContextPolicy().refusal(req.uri)
    if why is not None:
        raise SecretDocument(f"this file {why}; it is not sent to the daemon", hint="complete it with --local")
    req, withheld = redact_request(req)
    if withheld:
        print(f"soldaemon: withheld from the daemon: {describe([w.split(': ', 1)[1] for w in withheld])}",
              file=sys.stderr)
    try:
        return asyncio.run(ask_complete(target.url, target.token, req, on_delta=stream))
    except Unavailable:
        return None


def _complete_here(config: Config, req: CompletionRequest, stream: Callable[[Delta], None], *,
                   progress: bool) -> Done:
    from soldaemon.api import CancelToken, Delta, Done
    from soldaemon.runtime.engine.local import load_engine

    engine = load_engine(config, progress=progress)
    done: Done | None = None
    for ev in engine.complete(req, CancelToken()):
        if isinstance(ev, Done):
            done = ev
        elif isinstance(ev, Delta):
            stream(ev)
    if done is None:
        raise SolError("the engine ended without a result")
    return done


_LANGS = {".py": "python", ".js": "javascript", ".ts": "typescript", ".rs": "rust", ".go": "go", ".c": "c",
          ".h": "c", ".cpp": "cpp", ".java": "java", ".rb": "ruby", ".lua": "lua", ".sh": "shellscript"}


def cmd_serve(args: argparse.Namespace, config: Config) -> int:
    from soldaemon.server.command import run

    return run(args, config)


def cmd_status(args: argparse.Namespace, config: Config) -> int:
    from soldaemon.client.commands import run_status

    return run_status(args, config)


def cmd_stop(args: argparse.Namespace, config: Config) -> int:
    from soldaemon.client.commands import run_stop

    return run_stop(args, config)


def cmd_doctor(args: argparse.Namespace, config: Config) -> int:
    from soldaemon.doctor import checks as doctor

    if getattr(args, "port", None) is None:
        args.port = config.server.port
    return doctor.run(args, config)


def cmd_bench(args: argparse.Namespace, config: Config) -> int:
    from soldaemon_bench import bench

    return bench.run(args, server.with_options(config, args))


class _Command(argparse.ArgumentParser):
    """A subcommand parser that adds its options (``add_options``) only when first used, so
    ``serve`` and ``status`` never import bench's or doctor's code."""

    def __init__(self, *args: Any, add_options: Callable[[argparse.ArgumentParser], None] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._add_options = add_options

    def _complete(self) -> None:
        add, self._add_options = self._add_options, None
        if add is not None:
            add(self)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:   # the overloads of the base
        self._complete()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self._complete()
        return super().format_help()


def _bench_options(p: argparse.ArgumentParser) -> None:
    try:
        from soldaemon_bench import bench
    except ModuleNotFoundError as exc:
        if exc.name != "soldaemon_bench":
            raise
        # the benchmarks are their own distribution (bench/pyproject.toml), not in this wheel
        p.error("the benchmarks are a separate package, soldaemon-bench: pip install -e ./bench "
                "(in a soldaemon checkout)")    # exits 2
    server.add_model_options(p)
    bench.add_arguments(p)


def _doctor_options(p: argparse.ArgumentParser) -> None:
    from soldaemon.doctor import checks as doctor

    doctor.add_arguments(p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="soldaemon", description="a local, resident code-completion daemon")
    parser.add_argument("--version", action="version", version=f"soldaemon {__version__}")
    parser.add_argument("--config", help="sol_config.yaml (default: $SOLDAEMON_CONFIG, "
                                         "~/.config/soldaemon/sol_config.yaml; never ./sol_config.yaml)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Command)

    p = sub.add_parser("serve", help="load the model and serve the websocket API")
    server.add_arguments(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("status", help="ask a running daemon how it is")
    server.add_status_arguments(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("stop", help="stop the running daemon (a graceful drain)")
    p.add_argument("--url", help="the daemon's ws:// URL (default: the running daemon's, else from config)")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds to wait for it to exit")
    p.set_defaults(func=cmd_stop)

    p = sub.add_parser("complete", help="complete at FILE:LINE:COL (on the running daemon, else a model "
                                        "loaded here) and print it with one timing line")
    p.add_argument("location", help="FILE:LINE:COL, 1-based")
    p.add_argument("--local", action="store_true", help="load a model here even when a daemon runs")
    server.add_model_options(p)
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--multiline", choices=("auto", "single", "multi"))
    p.add_argument("--stream", action="store_true", help="also stream the raw preview to stderr")
    p.add_argument("--quiet", action="store_true", help="no progress bars (there are none unless stderr is a terminal)")
    p.set_defaults(func=cmd_complete)

    p = sub.add_parser("bench", help="benchmark against transformers generate() (and llama.cpp)",
                       add_options=_bench_options)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("doctor", help="check the machine: GPU, drivers, CPU, model cache, daemon",
                       add_options=_doctor_options)
    p.set_defaults(func=cmd_doctor)
    for p in sub.choices.values():   # --config after the subcommand too
        p.add_argument("--config", dest="sub_config", default=None, help="sol_config.yaml (as before the command)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(getattr(args, "sub_config", None) or args.config)
        return int(args.func(args, config))
    except SolError as exc:
        if args.command == "serve":     # the editor that started it reads why (lsp/launcher.py)
            from soldaemon.server.command import write_last_error

            write_last_error(exc)
        if args.debug:
            raise
        print(f"soldaemon: error [{exc.code}]: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
