"""Secrets in sent text, each replaced with :data:`REDACTED_MARK` (secret files: :mod:`.rules`).
Text is scanned as sent (prefix+suffix, a file's chunks joined) for private keys, detect-secrets'
findings widened to the token, secret-named assignments, high-entropy tokens and a string open at
the cursor; findings are cached per line. The ``redact*`` functions never raise; without
detect-secrets this module's own rules still run."""

from __future__ import annotations

import contextlib
import math
import re
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

REDACTED_MARK = "<redacted>"

Span = tuple[int, int, str]     # (start, end, kind): characters [start, end) of a text

_KEY_BLOCK = re.compile(
    r"-----BEGIN ([A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?)-----.*?(?:-----END \1-----|\Z)", re.DOTALL)
_KEY_END = re.compile(r"-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----")
# a PEM body line (64 wide; OpenSSH 70) or its armour headers
_BODY_LINE = re.compile(r"[A-Za-z0-9+/]{40,100}={0,2}")
_BODY_TAIL = re.compile(r"[A-Za-z0-9+/]{1,100}={0,2}|(?:Proc-Type|DEK-Info|Comment):.*|")
_TOKEN_CHARS = re.compile(r"[A-Za-z0-9_\-+/=.~]")
# NAME=value / name: value whose name says it holds a secret (``token`` alone is a model's token in code)
_SECRET_NAME = (r"(?P<name>[A-Z][A-Z0-9_.\-]*[_.\-](?:KEY|SECRET|TOKEN|PASSWORD|PASSWD|PASSPHRASE|PASS|PWD"
                r"|CREDENTIALS?)|PASSWORD|PASSWD|PASSPHRASE|SECRET|TOKEN|APIKEY|API_KEY"
                r"|(?:[a-z][a-z0-9_.\-]*[_.\-])?(?:password|passwd|passphrase|secret|api[_-]?key|apikey|secret[_-]?key"
                r"|access[_-]?key|private[_-]?key|client[_-]?secret|auth[_-]?token|access[_-]?token"
                r"|refresh[_-]?token|bearer[_-]?token|api[_-]?token))")
_ASSIGNMENT = re.compile(
    r"^\s*(?:export\s+|set\s+|const\s+|let\s+|var\s+|define\(\s*)?[\"']?(?:" + _SECRET_NAME + r")[\"']?"
    r"(?:\s*:\s*[A-Za-z_][\w\[\], .|]*?)?\s*(?::=|=>|=|:|,)\s*"
    r"(?:\"(?P<dq>(?:[^\"\\]|\\.){3,})\"|'(?P<sq>[^']{3,})'|(?P<bare>[^\s\"'#;,()\[\]{}<>$%`]{3,}))"
    r"\s*[,;)]?\s*(?:(?:#|//).*)?$")
# a value that names or builds one instead of holding it: a constant, a dotted
# or type name, a template, a placeholder or special token (``<|endoftext|>``), a small number
_NOT_A_VALUE = re.compile(r"None|null|nil|true|false|True|False|undefined|str|int|float|bytes|bool|Any|object"
                          r"|string|number|boolean|\w+(?:\.\w+)+|.*\$\{.*|.*\{\{.*|<.*>|\d{1,5}")
_UNQUOTED = re.compile(r"(?<![A-Za-z0-9_\-+/=])[A-Za-z0-9_\-+/]{20,}={0,2}(?![A-Za-z0-9_\-+/=])")
_MAX_LINE = 4000            # a longer line (minified code, data) is scanned in pieces this long
_OVERLAP = 200              # characters two pieces of a long line share: a token across the cut is whole in one
_CACHE_LINES = 50_000

_LINE_CACHE: dict[str, tuple[Span, ...]] = {}
_lock = threading.Lock()

_settings: Any = None       # detect-secrets' default_settings, loaded on first use; False: not installed


def _load_detector() -> Any:
    """detect-secrets' settings context, imported on first use; None when not installed."""
    global _settings
    if _settings is None:
        try:
            from detect_secrets.settings import default_settings
            _settings = default_settings
        except ImportError:      # a dependency; a broken install still runs this module's own rules
            _settings = False
    return _settings or None


class _Plugins:
    """detect-secrets' default plugins and filters over one line, built inside
    ``default_settings()`` (no verification filter: nothing goes to a network)."""

    def __init__(self) -> None:
        from detect_secrets.settings import get_filters, get_plugins
        from detect_secrets.util.code_snippet import get_code_snippet
        from detect_secrets.util.inject import call_function_with_arguments

        self.plugins = get_plugins()
        self.filters = get_filters()
        self.call = call_function_with_arguments
        self.snippet = get_code_snippet

    def _filtered(self, stage: str, **kwargs: Any) -> bool:
        """Whether a filter of ``stage`` (given all it takes) says skip."""
        for check in self.filters:
            wants = check.injectable_variables
            if stage in wants and wants <= kwargs.keys():
                try:
                    if self.call(check, **kwargs):
                        return True
                except TypeError:
                    continue
        return False

    def scan(self, line: str, filename: str) -> Iterator[tuple[str, str]]:
        """``(kind, value)`` of each secret on ``line``."""
        line = line.rstrip()
        context = self.snippet(lines=[line], line_number=1)
        if self._filtered("line", filename=filename, line=line, context=context):
            return
        for plugin in self.plugins:
            for secret in plugin.analyze_line(filename=filename, line=line, line_number=1, context=context):
                value = secret.secret_value or ""
                common = {"filename": filename, "secret": value, "plugin": plugin, "line": line}
                if not self._filtered("secret", **common) and not self._filtered("context", context=context, **common):
                    yield secret.type, value


