"""Scores of one completion against a hole's answer, and a column of them."""

from __future__ import annotations

import ast
import statistics
from dataclasses import dataclass, field

from soldaemon.pipeline.ending.parsed import opens_without_body
from soldaemon_bench.holes import Hole


def normalize(text: str) -> str:
    """``text`` with trailing whitespace removed from every line and trailing
    blank lines dropped: what the editor shows does not differ by them."""
    return "\n".join(line.rstrip() for line in text.split("\n")).rstrip("\n")


def exact_match(pred: str, expected: str) -> bool:
    """The completion is the removed text (after :func:`normalize`)."""
    return normalize(pred) == normalize(expected)


def first_line_match(pred: str, expected: str) -> bool:
    """The completion's first line is the removed text's first line (after
    :func:`normalize`): what accepting one line would give."""
    return normalize(pred).split("\n", 1)[0] == normalize(expected).split("\n", 1)[0]


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions of characters)."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def edit_similarity(pred: str, expected: str) -> float:
    """1 - levenshtein / max(len) on the normalized texts, in [0, 1]; 1.0
    when both are empty."""
    a, b = normalize(pred), normalize(expected)
    if not a and not b:
        return 1.0
    return 1.0 - levenshtein(a, b) / max(len(a), len(b))


def parses(prefix: str, completion: str, suffix: str) -> bool:
    """Whether ``prefix + completion + suffix`` is valid Python."""
    try:
        ast.parse(prefix + completion + suffix)
    except (SyntaxError, ValueError):
        return False
    return True


@dataclass(frozen=True)
class Score:
    exact: bool
    first_line: bool
    edit_sim: float
    parses: bool | None     # None: not Python
    passed: bool | None = None  # the hole's tests pass with it (functional holes); None: not executable


def score(hole: Hole, pred: str, *, python: bool = True) -> Score:
    return Score(exact_match(pred, hole.expected), first_line_match(pred, hole.expected),
                 edit_similarity(pred, hole.expected),
                 parses(hole.prefix, pred, hole.suffix) if python and hole.language == "python" else None)


@dataclass
class Column:
    """One way of completing, scored over all holes."""

    name: str
    texts: list[str] = field(default_factory=list)
    scores: list[Score] = field(default_factory=list)
    e2e_ms: list[float] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    generated_tokens: list[int] = field(default_factory=list)
    ttft_ms: list[float] = field(default_factory=list)      # request → first token (nan: no model run)
    ends: list[str] = field(default_factory=list)           # why each answer ended ("": not known; quality/ends.py)
    open_ends: list[bool] = field(default_factory=list)     # it ends on a block opener the suffix holds no body for

    def add(self, hole: Hole, text: str, ms: float, prompt_tokens: int, generated: int,
            ttft: float = float("nan"), end: str = "", *, python: bool) -> None:
        self.texts.append(text)
        self.ends.append(end)
        self.open_ends.append(opens_without_body(hole.prefix, text, hole.suffix))
        self.scores.append(score(hole, text, python=python))
        self.e2e_ms.append(ms)
        self.prompt_tokens.append(prompt_tokens)
        self.generated_tokens.append(generated)
        self.ttft_ms.append(ttft)

    def summary(self, kinds: list[str], only: str | None = None) -> dict[str, float]:
        """Rates in percent (edit similarity too) over the holes of kind
        ``only`` (all holes when None); e2e p50 in ms."""
        idx = [i for i, k in enumerate(kinds) if only is None or k == only]
        if not idx:
            return {}
        sc = [self.scores[i] for i in idx]
        parsed = [s.parses for s in sc if s.parses is not None]
        executed = [s.passed for s in sc if s.passed is not None]
        return {
            "n": len(idx),
            "exact": 100.0 * sum(s.exact for s in sc) / len(sc),
            "first_line": 100.0 * sum(s.first_line for s in sc) / len(sc),
            "edit_sim": 100.0 * statistics.mean(s.edit_sim for s in sc),
            "parses": 100.0 * sum(parsed) / len(parsed) if parsed else float("nan"),
            "e2e_p50_ms": statistics.median(self.e2e_ms[i] for i in idx),  # nan for raw+pp
            "ttft_p50_ms": statistics.median(self.ttft_ms[i] for i in idx),
            "prompt_tokens_p50": statistics.median(self.prompt_tokens[i] for i in idx),
            "generated_p50": statistics.median(self.generated_tokens[i] for i in idx),
            "pass_at_1": 100.0 * sum(executed) / len(executed) if executed else float("nan"),
            "decode_tok_s": self.decode_rate(idx),
        }

    def decode_rate(self, idx: list[int]) -> float:
        """Tokens per second after the first, over the holes ``idx``: the
        generated tokens past the first over the time from the first token to
        the end (nan where nothing was decoded or timed)."""
        tokens = ms = 0.0
        for i in idx:
            gen, e2e, ttft = self.generated_tokens[i], self.e2e_ms[i], self.ttft_ms[i]
            if gen > 1 and e2e == e2e and ttft == ttft and e2e > ttft:
                tokens += gen - 1
                ms += e2e - ttft
        return 1000.0 * tokens / ms if ms > 0 else float("nan")
