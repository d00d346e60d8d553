"""sol-lsp settings: command-line flags, then the client's ``initializationOptions`` on top;
:data:`OPTIONS` names each both ways. Launch-only options (where the daemon is, how to start it,
what widens the secret-file rule) come from the command line only, never from options a
project can set (docs/security.md)."""

from __future__ import annotations

import argparse
import dataclasses
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Sequence, TypeVar, get_args

from soldaemon.api import DOCUMENT_PREFIX_CHARS, DOCUMENT_SUFFIX_CHARS

CompletionItems = Literal["auto", "always", "never"]
Multiline = Literal["auto", "single", "multi"]


class SettingsError(ValueError):
    """An option has an invalid value."""


# Parsers take JSON values (initializationOptions) and strings (flags) alike.


@dataclass(frozen=True)
class Number:
    """A number option's parser (a bool is never a number) and its JSON schema."""

    lo: float
    hi: float
    integer: bool = False
    nullable: bool = False

    def __call__(self, value: Any, name: str) -> Any:
        if value is None and self.nullable:
            return None
        if isinstance(value, str):
            try:
                value = float(value) if not self.integer else int(value)
            except ValueError:
                raise SettingsError(f"{name}: expected a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SettingsError(f"{name}: expected a number")
        if self.integer and value != int(value):
            raise SettingsError(f"{name}: expected a whole number")
        if not self.lo <= value <= self.hi:
            raise SettingsError(f"{name}: must be between {self.lo:g} and {self.hi:g}")
        return int(value) if self.integer else float(value)

    def json_schema(self) -> dict[str, Any]:
        kind = "integer" if self.integer else "number"
        return {"type": [kind, "null"] if self.nullable else kind, "minimum": self.lo, "maximum": self.hi}


def _bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.lower() in ("true", "1", "yes")
    raise SettingsError(f"{name}: expected true or false")


def _text(value: Any, name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise SettingsError(f"{name}: expected a non-empty string")
    return value


def _url(value: Any, name: str) -> str | None:
    text = _text(value, name)
    if text is not None and not text.startswith(("ws://", "wss://")):
        raise SettingsError(f"{name}: expected a ws:// URL, got {text!r}")
    return text


def _path(value: Any, name: str) -> Path | None:
    text = _text(value, name)
    return Path(text).expanduser() if text is not None else None


def _argv(value: Any, name: str) -> tuple[str, ...]:
    """A command: a list of strings, or one string split as a shell would."""
    if value is None:
        return ()
    if isinstance(value, str):
        try:
            parts = shlex.split(value)
        except ValueError as exc:
            raise SettingsError(f"{name}: {exc}") from None
    elif isinstance(value, (list, tuple)) and all(isinstance(p, str) for p in value):
        parts = list(value)
    else:
        raise SettingsError(f"{name}: expected a list of strings or a command line")
    return tuple(parts)


def _globs(value: Any, name: str) -> tuple[str, ...]:
    """A list of globs, or one comma-separated string of them."""
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(p.strip() for p in value.split(",") if p.strip())
    if isinstance(value, (list, tuple)) and all(isinstance(p, str) and p for p in value):
        return tuple(value)
    raise SettingsError(f"{name}: expected a list of glob patterns")


def _languages(value: Any, name: str) -> tuple[tuple[str, bool], ...]:
    """``{"*": true, "markdown": false}``, or ``"*=true,markdown=false"``."""
    if value is None:
        return ()
    if isinstance(value, str):
        pairs: list[tuple[str, Any]] = []
        for part in (p.strip() for p in value.split(",") if p.strip()):
            key, sep, flag = part.partition("=")
            if not sep or not key.strip():
                raise SettingsError(f"{name}: expected LANGUAGE=true|false pairs, got {part!r}")
            pairs.append((key.strip(), flag.strip()))
    elif isinstance(value, Mapping):
        pairs = list(value.items())
    else:
        raise SettingsError(f"{name}: expected an object of language id → true/false")
    out: dict[str, bool] = {}
    for key, flag in pairs:
        if not isinstance(key, str) or not key:
            raise SettingsError(f"{name}: language ids must be non-empty strings")
        out[key] = _bool(flag, f"{name}.{key}")
    return tuple(sorted(out.items()))


@dataclass(frozen=True)
class Choice:
    """A one-of option's parser and its JSON schema."""

    choices: tuple[str, ...]

    def __call__(self, value: Any, name: str) -> str:
        if value not in self.choices:
            raise SettingsError(f"{name}: expected one of {', '.join(self.choices)}")
        return str(value)

    def json_schema(self) -> dict[str, Any]:
        return {"type": "string", "enum": list(self.choices)}


@dataclass(frozen=True)
class Option:
    field: str                     # Settings field
    key: str                       # initializationOptions key: the field's name in camelCase
    flag: str                      # command-line flag, --field-name; "": none (the setting only)
    parse: Callable[[Any, str], Any]
    help: str
    launch_only: bool = False      # command line only, never from initializationOptions

    def json_schema(self) -> dict[str, Any] | None:
        """The value's JSON schema, or None for paths, URLs and lists."""
        if self.parse is _bool:
            return {"type": "boolean"}
        rule = getattr(self.parse, "json_schema", None)
        return rule() if rule is not None else None


_T = TypeVar("_T")


def _option(default: _T, parse: Callable[[Any, str], Any], help: str, *, flag: bool = True,
            launch_only: bool = False) -> _T:
    """A :class:`Settings` field with its default and its :class:`Option` (made in :data:`OPTIONS`)."""
    return dataclasses.field(default=default, metadata={"option": (parse, help, flag, launch_only)})


@dataclass(frozen=True)
class Settings:
    """Everything sol-lsp can be told, in :data:`OPTIONS` order. Times are milliseconds unless
    named ``_s``."""

    url: str | None = _option(None, _url, "the daemon's ws:// URL (default: the running daemon's, from its "
                              "record daemon.json)", launch_only=True)
    token_file: Path | None = _option(None, _path, "the daemon's token file (default: the running daemon's, "
                                      "else the state directory's)", launch_only=True)
    config: str | None = _option(None, _text, "sol_config.yaml for the daemon sol-lsp starts "
                                 "(passed as soldaemon --config)", launch_only=True)
    start_daemon: bool = _option(True, _bool, "start `soldaemon serve` when no daemon answers", launch_only=True)
    daemon_command: tuple[str, ...] = _option((), _argv, "the command that starts the daemon (default: soldaemon "
                                              "serve)", launch_only=True)
    daemon_idle_exit_s: float = _option(1800.0, Number(0, 30 * 86_400), "a daemon sol-lsp starts exits after this "
                                        "many seconds without a connection (0: never)", launch_only=True)
    enable: bool = _option(True, _bool, "complete at all; off: nothing is sent to the daemon and no daemon is "
                           "started")
    languages: tuple[tuple[str, bool], ...] = _option(
        (), _languages, "completions per language id, e.g. '*=true,markdown=false' ({\"*\": true, \"markdown\": "
        "false} in initializationOptions); '*' is the default for ids not named")
    status_notifications: bool = _option(False, _bool, "send sol/status notifications (clients that handle them; "
                                         "also the client capability experimental.soldaemon.status)", flag=False)
    early_lines: bool = _option(
        False, _bool, "inline completions: show a multi-line answer's first whole lines as soon as they are "
        "written and send sol/completionReady {uri} when the rest is there (for clients that then ask again at "
        "the cursor: without that, the rest shows only once the user types or accepts)", flag=False)
    start_timeout_s: float = _option(180.0, Number(1, 3600), "seconds a started daemon may take to become ready")
    debounce_ms: float = _option(25.0, Number(0, 2000), "automatic triggers wait this long for more typing")
    timeout_ms: float = _option(5000.0, Number(50, 120_000), "a completion not answered within this is cancelled "
                                "and returns empty")
    budget_ms: float | None = _option(None, Number(1, 120_000, nullable=True),
                                      "the daemon's wall-clock budget per completion")
    # a block of max_lines lines often needs more than 64 tokens
    max_tokens: int = _option(128, Number(1, 2048, integer=True), "generated tokens, cap")
    max_lines: int = _option(8, Number(1, 1000, integer=True), "lines in a completion, cap")
    multiline: Multiline = _option("auto", Choice(get_args(Multiline)), "auto, single or multi")
    # 128,000 and 64,000: the outline reads beyond the token windows
    max_prefix_chars: int = _option(DOCUMENT_PREFIX_CHARS, Number(1, 900_000, integer=True),
                                    "document text before the cursor sent, cap")
    max_suffix_chars: int = _option(DOCUMENT_SUFFIX_CHARS, Number(0, 900_000, integer=True),
                                    "document text after the cursor sent, cap")
    completion_items: CompletionItems = _option("auto", Choice(get_args(CompletionItems)), "answer "
                                                "textDocument/completion: auto = only for clients without inline "
                                                "completion")
    alternatives: int = _option(3, Number(1, 3, integer=True), "candidates for an invoked completion: the greedy "
                                "one, then sampled ones")
    alternatives_temperature: float = _option(0.8, Number(0.05, 2.0), "sampling temperature of the extra candidates")
    context_chunks: int = _option(8, Number(0, 32, integer=True), "chunks of other recently edited/open documents "
                                  "sent as context")
    context_lines: int = _option(40, Number(2, 400, integer=True), "lines per chunk")
    context_include: tuple[str, ...] = _option((), _globs, "globs sent as context although they match a "
                                               "secret-file pattern", launch_only=True)
    context_exclude: tuple[str, ...] = _option((), _globs, "globs never sent as context (on top of the secret-file "
                                               "patterns)")
    complete_in_secret_files: bool = _option(False, _bool, "complete inside files that may not be sent as context "
                                             "(.env, keys, outside the workspace)", launch_only=True)
    log_level: str | None = _option(None, Choice(("debug", "info", "warning", "error")),
                                    "sol-lsp's log level (the command line's is --log-level)", flag=False)
    warm: bool = _option(True, _bool, "prefill the daemon's cache in the background after edits")
    warm_delay_ms: float = _option(250.0, Number(0, 60_000), "idle time after an edit before the background warm")
    slow_ms: float = _option(1500.0, Number(1, 600_000), "a completion slower than this reports 'slow'")
    backoff_initial_ms: float = _option(250.0, Number(10, 60_000), "first reconnect delay")
    backoff_max_ms: float = _option(10_000.0, Number(10, 600_000), "longest reconnect delay")
    connect_timeout_ms: float = _option(3000.0, Number(50, 60_000), "websocket handshake timeout")
    failure_message_after_s: float = _option(10.0, Number(0, 86_400), "show one message when the daemon has been "
                                             "unreachable this long")

    def language_enabled(self, language: str | None) -> bool:
        """Whether documents of LSP language id ``language`` get completions."""
        if not self.enable:
            return False
        table = dict(self.languages)
        return table.get(language or "", table.get("*", True))

    def with_options(self, options: Mapping[str, Any] | None) -> tuple[Settings, list[str]]:
        """These settings with ``initializationOptions`` applied, and the keys ignored (unknown, or
        ``"<key> (command line only)"``). Raises :class:`SettingsError` for a bad value."""
        if not options:
            return self, []
        if not isinstance(options, Mapping):
            raise SettingsError("initializationOptions must be an object")
        changes: dict[str, Any] = {}
        ignored: list[str] = []
        by_key = {opt.key: opt for opt in OPTIONS}
        for key, value in options.items():
            opt = by_key.get(key)
            if opt is None:
                ignored.append(key)
            elif opt.launch_only:
                ignored.append(f"{key} (command line only)")
            else:
                changes[opt.field] = opt.parse(value, key)
        return dataclasses.replace(self, **changes), ignored


def _named(f: dataclasses.Field[Any]) -> Option:
    """A field's :class:`Option`, its key and flag named after the field."""
    parse, help, flag, launch_only = f.metadata["option"]
    key = re.sub(r"_([a-z])", lambda m: m.group(1).upper(), f.name)
    return Option(f.name, key, "--" + f.name.replace("_", "-") if flag else "", parse, help, launch_only)


OPTIONS: tuple[Option, ...] = tuple(_named(f) for f in dataclasses.fields(Settings))


@dataclass(frozen=True)
class Launch:
    """How sol-lsp itself runs (command line only)."""

    settings: Settings
    log_level: str = "warning"      # Neovim logs a server's stderr as [ERROR]: quiet by default
    log_file: Path | None = None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sol-lsp",
        description="Language server for soldaemon: inline completions (LSP 3.18) and plain completions "
                    "from the local daemon. Speaks LSP on stdio.")
    parser.add_argument("--stdio", action="store_true", help="speak LSP on stdin/stdout (the default)")
    parser.add_argument("--tcp", metavar="HOST:PORT", help=argparse.SUPPRESS)  # refused in parse_args
    parser.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"),
                        help="stderr (or --log-file) logging; default warning")
    parser.add_argument("--log-file", help="append logs here instead of stderr")
    for opt in OPTIONS:
        if not opt.flag:
            continue
        if opt.parse is _bool:
            parser.add_argument(opt.flag, dest=opt.field, action=argparse.BooleanOptionalAction,
                                default=None, help=opt.help)
        else:
            parser.add_argument(opt.flag, dest=opt.field, default=None, help=opt.help)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> Launch:
    """Parse the command line (raises SystemExit with usage on bad flags)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    changes: dict[str, Any] = {}
    try:
        for opt in OPTIONS:
            value = getattr(args, opt.field, None)
            if value is not None:
                changes[opt.field] = opt.parse(value, opt.flag)
        if args.tcp:
            raise SettingsError("--tcp was removed: a TCP listener has no way to authenticate its client; "
                                "start sol-lsp over stdio (the default), as every editor set-up does")
    except SettingsError as exc:
        parser.error(str(exc))
    return Launch(Settings(**changes), args.log_level,
                  Path(args.log_file).expanduser() if args.log_file else None)