@dataclass(frozen=True)
class Redacted:
    """``text`` with its secrets replaced."""

    text: str
    kinds: tuple[str, ...] = ()     # what was withheld ("Private Key", ...), one per span


# One line


def _widen(text: str, start: int, end: int) -> tuple[int, int]:
    while start > 0 and _TOKEN_CHARS.match(text[start - 1]):
        start -= 1
    while end < len(text) and _TOKEN_CHARS.match(text[end]):
        end += 1
    return start, end


def _entropy(word: str) -> float:
    """Shannon entropy of ``word``'s characters; bits per character."""
    return -sum(n / len(word) * math.log2(n / len(word)) for n in Counter(word).values())


_ALNUM_RUN = re.compile(r"[A-Za-z0-9]{16,}")


def _mixed(word: str) -> bool:
    """Upper case, lower case and digits: random base64 has all three, a hex digest not."""
    return any(c.isupper() for c in word) and any(c.islower() for c in word) and any(c.isdigit() for c in word)


def _looks_random(word: str) -> bool:
    """Whether ``word`` is a key, not an identifier, a model name or a hex
    digest: mixed case and digits, a 16-character run, near-maximal entropy."""
    if not _mixed(word):
        return False
    return _ALNUM_RUN.search(word) is not None and _entropy(word) >= 0.85 * math.log2(min(len(word), 64))


def _own_rules(line: str) -> list[Span]:
    """This module's line rules: a secret-named assignment's value, unquoted random tokens."""
    spans: list[Span] = []
    m = _ASSIGNMENT.match(line)
    if m is not None:
        group = next(g for g in ("dq", "sq", "bare") if m.group(g) is not None)
        value = m.group(group)
        echo = group == "bare" and value.isidentifier() and value.lower() in m.group("name").lower()
        if not echo and not _NOT_A_VALUE.fullmatch(value):        # ``PASSWORD = password``: a variable
            spans.append((m.start(group), m.end(group), "Secret-named Value"))
    for word in _UNQUOTED.finditer(line):
        if _looks_random(word.group().rstrip("=")):
            spans.append((word.start(), word.end(), "High Entropy Token"))
    return spans


def _detect(line: str, filename: str, plugins: _Plugins | None) -> list[Span]:
    """What ``plugins`` and this module's rules find on one line."""
    spans = _own_rules(line)
    if plugins is None or len(line.strip()) < 8:
        return spans
    for kind, value in plugins.scan(line, filename):
        at = line.find(value) if value else -1
        if at >= 0:
            start, end = _widen(line, at, at + len(value))
            spans.append((start, end, kind))
    return spans


def _pieces(line: str) -> Iterator[tuple[int, str]]:
    """``line`` as ``(offset, piece)``, in overlapping pieces when over :data:`_MAX_LINE`."""
    if len(line) <= _MAX_LINE:
        yield 0, line
        return
    for at in range(0, len(line) - _OVERLAP, _MAX_LINE - _OVERLAP):
        yield at, line[at: at + _MAX_LINE]


def _scan_lines(lines: Sequence[str], filename: str) -> list[tuple[Span, ...]]:
    """Findings of each line (its own offsets), from the cache or the detectors."""
    missing = [piece for line in dict.fromkeys(lines) for _, piece in _pieces(line) if piece not in _LINE_CACHE]
    if missing:
        settings = _load_detector()
        with settings() if settings is not None else contextlib.nullcontext():
            plugins = _Plugins() if settings is not None else None
            found = {piece: tuple(_detect(piece, filename, plugins)) for piece in missing}
        if len(_LINE_CACHE) + len(found) > _CACHE_LINES:
            _LINE_CACHE.clear()
        _LINE_CACHE.update(found)
    out: list[tuple[Span, ...]] = []
    for line in lines:
        if len(line) <= _MAX_LINE:
            out.append(_LINE_CACHE[line])
        else:
            out.append(tuple((at + s, at + e, kind)
                             for at, piece in _pieces(line) for s, e, kind in _LINE_CACHE[piece]))
    return out


# A whole text


