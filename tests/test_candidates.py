"""A block answer chosen among the greedy one and sampled ones by the model's
confidence (pipeline/candidates.py, completion.candidates;
runtime/decode/second.py's token_scores)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import pytest
import torch

from soldaemon.api import CancelToken, CompletionRequest, Delta, Done
from soldaemon.config import config_from_dict
from soldaemon.pipeline import candidates
from soldaemon.pipeline.ending import ParsedEnding, TextEnding
from soldaemon.runtime.decode.generate import generated_text
from soldaemon.runtime.decode.second import token_scores
from soldaemon.runtime.engine.local import LocalEngine, load_engine
from soldaemon.runtime.forward.backend import LeanBackend
from soldaemon.runtime.kv.session import KVSession
from soldaemon_bench.tiny import build_tiny_model

# -- the ranking, over a tokenizer of one character per token ---------------------

CHARS = "abcdefgh \n:()xyz"


def text(ids: Sequence[int]) -> str:
    return "".join(CHARS[i] for i in ids)


def ids_of(s: str) -> list[int]:
    return [CHARS.index(c) for c in s]


@dataclass
class S:
    logp: list[float]


class CharTokenizer:
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return text(ids)


def test_shown_tokens_counts_the_tokens_the_shown_answer_is_made_of() -> None:
    ids = ids_of("  ab\n  cd\n  ef")
    assert candidates.shown_tokens(text, ids, "ab\n  cd\n  ef") == len(ids)     # re-indented first line
    # cut at the end: up to the next line's code (the white space before it counts)
    assert candidates.shown_tokens(text, ids, "ab\n  cd") == len(ids_of("  ab\n  cd\n  "))
    assert candidates.shown_tokens(text, ids, "ab\n  cd\n") == len(ids_of("  ab\n  cd\n  "))
    assert candidates.shown_tokens(text, ids, "ab\n  c") == len(ids_of("  ab\n  c"))
    assert candidates.shown_tokens(text, ids, "") == 0
    assert candidates.shown_tokens(text, ids, "  \n") == 0


def test_the_text_of_healed_tokens_leaves_out_what_they_re_write() -> None:
    assert generated_text(CharTokenizer(), ids_of("abcd"), "ab") == "cd"
    assert generated_text(CharTokenizer(), ids_of("a"), "ab") == ""          # not yet past the healed text
    assert generated_text(CharTokenizer(), ids_of("abcd"), "") == "abcd"


def test_confidence_is_the_mean_log_probability_of_the_shown_tokens() -> None:
    s = S([-1.0, -3.0, -8.0])
    assert candidates.confidence(s, 2) == pytest.approx(-2.0)
    assert candidates.confidence(s, 0) == float("-inf")


def test_a_candidate_is_the_request_sampled_with_its_own_seed() -> None:
    req = CompletionRequest(id="a", prefix="x", suffix="", n=1)
    one, two = candidates.sampled(req, 1), candidates.sampled(req, 2)
    assert one.temperature == two.temperature == candidates.SAMPLE_TEMPERATURE > 0
    assert (one.seed, two.seed) == (candidates.SAMPLE_SEED + 1, candidates.SAMPLE_SEED + 2)
    assert one.prefix == req.prefix and one.id == req.id


# -- the scores, on the tiny model ------------------------------------------------


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


def test_token_scores_are_the_models_own_log_probabilities(tiny_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_path)).eval()
    prompt, tokens = [5, 17, 42, 9, 77], [13, 88, 4]
    session = KVSession(LeanBackend(model, 64))
    got = token_scores(session, prompt, tokens)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:].float()
    logp = torch.log_softmax(logits, -1)
    assert len(got.logp) == len(tokens)
    for i, t in enumerate(tokens):
        assert got.logp[i] == pytest.approx(float(logp[i, t]), abs=1e-4)
    assert session.tokens == prompt + tokens


# -- in the pipeline ---------------------------------------------------------------

# The tiny model (random weights) writes three lines here, cut by max_lines.
PREFIX = "class A:\n    def g(self):\n        "


def _engine(path: Path, n: int) -> LocalEngine:
    config = config_from_dict({"model": {"path": str(path), "max_context": 2048, "precision": "float32",
                                         "max_suffix_tokens": 0},
                               "device": {"device": "cpu"},
                               "completion": {"candidates": n, "speculative_fim": False, "max_lines": 3}})
    return load_engine(config, progress=False)


def _done(engine: LocalEngine, req: CompletionRequest, cancel: CancelToken | None = None) -> Done:
    events = list(engine.complete(req, cancel or CancelToken()))
    assert isinstance(events[-1], Done)
    return events[-1]


def _req(rid: str, **kw) -> CompletionRequest:
    return CompletionRequest(id=rid, **{"prefix": PREFIX, "suffix": "\n    return 1\n", "max_tokens": 64,
                                        "multiline": "multi", **kw})


@pytest.fixture(scope="module")
def engines(tiny_path: Path) -> tuple[LocalEngine, LocalEngine]:
    return _engine(tiny_path, 1), _engine(tiny_path, 3)


@pytest.fixture(autouse=True)
def always_sample() -> Iterator[None]:
    """Samples after every greedy answer, however sure (the gate has its own
    test); a patch of its own, so a test's ``monkeypatch.undo()`` keeps it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(candidates, "SURE", float("inf"))
        yield


