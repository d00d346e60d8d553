"""sol-lsp settings: command-line flags, then the client's ``initializationOptions`` on top;
:data:`OPTIONS` names each both ways. Launch-only options (where the daemon is, how to start it,
what widens the secret-file rule) come from the command line only, never from options a
project can set (docs/security.md)."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Sequence

from soldaemon.api import DOCUMENT_PREFIX_CHARS, DOCUMENT_SUFFIX_CHARS

CompletionItems = Literal["auto", "always", "never"]
Multiline = Literal["auto", "single", "multi"]


class SettingsError(ValueError):
    """An option has an invalid value."""


@dataclass(frozen=True)
class Settings:
    """Everything sol-lsp can be told. Times are milliseconds unless named ``_s``."""

    url: str | None = None                  # None: the running daemon's record (daemon.json)
    token_file: Path | None = None          # None: the daemon's record, else state_dir()/token
    config: str | None = None               # sol_config.yaml for the daemon sol-lsp starts (--config)
    start_daemon: bool = True               # start `soldaemon serve` when none answers
    daemon_command: tuple[str, ...] = ()    # argv for that; () = soldaemon serve
    start_timeout_s: float = 180.0          # how long a started daemon may take to be ready
    daemon_idle_exit_s: float = 1800.0      # a daemon we start exits after this long unused; 0: never
    # a document these turn off sends nothing and starts no daemon
    enable: bool = True
    languages: tuple[tuple[str, bool], ...] = ()  # (language id, on); "*": the default; () = all on
    status_notifications: bool = False      # send sol/status (the client said it handles it)
    early_lines: bool = False               # show a block's first lines early; sol/completionReady when the rest is
    # Requests
    debounce_ms: float = 25.0               # automatic triggers wait this long for more typing
    timeout_ms: float = 5000.0              # a daemon answer later than this is cancelled
    budget_ms: float | None = None          # the daemon's own budget per request
    max_tokens: int = 128                   # a block of max_lines lines often needs more than 64
    max_lines: int = 8                      # lines in an item, cap
    multiline: Multiline = "auto"
    max_prefix_chars: int = DOCUMENT_PREFIX_CHARS   # 128,000: the outline reads beyond the token windows
    max_suffix_chars: int = DOCUMENT_SUFFIX_CHARS   # 64,000
    completion_items: CompletionItems = "auto"  # textDocument/completion: auto = only without inline
    alternatives: int = 3                   # candidates for an invoked completion (greedy first)
    alternatives_temperature: float = 0.8   # sampling temperature of the extra candidates
    # Context and warm-up
    context_chunks: int = 8                 # 0: send no extra context
    context_lines: int = 40
    context_include: tuple[str, ...] = ()   # globs sent even if they match a secret pattern
    context_exclude: tuple[str, ...] = ()   # globs never sent, on top of the secret patterns
    complete_in_secret_files: bool = False  # complete inside files the context rule refuses
    log_level: str | None = None            # sol-lsp's own logging; None: --log-level
    warm: bool = True
    warm_delay_ms: float = 250.0            # idle time after an edit before a warm
    # Status and reconnection
    slow_ms: float = 1500.0                 # a completion slower than this reports "slow"
    backoff_initial_ms: float = 250.0
    backoff_max_ms: float = 10_000.0
    connect_timeout_ms: float = 3000.0
    failure_message_after_s: float = 10.0   # a failure this old is persistent: one showMessage

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


def _choice(*choices: str) -> Choice:
    return Choice(choices)


@dataclass(frozen=True)
class Option:
    field: str                     # Settings field
    key: str                       # initializationOptions key
    flag: str                      # command-line flag; "": none (the setting only)
    parse: Callable[[Any, str], Any]
    help: str
    launch_only: bool = False      # command line only, never from initializationOptions

    def json_schema(self) -> dict[str, Any] | None:
        """The value's JSON schema, or None for paths, URLs and lists."""
        if self.parse is _bool:
            return {"type": "boolean"}
        rule = getattr(self.parse, "json_schema", None)
        return rule() if rule is not None else None


