"""FIM templates, token-level prompts and windowing, on small tokenizers built
in code that carry each family's special tokens (no files, no downloads)."""

from __future__ import annotations

import string

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from soldaemon import fim
from soldaemon.api import DOCUMENT_GRAIN, ContextChunk, document_window
from soldaemon.errors import NoFimTokens
from soldaemon.fim.windows import fit_prefix, fit_suffix

QWEN_SPECIALS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
]
STARCODER2_SPECIALS = [
    "<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>",
    "<repo_name>", "<file_sep>", "<issue_start>",
]
DEEPSEEK_SPECIALS = [
    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜fim▁hole｜>", "<｜fim▁begin｜>",
    "<｜fim▁end｜>", "<|EOT|>",
]
CHAT_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_tokenizer(
    specials: list[str],
    *,
    bos: str | None = None,
    eos: str | None = None,
    special_flag: bool = True,
    name: str = "",
) -> PreTrainedTokenizerFast:
    """Byte-level BPE without merges: every UTF-8 byte is one token (ids
    0..255), then the added tokens in order (ids 256...)."""
    vocab = dict(_INDEX)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    added = [AddedToken(s, special=special_flag, normalized=False) for s in specials]
    if special_flag:
        tok.add_special_tokens(added)
    else:
        tok.add_tokens(added)
    out = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos)
    out.name_or_path = name
    return out