def test_a_greedy_answer_the_model_is_sure_of_stands_without_samples(engines, monkeypatch) -> None:
    """Sure enough (mean log-p per shown token >= SURE): nothing is sampled,
    the greedy answer is shown; below it the samples are decoded."""
    off, on = engines
    greedy = _done(off, _req("s0"))
    sure: list[float] = []
    confidence = candidates.confidence
    monkeypatch.setattr(candidates, "confidence", lambda *a: sure.append(confidence(*a)) or sure[-1])
    ranked = _done(on, _req("s1"))
    assert len(sure) >= 2 and ranked.timings.generated_tokens > greedy.timings.generated_tokens
    monkeypatch.setattr(candidates, "SURE", sure[0] - 1e-3)      # the greedy answer's own: sure enough
    sure.clear()
    stands = _done(on, _req("s2"))
    assert len(sure) == 1 and stands.items == greedy.items and stands.streamed is None
    assert stands.timings.generated_tokens == greedy.timings.generated_tokens
    monkeypatch.setattr(candidates, "SURE", sure[0] + 1e-3)      # just short of it: sampled again
    sure.clear()
    assert _done(on, _req("s3")).items == ranked.items and len(sure) >= 2


def test_candidates_are_decoded_and_the_one_the_model_is_surest_of_is_shown(engines, monkeypatch) -> None:
    off, on = engines
    greedy = _done(off, _req("a"))
    assert greedy.items[0].count("\n") == 2, greedy        # a multi-line answer
    sure: list[float] = []
    shown: list[str] = []
    confidence = candidates.confidence
    monkeypatch.setattr(candidates, "confidence", lambda *a: sure.append(confidence(*a)) or sure[-1])
    for strategy in (TextEnding, ParsedEnding):        # what is shown of each answer, whichever decides
        monkeypatch.setattr(strategy, "shown", lambda self, *a, finish=strategy.shown:
                            shown.append(finish(self, *a).text) or finish(self, *a))
    done = _done(on, _req("b"))
    assert shown[0] == greedy.items[0] and 2 <= len(shown) <= 3
    texts = [t for i, t in enumerate(shown) if t not in shown[:i]]    # the same text is scored once
    assert len(sure) == len(texts)
    assert done.items[0] == texts[sure.index(max(sure))]      # the surest; greedy's on a tie
    assert done.timings.generated_tokens > greedy.timings.generated_tokens
    monkeypatch.undo()
    assert _done(on, _req("c")).items == done.items            # seeded: the same request, the same answer


def test_a_surer_candidate_is_shown_and_greedy_stands_otherwise(engines, monkeypatch) -> None:
    off, on = engines
    greedy = _done(off, _req("d"))
    confidence = candidates.confidence
    calls = {"n": 0}

    def favour(first_wins: bool):
        def sure(scores, shown):
            calls["n"] += 1
            return confidence(scores, shown) + (50.0 if (calls["n"] == 1) == first_wins else 0.0)
        return sure

    monkeypatch.setattr(candidates, "confidence", favour(first_wins=True))
    stands = _done(on, _req("e"))
    assert stands.items == greedy.items and stands.streamed is None
    assert calls["n"] >= 2
    calls["n"] = 0
    monkeypatch.setattr(candidates, "confidence", favour(first_wins=False))
    events = list(on.complete(_req("f", uri="file:///f.py"), CancelToken()))
    done = events[-1]
    assert isinstance(done, Done) and done.items != greedy.items
    # the deltas streamed the greedy answer; the Done says so, and typing along it goes on from it
    assert done.streamed == greedy.items[0]
    deltas = "".join(e.text for e in events if isinstance(e, Delta))
    assert deltas.strip().startswith(greedy.items[0].split("\n")[0].strip())
    shown, kept = done.items[0], greedy.items[0]
    k = next(i for i in range(len(kept)) if i >= len(shown) or shown[i] != kept[i])   # where they part
    assert kept[k + 1:].strip(), (shown, kept)
    typed = _done(on, _req("f2", uri="file:///f.py", prefix=PREFIX + kept[:k + 1]))
    assert typed.timings.source == "type-through" and typed.items == (kept[k + 1:],)


