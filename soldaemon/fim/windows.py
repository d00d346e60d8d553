"""Windows of the prefix and suffix that fit a token budget, cut on a stable
grid of lines, and the memo of recent windows."""

from __future__ import annotations

from typing import Any, Callable, Sequence


def split_lines(text: str) -> list[str]:
    """Lines of ``text`` keeping their "\\n"; the last is the (maybe empty) rest."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + [parts[-1]]


def count_tokens(tokenizer: Any, texts: Sequence[str]) -> list[int]:
    """Estimated token counts of ``texts``, one by one (``encode_batch``'s threads cost more)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "encode"):
        return [len(backend.encode(t, add_special_tokens=False).ids) if t else 0 for t in texts]
    return [len(tokenizer(t, add_special_tokens=False)["input_ids"]) if t else 0 for t in texts]


def _offsets(tokenizer: Any, text: str) -> list[tuple[int, int]]:
    enc = tokenizer(
        text, add_special_tokens=False, split_special_tokens=True, return_offsets_mapping=True
    )
    return [(int(a), int(b)) for a, b in enc["offset_mapping"]]


_BATCH = 8  # chunks counted per tokenizer call


def _tail_fit(tokenizer: Any, lines: list[str], max_tokens: int, grain: int) -> int | None:
    """The smallest multiple of ``grain`` where ``lines[cut:]`` is estimated to fit ``max_tokens``,
    else the smallest fitting line after the last grid line, else None."""
    last = len(lines) - 1
    starts = list(range(0, last + 1, grain))
    total = 0
    best: int | None = None
    k = len(starts)
    batch = 1
    while k > 0:
        lo = max(0, k - batch)
        batch = min(2 * batch, _BATCH)
        texts = [
            "".join(lines[starts[j]: starts[j + 1] if j + 1 < len(starts) else len(lines)])
            for j in range(lo, k)
        ]
        counts = count_tokens(tokenizer, texts)
        for j in range(k - 1, lo - 1, -1):
            total += counts[j - lo]
            if total > max_tokens:
                k = 0
                break
            best = starts[j]
        else:
            k = lo
    if best is not None:
        return best
    first = starts[-1]
    counts = count_tokens(tokenizer, lines[first:])
    total = 0
    fine: int | None = None
    for j in range(last, first - 1, -1):
        total += counts[j - first]
        if total > max_tokens:
            break
        fine = j
    return fine


def _head_fit(tokenizer: Any, lines: list[str], max_tokens: int, grain: int) -> int:
    """The largest k such that ``lines[:k]`` is estimated to fit."""
    total = 0
    pos = 0
    batch = 1
    while pos < len(lines):
        bounds = [
            (a, min(len(lines), a + grain))
            for a in range(pos, min(len(lines), pos + grain * batch), grain)
        ]
        batch = min(2 * batch, _BATCH)
        counts = count_tokens(tokenizer, ["".join(lines[a:b]) for a, b in bounds])
        for (a, b), n in zip(bounds, counts):
            if total + n > max_tokens:
                line_counts = count_tokens(tokenizer, lines[a:b])
                for j, m in zip(range(a, b), line_counts):
                    if total + m > max_tokens:
                        return j
                    total += m
                return b
            total += n
        pos = bounds[-1][1]
    return len(lines)


def _effective_grain(grain_lines: int, max_tokens: int) -> int:
    """``grain_lines``, at most ``max_tokens // 64``: stability costs at most ~1/8 of the budget."""
    return max(1, min(grain_lines, max_tokens // 64))


def fit_prefix(
    prefix: str,
    tokenizer: Any,
    max_tokens: int,
    grain_lines: int,
    encode: Callable[[str], list[int]],
) -> tuple[str, list[int]]:
    """The end of ``prefix`` that fits ``max_tokens`` and its ids through ``encode`` (verified to
    fit): cut at the earliest line that is a multiple of ``grain_lines`` and fits (so typing on
    the last line keeps the cut); else at the earliest fitting line, else inside the cursor line."""
    if max_tokens <= 0 or not prefix:
        return "", encode("")
    grain = _effective_grain(grain_lines, max_tokens)
    lines = split_lines(prefix)
    last = len(lines) - 1
    cut = _tail_fit(tokenizer, lines, max_tokens, grain)
    if cut is not None:
        while cut <= last:
            text = "".join(lines[cut:])
            ids = encode(text)
            if len(ids) <= max_tokens:
                return text, ids
            nxt = -(-(cut + 1) // grain) * grain
            cut = nxt if nxt <= last else cut + 1
    # not even the cursor line fits: cut inside it
    line = lines[last]
    offs = _offsets(tokenizer, line)
    k = max(0, len(offs) - max_tokens)
    while k <= len(offs):
        start = offs[k][0] if k < len(offs) else len(line)
        text = line[start:]
        ids = encode(text)
        if len(ids) <= max_tokens:
            return text, ids
        k += 1
    return "", encode("")


def fit_suffix(
    suffix: str,
    tokenizer: Any,
    max_tokens: int,
    encode: Callable[[str], list[int]],
) -> tuple[str, list[int]]:
    """The start of ``suffix`` that fits ``max_tokens``, cut at a line end (else inside line 1),
    and its ids through ``encode`` (verified to fit)."""
    if max_tokens <= 0 or not suffix:
        return "", encode("")
    lines = split_lines(suffix)
    if lines[-1] == "":
        lines.pop()
    k = _head_fit(tokenizer, lines, max_tokens, 16)
    while k > 0:
        text = "".join(lines[:k])
        ids = encode(text)
        if len(ids) <= max_tokens:
            return text, ids
        k -= 1
    # not even the first line fits: cut inside it
    line = lines[0]
    offs = _offsets(tokenizer, line)
    n = min(len(offs), max_tokens)
    while n > 0:
        text = line[: offs[n - 1][1]]
        ids = encode(text)
        if len(ids) <= max_tokens:
            return text, ids
        n -= 1
    return "", encode("")


class WindowMemo:
    """The last ``size`` windows :func:`make_prompt` computed, by their
    inputs, least recently used dropped; owned by the caller."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._entries: dict[tuple[Any, ...], tuple[str, tuple[int, ...]]] = {}
        self.hits = 0

    def through(self, key: tuple[Any, ...], compute: Callable[[], tuple[str, list[int]]]) -> tuple[str, list[int]]:
        """The entry of ``key``, else ``compute()``'s result, kept."""
        found = self._entries.pop(key, None)
        if found is not None:
            self.hits += 1
        else:
            text, ids = compute()
            found = (text, tuple(ids))
        self._entries[key] = found
        while len(self._entries) > self.size:
            self._entries.pop(next(iter(self._entries)))
        return found[0], list(found[1])