OPTIONS: tuple[Option, ...] = (
    Option("url", "url", "--url", _url, "the daemon's ws:// URL (default: the running daemon's, from its record "
           "daemon.json)", launch_only=True),
    Option("token_file", "tokenFile", "--token-file", _path,
           "the daemon's token file (default: the running daemon's, else the state directory's)", launch_only=True),
    Option("config", "config", "--config", _text, "sol_config.yaml for the daemon sol-lsp starts "
           "(passed as soldaemon --config)", launch_only=True),
    Option("start_daemon", "startDaemon", "--start-daemon", _bool, "start `soldaemon serve` when no daemon answers",
           launch_only=True),
    Option("daemon_command", "daemonCommand", "--daemon-command", _argv,
           "the command that starts the daemon (default: soldaemon serve)", launch_only=True),
    Option("daemon_idle_exit_s", "daemonIdleExitS", "--daemon-idle-exit-s", Number(0, 30 * 86_400),
           "a daemon sol-lsp starts exits after this many seconds without a connection (0: never)",
           launch_only=True),
    Option("enable", "enable", "--enable", _bool,
           "complete at all; off: nothing is sent to the daemon and no daemon is started"),
    Option("languages", "languages", "--languages", _languages,
           "completions per language id, e.g. '*=true,markdown=false' ({\"*\": true, \"markdown\": false} "
           "in initializationOptions); '*' is the default for ids not named"),
    Option("status_notifications", "statusNotifications", "", _bool,
           "send sol/status notifications (clients that handle them; also the client capability "
           "experimental.soldaemon.status)"),
    Option("early_lines", "earlyLines", "", _bool,
           "inline completions: show a multi-line answer's first whole lines as soon as they are written and "
           "send sol/completionReady {uri} when the rest is there (for clients that then ask again at the "
           "cursor: without that, the rest shows only once the user types or accepts)"),
    Option("start_timeout_s", "startTimeoutS", "--start-timeout-s", Number(1, 3600),
           "seconds a started daemon may take to become ready"),
    Option("debounce_ms", "debounceMs", "--debounce-ms", Number(0, 2000),
           "automatic triggers wait this long for more typing"),
    Option("timeout_ms", "timeoutMs", "--timeout-ms", Number(50, 120_000),
           "a completion not answered within this is cancelled and returns empty"),
    Option("budget_ms", "budgetMs", "--budget-ms", Number(1, 120_000, nullable=True),
           "the daemon's wall-clock budget per completion"),
    Option("max_tokens", "maxTokens", "--max-tokens", Number(1, 2048, integer=True), "generated tokens, cap"),
    Option("max_lines", "maxLines", "--max-lines", Number(1, 1000, integer=True), "lines in a completion, cap"),
    Option("multiline", "multiline", "--multiline", _choice("auto", "single", "multi"), "auto, single or multi"),
    Option("max_prefix_chars", "maxPrefixChars", "--max-prefix-chars", Number(1, 900_000, integer=True),
           "document text before the cursor sent, cap"),
    Option("max_suffix_chars", "maxSuffixChars", "--max-suffix-chars", Number(0, 900_000, integer=True),
           "document text after the cursor sent, cap"),
    Option("completion_items", "completionItems", "--completion-items", _choice("auto", "always", "never"),
           "answer textDocument/completion: auto = only for clients without inline completion"),
    Option("alternatives", "alternatives", "--alternatives", Number(1, 3, integer=True),
           "candidates for an invoked completion: the greedy one, then sampled ones"),
    Option("alternatives_temperature", "alternativesTemperature", "--alternatives-temperature",
           Number(0.05, 2.0), "sampling temperature of the extra candidates"),
    Option("context_chunks", "contextChunks", "--context-chunks", Number(0, 32, integer=True),
           "chunks of other recently edited/open documents sent as context"),
    Option("context_lines", "contextLines", "--context-lines", Number(2, 400, integer=True), "lines per chunk"),
    Option("context_include", "contextInclude", "--context-include", _globs,
           "globs sent as context although they match a secret-file pattern", launch_only=True),
    Option("context_exclude", "contextExclude", "--context-exclude", _globs,
           "globs never sent as context (on top of the secret-file patterns)"),
    Option("complete_in_secret_files", "completeInSecretFiles", "--complete-in-secret-files", _bool,
           "complete inside files that may not be sent as context (.env, keys, outside the workspace)",
           launch_only=True),
    Option("log_level", "logLevel", "", _choice("debug", "info", "warning", "error"),
           "sol-lsp's log level (the command line's is --log-level)"),
    Option("warm", "warm", "--warm", _bool, "prefill the daemon's cache in the background after edits"),
    Option("warm_delay_ms", "warmDelayMs", "--warm-delay-ms", Number(0, 60_000),
           "idle time after an edit before the background warm"),
    Option("slow_ms", "slowMs", "--slow-ms", Number(1, 600_000), "a completion slower than this reports 'slow'"),
    Option("backoff_initial_ms", "backoffInitialMs", "--backoff-initial-ms", Number(10, 60_000),
           "first reconnect delay"),
    Option("backoff_max_ms", "backoffMaxMs", "--backoff-max-ms", Number(10, 600_000), "longest reconnect delay"),
    Option("connect_timeout_ms", "connectTimeoutMs", "--connect-timeout-ms", Number(50, 60_000),
           "websocket handshake timeout"),
    Option("failure_message_after_s", "failureMessageAfterS", "--failure-message-after-s", Number(0, 86_400),
           "show one message when the daemon has been unreachable this long"),
)


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