def _key_spans(text: str) -> list[Span]:
    """Private keys: whole blocks, an ``END`` line with the body above it, a body alone."""
    spans: list[Span] = [(m.start(), m.end(), "Private Key") for m in _KEY_BLOCK.finditer(text)]

    def inside(at: int) -> bool:
        return any(s <= at < e for s, e, _ in spans)

    for m in _KEY_END.finditer(text):
        if inside(m.start()):
            continue
        start = m.start()
        while start > 0:          # walk up the body lines above the END line
            above = text.rfind("\n", 0, start - 1) + 1
            if not _BODY_TAIL.fullmatch(text[above: start - 1].strip()):
                break
            start = above
        spans.append((start, m.end(), "Private Key"))
    offset, run_start, run_lines = 0, -1, 0
    for line in text.split("\n") + [""]:
        body = _BODY_LINE.fullmatch(line.strip()) is not None and _mixed(line.strip())
        if body and not inside(offset):
            if run_lines == 0:
                run_start = offset
            run_lines += 1
        else:
            if run_lines >= 2:
                end = offset + len(line) if _BODY_TAIL.fullmatch(line.strip()) and line.strip() else offset - 1
                spans.append((run_start, max(end, run_start), "Private Key"))
            run_lines = 0
        offset += len(line) + 1
    return spans


def _open_string(line: str) -> str | None:
    """The quote of a string ``line`` leaves open, else None."""
    quote: str | None = None
    escaped = False
    for ch in line:
        if escaped:
            escaped = False
        elif ch == "\\" and quote is not None:
            escaped = True
        elif quote is None and ch in "\"'`":
            quote = ch
        elif ch == quote:
            quote = None
        elif quote is None and ch == "#":
            break
    return quote


def _closed_at_cursor(text: str, cursor: int) -> tuple[int, str] | None:
    """``(start, line)``: the cursor's line up to the cursor, its open string closed; else None."""
    start = text.rfind("\n", 0, cursor) + 1
    before = text[start:cursor]
    quote = _open_string(before)
    return None if quote is None else (start, before + quote)


def _find(text: str, filename: str, cursor: int | None = None) -> list[Span]:
    spans = _key_spans(text)
    lines = text.split("\n")
    closed = _closed_at_cursor(text, cursor) if cursor is not None else None
    with _lock:
        per_line = _scan_lines(lines + [closed[1]] if closed else lines, filename)
    if closed is not None and cursor is not None:
        start = closed[0]
        for s, e, kind in per_line.pop():
            spans.append((*_widen(text, start + s, min(start + e, cursor)), kind))
    offset = 0
    for line, found in zip(lines, per_line):
        spans.extend((offset + s, offset + e, kind) for s, e, kind in found)
        offset += len(line) + 1
    return _merge(spans)


def _merge(spans: list[Span]) -> list[Span]:
    merged: list[Span] = []
    for start, end, kind in sorted(spans):
        if merged and start <= merged[-1][1]:
            prev = merged[-1]
            merged[-1] = (prev[0], max(prev[1], end), prev[2])
        else:
            merged.append((start, end, kind))
    return merged


def _replace(text: str, spans: Sequence[Span]) -> str:
    kept = zip([0, *(end for _, end, _ in spans)], [*(start for start, _, _ in spans), len(text)])
    return REDACTED_MARK.join(text[a:b] for a, b in kept)


def _split_back(pieces: Sequence[str], sep: str, spans: Sequence[Span]) -> tuple[Redacted, ...]:
    """``spans`` of ``sep.join(pieces)`` applied to each piece (a span across
    two is redacted in both, named in the first)."""
    out: list[Redacted] = []
    at = 0
    for piece in pieces:
        end = at + len(piece)
        mine = [(max(s, at) - at, min(e, end) - at, kind) for s, e, kind in spans if s < end and e > at]
        named = tuple(kind for s, _e, kind in spans if at <= s < end)
        out.append(Redacted(_replace(piece, [m for m in mine if m[1] > m[0]]), named) if mine else Redacted(piece))
        at = end + len(sep)
    return tuple(out)


def _safely(fallback: int, work: Callable[[], tuple[Redacted, ...]]) -> tuple[Redacted, ...]:
    try:
        return work()
    except Exception as exc:  # noqa: BLE001 - a detector bug must not pass the text unchecked
        why = f"the whole text (the secret scan failed: {type(exc).__name__})"
        return tuple(Redacted(REDACTED_MARK, (why,)) for _ in range(fallback))


def redact(text: str, filename: str = "document") -> Redacted:
    """``text`` with every secret replaced; ``filename`` is a base name (lock files are skipped)."""
    return _safely(1, lambda: _split_back([text], "", _find(text, filename)))[0]


def redact_around(prefix: str, suffix: str, filename: str = "document") -> tuple[Redacted, Redacted]:
    """The text before and after a cursor, scanned as one text, redacted in each."""
    found = _safely(2, lambda: _split_back([prefix, suffix], "", _find(prefix + suffix, filename, len(prefix))))
    return found[0], found[1]


def redact_chunks(texts: Sequence[str], filename: str = "document") -> tuple[Redacted, ...]:
    """Chunks of one file, scanned joined by newlines, redacted in each."""
    return _safely(len(texts), lambda: _split_back(texts, "\n", _find("\n".join(texts), filename)))


def describe(kinds: tuple[str, ...] | list[str]) -> str:
    """``"2 × Private Key, 1 × AWS Access Key"``: what was withheld, for a status line."""
    return ", ".join(f"{n} × {kind}" for kind, n in Counter(kinds).items())
