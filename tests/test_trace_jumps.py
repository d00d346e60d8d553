"""``bench --trace --jumps``: the cursor jumps to other functions of the file
and types there, at once and after a pause that warms the spot; the jump
keystrokes are reported on their own (tiny model: the numbers' shape, not
speed)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from soldaemon.cli import main
from soldaemon_bench.tiny import build_tiny_model
from soldaemon_bench.holes import default_corpus
from soldaemon_bench.jumps import JUMP, JUMP_KEYS, JUMP_PAUSE, function_of, jump_targets
from soldaemon_bench.trace import make_trace

TEXT = "def f():\n    a = 1\n    return a\n\n\ndef g():\n    def inner():\n        return 2\n    return inner\n"


def test_jump_targets_are_in_other_functions() -> None:
    owner = function_of(TEXT)
    assert owner[2] == owner[3] == 1 and owner[8] == 7 and owner[9] == 6 and 4 not in owner
    for seed in range(5):
        first, second = jump_targets(TEXT, 2, [2, 3, 8, 9], random.Random(seed))
        assert owner[first] != 1 and owner[second] != owner[first]
    assert jump_targets("def f():\n    return 1\n", 2, [2], random.Random(0)) == []


def test_trace_with_jumps_keeps_the_lines_and_adds_jumps() -> None:
    files = default_corpus()
    plain = make_trace(files, 2, seed=1)
    trace = make_trace(files, 2, seed=1, jumps=True)
    assert trace == make_trace(files, 2, seed=1, jumps=True)
    starts = [i for i, ks in enumerate(trace) if ks.jump]
    assert [trace[i].jump for i in starts] == [JUMP, JUMP_PAUSE, JUMP, JUMP_PAUSE]
    ends = starts[1:] + [len(trace)]
    jump_keys = {j for s, e in zip(starts, ends) for j in range(s, min(e, s + JUMP_KEYS))}
    assert [ks for i, ks in enumerate(trace) if i not in jump_keys] == plain   # the typed lines are unchanged
    texts = {p.name: p.read_text(encoding="utf-8") for p in files}
    for i in starts:
        before, ks = trace[i - 1], trace[i]
        assert ks.file == before.file and ks.line != before.line
        owner = function_of(texts[ks.file])
        assert owner[ks.line] != owner[before.line]                # another function
        assert ks.prefix.endswith("\n" + " " * (len(ks.prefix) - ks.prefix.rfind("\n") - 1))  # at its indentation
        run = [k for k in trace[i:i + JUMP_KEYS] if k.line == ks.line and k.file == ks.file]
        assert 1 <= len(run) <= JUMP_KEYS and all(k.prefix.startswith(ks.prefix) for k in run)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


def test_bench_trace_reports_jump_keystrokes(tiny_dir: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "trace.json"
    rc = main(["bench", "--trace", "--jumps", "--model", str(tiny_dir), "--threads", "1", "--lines", "2",
               "--baselines", "generate", "--baseline-every", "10", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "sol:jump " in text and "sol:jump+pause" in text and "two jumps to other functions" in text
    data = json.loads(out.read_text())["results"]
    cold, warmed = data["sol:jump"], data["sol:jump+pause"]
    assert len(cold["ttft_ms"]) == len(warmed["ttft_ms"]) == 2
    for series in (cold, warmed):
        assert all(t > 0 for t in series["ttft_ms"]) and all(
            c <= p for c, p in zip(series["computed_tokens"], series["prompt_tokens"]))
    # the pause warmed the new place: its first keystroke computes (almost) nothing; without it, a fresh prompt
    assert max(warmed["computed_tokens"]) <= 2
    assert min(cold["computed_tokens"]) > 10
    # the jump keystrokes are among every keystroke too
    assert len(data["sol"]["ttft_ms"]) > 4 * JUMP_KEYS