def test_no_candidates_for_one_line_a_sampled_request_candidates_1_or_a_cancel(engines, monkeypatch) -> None:
    off, on = engines
    scored: list[int] = []
    confidence = candidates.confidence

    def counted(*a):
        scored.append(1)
        return confidence(*a)

    monkeypatch.setattr(candidates, "confidence", counted)
    _done(on, _req("g", multiline="single"))
    _done(on, _req("h", temperature=0.7, seed=1))
    assert scored == []
    on.config = on.config.with_overrides({"completion.candidates": 1}, source="test")
    try:
        _done(on, _req("i"))
        assert scored == []
    finally:
        on.config = on.config.with_overrides({"completion.candidates": 3}, source="test")
    _done(on, _req("i2"))
    assert scored                                    # the same request with candidates: ranked
    # a cancel while ranking: the greedy answer stands, nothing more is decoded
    greedy = _done(off, _req("j"))
    cancel = CancelToken()

    def cancelling(*a):
        cancel.supersede()
        return confidence(*a)

    monkeypatch.setattr(candidates, "confidence", cancelling)
    done = _done(on, _req("k"), cancel)
    assert done.items == greedy.items and done.timings.generated_tokens == greedy.timings.generated_tokens


def test_scores_kept_while_decoding_are_the_forwards(tiny_path: Path) -> None:
    """The log-probabilities a decode records (greedy with drafts, sampled
    with drafts along a reference) are what token_scores' own forward says."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from soldaemon.policy.draft import AlongReference, PromptLookup
    from soldaemon.runtime.decode.generate import generate
    from soldaemon.runtime.decode.sampling import Greedy, TopP

    model = AutoModelForCausalLM.from_pretrained(str(tiny_path)).eval()
    tok = AutoTokenizer.from_pretrained(str(tiny_path))
    ids = tok("def f(a, b):\n    return a + b\n\ndef g(a, b):\n", add_special_tokens=False).input_ids * 3
    session = KVSession(LeanBackend(model, 2048))
    greedy: list[int] = []
    for sampler in (Greedy(), TopP(0.8, seed=5)):
        logp: list[float] = []
        out: list[int] = []
        drafter = AlongReference(greedy) if greedy else PromptLookup()
        last = None
        for ev in generate(session, ids, sampler=sampler, stop_ids=frozenset(), max_tokens=24, drafter=drafter,
                           logp=logp):
            out.extend(ev.tokens)
            last = ev
        assert last is not None and last.stats.draft_tokens > 0
        greedy = greedy or out
        assert len(logp) == len(out) == 24
        assert logp == pytest.approx(token_scores(session, ids, out).logp, abs=1e-4)


def test_candidates_are_drafted_along_the_greedy_answer_with_their_own_rates(engines, monkeypatch) -> None:
    """The sampled candidates draft from the greedy answer's tokens (verified
    by speculative sampling); their acceptance is kept apart from the greedy
    decodes' draft sizing."""
    import soldaemon.runtime.engine.part as part_module
    from soldaemon.policy.draft import AlongReference, DraftLength

    off, on = engines
    greedy = _done(off, _req("m"))
    references: list[list[int]] = []
    proposed: list[int] = []

    class Spy(AlongReference):
        def __init__(self, reference, *a, **k) -> None:
            references.append(list(reference))
            super().__init__(reference, *a, **k)

        def propose(self, k: int) -> list[int]:
            out = super().propose(k)
            proposed.append(len(out))
            return out

    monkeypatch.setattr(part_module, "AlongReference", Spy)
    class Flat(DraftLength):   # forwards of more rows as cheap as one (a device's), whatever is timed here
        def observe(self, t: int, ms: float) -> None:
            pass

    monkeypatch.setattr(on.part, "draft_length", Flat({1: 10.0, 2: 10.1, 9: 10.5}, 8))
    _done(on, _req("n"))
    assert 1 <= len(references) <= 2 and sum(proposed) > 0
    first_line = greedy.items[0].splitlines()[0].strip()
    assert all(first_line in on.part.tokenizer.decode(r) for r in references)   # the greedy answer's tokens
    assert on.part.draft_length is not None and on.part._sampled_length is not None
    assert all(kind < AlongReference.REFERENCE for kind in on.part.draft_length.rates())
    assert any(kind > AlongReference.REFERENCE for kind in on.part._sampled_length[1].rates())


def test_type_through_goes_on_along_either_the_shown_or_the_streamed_answer() -> None:
    from soldaemon.shown import remember, type_through

    shown: dict = {}
    first = CompletionRequest(id="t0", uri="file:///t.py", prefix="def f():\n    ", suffix="\n")
    remember(shown, first, "x = 1\n    return x", "x = 2\n    return x + 1")
    at = lambda typed: dataclasses.replace(first, id=typed, prefix=first.prefix + typed)   # noqa: E731
    assert type_through(shown, at("")) == ()
    assert type_through(shown, at("x = ")) == ("1\n    return x", "2\n    return x + 1")   # the shown one first
    remember(shown, at("x = "), *type_through(shown, at("x = ")))
    # typing on along the streamed answer after a beginning both share: still answered from memory
    assert type_through(shown, at("x = 2")) == ("\n    return x + 1",)
    assert type_through(shown, at("x = 3")) == ()
    assert type_through(shown, dataclasses.replace(at("x = 2"), suffix="\n\n")) == ()   # another suffix
