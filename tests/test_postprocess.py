"""Post-processing: every case asserts the exact text the editor would show."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soldaemon.pipeline.ending import TextEnding, decide_multiline, postprocess
from soldaemon.pipeline.ending.lines import cursor_at
from soldaemon.pipeline.ending.text import may_repeat_below


def pp(text: str, prefix: str, suffix: str = "", *, multi: bool = True, max_lines: int = 10) -> str:
    return postprocess(text, prefix=prefix, suffix=suffix, multiline=multi, max_lines=max_lines)


# ---------------------------------------------------------------------------
# decide_multiline


@pytest.mark.parametrize(
    "prefix,suffix,expected",
    [
        ("def f():", "", True),                       # block opener at end of line
        ("def f():\n    ", "", True),                 # blank (indented) line
        ("", "", True),                               # empty file
        ("class A:\n    def m(self):\n", "\n", True),  # empty line
        ("foo(", ")", True),                          # only a closer after the cursor
        ("foo(", ");\n", True),
        ("if (x) {", "}", True),
        ("items.map(x =>", ")", True),
        ("case Just x ->", "", True),
        ("for i in 1..10 do", "", True),
        ("if x then", "\n", True),
        ("x = foo(a, ", ", c)\n", False),             # middle of a line
        ("x = ", "y\n", False),
        ("return fo", "o(bar)", False),
        ("    # compute the:", "", False),            # comment line
        ("// loop {", "", False),
        ("-- select (", "", False),
        ("x = compute(a)", "\n", False),              # end of a complete statement
        ("x = 1", "  ", False),
        ('d = {"a":', "}", False),                    # ':' inside an open bracket
        ("a[1:", "]", False),
        ("std::", "", False),                         # '::' is no block
        ("ptr->", "", False),                         # member access, not an arrow
        ("undo", "", False),                          # 'do' only as a word
    ],
)
def test_decide_multiline_auto(prefix: str, suffix: str, expected: bool) -> None:
    assert decide_multiline(prefix, suffix, "auto") is expected


def test_decide_multiline_explicit_modes() -> None:
    assert decide_multiline("x = foo(a, ", ", c)", "multi") is True
    assert decide_multiline("def f():\n    ", "", "single") is False


# ---------------------------------------------------------------------------
# single line


def test_single_line_cut_at_first_newline() -> None:
    assert pp("compute(1)\nprint(x)", "x = ", "\n", multi=False) == "compute(1)"


def test_single_line_leading_newline_gives_nothing() -> None:
    assert pp("\nprint(x)", "x = 1", "", multi=False) == ""
    assert pp("  \n  foo()", "x = 1", "\n", multi=False) == ""


def test_single_line_in_the_middle_of_a_line() -> None:
    assert pp("b", "foo(a, ", ", c)\n", multi=False) == "b"
    # The model ran on into the rest of the line: the repeat is cut.
    assert pp("b, c)", "foo(a, ", ", c)\n", multi=False) == "b"
    assert pp("x + 1) * 2", "y = (", ") * 2\n", multi=False) == "x + 1"


def test_closing_paren_already_in_suffix() -> None:
    assert pp("a, b)", "foo(", ")", multi=False) == "a, b"
    assert pp("a, b)", "foo(", ")\n", multi=True) == "a, b"
    assert pp("a, b);", "foo(", ");\n", multi=False) == "a, b"


def test_closing_paren_of_the_completion_is_kept() -> None:
    # g(b) closes its own paren; only the extra one repeats the suffix.
    assert pp("g(b))", "x = f(a, ", ")", multi=False) == "g(b)"
    assert pp("g(b)", "x = f(a, ", ")", multi=False) == "g(b)"
    assert pp("[1, 2]", "f(", ")", multi=False) == "[1, 2]"


def test_closing_quote_already_in_suffix() -> None:
    assert pp('hello")', 'print("', '")', multi=False) == "hello"
    assert pp("it's\"", 'x = "', '"\n', multi=False) == "it's"
    # A string the completion opens itself keeps its quote.
    assert pp('"a")', "x = f(", ")", multi=False) == '"a"'


def test_brackets_and_quotes_nested() -> None:
    assert pp("x]})", "f({a: [", "]})\n", multi=False) == "x"
    assert pp("g(x)]", "y = [", "]", multi=False) == "g(x)"


def test_trailing_whitespace_stripped() -> None:
    assert pp("foo   ", "x = ", "", multi=False) == "foo"
    assert pp("a, b )", "f(", ")", multi=False) == "a, b"


def test_only_whitespace_gives_nothing() -> None:
    assert pp("   ", "x = ", "", multi=False) == ""
    assert pp("", "x = ", "", multi=False) == ""
    assert pp("\n\n  \n", "def f():\n    ", "") == ""


def test_unicode_single_line() -> None:
    assert pp('héllo wörld ✓")', 'print("', '")', multi=False) == "héllo wörld ✓"
    assert pp("「こんにちは」\n次", "s = ", "", multi=False) == "「こんにちは」"


# ---------------------------------------------------------------------------
# multi-line: the enclosing block


def test_multi_after_def_blank_line() -> None:
    assert pp("return 42\n\ndef g():\n    pass", "def f():\n    ") == "return 42"


def test_multi_after_opener_at_end_of_line() -> None:
    text = "\n    y = x + 1\n    return y\n\nprint(f(1))"
    assert pp(text, "def f(x):", "\n") == "\n    y = x + 1\n    return y"


def test_dedent_ends_block_python() -> None:
    prefix = "class A:\n    def m(self):\n        "
    text = "x = 1\n        return x\n\n    def n(self):\n        return 2"
    assert pp(text, prefix) == "x = 1\n        return x"


def test_dedent_nested_blocks_inside_the_completion_are_fine() -> None:
    prefix = "def f(xs):\n    "
    text = "for x in xs:\n        if x:\n            print(x)\n    return 0\nf([])"
    assert pp(text, prefix) == "for x in xs:\n        if x:\n            print(x)\n    return 0"


def test_python_else_at_header_level_continues_the_if_statement() -> None:
    # ``else`` goes on with the ``if`` the completion is in: not a block end.
    assert pp("\n    a()\nelse:\n    b()\nc()", "if x:", "\n") == "\n    a()\nelse:\n    b()"


def test_elif_chain_goes_on_until_it_meets_the_suffix() -> None:
    prefix = "def g(p):\n    r = []\n    if p > 3.9:\n        r.append('A+')\n    elif p > 3.7:\n        "
    suffix = "\n    elif p > 2.7:\n        r.append('B')\n    return r\n"
    text = ("r.append('A')\n    elif p > 3.3:\n        r.append('A-')\n    elif p > 2.7:\n"
            "        r.append('B')\n")
    assert pp(text, prefix, suffix) == "r.append('A')\n    elif p > 3.3:\n        r.append('A-')"


def test_a_branch_the_suffix_already_has_further_down_ends_the_block() -> None:
    # As in fractions.Fraction.__new__: the cursor ends one branch, the model
    # writes the ``str`` branch, which the suffix holds two branches below.
    prefix = ("def f(n):\n    if type(n) is int:\n        a = n\n        return a\n"
              "    elif isinstance(n, Rational):\n        a = n.numerator\n        ")
    suffix = ("\n\n    elif isinstance(n, float):\n        # exact\n        return n.as_integer_ratio()\n\n"
              "    elif isinstance(n, str):\n        m = match(n)\n    return None\n")
    text = "b = n.denominator\n        return a, b\n\n    elif isinstance(n, str):\n        m = parse(n)\n"
    assert pp(text, prefix, suffix) == "b = n.denominator\n        return a, b"
    # The same branch in a later, different statement is no repeat: the
    # statement at the cursor ends at ``return None``.
    later = "\n    elif isinstance(n, float):\n        x()\n    return None\n    if y:\n        z()\n" \
            "    elif isinstance(n, str):\n        w()\n"
    assert pp(text, prefix, later) == text.rstrip("\n")
    # and so is the same condition at another indentation
    inner = "\n    elif isinstance(n, float):\n        if k:\n            q()\n        elif isinstance(n, str):\n" \
            "            w()\n"
    assert pp(text, prefix, inner) == text.rstrip("\n")


def test_except_and_finally_continue_a_try_else_does_not_continue_a_def() -> None:
    prefix = "def f():\n    try:\n        "
    text = "a()\n    except OSError:\n        b()\n    finally:\n        c()\n    d()"
    assert pp(text, prefix, "\n") == "a()\n    except OSError:\n        b()\n    finally:\n        c()"
    # A keyword that cannot follow the header is still the end of the block.
    assert pp("a()\nelse:\n    b()", "def f():\n    ", "\n") == "a()"
    # ``elif`` after a ``for`` body is no continuation.
    assert pp("a()\n    elif y:\n        b()", "def f():\n    for i in x:\n        ", "\n") == "a()"


def test_brace_else_continues_when_the_suffix_does_not_close_the_block() -> None:
    text = "\n  a();\n} else {\n  b();\n}\n\nfunction g() {}"
    assert pp(text, "if (x) {", "\n") == "\n  a();\n} else {\n  b();\n}"
    # The suffix closes the block: the hole ends where the generation meets it.
    assert pp("\n  a();\n} else {\n  b();\n}\n", "if (x) {", "\n}\n") == "\n  a();"


def test_brace_closer_kept_when_suffix_lacks_it() -> None:
    text = "\n  return 1;\n}\n\nfunction g() {}"
    assert pp(text, "function f() {", "\n") == "\n  return 1;\n}"


def test_brace_closer_dropped_when_next_suffix_line_is_it() -> None:
    assert pp("\n  return 1;\n}\n", "function f() {", "\n}\n") == "\n  return 1;"


def test_brace_closer_dropped_when_suffix_closes_the_block_later() -> None:
    prefix = "function f() {\n  "
    assert pp("a();\n}\n", prefix, "\n  more();\n}\n") == "a();"


def test_brace_closer_kept_at_end_of_file() -> None:
    prefix = "int main() {\n    "
    text = "return 0;\n}\n\nint other() {"
    assert pp(text, prefix, "") == "return 0;\n}"


def test_brace_closer_of_another_block_is_not_kept() -> None:
    # The header of the cursor's block is 'if (x) {' at indent 2; a '}' at
    # indent 0 closes something else.
    prefix = "void f() {\n  if (x) {\n    "
    assert pp("go();\n  }\n}\n", prefix, "") == "go();\n  }"


def test_closer_right_after_cursor_becomes_placement() -> None:
    # Cursor between braces: the suffix's '}' ends up on its own line.
    assert pp("\n  go();\n}", "if (x) {", "}") == "\n  go();\n"
    assert pp("\n        go();\n    }", "    if (x) {", "}\n") == "\n        go();\n    "


def test_multi_line_call_arguments() -> None:
    assert pp("\n    a,\n    b,\n)", "result = foo(", ")\n") == "\n    a,\n    b,\n"


def test_python_list_literal_closer_in_suffix() -> None:
    prefix = "x = [\n    1,\n    "
    assert pp("2,\n    3,\n]\n\nprint(x)", prefix, "\n]\n") == "2,\n    3,"


def test_cursor_deeper_than_the_code_keeps_its_level() -> None:
    assert pp("a()\n    b()\nc()", "def f():\n    ") == "a()\n    b()"


def test_top_level_completion_is_bounded_by_max_lines() -> None:
    text = "import os\nimport sys\n\ndef main():\n    pass\n"
    assert pp(text, "", "", max_lines=4) == "import os\nimport sys\n\ndef main():"


def test_tabs() -> None:
    assert pp("x = 1\n\treturn x\nprint(1)", "def f():\n\t") == "x = 1\n\treturn x"


def test_crlf_lines() -> None:
    assert pp("x = 1\r\n    return x\r\n\r\nprint()", "def f():\r\n    ") == "x = 1\r\n    return x"


def test_unicode_multi_line() -> None:
    prefix = "def grüße():\n    "
    text = "print('日本語')\n    return 'ü'\n\nx = 1"
    assert pp(text, prefix) == "print('日本語')\n    return 'ü'"


# ---------------------------------------------------------------------------
# multi-line: max_lines, suffix overlap, repetition, blank lines


def test_max_lines() -> None:
    text = "a = 1\n    b = 2\n    c = 3\n    d = 4"
    assert pp(text, "def f():\n    ", max_lines=2) == "a = 1\n    b = 2"
    assert pp(text, "def f():\n    ", max_lines=1) == "a = 1"


def test_max_lines_leading_newline_not_counted() -> None:
    text = "\n    a = 1\n    b = 2\n    c = 3"
    assert pp(text, "def f():", "\n", max_lines=2) == "\n    a = 1\n    b = 2"


def test_completion_repeating_next_suffix_line() -> None:
    prefix = "def f(x):\n    "
    suffix = "\n    return y\n"
    assert pp("y = x * 2\n    return y\n", prefix, suffix) == "y = x * 2"
    assert pp("y = x * 2\n    return y   \n    z = 0", prefix, suffix) == "y = x * 2"


def test_first_line_on_a_line_of_its_own_repeating_the_line_below() -> None:
    # after Enter (blank cursor line): the model writes the line that is
    # already below the cursor -- showing it would duplicate that line
    prefix = "def f(a):\n    b = a + 1\n    "
    suffix = "\n    x = b * 2\n    return x\n"
    assert pp("x = b * 2\n    return x\n", prefix, suffix) == ""
    assert pp("x = b * 2", prefix, suffix) == ""          # ended by the model after that line
    assert pp("x = b * 3\n    return x\n", prefix, suffix) == "x = b * 3"
    checker = TextEnding(prefix, suffix, True, 10)
    assert not checker.may_stop("x = b * 2")                # the line may still go on
    assert checker.may_stop("x = b * 2\n") and checker.rule == "suffix"
    # text before the cursor on its line: the line is the user's, not a repeat
    assert pp("b * 2\n    y = 1", "def f(a):\n    x = ", suffix) == "b * 2\n    y = 1"
    # at column 0 before existing text the rest of the line is the next line (own rule)
    assert pp("y = 1\n", "def f(a):\n", "    x = b * 2\n") == "y = 1\n"


def test_the_preview_holds_a_first_line_that_may_become_the_line_below() -> None:
    prefix = "def f(a):\n    b = a + 1\n    "
    held = may_repeat_below(cursor_at(prefix, "\n    x = b * 2\n    return x\n"))
    assert held("x") and held("x = b") and held("x = b * 2")      # may still be the line below
    assert held("x = b * 2\n    return")                          # it is: post-processing drops it all
    assert not held("x = b + 1") and not held("x = b * 20") and not held("y")
    assert not held("x = b * 3\n    return x")
    # text before the cursor, or no line below: nothing is held
    assert not may_repeat_below(cursor_at("def f(a):\n    x = ", "\n    x = b * 2\n"))("b * 2")
    assert not may_repeat_below(cursor_at(prefix, "\n"))("x")


def test_completion_repeating_several_suffix_lines() -> None:
    prefix = "def f(x):\n    "
    suffix = "\n\n    z = y + 1\n    return z\n"
    text = "y = x * 2\n\n    z = y + 1\n    return z\n"
    assert pp(text, prefix, suffix) == "y = x * 2"


def test_completion_skipping_to_a_later_suffix_line() -> None:
    # the model wrote the hole, skipped the suffix's next line and went on with the one after it
    prefix = "def f(x):\n    "
    suffix = "\n    z = y + 1\n    total = z * scale\n    return total\n"
    text = "y = x * 2\n    total = z * scale\n    return total"
    assert pp(text, prefix, suffix) == "y = x * 2"
    checker = TextEnding(prefix, suffix, True, 10)
    assert not checker.may_stop("y = x * 2\n    total = z")
    assert checker.may_stop("y = x * 2\n    total = z * scale\n")
    # a short line recurring further down is not cut: only the next line counts for it
    suffix = "\n    z = y + 1\n    pass\n"
    assert pp("y = 0\n    pass\n    w = 1", prefix, suffix) == "y = 0\n    pass\n    w = 1"
    # three lines further is not looked at
    suffix = "\n    a = 1\n    b = 2\n    c = 3\n    total = z * scale\n"
    assert pp(text, prefix, suffix) == text


def test_same_text_at_other_indentation_is_not_the_suffix_line() -> None:
    prefix = "def f(x):\n    "
    suffix = "\nreturn y\n"  # at column 0
    assert pp("if x:\n        return y\n    y = 1", prefix, suffix) == "if x:\n        return y\n    y = 1"


def test_repetition_cut_after_first() -> None:
    assert pp("import os\nimport os\nimport os\nimport os", "") == "import os"
    text = "print(i)\n    print(i)\n    print(i)\n    print(i)"
    assert pp(text, "for i in range(3):\n    ") == "print(i)"
    assert pp("a = 1\n\na = 1\n\na = 1\n", "") == "a = 1"


def test_two_repeats_are_kept() -> None:
    assert pp("x()\nx()\ny()", "") == "x()\nx()\ny()"


def test_repetition_after_other_lines() -> None:
    text = "a = 0\nb += 1\nb += 1\nb += 1\nc = 2"
    assert pp(text, "") == "a = 0\nb += 1"


def test_trailing_blank_lines_cut() -> None:
    assert pp("x = 1\n\n\n", "def f():\n    ") == "x = 1"
    assert pp("\n    x = 1\n    \n", "def f():", "\n") == "\n    x = 1"


# ---------------------------------------------------------------------------
# TextEnding.may_stop


def run_checker(text: str, prefix: str, suffix: str, multi: bool, max_lines: int, step: int = 1) -> int | None:
    """Feed ``text`` in steps; the length at which check() first said stop."""
    checker = TextEnding(prefix, suffix, multi, max_lines)
    n = 0
    while n < len(text):
        n = min(len(text), n + step)
        if checker.may_stop(text[:n]):
            return n
    return None


def test_stop_single_line_at_newline() -> None:
    checker = TextEnding("x = ", "", False, 10)
    assert checker.may_stop("abc") is False
    assert checker.may_stop("abc\n") is True
    assert checker.may_stop("abc\nmore") is True  # sticky


def test_stop_single_line_leading_newline() -> None:
    assert run_checker("\nfoo", "x = 1", "", False, 10) == 1


def test_stop_on_dedent_without_waiting_for_the_line() -> None:
    text = "return 1\n\ndef g():\n    pass\n"
    stop = run_checker(text, "def f():\n    ", "", True, 10)
    assert stop == len("return 1\n\nd")


def test_stop_waits_for_a_closer_line_to_end() -> None:
    text = "\n  return 1;\n}\nfunction g() {}"
    stop = run_checker(text, "function f() {", "", True, 10)
    assert stop == len("\n  return 1;\n}\n")


def test_stop_max_lines() -> None:
    text = "a = 1\n    b = 2\n    c = 3\n"
    assert run_checker(text, "def f():\n    ", "", True, 2) == len("a = 1\n    b = 2\n")


def test_stop_on_suffix_line() -> None:
    text = "y = 2\n    return y\n    more = 1\n"
    stop = run_checker(text, "def f():\n    ", "\n    return y\n", True, 10)
    assert stop == len("y = 2\n    return y\n")


def test_stop_on_repetition() -> None:
    text = "x()\nx()\nx()\nx()\nx()\n"
    assert run_checker(text, "", "", True, 10) == len("x()\nx()\nx()\n")


def test_no_stop_inside_the_block() -> None:
    assert run_checker("a = 1\n    b = 2\n    c", "def f():\n    ", "", True, 10) is None


def test_stop_checker_restarts_when_text_is_not_an_extension() -> None:
    checker = TextEnding("def f():\n    ", "", True, 10)
    assert checker.may_stop("a = 1\n    b = 2\n") is False
    assert checker.may_stop("z") is False
    assert checker.may_stop("z\nx") is True


CASES: list[tuple[str, str, str, bool, int]] = [
    # (prefix, suffix, text, multiline, max_lines)
    ("x = ", "\n", "compute(1)\nprint(x)\n", False, 5),
    ("x = 1", "", "\nprint(x)", False, 5),
    ("foo(", ")", "a, b)\nfoo()", False, 5),
    ("def f():\n    ", "", "return 42\n\ndef g():\n    pass\n", True, 10),
    ("def f(x):", "\n", "\n    y = x + 1\n    return y\n\nprint(f(1))\n", True, 10),
    ("function f() {", "\n", "\n  return 1;\n}\n\nfunction g() {}\n", True, 10),
    ("function f() {", "\n}\n", "\n  return 1;\n}\n\nfunction g() {}\n", True, 10),
    ("function f() {\n  ", "\n  more();\n}\n", "a();\n}\nx", True, 10),
    ("if (x) {", "}", "\n  go();\n}\nelse {\n", True, 10),
    ("result = foo(", ")\n", "\n    a,\n    b,\n)\nprint(result)\n", True, 10),
    ("x = [\n    1,\n    ", "\n]\n", "2,\n    3,\n]\n\nprint(x)\n", True, 10),
    ("def f():\n    ", "", "a = 1\n    b = 2\n    c = 3\n    d = 4\n", True, 2),
    ("def f():", "\n", "\n    a = 1\n    b = 2\n    c = 3\n", True, 2),
    ("def f(x):\n    ", "\n    return y\n", "y = x * 2\n    return y\n    q\n", True, 10),
    ("", "", "import os\nimport os\nimport os\nimport os\n", True, 10),
    ("", "", "a = 1\n\na = 1\n\na = 1\n\nb\n", True, 10),
    ("for i in range(3):\n    ", "", "print(i)\n    print(i)\n    print(i)\n    print(i)\n", True, 10),
    ("def grüße():\n    ", "", "print('日本語')\n    return 'ü'\n\nx = 1\ny = 2\n", True, 10),
    ("    if (x) {", "}\n", "\n        go();\n    }\n    else {\n", True, 10),
    ("int main() {\n    ", "", "return 0;\n}\n\nint other() {\n", True, 10),
    ("if x:\n    ", "\n", "a()\nelif y:\n    b()\nelse:\n    c()\nd()\n", True, 10),
    ("    try:\n        ", "\n", "a()\n    except E:\n        b()\n    finally:\n        c()\n    d()\n    e = 1\n", True, 10),
    ("if p:\n    a()\nelif q:\n    ", "\nelif r:\n    c()\n", "b()\nelif s:\n    d()\nelif r:\n    c()\n", True, 10),
    ("if (x) {", "\n", "\n  a();\n} else {\n  b();\n}\n\nf();\n", True, 10),
    ("if p:\n    a()\nelif q:\n    ", "\nelif r:\n    c()\nelif s:\n    d()\n",
     "b()\nelif s:\n    d()\n", True, 10),
]


@pytest.mark.parametrize("prefix,suffix,text,multi,max_lines", CASES)
@pytest.mark.parametrize("step", [1, 2, 3, 7])
def test_early_stop_never_changes_the_result(
    prefix: str, suffix: str, text: str, multi: bool, max_lines: int, step: int
) -> None:
    final = postprocess(text, prefix=prefix, suffix=suffix, multiline=multi, max_lines=max_lines)
    stop = run_checker(text, prefix, suffix, multi, max_lines, step)
    assert stop is not None and stop < len(text)  # every case stops early
    for q in range(stop, len(text) + 1):
        got = postprocess(text[:q], prefix=prefix, suffix=suffix, multiline=multi, max_lines=max_lines)
        assert got == final, (q, text[:q])


_PREFIXES = [
    "", "x = ", "def f():", "def f():\n    ", "function f() {", "function f() {\n  ",
    "foo(", "    if (x) {", "x = [\n    1,\n    ", "class A:\n    def m(self):\n        ",
    "if x:\n    ", "try:\n    ", "for i in x:\n    ", "if (x) {\n  ",
]
_SUFFIXES = ["", "\n", ")", "}", "\n}\n", "\n    return y\n", "\n]\n", "\n  more();\n}\n", "\")"]
_PIECES = ["a", "b()", "return y", "}", ")", "]", "x = 1", "\"", "if x:", "{", "(", ";", "é",
           "elif", "else:", "except E:", "finally:", "e", "els", "} else {", "while (x);"]


@st.composite
def completions(draw: st.DrawFn) -> str:
    lines = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["", "  ", "    ", "        ", "\t"]),
                st.lists(st.sampled_from(_PIECES), max_size=3),
            ),
            min_size=1,
            max_size=7,
        )
    )
    return "\n".join(ind + " ".join(parts) for ind, parts in lines)


@settings(max_examples=400, deadline=None)
@given(
    prefix=st.sampled_from(_PREFIXES),
    suffix=st.sampled_from(_SUFFIXES),
    text=completions(),
    multi=st.booleans(),
    max_lines=st.integers(min_value=1, max_value=5),
    step=st.integers(min_value=1, max_value=6),
)
def test_early_stop_property(
    prefix: str, suffix: str, text: str, multi: bool, max_lines: int, step: int
) -> None:
    final = postprocess(text, prefix=prefix, suffix=suffix, multiline=multi, max_lines=max_lines)
    assert final == "" or final.strip()
    stop = run_checker(text, prefix, suffix, multi, max_lines, step)
    if stop is None:
        return
    for q in range(stop, len(text) + 1):
        got = postprocess(text[:q], prefix=prefix, suffix=suffix, multiline=multi, max_lines=max_lines)
        assert got == final
