"""The middle's anchor (``model.fim_anchor``; fim.make_prompt's
``lead_from``, pipeline.LeadAnchors): the typed part of the cursor line
goes after the middle token, so typing only appends to the prompt; on the
tiny model, each keystroke reuses all but its last tokens and answers as a
full recompute does."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from soldaemon import fim
from soldaemon.api import CancelToken, CompletionRequest, Done
from soldaemon.config import config_from_dict
from soldaemon.fim.prompt import HEAL_MAX_TOKENS
from soldaemon.pipeline.prompt import MAX_LEAD_LINES, LeadAnchors, lead_from
from soldaemon.runtime.engine.local import LocalEngine, load_engine
from soldaemon_bench.tiny import build_tiny_model
from tests.test_fim import QWEN_SPECIALS, b, byte_tokenizer, sid

HEAD = "import os\n\n\ndef f(x):\n    y = x + 1\n"
LINE = "    return os.path.join(y)"
SUFFIX = "\n\n\nprint(f(2))\n"
AT = len(HEAD) + 4      # the cursor line's anchor: after its indentation


@pytest.fixture(scope="module")
def qwen() -> PreTrainedTokenizerFast:
    return byte_tokenizer(QWEN_SPECIALS, eos="<|im_end|>", name="tiny-qwen")


def _prompt(tok: PreTrainedTokenizerFast, prefix: str, suffix: str = SUFFIX, *, lead_from: int | None = None,
            max_prefix_tokens: int = 1024, **kw: object) -> fim.FimPrompt:
    place = fim.Place(prefix, suffix, lead_from=lead_from)
    budget = fim.Budget(max_prefix_tokens, 256)
    return fim.make_prompt(fim.detect_template(tok), tok, place, budget, **kw)  # type: ignore[arg-type]


def test_the_cursor_line_goes_after_the_middle_token(qwen: PreTrainedTokenizerFast) -> None:
    prefix = HEAD + LINE
    assert fim.line_anchor(prefix) == AT
    p = _prompt(qwen, prefix, lead_from=AT)
    pre, suf, mid = (sid(qwen, t) for t in ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"))
    assert p.ids == [pre, *b(HEAD + "    "), suf, *b(SUFFIX), mid, *b(LINE.lstrip())]
    assert p.prefix_text == prefix and p.n_prefix_tokens == len(b(prefix)) and p.n_context_tokens == 0
    # the classic layout, for comparison: the middle starts at the cursor
    assert _prompt(qwen, prefix).ids == [pre, *b(prefix), suf, *b(SUFFIX), mid]
    # healing drops the lead's last token, as it drops the prefix's
    healed = _prompt(qwen, prefix, lead_from=AT, heal=True)
    assert healed.heal == ")" and healed.ids == p.ids[:-1]
    # a blank cursor line (after Enter) anchors at its start: the lead is
    # its indentation, all but the last blank as the code after it would
    # tokenize them, and the last blank healed (the first token is a blank
    # and a word); a template that cannot heal keeps the classic layout
    assert fim.line_anchor(HEAD + "    ") == len(HEAD)
    blank = _prompt(qwen, HEAD + "    ", lead_from=len(HEAD), heal=True)
    assert blank.heal == " " and blank.ids == [pre, *b(HEAD), suf, *b(SUFFIX), mid, *b("   ")]
    assert blank.n_middle == 1 + len(b("   ")) and blank.prefix_text == HEAD + "    "
    assert _prompt(qwen, HEAD + "    ", lead_from=len(HEAD)).ids == _prompt(qwen, HEAD + "    ").ids
    assert fim.line_anchor(HEAD) == len(HEAD)                 # column 0: no lead at all


def test_indentation_that_ends_a_lead_is_healed(qwen: PreTrainedTokenizerFast) -> None:
    """After Enter inside a sticky lead the middle ends in indentation, a
    token the model never saw there (it was trained on ``" " * 7`` +
    ``" self"``); healed, the first generated token must agree with it."""
    prefix = HEAD + "    z = 1\n    "
    p = _prompt(qwen, prefix, lead_from=AT, heal=True)
    assert p.heal == " " and p.ids == _prompt(qwen, prefix, lead_from=AT).ids[:-1]
    assert _prompt(qwen, HEAD + "    z = 1\n", lead_from=AT, heal=True).heal == "\n"
    # with the middle at the cursor, a blank cursor line is not healed (as before)
    assert _prompt(qwen, prefix, heal=True).heal == ""


def test_typing_on_the_line_only_appends_to_the_prompt(qwen: PreTrainedTokenizerFast) -> None:
    indent = len(LINE) - len(LINE.lstrip())
    last: list[int] | None = None
    for k in range(indent, len(LINE) + 1):
        ids = _prompt(qwen, HEAD + LINE[:k], lead_from=AT, heal=True).ids
        if last is not None:
            assert ids[:len(last)] == last      # everything computed before is reused
            # inside a word the prompt ends at the word's start (healing, at most
            # HEAL_MAX_TOKENS pieces back): it grows when the word ends
            assert 0 <= len(ids) - len(last) <= HEAL_MAX_TOKENS
        last = ids
    # with the middle at the cursor, the suffix moves at every keystroke
    a = _prompt(qwen, HEAD + LINE[:10]).ids
    c = _prompt(qwen, HEAD + LINE[:11]).ids
    common = next(i for i, (x, y) in enumerate(zip(a, c)) if x != y)
    assert len(a) - common > len(b(SUFFIX))


def test_a_lead_too_long_for_its_reserve_moves_to_the_line_then_to_the_cursor(qwen: PreTrainedTokenizerFast) -> None:
    reserve = fim.lead_reserve(128)
    lines = "".join(f"v{i} = {i}\n    " for i in range(12))     # 12 lines, more than the reserve
    assert len(b(lines)) > reserve
    prefix = HEAD + "    " + lines + LINE.lstrip()
    p = _prompt(qwen, prefix, lead_from=AT, max_prefix_tokens=128)
    mid = sid(qwen, "<|fim_middle|>")
    assert p.ids[p.ids.index(mid) + 1:] == b(LINE.lstrip())  # anchored on the cursor line instead
    assert len(p.ids) <= 128 + reserve + len(b(SUFFIX)) + 3    # the window, the lead on top
    long_line = "    x = " + "+".join(["1"] * reserve)
    q = _prompt(qwen, HEAD + long_line, lead_from=AT, max_prefix_tokens=128)
    assert q.ids[-1] == mid                                   # no lead at all: the classic layout
    with pytest.raises(ValueError, match="lead_from"):
        _prompt(qwen, HEAD, lead_from=len(HEAD) + 1)


def test_window_memo_gives_the_same_prompts(qwen: PreTrainedTokenizerFast) -> None:
    """While typing on a line the text before the anchor and the suffix do
    not change: their windows come from the memo, and every prompt equals
    the one computed from scratch."""
    memo = fim.WindowMemo(size=4)
    for k in range(4, len(LINE) + 1):
        prefix = HEAD + LINE[:k]
        for budget in (1024, 12):          # 12: a window that cuts the head
            kw = {"lead_from": AT, "heal": True, "max_prefix_tokens": budget}
            assert _prompt(qwen, prefix, memo=memo, **kw) == _prompt(qwen, prefix, **kw)
    assert memo.hits >= 3 * (len(LINE) - 4)    # head and suffix at 1024, the suffix at 12 (its head moves)
    assert len(memo._entries) <= 4
    # another suffix (an edit after the cursor) is not served from the memo
    other = _prompt(qwen, HEAD + LINE, SUFFIX + "x = 1\n", memo=memo, lead_from=AT)
    assert other == _prompt(qwen, HEAD + LINE, SUFFIX + "x = 1\n", lead_from=AT)


def test_spm_keeps_the_lead_at_the_end_of_the_prefix(qwen: PreTrainedTokenizerFast) -> None:
    prefix = HEAD + LINE
    assert _prompt(qwen, prefix, lead_from=AT, order="spm").ids == _prompt(qwen, prefix, order="spm").ids


def test_sticky_anchor_follows_a_typing_run() -> None:
    anchors = LeadAnchors()
    uri = "file:///a.py"
    assert anchors.anchor(uri, HEAD + "    z", SUFFIX) == AT
    # Enter and the next line: the anchor stays, the prompt only grows
    for typed in ("    z = 1", "    z = 1\n", "    z = 1\n    w", "    z = 1\n    w = z"):
        assert anchors.anchor(uri, HEAD + typed, SUFFIX) == AT
    # backspace inside the lead keeps it too
    assert anchors.anchor(uri, HEAD + "    z = 1\n    w", SUFFIX) == AT
    # an edit after the cursor moves it to the cursor line
    moved = HEAD + "    z = 1\n    w"
    assert anchors.anchor(uri, moved, SUFFIX + "x") == len(moved) - 1
    # so does an edit before the anchor
    edited = "import sys\n" + HEAD[len("import os\n"):] + "    q"
    assert anchors.anchor(uri, edited, SUFFIX + "x") == len(edited) - 1
    # and a lead of more than MAX_LEAD_LINES lines
    start = HEAD + "    q"
    anchors.anchor("file:///b.py", start, SUFFIX)
    long = start + "".join(f"\n    v{i} = {i}" for i in range(MAX_LEAD_LINES))
    assert anchors.anchor("file:///b.py", long, SUFFIX) == long.rfind("\n") + 5
    # documents are independent; a blank line anchors at its start, and
    # typing on it keeps that anchor
    assert anchors.anchor("file:///c.py", HEAD + "    z", SUFFIX) == AT
    assert anchors.anchor("file:///d.py", HEAD + "    ", SUFFIX) == len(HEAD)
    assert anchors.anchor("file:///d.py", HEAD + "    z", SUFFIX) == len(HEAD)


def test_the_configured_anchor() -> None:
    req = CompletionRequest(id="a", uri="file:///a.py", prefix=HEAD + "    re", suffix=SUFFIX)
    model = config_from_dict({}).model
    assert model.fim_anchor == "sticky"
    assert lead_from(model, req, None) == AT                  # sticky without state: the line
    cursor = config_from_dict({"model": {"fim_anchor": "cursor"}}).model
    assert lead_from(cursor, req, LeadAnchors()) is None
    with pytest.raises(Exception, match="fim_anchor"):
        config_from_dict({"model": {"fim_anchor": "word"}})


# ---------------------------------------------------------------------------
# the engine, tiny model

ENGINE_HEAD = "import os\n\n\ndef join_all(parts):\n    result = []\n    for part in parts:\n"
ENGINE_LINE = "        result.append(os.path.join(part, 'x'))"
ENGINE_SUFFIX = "\n    return result\n"


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> LocalEngine:
    path = build_tiny_model(tmp_path_factory.mktemp("tiny"))
    # the float32 plan, pinned: the tiny model's text (which these tests rely on) must not
    # depend on the kernel timings a busy machine measured at load
    config = config_from_dict({"model": {"path": str(path), "max_context": 2048, "precision": "float32"},
                               "device": {"device": "cpu"}})
    return load_engine(config, progress=False)


def _done(engine: LocalEngine, req: CompletionRequest) -> Done:
    events = list(engine.complete(req, CancelToken()))
    assert isinstance(events[-1], Done)
    return events[-1]


def test_keystrokes_reuse_all_but_the_newest_tokens_and_match_a_full_recompute(engine: LocalEngine) -> None:
    """Each keystroke of a typed line: the prompt computes at most the last
    couple of tokens (the suffix stays cached), and greedy output equals
    the same request on an empty KV cache."""
    uri = "file:///lead.py"
    indent = len(ENGINE_LINE) - len(ENGINE_LINE.lstrip())
    computed = []
    forward = engine.backend.forward
    precise_calls: list[bool] = []

    def spy(tokens: object, pos: int, **kw: object) -> object:
        precise_calls.append(bool(kw.get("precise")))
        return forward(tokens, pos, **kw)  # type: ignore[arg-type]

    for k in range(indent, len(ENGINE_LINE), 3):
        req = CompletionRequest(id=f"k{k}", uri=uri, prefix=ENGINE_HEAD + ENGINE_LINE[:k], suffix=ENGINE_SUFFIX,
                                max_tokens=8)
        engine.forget_shown()      # the model answers every keystroke (no type-through)
        precise_calls.clear()
        engine.backend.forward = spy   # type: ignore[method-assign]
        try:
            done = _done(engine, req)
        finally:
            engine.backend.forward = forward   # type: ignore[method-assign]
        assert done.timings.source == "model"
        if k > indent:   # a warm keystroke: the middle token and the line run on the decode weights
            assert precise_calls and not any(precise_calls), precise_calls
        computed.append(done.timings.prompt_tokens - done.timings.cached_tokens)
        engine.forget_shown()
        engine.pool.acquire(uri).truncate(0)   # the same request from scratch
        fresh = _done(engine, req)
        assert fresh.timings.cached_tokens == 0
        assert fresh.items == done.items, f"keystroke {k}: reuse answered {done.items}, recompute {fresh.items}"
    # the first keystroke computes the whole prompt, the others a few tokens
    assert computed[0] > 30
    assert max(computed[1:]) <= 6, computed
