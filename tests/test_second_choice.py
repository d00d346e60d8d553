"""The model's second choice for a first line that repeats the line below
(runtime/decode/second.py, completion.second_choice)."""

from __future__ import annotations

import inspect
import textwrap
from pathlib import Path

import pytest
import torch

from soldaemon.api import CancelToken, CompletionRequest, Delta, Done
from soldaemon.config import config_from_dict
from soldaemon.runtime.decode.generate import generate
from soldaemon.runtime.decode.sampling import HealingSampler, TokenTexts
from soldaemon.runtime.decode.sampling import Greedy
from soldaemon.runtime.decode.second import Replay, second_choice
from soldaemon.runtime.engine.local import LocalEngine, load_engine
from soldaemon.runtime.forward.backend import LeanBackend
from soldaemon.runtime.kv.session import KVSession
from soldaemon_bench.tiny import build_tiny_model


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def tiny(tiny_path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_path))
    model.eval()
    return model, AutoTokenizer.from_pretrained(str(tiny_path))


def _greedy(session: KVSession, ids: list[int], n: int) -> list[int]:
    out: list[int] = []
    for ev in generate(session, ids, sampler=Greedy(), stop_ids=frozenset(), max_tokens=n):
        out.extend(ev.tokens)
    return out


def test_the_choice_is_the_closest_other_token_along_the_line(tiny) -> None:
    """One forward over the line gives what a token-by-token look at every
    position gives: the position whose best other token came closest."""
    model, tok = tiny
    prompt = tok(inspect.getsource(textwrap)[:400], add_special_tokens=False).input_ids
    session = KVSession(LeanBackend(model, 2048))
    line = _greedy(session, prompt, 7)
    choice = second_choice(session, prompt, line, frozenset())
    assert choice is not None

    fresh = KVSession(LeanBackend(model, 2048))
    gaps = []
    for j in range(len(line)):
        row = fresh.prefill(prompt + line[:j]).logits.float()
        logp = torch.log_softmax(row, dim=-1)
        masked = row.clone()
        masked[line[j]] = float("-inf")
        alt = int(torch.argmax(masked))
        gaps.append((float(logp[line[j]] - logp[alt]), j, alt))
    gap, j, alt = min(gaps)
    assert (choice.at, choice.tokens) == (j, line[:j] + [alt])
    assert choice.gap == pytest.approx(max(gap, 0.0), abs=1e-3)


def test_end_tokens_are_never_the_other_choice(tiny) -> None:
    model, tok = tiny
    prompt = tok("def f(x):\n    return x", add_special_tokens=False).input_ids
    session = KVSession(LeanBackend(model, 2048))
    line = _greedy(session, prompt, 4)
    # every token an end token: no position has an other choice
    assert second_choice(session, prompt, line, frozenset(range(len(tok)))) is None
    # all but one: that one is the choice, wherever it came closest
    other = next(i for i in range(len(tok)) if i not in line)
    choice = second_choice(session, prompt, line, frozenset(range(len(tok))) - {other})
    assert choice is not None and choice.tokens[-1] == other and choice.tokens[:-1] == line[:choice.at]


def test_replay_forces_its_tokens_then_lets_the_sampler_choose() -> None:
    logits = torch.tensor([0.0, 5.0, 1.0, 2.0])
    replay = Replay(Greedy(), [3, 0])
    assert replay.constrained
    assert [replay(logits), replay(logits)] == [3, 0]
    assert not replay.constrained
    assert replay(logits) == 1


def test_replayed_tokens_count_for_token_healing(tiny) -> None:
    _model, tok = tiny
    texts = TokenTexts(tok)
    healing = HealingSampler(Greedy(), texts, " return")
    space = texts.texts.index(" ")
    replay = Replay(healing, [space])
    assert replay(torch.zeros(len(texts.texts))) == space
    assert healing.rest == "return" and replay.constrained     # the rest of the healed text still binds
    token = replay(torch.zeros(len(texts.texts)))
    assert texts.texts[token].startswith("return") or "return".startswith(texts.texts[token])


def _engine(path: Path, second: bool) -> LocalEngine:
    # no suffix in the prompt: the model's text does not depend on the line
    # below, so a test can put there exactly the line it writes
    config = config_from_dict({"model": {"path": str(path), "max_context": 2048, "precision": "float32",
                                         "max_suffix_tokens": 0},
                               "device": {"device": "cpu"},
                               "completion": {"second_choice": second, "speculative_fim": False}})
    return load_engine(config, progress=False)


def _done(engine: LocalEngine, req: CompletionRequest) -> Done:
    return _events(engine, req)[1]


def _events(engine: LocalEngine, req: CompletionRequest) -> tuple[str, Done]:
    """The streamed preview (deltas joined) and the Done."""
    events = list(engine.complete(req, CancelToken()))
    assert isinstance(events[-1], Done)
    return "".join(e.text for e in events[:-1] if isinstance(e, Delta)), events[-1]


def test_a_first_line_that_is_the_line_below_is_decoded_again(tiny_path: Path) -> None:
    # the tiny model ends its first line here (a newline, then a dedent)
    prefix = "import os\n\n\ndef join_all(parts):\n    result = []\n    for part in parts:\n        "
    off, on = _engine(tiny_path, False), _engine(tiny_path, True)
    first = _done(off, CompletionRequest(id="a", prefix=prefix, suffix="\n    return result\n", max_tokens=48,
                                         multiline="multi"))
    line = first.items[0].split("\n")[0].strip()
    assert line and first.finish_reason == "stop", first
    suffix = f"\n        {line}\n    return result\n"
    req = CompletionRequest(id="b", prefix=prefix, suffix=suffix, max_tokens=48, multiline="multi")

    streamed, dropped = _events(off, req)     # the line below, shown twice: dropped, nothing left
    assert dropped.items == ("",) and dropped.ends == ("suffix",)
    assert streamed == ""                      # and never streamed either

    streamed, again = _events(on, req)
    text = again.items[0]
    assert text.strip() and text.split("\n")[0].strip() != line
    assert streamed and not streamed.startswith(line) and text.startswith(streamed.split("\n")[0].rstrip())
    assert dropped.timings.generated_tokens < again.timings.generated_tokens <= req.max_tokens
