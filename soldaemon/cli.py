"""The ``soldaemon`` command.

Subcommands: ``serve``, ``status``, ``complete FILE:LINE:COL``, ``bench``,
``doctor``. Every :class:`SolError` becomes one clear message on stderr and
its exit code; no traceback reaches the user (``--debug`` shows one).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from . import __version__
from .config import Config, load_config
from .errors import BadRequest, SolError


def _add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="a local Hugging Face model directory or .gguf file (default: the embedded model)")
    p.add_argument("--device", help="auto, cpu, cuda or cuda:N (default from config)")
    p.add_argument("--threads", type=int, help="CPU threads for torch (default from config)")


def apply_model_options(config: Config, args: argparse.Namespace) -> Config:
    overrides: dict[str, object] = {}
    for arg, key in (("model", "model.path"), ("device", "device.device"), ("threads", "device.threads")):
        value = getattr(args, arg, None)
        if value is not None:
            overrides[key] = value
    return config.with_overrides(overrides, source="command line") if overrides else config


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
    """Split ``text`` at 1-based ``line``/``col`` (a column past the end of
    the line means its end)."""
    lines = text.splitlines(keepends=True)
    if line > len(lines) + 1 or (line == len(lines) + 1 and text.endswith("\n") is False and lines):
        raise BadRequest(f"line {line} is past the end of the file ({len(lines)} lines)")
    offset = sum(len(s) for s in lines[: line - 1])
    current = lines[line - 1] if line - 1 < len(lines) else ""
    body = current.rstrip("\r\n")
    offset += min(col - 1, len(body))
    return text[:offset], text[offset:]


def cmd_complete(args: argparse.Namespace, config: Config) -> int:
    from .api import CancelToken, CompletionRequest, Delta, Done
    from .runtime.engine import load_engine

    path, line, col = parse_location(args.location)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadRequest(f"cannot read '{path}': {exc}") from None
    prefix, suffix = split_at(text, line, col)
    config = apply_model_options(config, args)
    engine = load_engine(config, progress=not args.quiet)
    req = CompletionRequest(
        id="cli", prefix=prefix, suffix=suffix, uri=path.resolve().as_uri(),
        language=_language_of(path), max_tokens=args.max_tokens or config.completion.max_tokens,
        multiline=args.multiline or config.completion.multiline, temperature=config.completion.temperature,
        top_p=config.completion.top_p,
    )
    done: Done | None = None
    for ev in engine.complete(req, CancelToken()):
        if isinstance(ev, Done):
            done = ev
        elif isinstance(ev, Delta) and args.stream:
            print(ev.text, end="", flush=True, file=sys.stderr)
    assert done is not None
    if args.stream:
        print(file=sys.stderr)
    print(done.items[0] if done.items else "")
    t = done.timings
    print(f"prompt {t.prompt_tokens} tok ({t.cached_tokens} cached) | prefill {t.prefill_ms:.0f} ms | "
          f"TTFT {t.ttft_ms:.0f} ms | {t.generated_tokens} tok at {t.tokens_per_s:.1f} tok/s | "
          f"finish {done.finish_reason}", file=sys.stderr)
    return 0


_LANGS = {".py": "python", ".js": "javascript", ".ts": "typescript", ".rs": "rust", ".go": "go", ".c": "c",
          ".h": "c", ".cpp": "cpp", ".java": "java", ".rb": "ruby", ".lua": "lua", ".sh": "shellscript"}


def _language_of(path: Path) -> str | None:
    return _LANGS.get(path.suffix.lower())


def cmd_serve(args: argparse.Namespace, config: Config) -> int:
    from .server.command import run

    config = apply_model_options(config, args)
    return run(args, config)


def cmd_status(args: argparse.Namespace, config: Config) -> int:
    from .server.status import run_status

    return run_status(args, config)


def cmd_doctor(args: argparse.Namespace, config: Config) -> int:
    from . import doctor

    if getattr(args, "port", None) is None:
        args.port = config.server.port
    return doctor.run(args)


def cmd_bench(args: argparse.Namespace, config: Config) -> int:
    from . import bench

    config = apply_model_options(config, args)
    return bench.run(args, config)


def build_parser() -> argparse.ArgumentParser:
    # Only the options here: each command's code (the server, torch, the
    # benchmarks) is imported by its cmd_* when it runs, so `status` and
    # `doctor` start without torch.
    from . import bench, doctor
    from .server import arguments as server

    parser = argparse.ArgumentParser(prog="soldaemon", description="a local, resident code-completion daemon")
    parser.add_argument("--version", action="version", version=f"soldaemon {__version__}")
    parser.add_argument("--config", help="sol_config.yaml (default: $SOLDAEMON_CONFIG, "
                                         "~/.config/soldaemon/sol_config.yaml; never ./sol_config.yaml)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="load the model and serve the websocket API")
    server.add_arguments(p)
    p.add_argument("--device", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--threads", type=int, help="CPU threads for torch")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("status", help="ask a running daemon how it is")
    server.add_status_arguments(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("complete", help="complete at FILE:LINE:COL and print it with one timing line")
    p.add_argument("location", help="FILE:LINE:COL, 1-based")
    _add_model_options(p)
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--multiline", choices=("auto", "single", "multi"))
    p.add_argument("--stream", action="store_true", help="also stream the raw preview to stderr")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_complete)

    p = sub.add_parser("bench", help="benchmark against transformers generate() (and llama.cpp)")
    _add_model_options(p)
    bench.add_arguments(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("doctor", help="check the machine: GPU, drivers, CPU, model cache, daemon")
    doctor.add_arguments(p)
    p.set_defaults(func=cmd_doctor)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config)
        return int(args.func(args, config))
    except SolError as exc:
        if args.debug:
            raise
        print(f"soldaemon: error [{exc.code}]: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