def llama_tokenizer() -> PreTrainedTokenizerFast:
    """SentencePiece-like (Metaspace, byte fallback), single characters only,
    with CodeLlama's "▁<PRE>"-style tokens."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for ch in ["▁"] + [c for c in string.printable if not c.isspace()]:
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.add_special_tokens(
        [AddedToken(s, special=True, normalized=False) for s in ["▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>"]]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


@pytest.fixture(scope="module")
def qwen() -> PreTrainedTokenizerFast:
    return byte_tokenizer(QWEN_SPECIALS, eos="<|im_end|>", name="tiny-qwen")


@pytest.fixture(scope="module")
def starcoder() -> PreTrainedTokenizerFast:
    return byte_tokenizer(STARCODER2_SPECIALS, bos="<|endoftext|>", eos="<|endoftext|>")


@pytest.fixture(scope="module")
def deepseek() -> PreTrainedTokenizerFast:
    return byte_tokenizer(
        DEEPSEEK_SPECIALS, bos="<｜begin▁of▁sentence｜>", eos="<｜end▁of▁sentence｜>"
    )


@pytest.fixture(scope="module")
def codellama() -> PreTrainedTokenizerFast:
    return llama_tokenizer()


_ALPHABET = sorted(pre_tokenizers.ByteLevel.alphabet())
_INDEX = {ch: i for i, ch in enumerate(_ALPHABET)}
_BYTES = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)


def b(text: str) -> list[int]:
    """Ids of ``text`` in a byte tokenizer: one per UTF-8 byte, computed
    without the tokenizer (so without any special-token handling)."""
    return [_INDEX[ch] for piece, _ in _BYTES.pre_tokenize_str(text) for ch in piece]


def sid(tok: PreTrainedTokenizerFast, s: str) -> int:
    tid = tok.convert_tokens_to_ids(s)
    assert isinstance(tid, int)
    return tid


# ---------------------------------------------------------------------------
# detection


def test_byte_helper_matches_tokenizer(qwen: PreTrainedTokenizerFast) -> None:
    text = "def f(x):\n    return 'é' + \"<\"\n"
    assert fim.encode_text(qwen, text) == b(text)


def test_detect_qwen(qwen: PreTrainedTokenizerFast) -> None:
    t = fim.detect_template(qwen)
    assert t == fim.FimTemplate(
        family="qwen2.5-coder",
        prefix_id=259,
        suffix_id=261,
        middle_id=260,
        stop_ids=frozenset({256, 258, 259, 260, 261, 262, 263, 264}),
        file_sep_id=264,
        bos_id=None,
        dummy_prefix=False,
    )
    # <|im_start|> (257) is not a stop token; <|im_end|> is (and is the eos).
    assert 257 not in t.stop_ids and qwen.eos_token_id == 258


def test_detect_qwen_eos_outside_list_is_a_stop() -> None:
    tok = byte_tokenizer(QWEN_SPECIALS + ["<|custom_eos|>"], eos="<|custom_eos|>")
    t = fim.detect_template(tok)
    assert sid(tok, "<|custom_eos|>") in t.stop_ids


def test_detect_starcoder2(starcoder: PreTrainedTokenizerFast) -> None:
    t = fim.detect_template(starcoder)
    assert t.family == "starcoder2"
    assert (t.prefix_id, t.suffix_id, t.middle_id) == (257, 259, 258)
    assert t.file_sep_id == 262
    assert t.stop_ids == frozenset({256, 257, 258, 259, 260, 262})
    assert t.bos_id is None  # StarCoder2 prompts take no bos


def test_detect_deepseek(deepseek: PreTrainedTokenizerFast) -> None:
    t = fim.detect_template(deepseek)
    assert t.family == "deepseek-coder"
    assert (t.prefix_id, t.suffix_id, t.middle_id) == (259, 258, 260)
    assert t.file_sep_id is None
    assert t.stop_ids == frozenset({257, 258, 259, 260, 261})
    assert t.bos_id == 256


def test_detect_codellama(codellama: PreTrainedTokenizerFast) -> None:
    t = fim.detect_template(codellama)
    assert t.family == "codellama"
    pre, suf, mid, eot = (sid(codellama, s) for s in ("▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>"))
    assert (t.prefix_id, t.suffix_id, t.middle_id) == (pre, suf, mid)
    assert t.stop_ids == frozenset({eot, 2, pre, suf, mid})
    assert t.bos_id == 1
    assert t.dummy_prefix is True


def test_detect_codellama_plain_spelling() -> None:
    tok = byte_tokenizer(["<s>", "</s>", "<PRE>", "<SUF>", "<MID>", "<EOT>"], bos="<s>", eos="</s>")
    t = fim.detect_template(tok)
    assert t.family == "codellama"
    assert (t.prefix_id, t.suffix_id, t.middle_id) == (258, 259, 260)
    assert t.stop_ids == frozenset({257, 258, 259, 260, 261})
    assert t.bos_id == 256 and t.dummy_prefix is False


def test_no_fim_tokens_is_a_clear_error() -> None:
    chat = byte_tokenizer(CHAT_SPECIALS, eos="<|im_end|>", name="acme/Chat-7B-Instruct")
    with pytest.raises(NoFimTokens) as info:
        fim.detect_template(chat)
    err = info.value
    assert err.code == "model_no_fim"
    assert "acme/Chat-7B-Instruct" in err.message
    for word in ("Qwen2.5-Coder", "StarCoder2", "DeepSeek-Coder", "CodeLlama", "instruct"):
        assert word in err.message
    assert err.hint


def test_partial_family_is_not_detected() -> None:
    tok = byte_tokenizer(["<|endoftext|>", "<|fim_prefix|>", "<|fim_suffix|>"])
    with pytest.raises(NoFimTokens):
        fim.detect_template(tok)


# ---------------------------------------------------------------------------
# encode_text: user text never becomes a control token


@pytest.mark.parametrize(
    "fixture,control",
    [
        ("qwen", QWEN_SPECIALS),
        ("starcoder", STARCODER2_SPECIALS),
        ("deepseek", DEEPSEEK_SPECIALS),
        ("codellama", ["▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>", "<s>", "</s>"]),
    ],
)
def test_encode_text_does_not_parse_special_tokens(
    request: pytest.FixtureRequest, fixture: str, control: list[str]
) -> None:
    tok = request.getfixturevalue(fixture)
    text = "x = '" + "".join(control) + "' # <|fim_prefix|><PRE> done\n"
    ids = fim.encode_text(tok, text)
    control_ids = {sid(tok, s) for s in control}
    assert not control_ids.intersection(ids)
    if fixture != "codellama":  # its decoder drops the dummy-prefix space
        assert tok.decode(ids) == text


def test_encode_text_qwen_literal_fim_prefix(qwen: PreTrainedTokenizerFast) -> None:
    ids = fim.encode_text(qwen, "a<|fim_prefix|>b")
    assert ids == b("a<|fim_prefix|>b")
    # The plain tokenizer call *would* parse it: that is what we avoid.
    assert qwen("a<|fim_prefix|>b", add_special_tokens=False)["input_ids"] == [
        *b("a"), 259, *b("b")
    ]


def test_encode_text_empty(qwen: PreTrainedTokenizerFast) -> None:
    assert fim.encode_text(qwen, "") == []


def test_encode_text_non_special_added_control_tokens_are_split() -> None:
    # A converted tokenizer that lost the "special" flag on its FIM tokens:
    # split_special_tokens does not protect them, the fallback does.
    tok = byte_tokenizer(QWEN_SPECIALS, special_flag=False)
    text = "s = '<|fim_middle|>'\n"
    ids = fim.encode_text(tok, text)
    assert sid(tok, "<|fim_middle|>") not in ids
    assert tok.decode(ids) == text


def test_encode_text_unicode(qwen: PreTrainedTokenizerFast) -> None:
    text = "naïve = '日本語' # ✓\n"
    assert fim.encode_text(qwen, text) == b(text)


# ---------------------------------------------------------------------------
# build_prompt


def test_build_prompt_qwen_psm(qwen: PreTrainedTokenizerFast) -> None:
    t = fim.detect_template(qwen)
    ids = fim.build_prompt(t, b("def f():\n    "), b("\n"))
    assert ids == [259, *b("def f():\n    "), 261, *b("\n"), 260]


def test_build_prompt_qwen_repo_context(qwen: PreTrainedTokenizerFast) -> None:
    t = fim.detect_template(qwen)
    ids = fim.build_prompt(
        t, b("x = "), b(""), [("lib/a.py", b("A = 1\n"))],
        current_path="main.py", tokenizer=qwen,
    )
    assert ids == [
        264, *b("lib/a.py\n"), *b("A = 1\n"),
        264, *b("main.py\n"),
        259, *b("x = "), 261, 260,
    ]
    assert qwen.decode(ids) == (
        "<|file_sep|>lib/a.py\nA = 1\n"
        "<|file_sep|>main.py\n<|fim_prefix|>x = <|fim_suffix|><|fim_middle|>"
    )


def test_build_prompt_starcoder2_repo_context(starcoder: PreTrainedTokenizerFast) -> None:
    t = fim.detect_template(starcoder)
    ids = fim.build_prompt(
        t, b("x = "), b("\n"), [("a.py", b("A = 1\n"))],
        current_path="main.py", tokenizer=starcoder,
    )
    assert starcoder.decode(ids) == (
        "<file_sep>a.py\nA = 1\n"
        "<file_sep><fim_prefix>main.py\nx = <fim_suffix>\n<fim_middle>"
    )


def test_build_prompt_spm_puts_the_suffix_first(qwen: PreTrainedTokenizerFast,
                                               starcoder: PreTrainedTokenizerFast) -> None:
    t = fim.detect_template(qwen)
    ids = fim.build_prompt(t, b("def f():\n    "), b("\n"), order="spm")
    assert ids == [261, *b("\n"), 259, *b("def f():\n    "), 260]
    ids = fim.build_prompt(t, b("x = "), b("\n"), [("a.py", b("A = 1\n"))],
                           current_path="main.py", tokenizer=qwen, order="spm")
    assert qwen.decode(ids) == "<|file_sep|>a.py\nA = 1\n<|file_sep|>main.py\n<|fim_suffix|>\n<|fim_prefix|>x = <|fim_middle|>"
    s = fim.detect_template(starcoder)
    ids = fim.build_prompt(s, b("x = "), b("\n"), [("a.py", b("A = 1\n"))],
                           current_path="main.py", tokenizer=starcoder, order="spm")
    assert starcoder.decode(ids) == "<file_sep>a.py\nA = 1\n<file_sep><fim_suffix>\n<fim_prefix>main.py\nx = <fim_middle>"
    with pytest.raises(ValueError, match="psm"):
        fim.build_prompt(t, b("x"), b(""), order="mps")  # type: ignore[arg-type]


def test_spm_typing_only_appends(qwen: PreTrainedTokenizerFast) -> None:
    """With SPM, the prompt of a keystroke extends the previous one up to
    the last few prefix tokens (retokenization at the cursor), so the KV
    cache covers all of the suffix and the prefix."""
    t = fim.detect_template(qwen)
    text = "def area(r):\n    return 3.14159 * r * r\n"
    suffix = "\n\nprint(area(2))\n"
    cut = text.index("return")
    prev = None
    for i in range(cut, len(text)):
        p = fim.make_prompt(t, qwen, fim.Place(text[:i], suffix), fim.Budget(200, 50), order="spm")
        if prev is not None:
            same = 0
            while same < min(len(prev), len(p.ids)) and prev[same] == p.ids[same]:
                same += 1
            assert same >= len(prev) - 3, (i, same, len(prev))
        prev = p.ids


def test_build_prompt_repo_context_needs_tokenizer(qwen: PreTrainedTokenizerFast) -> None:
    t = fim.detect_template(qwen)
    with pytest.raises(ValueError):
        fim.build_prompt(t, b("x"), b(""), [("a.py", b("A\n"))])


def test_build_prompt_deepseek_bos_and_context_in_prefix(deepseek: PreTrainedTokenizerFast) -> None:
    t = fim.detect_template(deepseek)
    ids = fim.build_prompt(t, b("x = "), b("\n"), [("a.py", b("# a.py\n"))])
    assert ids == [256, 259, *b("# a.py\n"), *b("x = "), 258, *b("\n"), 260]
    assert deepseek.decode(ids) == (
        "<｜begin▁of▁sentence｜><｜fim▁begin｜># a.py\nx = <｜fim▁hole｜>\n<｜fim▁end｜>"
    )


def test_make_prompt_codellama_matches_reference_layout(codellama: PreTrainedTokenizerFast) -> None:
    t = fim.detect_template(codellama)
    p = fim.make_prompt(t, codellama, fim.Place("def f(x):\n    ", "\n    return x\n"), fim.Budget(100, 100))
    toks = codellama.convert_ids_to_tokens(p.ids)
    # bos, <PRE>, " " + prefix (one leading "▁"), <SUF>, suffix without a
    # leading "▁", <MID> -- CodeLlama's infilling_prompt_tokens.
    assert toks == [
        "<s>", "▁<PRE>", "▁", "d", "e", "f", "▁", "f", "(", "x", ")", ":", "<0x0A>",
        "▁", "▁", "▁", "▁", "▁<SUF>", "<0x0A>", "▁", "▁", "▁", "▁", "r", "e", "t", "u",
        "r", "n", "▁", "x", "<0x0A>", "▁<MID>",
    ]
    assert p.n_prefix_tokens == 15 and p.n_suffix_tokens == 14


def test_make_prompt_codellama_empty_prefix(codellama: PreTrainedTokenizerFast) -> None:
    t = fim.detect_template(codellama)
    p = fim.make_prompt(t, codellama, fim.Place("", "x"), fim.Budget(10, 10))
    assert codellama.convert_ids_to_tokens(p.ids) == ["<s>", "▁<PRE>", "▁", "▁<SUF>", "x", "▁<MID>"]


# ---------------------------------------------------------------------------
# make_prompt


def test_make_prompt_qwen_plain(qwen: PreTrainedTokenizerFast) -> None:
    t = fim.detect_template(qwen)
    p = fim.make_prompt(t, qwen, fim.Place("a = 1\nb = ", "\nc = 3\n"), fim.Budget(100, 100))
    assert p == fim.FimPrompt(
        ids=[259, *b("a = 1\nb = "), 261, *b("\nc = 3\n"), 260],
        prefix_text="a = 1\nb = ",
        suffix_text="\nc = 3\n",
        n_prefix_tokens=10,
        n_suffix_tokens=7,
        n_context_tokens=0,
    )


def test_make_prompt_injection_is_impossible(qwen: PreTrainedTokenizerFast) -> None:
    t = fim.detect_template(qwen)
    evil = "s = '<|fim_suffix|><|fim_middle|><|endoftext|><|file_sep|>'\n"
    p = fim.make_prompt(t, qwen, fim.Place(evil, evil, context=[("x.py", evil)], current_path="<|repo_name|>"),
                        fim.Budget(500, 500))
    for control in (259, 260, 261, 256, 263):
        expected = 1 if control in (259, 260, 261) else 0
        assert p.ids.count(control) == expected
    assert p.ids.count(264) == 2  # our own two file separators only


def test_make_prompt_context_qwen(qwen: PreTrainedTokenizerFast) -> None:
    t = fim.detect_template(qwen)
    context = [ContextChunk(uri="a.py", text="A = 1"), ("b.py", "B = 2\n")]
    p = fim.make_prompt(t, qwen, fim.Place("x = ", "", context=context, current_path="main.py"), fim.Budget(100, 100))
    assert qwen.decode(p.ids) == (
        "<|file_sep|>a.py\nA = 1\n<|file_sep|>b.py\nB = 2\n<|file_sep|>main.py\n"
        "<|fim_prefix|>x = <|fim_suffix|><|fim_middle|>"
    )
    assert p.n_context_tokens == len(p.ids) - 3 - 4


def test_make_prompt_context_budget(qwen: PreTrainedTokenizerFast) -> None:
    t = fim.detect_template(qwen)
    big = "".join(f"line{i:03d}\n" for i in range(100))  # 8 tokens a line
    p = fim.make_prompt(t, qwen, fim.Place("x", "", context=[("a.py", big), ("b.py", "B\n")]),
                        fim.Budget(100, 100, context=40))
    # 1 separator + "a.py\n" (5) leaves 34: four whole lines (32 tokens); the
    # remaining 2 cannot hold b.py's separator and path.
    assert qwen.decode(p.ids) == (
        "<|file_sep|>a.py\nline000\nline001\nline002\nline003\n<|file_sep|>"
        "<|fim_prefix|>x<|fim_suffix|><|fim_middle|>"
    )
    assert p.n_context_tokens == 39


def test_make_prompt_context_comment_header_deepseek(deepseek: PreTrainedTokenizerFast) -> None:
    t = fim.detect_template(deepseek)
    place = fim.Place("def main():\n    ", "", context=[("util.py", "def helper():\n\n    return 1\n")],
                      language="python")
    p = fim.make_prompt(t, deepseek, place, fim.Budget(100, 100))
    assert deepseek.decode(p.ids) == (
        "<｜begin▁of▁sentence｜><｜fim▁begin｜># Path: util.py\n# def helper():\n#\n#     return 1\n"
        "def main():\n    <｜fim▁hole｜><｜fim▁end｜>"
    )
    assert p.prefix_text == "def main():\n    "
    assert p.n_context_tokens == len(b("# Path: util.py\n# def helper():\n#\n#     return 1\n"))


def test_comment_header_languages() -> None:
    assert fim.comment_header("typescript", "a.ts", "let x = 1;\n") == "// Path: a.ts\n// let x = 1;\n"
    assert fim.comment_header("lua", "a.lua", "x = 1") == "-- Path: a.lua\n-- x = 1\n"
    assert fim.comment_header(None, "a", "") == "# Path: a\n"
    assert fim.comment_header("html", "i.html", "<p>-->x</p>\n") == (
        "<!-- Path: i.html\n<p>- ->x</p>\n-->\n"
    )
    assert fim.comment_header("css", "s.css", "a { }\n") == "/* Path: s.css\na { }\n*/\n"


# ---------------------------------------------------------------------------
# windowing


def numbered(n: int, start: int = 0) -> str:
    return "".join(f"row {i:04d} = value\n" for i in range(start, start + n))  # 17 tokens


def window_prefix(prefix: str, tokenizer: PreTrainedTokenizerFast, max_tokens: int, grain_lines: int = 16) -> str:
    return fit_prefix(prefix, tokenizer, max_tokens, grain_lines, lambda t: fim.encode_text(tokenizer, t))[0]


def window_suffix(suffix: str, tokenizer: PreTrainedTokenizerFast, max_tokens: int) -> str:
    return fit_suffix(suffix, tokenizer, max_tokens, lambda t: fim.encode_text(tokenizer, t))[0]


def test_window_prefix_whole_when_it_fits(qwen: PreTrainedTokenizerFast) -> None:
    text = numbered(10) + "x = "
    assert window_prefix(text, qwen, 1000) == text


def test_window_prefix_zero_budget(qwen: PreTrainedTokenizerFast) -> None:
    assert window_prefix("abc\ndef", qwen, 0) == ""


def test_window_prefix_cuts_on_the_grid(qwen: PreTrainedTokenizerFast) -> None:
    text = numbered(200) + "    result = "  # 200 * 17 + 13 tokens
    out = window_prefix(text, qwen, 1024)
    # 59 lines (1003 tokens) + the cursor line fit; the grid (16) rounds the
    # cut up from line 141 to line 144.
    assert out == numbered(56, start=144) + "    result = "
    assert len(fim.encode_text(qwen, out)) == 56 * 17 + 13


def test_window_prefix_is_stable_while_typing(qwen: PreTrainedTokenizerFast) -> None:
    base = numbered(120)
    budget = 1024
    cuts = []
    typed = ""
    for ch in "result = compute(alpha, beta, gamma) + other_function_name(delta) * 2" * 4:
        typed += ch
        out = window_prefix(base + typed, qwen, budget)
        assert out.endswith(typed)
        assert len(fim.encode_text(qwen, out)) <= budget
        cut_line = (base + typed)[: len(base + typed) - len(out)].count("\n")
        assert cut_line % 16 == 0
        if cuts and cut_line != cuts[-1]:
            # The cut moved: only because the old window no longer fit.
            old = "".join(f"row {i:04d} = value\n" for i in range(cuts[-1], 120)) + typed
            assert len(fim.encode_text(qwen, old)) > budget
            assert cut_line == cuts[-1] + 16
        cuts.append(cut_line)
    # 56 lines from 64 hold 952 tokens: the cut moves once the typed line
    # passes 72 tokens, by one grain.
    assert cuts[0] == 64 and cuts[-1] == 80


def test_window_prefix_new_lines_do_not_move_the_cut(qwen: PreTrainedTokenizerFast) -> None:
    base = numbered(120)
    first = window_prefix(base + "a = 1", qwen, 1024)
    second = window_prefix(base + "a = 1\nb", qwen, 1024)
    assert second.startswith(first)


def test_window_prefix_long_last_line_cut_inside(qwen: PreTrainedTokenizerFast) -> None:
    text = "first\n" + "x" * 50
    out = window_prefix(text, qwen, 20)
    assert out == "x" * 20


def test_window_prefix_small_budget_lowers_the_grain(qwen: PreTrainedTokenizerFast) -> None:
    text = numbered(40) + "y"
    out = window_prefix(text, qwen, 100)  # grain 1: 5 lines (85 tokens) + "y"
    assert out == numbered(5, start=35) + "y"


def test_window_prefix_custom_grain(qwen: PreTrainedTokenizerFast) -> None:
    text = numbered(400) + "z"
    out = window_prefix(text, qwen, 4096, grain_lines=50)
    assert out == numbered(200, start=200) + "z"  # 240 lines would fit: from 160


def test_window_suffix_keeps_whole_lines_from_the_start(qwen: PreTrainedTokenizerFast) -> None:
    text = ")\n" + numbered(100)
    out = window_suffix(text, qwen, 100)
    assert out == ")\n" + numbered(5)  # 2 + 5 * 17 = 87 tokens; 6 lines: 104
    assert window_suffix(text, qwen, 10_000) == text
    assert window_suffix(text, qwen, 0) == ""


def test_window_suffix_long_first_line_cut_inside(qwen: PreTrainedTokenizerFast) -> None:
    assert window_suffix("y" * 50 + "\nz\n", qwen, 7) == "y" * 7


def test_window_unicode(qwen: PreTrainedTokenizerFast) -> None:
    text = "".join(f"# 日本語 {i}\n" for i in range(50)) + "s = '"
    out = window_prefix(text, qwen, 200)
    assert len(fim.encode_text(qwen, out)) <= 200
    assert out.endswith("s = '") and (out.startswith("# ") or out == "s = '")


def test_make_prompt_windows_both_sides(qwen: PreTrainedTokenizerFast) -> None:
    t = fim.detect_template(qwen)
    prefix = numbered(200) + "x = "
    suffix = "\n" + numbered(200)
    p = fim.make_prompt(t, qwen, fim.Place(prefix, suffix), fim.Budget(1024, 60))
    assert p.prefix_text == numbered(56, start=144) + "x = "
    assert p.suffix_text == "\n" + numbered(3)
    assert p.ids == [259, *b(p.prefix_text), 261, *b(p.suffix_text), 260]
    assert p.n_prefix_tokens == 56 * 17 + 4 and p.n_suffix_tokens == 52


def test_make_prompt_codellama_budgets_hold(codellama: PreTrainedTokenizerFast) -> None:
    t = fim.detect_template(codellama)
    prefix = numbered(100) + "x = "
    suffix = "\n" + numbered(100)
    p = fim.make_prompt(t, codellama, fim.Place(prefix, suffix), fim.Budget(300, 50))
    assert 250 < p.n_prefix_tokens <= 300 and 30 < p.n_suffix_tokens <= 50
    assert prefix.endswith(p.prefix_text) and suffix.startswith(p.suffix_text)
    assert p.prefix_text.startswith("row ") and p.suffix_text.endswith("\n")
    toks = codellama.convert_ids_to_tokens(p.ids)
    assert toks[:4] == ["<s>", "▁<PRE>", "▁", "r"]
    assert len(p.ids) == 3 + 1 + p.n_prefix_tokens + p.n_suffix_tokens


# ---------------------------------------------------------------------------
# outline of what the window left out

OUTLINE_SRC = '''\
import os
from collections import (deque,
                         OrderedDict)


def helper(a, b):
    """Docstring text:
    not a header.
    """
    return a + b


class Parser:
    def parse(self, text,
              strict=True):
        for line in text:
            x = 1
            y = 2
            z = 3
            w = 4
            out = helper('''


def test_scope_outline_keeps_enclosing_headers_imports_and_used_definitions() -> None:
    cut = OUTLINE_SRC.index("            x = 1")       # the window starts at "x = 1"
    items = fim.scope_outline(OUTLINE_SRC, cut, ")\n")
    texts = [t for _, t in items]
    assert texts == [
        "import os\n",
        "from collections import (deque,\n                         OrderedDict)\n",
        "def helper(a, b):\n",                              # used at the cursor: helper(
        "class Parser:\n",
        "    def parse(self, text,\n              strict=True):\n",
        "        for line in text:\n",
    ]
    pri = dict((t, p) for p, t in items)
    assert pri["class Parser:\n"] == 0 and pri["def helper(a, b):\n"] == 1 and pri["import os\n"] == 2
    assert not any("Docstring" in t or "not a header" in t for t in texts)
    assert fim.scope_outline(OUTLINE_SRC, 0, "") == []       # nothing cut: no outline


def test_make_prompt_puts_the_outline_in_front_of_the_window(qwen: PreTrainedTokenizerFast) -> None:
    t = fim.detect_template(qwen)
    budget = len(b("            y = 2\n            z = 3\n            w = 4\n            out = helper("))
    p = fim.make_prompt(t, qwen, fim.Place(OUTLINE_SRC, ")\n"), fim.Budget(budget, 10, outline=95, grain_lines=1))
    assert p.prefix_text.startswith("            y = 2")
    text = qwen.decode(p.ids)
    # the innermost headers first until the budget is spent (94 of 95 byte tokens), shown in file order
    assert "<|fim_prefix|>class Parser:\n    def parse(self, text,\n              strict=True):\n" \
           "        for line in text:\n            y = 2" in text
    assert p.n_prefix_tokens == budget and p.n_context_tokens == len(p.ids) - 3 - budget - len(b(")\n"))
    assert p.n_context_tokens == 94
    off = fim.make_prompt(t, qwen, fim.Place(OUTLINE_SRC, ")\n"), fim.Budget(budget, 10, outline=0, grain_lines=1))
    assert off.n_context_tokens == 0 and qwen.decode(off.ids).startswith("<|fim_prefix|>            y = 2")


BELOW_PREFIX = """\
import os


