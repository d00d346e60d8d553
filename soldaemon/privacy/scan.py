"""Secrets in the text itself: the content half of the secret rule.

:mod:`soldaemon.privacy.rules` refuses files by name; this module looks at the
text that would be sent (a context chunk, a prefix or suffix) and replaces
each secret with ``REDACTED_MARK``, so the rest of the file still helps the
completion. What it finds:

- private-key blocks (``-----BEGIN … PRIVATE KEY-----`` through the matching
  ``END`` line, or to the end of the text when the block is cut off): the
  whole block goes;
- everything the maintained detector `detect-secrets` (Yelp) finds on a line
  with its default plugins and filters: well-known token shapes (AWS, GitHub,
  Slack, Stripe, JWT, …), keyword assignments (``password = "…"``) and
  high-entropy strings. The span it reports is widened to the whole token
  around it (``ghp`` → the full ``ghp_…`` token).

Speed: detect-secrets costs ~0.3–1 ms per line (every plugin's regexes), too
much for a whole document on every keystroke, so findings are cached per
line text (:data:`_LINE_CACHE`, bounded): typing re-scans only the edited
line. Contract: :func:`redact` never raises; without detect-secrets
installed only the private-key blocks are found (and :data:`DETECTOR` says
so). detect-secrets is imported on the first scan, not with this module.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Any

REDACTED_MARK = "<redacted>"

_KEY_BLOCK = re.compile(
    r"-----BEGIN ([A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?)-----.*?(?:-----END \1-----|\Z)", re.DOTALL)
_TOKEN_CHARS = re.compile(r"[A-Za-z0-9_\-+/=.~]")
_MAX_LINE = 4000            # a longer line (minified code, data) is scanned by key blocks only
_CACHE_LINES = 50_000

_LINE_CACHE: dict[str, tuple[tuple[int, int, str], ...]] = {}
_lock = threading.Lock()

DETECTOR = "detect-secrets"
_detector: tuple[Any, Any] | None = None     # (scan function, settings context), loaded on first use


def _load_detector() -> tuple[Any, Any] | None:
    """detect-secrets, imported on first use (≈0.2 s: sol-lsp starts without it)."""
    global _detector, DETECTOR
    if _detector is None:
        try:
            from detect_secrets.core.scan import _process_line_based_plugins
            from detect_secrets.settings import default_settings
            _detector = (_process_line_based_plugins, default_settings)
        except ImportError:      # a dependency; a broken install still redacts key blocks
            DETECTOR = "private-key blocks only (detect-secrets is not installed)"
            _detector = (None, None)
    return _detector if _detector[0] is not None else None


@dataclass(frozen=True)
class Redacted:
    """``text`` with its secrets replaced; ``kinds`` names what was withheld
    (``"Private Key"``, ``"AWS Access Key"``, …), one entry per span."""

    text: str
    kinds: tuple[str, ...] = ()


def _widen(line: str, start: int, end: int) -> tuple[int, int]:
    while start > 0 and _TOKEN_CHARS.match(line[start - 1]):
        start -= 1
    while end < len(line) and _TOKEN_CHARS.match(line[end]):
        end += 1
    return start, end


def _scan_lines(lines: list[str], filename: str) -> list[tuple[tuple[int, int, str], ...]]:
    """Findings ``(start, end, kind)`` of each line, from the cache or the detector."""
    out: list[tuple[tuple[int, int, str], ...]] = []
    missing = [line for line in dict.fromkeys(lines) if line not in _LINE_CACHE]
    detector = _load_detector() if missing else None
    if missing and detector is not None:
        scan, settings = detector
        found: dict[str, list[tuple[int, int, str]]] = {line: [] for line in missing}
        with settings():
            for line in missing:
                if len(line) > _MAX_LINE or len(line.strip()) < 8:
                    continue
                for secret in scan([(1, line)], filename=filename):
                    value = secret.secret_value or ""
                    at = line.find(value) if value else -1
                    if at < 0:
                        continue
                    start, end = _widen(line, at, at + len(value))
                    found[line].append((start, end, secret.type))
        if len(_LINE_CACHE) + len(missing) > _CACHE_LINES:
            _LINE_CACHE.clear()
        _LINE_CACHE.update({line: tuple(spans) for line, spans in found.items()})
    for line in lines:
        out.append(_LINE_CACHE.get(line, ()))
    return out


def _merge(spans: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    merged: list[tuple[int, int, str]] = []
    for start, end, kind in sorted(spans):
        if merged and start <= merged[-1][1]:
            prev = merged[-1]
            merged[-1] = (prev[0], max(prev[1], end), prev[2])
        else:
            merged.append((start, end, kind))
    return merged


def redact(text: str, filename: str = "document") -> Redacted:
    """``text`` with every secret found replaced by :data:`REDACTED_MARK`.
    ``filename`` (a base name) lets the detector's filters skip lock files
    and the like."""
    try:
        return _redact(text, filename)
    except Exception as exc:  # noqa: BLE001 - a detector bug must not pass the text unchecked
        return Redacted(REDACTED_MARK, (f"the whole text (the secret scan failed: {type(exc).__name__})",))


def _redact(text: str, filename: str) -> Redacted:
    spans: list[tuple[int, int, str]] = [(m.start(), m.end(), "Private Key") for m in _KEY_BLOCK.finditer(text)]
    lines = text.split("\n")
    with _lock:
        per_line = _scan_lines(lines, filename)
    offset = 0
    for line, found in zip(lines, per_line):
        spans.extend((offset + s, offset + e, kind) for s, e, kind in found)
        offset += len(line) + 1
    if not spans:
        return Redacted(text)
    merged = _merge(spans)
    parts: list[str] = []
    last = 0
    for start, end, _kind in merged:
        parts.append(text[last:start])
        parts.append(REDACTED_MARK)
        last = end
    parts.append(text[last:])
    return Redacted("".join(parts), tuple(kind for _s, _e, kind in merged))


def describe(kinds: tuple[str, ...] | list[str]) -> str:
    """``"2 × Private Key, 1 × AWS Access Key"``: what was withheld, for a status line."""
    counts: dict[str, int] = {}
    for kind in kinds:
        counts[kind] = counts.get(kind, 0) + 1
    return ", ".join(f"{n} × {kind}" for kind, n in counts.items())

