"""Token healing (runtime/decode/sampling.py, fim.make_prompt(heal=True)): the
vocabulary index, the constrained sampler, the healed prompt, and — on the
real model — a cursor inside a word completed without repeating what was
typed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from soldaemon.fim import Budget, Place, detect_template, encode_text, heal_tokens, make_prompt
from soldaemon.runtime.decode.sampling import HealingSampler, TokenTexts
from soldaemon.runtime.decode.sampling import Greedy
from soldaemon_bench.tiny import build_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def texts(tok) -> TokenTexts:
    return TokenTexts(tok)


def _agrees(text: str, rest: str) -> bool:
    return bool(text) and (text.startswith(rest) or rest.startswith(text))


@pytest.mark.parametrize("rest", ["re", "result", " ", "(", ".app", "zzzq"])
def test_allowed_is_exactly_the_tokens_that_agree(texts: TokenTexts, rest: str) -> None:
    got = sorted(set(texts.allowed(rest)))
    brute = sorted(i for i, t in enumerate(texts.texts) if _agrees(t, rest))
    assert got == brute
    assert got, f"no token agrees with {rest!r}: single bytes always should"


def test_sampler_forces_agreeing_tokens_until_the_healed_text_is_covered(texts: TokenTexts) -> None:
    gen = torch.Generator().manual_seed(0)
    V = len(texts.texts)
    for heal in ["resu", " ", "append(", "x"]:
        for _ in range(5):
            s = HealingSampler(Greedy(), texts, heal)
            out = ""
            steps = 0
            while s.constrained:
                logits = torch.randn(V, generator=gen)
                token = s(logits)
                assert _agrees(texts.texts[token], heal[len(out):])
                out += texts.texts[token]
                steps += 1
                assert steps <= len(heal)
            assert out.startswith(heal)
            # once covered, the inner sampler alone: the plain argmax
            logits = torch.randn(V, generator=gen)
            assert s(logits) == int(torch.argmax(logits))


def test_the_constrained_pick_is_the_best_agreeing_token(texts: TokenTexts) -> None:
    heal = "resu"
    logits = torch.zeros(len(texts.texts))
    best = max(texts.allowed(heal), key=lambda i: len(texts.texts[i]))   # the longest agreeing token
    logits[best] = 5.0
    other = next(i for i, t in enumerate(texts.texts) if t and not _agrees(t, heal))
    logits[other] = 50.0                        # higher, but does not agree: never picked
    assert HealingSampler(Greedy(), texts, heal)(logits) == best


def test_healed_indentation_is_followed_by_code_not_more_blanks(texts: TokenTexts) -> None:
    """A healed run of blanks (a blank cursor line) may be covered by a
    shorter blank and then a token that starts with the rest and goes on
    with code, never by a token of blanks only that reaches past it: the
    model, offered those, wrote blanks to the end of its budget (10 of 64
    block holes empty, docs/quality.md)."""
    V = len(texts.texts)
    heal = "    "
    covering = [i for i in texts.allowed(heal) if not texts.texts[i].strip() and len(texts.texts[i]) >= len(heal)]
    assert covering, "the tokenizer has a token of 4 or more blanks"
    logits = torch.zeros(V)
    logits[covering] = 100.0                   # the model wants more blanks: refused
    s = HealingSampler(Greedy(), texts, heal)
    out = ""
    while s.constrained:
        out += texts.texts[s(logits)]
    assert out.startswith(heal) and out[len(heal):].strip(), f"the healed blanks were covered by blanks only: {out!r}"
    # a word after the blanks is what is left to choose: the best such token
    word = next(i for i in texts.allowed(" ") if texts.texts[i].strip() and texts.texts[i].startswith(" "))
    logits = torch.zeros(V)
    logits[covering] = 100.0
    logits[word] = 10.0
    s = HealingSampler(Greedy(), texts, " ")
    assert s(logits) == word and not s.constrained


def test_make_prompt_heals_a_cursor_after_text_and_only_then(tok) -> None:
    template = detect_template(tok)
    budget = Budget(256, 64)
    prefix = "def f(items):\n    resu"
    plain = make_prompt(template, tok, Place(prefix, "\n"), budget)
    healed = make_prompt(template, tok, Place(prefix, "\n"), budget, heal=True)
    ids = encode_text(tok, prefix)
    # `resu` is three pieces here (" re", "s", "u"): healing goes back to the word's start
    assert [tok.decode([i]) for i in ids[-3:]] == [" re", "s", "u"]
    assert plain.heal == "" and healed.heal == " resu"
    assert len(healed.ids) == len(plain.ids) - 3
    assert healed.n_prefix_tokens == plain.n_prefix_tokens - 3
    # the healed prompt is the plain one without the word's pieces
    s = plain.ids.index(template.suffix_id)
    assert healed.ids == plain.ids[: s - 3] + plain.ids[s:]
    # nothing to heal: the cursor at the start of a line or after its indentation
    # nor a token with non-ASCII text (its bytes may not be tokens of their own)
    for p in ["def f(items):\n", "def f(items):\n    ", "", "x = caf\u00e9"]:
        assert make_prompt(template, tok, Place(p, "\n"), budget, heal=True).heal == ""


@pytest.mark.parametrize("prefix, healed", [
    ("    retu", " retu"),                    # " ret" + "u": back to the word's start
    ("    result = ite", " ite"),             # " i" + "te"
    ("def f(items):\n    resu", " resu"),      # three pieces
    ("    return os.pa", "pa"),               # the token before ends the word ("."): one piece
    ("x = self.appe", "appe"),
    ("foo(a, b", " b"),                       # a whole word token: itself only
    ("x = caf\u00e9", ""),                     # not ASCII: nothing
    ("def f(items):\n    ", ""),              # after indentation: nothing
])
def test_healing_goes_back_to_the_start_of_the_word(tok, prefix: str, healed: str) -> None:
    ids = encode_text(tok, prefix)
    text, n = heal_tokens(tok, ids, prefix)
    assert text == healed
    if n:
        assert prefix.endswith(text) and tok.decode(ids[len(ids) - n:]) == text
    else:
        assert text == ""


def test_healing_stops_at_its_bounds(tok) -> None:
    """A long identifier is healed at most HEAL_MAX_TOKENS pieces (or
    HEAL_MAX_CHARS characters) back, never the whole prefix."""
    from soldaemon.fim.prompt import HEAL_MAX_CHARS, HEAL_MAX_TOKENS

    prefix = "x = " + "abcdefghij" * 5
    ids = encode_text(tok, prefix)
    text, n = heal_tokens(tok, ids, prefix)
    assert 1 <= n <= HEAL_MAX_TOKENS and len(text) <= HEAL_MAX_CHARS and prefix.endswith(text)
    word = "abcdefghij"
    ids = encode_text(tok, word)
    text, n = heal_tokens(tok, ids, word)
    assert len(text) < len(word)


@pytest.mark.slow
def test_real_model_completes_inside_a_word_without_repeating_it() -> None:
    """functools.reduce's `if initial is _in|` in the standard library's
    functools.py, the benchmark's 384/128-token windows: the quality
    benchmark hole the daemon got wrong before token healing (it wrote
    `initial_missing:` after the typed `_in`; docs/quality.md)."""
    import functools

    from soldaemon.api import CancelToken, CompletionRequest, Done
    from soldaemon.config import config_from_dict
    from soldaemon.runtime.engine.local import load_engine

    src = Path(functools.__file__).read_text()
    line = "    if initial is _initial_missing:"
    if line not in src:
        pytest.skip("this Python's functools.py has no such line")
    cut = src.index(line) + len("    if initial is _in")
    prefix, suffix = src[:cut], src[cut + len("itial_missing:"):]
    results = {}
    for heal in (True, False):
        config = config_from_dict({"device": {"device": "cpu"},
                                   # the prompt of the benchmark run this hole comes from: no outline
                                   "model": {"max_prefix_tokens": 384, "max_suffix_tokens": 128,
                                             "max_outline_tokens": 0},
                                   "completion": {"token_healing": heal}})
        engine = load_engine(config, progress=False)
        req = CompletionRequest(id="h", uri="file:///src/functools.py", prefix=prefix, suffix=suffix,
                                language="python", max_tokens=16)
        done = [e for e in engine.complete(req, CancelToken()) if isinstance(e, Done)][0]
        results[heal] = done.items[0]
        del engine
    assert results[True] == "itial_missing:", results
    # without healing the prompt ends in the token `in` and the model writes the word again
    assert results[False] == "initial_missing:", results


def test_healing_off_by_config_gives_an_unhealed_prompt(tmp_path: Path) -> None:
    from soldaemon.api import CompletionRequest
    from soldaemon.config import config_from_dict
    from soldaemon.runtime.engine.local import load_engine
    from soldaemon_bench.tiny import build_tiny_model

    path = build_tiny_model(tmp_path / "tiny")
    req = CompletionRequest(id="1", uri="file:///t.py", prefix="x = foo.ba", suffix="\n", max_tokens=4)
    prompts = {}
    for heal in (True, False):
        engine = load_engine(config_from_dict({"model": {"path": str(path), "max_context": 2048},
                                               "device": {"device": "cpu"},
                                               "completion": {"token_healing": heal}}), progress=False)
        prompts[heal] = engine.build_prompt(req)[0]
        done = engine.complete_all(req)
        assert done.finish_reason in ("stop", "length")
    assert prompts[True].heal and not prompts[False].heal
    assert req.prefix.endswith(prompts[True].heal)
    # the word's pieces (`ba`: here two) are left out of the healed prompt
    assert len(prompts[True].ids) < len(prompts[False].ids)


def test_a_blank_cursor_line_is_tokenized_as_the_code_after_it_would_be(tok) -> None:
    """After Enter the cursor line is indentation only. With the middle
    anchored at the line's start (``fim.line_anchor``), the middle begins
    with the blanks exactly as a byte-level BPE splits them in front of
    code (``"   "`` + ``" return"``), and the last blank is healed: the
    first generated token must be that blank and a word."""
    from soldaemon.fim import line_anchor

    template = detect_template(tok)
    head = "def f(items):\n    total = 0\n"
    prefix = head + "    "
    place = Place(prefix, "\n    return total\n", lead_from=line_anchor(prefix))
    p = make_prompt(template, tok, place, Budget(256, 64), heal=True)
    assert p.heal == " "
    middle = p.ids[p.ids.index(template.middle_id) + 1:]
    code = encode_text(tok, "    return total")
    word = next(i for i, t in enumerate(code) if tok.decode([t]).strip())
    assert middle == code[:word] and tok.decode([code[word]]).startswith(" ")
    assert tok.decode(middle) + p.heal == "    "