def helper():
    pass


class Cache:
    def __init__(self, size, loader=load_from):
        """

BELOW_SUFFIX = '''
        self.hits = 0

    def get(self, key):
        """Docstring naming self.ghost, not code."""
        self.lookups += 1
        if key in self.store:
            self.hits += 1
            return self.store[key]
        return self._load(key)

    def _load(self, key):
        value = load_from(key, self.root)
        self.store[key] = value
        return value

    def shout(self): return "a long line, no outline: !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" + str(self.loud)


def load_from(key, root):
    return os.path.join(root, key)


def unrelated():
    return self.other


def far():
    pass
'''

BELOW_KEPT = "\n        self.hits = 0\n\n"   # what the suffix window shows


def test_below_outline_keeps_new_attributes_used_definitions_and_the_nearest_others() -> None:
    assert BELOW_SUFFIX.startswith(BELOW_KEPT)
    items = fim.below_outline(BELOW_PREFIX, BELOW_SUFFIX, len(BELOW_KEPT), BELOW_PREFIX + BELOW_KEPT)
    assert items == [
        (3, "    def get(self, key):\n"),          # the class's methods, nearest first
        (0, "        self.lookups += 1\n"),        # attributes the windows never name, first use each
        (0, "        if key in self.store:\n"),    # (self.hits is shown, self._load( is a method call)
        (4, "    def _load(self, key):\n"),
        (0, "        value = load_from(key, self.root)\n"),
        (1, "def load_from(key, root):\n"),       # used at the cursor (the default argument)
        (5, "def unrelated():\n"),                # no self.other: the class has ended
        (6, "def far():\n"),
    ]
    assert not any("ghost" in t or "loud" in t for _, t in items)   # a docstring, a line too long
    # nothing cut below, or a cursor in no scope: no outline
    assert fim.below_outline(BELOW_PREFIX, BELOW_SUFFIX, len(BELOW_SUFFIX), BELOW_PREFIX + BELOW_SUFFIX) == []
    assert fim.below_outline("x = ", "\ny = 1\n\ndef f():\n    pass\n", 1, "x = \n") == []
    # outside a method: no attributes, definitions at the module's depth only
    items = fim.below_outline("def top():\n    ", BELOW_SUFFIX, len(BELOW_KEPT), "def top():\n    " + BELOW_KEPT)
    assert [t for _, t in items] == ["def load_from(key, root):\n", "def unrelated():\n", "def far():\n"]


def test_scope_outline_adds_the_other_definitions_nearest_first() -> None:
    src = "def a():\n    pass\n\n\ndef b():\n    pass\n\n\nclass C:\n    def m(self):\n        pass\n\n" \
          "    def n(self):\n        x = 1\n        "
    cut = src.index("        x = 1")
    items = fim.scope_outline(src, cut, "\n", near_lines=1)
    assert items == [(5, "def a():\n"), (4, "def b():\n"), (0, "class C:\n"), (3, "    def m(self):\n"),
                     (0, "    def n(self):\n")]


def test_fit_outlines_share_one_budget_by_priority_then_nearness(qwen: PreTrainedTokenizerFast) -> None:
    above = [(3, "def far_above():\n"), (2, "import os\n"), (0, "class C:\n")]
    below = [(0, "    self.x += 1\n"), (3, "def near_below():\n"), (4, "def far_below():\n")]
    budget = len(b("class C:\n    self.x += 1\nimport os\n")) + len(b("def near_below():\n"))
    assert fim.fit_outlines(qwen, above, below, budget) == ("import os\nclass C:\n",
                                                           "    self.x += 1\ndef near_below():\n")
    assert fim.fit_outlines(qwen, above, below, 0) == ("", "")
    # at equal priority the item nearest the cursor first: the last above, the first below
    assert fim.fit_outlines(qwen, [(3, "def a():\n"), (3, "def b():\n")], [], len(b("def b():\n"))) == \
        ("def b():\n", "")


def test_make_prompt_puts_the_below_outline_after_the_suffix_window(qwen: PreTrainedTokenizerFast) -> None:
    t = fim.detect_template(qwen)
    place = fim.Place(BELOW_PREFIX, BELOW_SUFFIX)
    p = fim.make_prompt(t, qwen, place, fim.Budget(1000, len(b(BELOW_KEPT)), outline=60))
    text = qwen.decode(p.ids)
    assert p.suffix_text == BELOW_KEPT and p.n_suffix_tokens == len(b(BELOW_KEPT))
    # the three attribute lines (59 byte tokens) fit, the rest does not; after the window, in file order
    below = "        self.lookups += 1\n        if key in self.store:\n"
    assert text.endswith("<|fim_suffix|>" + BELOW_KEPT + below + "<|fim_middle|>"), text
    assert p.n_context_tokens == len(b(below)) and len(p.ids) == 3 + p.n_prefix_tokens + p.n_suffix_tokens + \
        p.n_context_tokens
    off = fim.make_prompt(t, qwen, place, fim.Budget(1000, len(b(BELOW_KEPT)), outline=0))
    assert qwen.decode(off.ids).endswith("<|fim_suffix|>" + BELOW_KEPT + "<|fim_middle|>")
    assert off.n_context_tokens == 0


def test_the_outline_keeps_its_part_of_the_context_budget_from_the_chunks(qwen: PreTrainedTokenizerFast) -> None:
    t = fim.detect_template(qwen)
    chunk = ("other.py", "".join(f"line_{i} = {i}\n" for i in range(200)))     # would fill any budget
    place = fim.Place(BELOW_PREFIX, BELOW_SUFFIX, context=[chunk])
    p = fim.make_prompt(t, qwen, place, fim.Budget(1000, len(b(BELOW_KEPT)), context=160, outline=60))
    text = qwen.decode(p.ids)
    assert text.endswith(BELOW_KEPT + "        self.lookups += 1\n        if key in self.store:\n<|fim_middle|>")
    assert "line_0 = 0" in text and p.n_context_tokens <= 160
    none = fim.make_prompt(t, qwen, place, fim.Budget(1000, len(b(BELOW_KEPT)), context=160, outline=0))
    assert qwen.decode(none.ids).count("line_") > text.count("line_")    # off: the chunks get it all


def test_typing_on_the_cursor_line_keeps_the_outlines(qwen: PreTrainedTokenizerFast) -> None:
    # "far" typed in full names a definition below; with a lead the outline ignores the line being typed,
    # so the prompt before the middle token (the cached part) stays the same keystroke after keystroke
    t = fim.detect_template(qwen)
    heads = []
    memo = fim.WindowMemo()
    anchor = len(BELOW_PREFIX) - len("        ")
    for typed in ("x = fa", "x = far", "x = far(", "x = far()\n        y = far"):   # a typing run: one anchor
        prefix = BELOW_PREFIX + typed
        place = fim.Place(prefix, BELOW_SUFFIX, lead_from=anchor)
        budget = fim.Budget(1000, len(b(BELOW_KEPT)), outline=60)
        p = fim.make_prompt(t, qwen, place, budget, memo=memo)
        assert p == fim.make_prompt(t, qwen, place, budget)
        heads.append(p.ids[: p.ids.index(t.middle_id)])
    assert all(h == heads[0] for h in heads)
    assert memo.hits >= 3 * 3     # the prefix window, the suffix window and the outlines, after the first
    assert qwen.decode(heads[0]).endswith(BELOW_KEPT + "        self.lookups += 1\n        if key in self.store:\n")
    # the same name typed on a line above the cursor's is used near it: its definition ranks before the others
    for typed, below in (("x = far(", "def unrelated():\n"), ("x = far()\n        ", "def far():\n")):
        prefix = BELOW_PREFIX + typed
        p = fim.make_prompt(t, qwen, fim.Place(prefix, BELOW_SUFFIX, lead_from=fim.line_anchor(prefix)),
                            fim.Budget(1000, len(b(BELOW_KEPT)), outline=43))
        text = qwen.decode(p.ids[: p.ids.index(t.middle_id)])
        assert text.endswith(BELOW_KEPT + "        self.lookups += 1\n" + below), typed


def test_make_prompt_lone_file_has_no_path_header(qwen: PreTrainedTokenizerFast) -> None:
    # measured on the embedded model: the path alone in front of a lone file made answers worse
    t = fim.detect_template(qwen)
    p = fim.make_prompt(t, qwen, fim.Place("x = ", "\n", current_path="main.py"), fim.Budget(100, 100))
    assert qwen.decode(p.ids) == "<|fim_prefix|>x = <|fim_suffix|>\n<|fim_middle|>"


def test_document_window_is_what_an_editor_sends() -> None:
    text = "".join(f"{i:05d}\n" for i in range(3000))         # 18000 chars, lines of 6
    assert document_window(text, 12_000) == (0, len(text))  # the defaults hold this file whole
    start, end = document_window(text, 12_000, 5000, 100)
    assert start % 6 == 0 and 12_000 - 5000 <= start <= 12_000 - 5000 + DOCUMENT_GRAIN + 6
    assert end <= 12_100 and text[end - 1] == "\n"
    # nearby cursors share the start (a grid of DOCUMENT_GRAIN characters)
    assert document_window(text, 12_006, 5000, 100)[0] == start
