"""Where a multi-line completion ends (soldaemon.pipeline.ending): a table
of (prefix, suffix, the model's raw output, how generation ended) -> the
shown answer, why it ends, and the multi-line decision, in Python,
JavaScript and Go. Each case of ``CASES`` differs from what the text rules
alone show (``old_rules``, today's cut), and asserts that difference."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("tree_sitter_python")

from soldaemon.pipeline.ending import Answer, Ending, TextEnding, decide_multiline, ending_for, postprocess  # noqa: E402
from soldaemon.pipeline.ending.parsed import window_at  # noqa: E402
from soldaemon.pipeline.ending.text import postprocess_why  # noqa: E402

MAX_LINES = 8


@dataclass(frozen=True)
class Case:
    name: str
    language: str
    prefix: str
    suffix: str
    raw: str            # the model's text
    finish: str         # how generation ended: "stop" (its end token) or "length"/"budget"
    shown: str          # the answer shown
    end: str            # why it ends
    multiline: bool = True


def old_rules(c: Case) -> str:
    """What the text rules alone show (before this module)."""
    multi = decide_multiline(c.prefix, c.suffix, "auto")
    return postprocess(c.raw, prefix=c.prefix, suffix=c.suffix, multiline=multi,
                       max_lines=MAX_LINES if multi else 1)


def restarted(ending: Ending) -> Ending:
    """``ending`` ready for a new generation (a fresh stop check)."""
    ending.restart()
    return ending


def run(c: Case, block_end: str = "model") -> tuple[Answer, bool]:
    """The pipeline's end decisions on ``c``: the plan, the early stop fed
    the raw text a character at a time, the finish."""
    plan = ending_for(c.prefix, c.suffix, c.language, "auto", MAX_LINES, block_end)
    checker = restarted(plan)
    raw, finish = c.raw, c.finish
    for n in range(1, len(c.raw) + 1):
        if checker.may_stop(c.raw[:n]):
            raw, finish = c.raw[:n], "stop"
            break
    return plan.shown(raw, finish, checker.rule), plan.multiline


PY_NESTED_PREFIX = ("def primes(n):\n    def is_prime(k):\n        for d in range(2, k):\n"
                    "            if k % d == 0:\n                return False\n        ")
PY_NESTED_MIDDLE = ("return True\n    out = []\n    for i in range(2, n):\n        if is_prime(i):\n"
                    "            out.append(i)")
JS_NESTED_PREFIX = ("function primes(n) {\n  function isPrime(k) {\n    for (let d = 2; d < k; d++) {\n"
                    "      if (k % d === 0) return false;\n    }\n    ")
JS_NESTED_MIDDLE = "return true;\n  }\n  const out = [];\n  for (let i = 2; i < n; i++) if (isPrime(i)) out.push(i);"
PY_CLASS_PREFIX = "class Cache:\n    def __init__(self, key):\n        self._data = {}\n        "
PY_CLASS_SUFFIX = "\n\n    def __len__(self):\n        return len(self._data)\n"

CASES = [
    # -- Python ---------------------------------------------------------------
    Case("py: a nested function's return, then the outer scope's code", "python",
         PY_NESTED_PREFIX, "\n    return out\n", PY_NESTED_MIDDLE + "\n", "stop", PY_NESTED_MIDDLE, "model"),
    Case("py: the hole goes on after the function's end", "python",
         "import math\n\ndef area(r):\n    ", "\n\n\nprint(area(2), UNIT)\n",
         "return math.pi * r * r\n\n\nUNIT = area(1)\n", "stop",
         "return math.pi * r * r\n\n\nUNIT = area(1)", "model"),
    Case("py: an answer ending on a block opener without its body", "python",
         "def primes():\n    out = []\n    ", "\n    return out\n",
         "out.append(2)\n    for i in range(2,101):\n", "stop", "out.append(2)", "opener"),
    Case("py: the opener alone is not shown", "python",
         "def primes():\n    out = []\n    ", "\n    return out\n",
         "for i in range(2,101):\n", "stop", "", "opener"),
    Case("py: brackets in strings and comments before the cursor do not hide a bare opener", "python",
         "import re\n\nclass Wrapper:\n    pattern = r'[^' + re.escape('x')   # (see above\n\n"
         "    def __init__(self, width):\n        self.width = width\n        ",
         "\n        self.indent = ''\n", "def wrap(self, text):\n", "stop", "", "opener"),
    Case("py: an unclosed bracket at the budget", "python",
         "def f(xs):\n    ", "\n    return total\n",
         "total = 0\n    items = [x * x for x in xs", "length", "total = 0", "parse"),
    Case("py: an unclosed string", "python",
         "def f():\n    ", "\n    return msg\n", "x = 1\n    msg = 'hello\n", "stop", "x = 1", "parse"),
    Case("py: past the block, a name like a definition word is the outer scope's code", "python",
         PY_NESTED_PREFIX, "\n    return out\n",
         "return True\n    func = is_prime\n    out = [i for i in range(n) if func(i)]\n", "stop",
         "return True\n    func = is_prime\n    out = [i for i in range(n) if func(i)]", "model"),
    Case("py: an unfinished statement is multi-line", "python",
         "def f(a, b):\n    total = (a +", "\n    return total\n", " b +\n             1)\n", "stop",
         " b +\n             1)", "model"),
    # -- JavaScript -----------------------------------------------------------
    Case("js: a nested function's end, then the outer scope's code", "javascript",
         JS_NESTED_PREFIX, "\n  return out;\n}\n", JS_NESTED_MIDDLE + "\n", "stop", JS_NESTED_MIDDLE, "model"),
    Case("js: an answer ending on a block opener without its body", "javascript",
         "function f(xs) {\n  let t = 0;\n  ", "\n  return t;\n}\n",
         "t = 1;\n  for (const x of xs) {\n", "length", "t = 1;", "opener"),
    Case("js: an unclosed string", "javascript",
         "function f() {\n  ", "\n  return s;\n}\n", "let t = 1;\n  const s = 'abc\n", "stop", "let t = 1;", "parse"),
    Case("js: an unclosed bracket", "javascript",
         "function f(xs) {\n  ", "\n  return t;\n}\n", "let t = 0;\n  t = Math.max(t,\n", "stop",
         "let t = 0;", "parse"),
    Case("js: an unfinished statement is multi-line", "javascript",
         "function f(a, b) {\n  const total = (a +", "\n  return total;\n}\n", " b +\n    1);\n", "stop",
         " b +\n    1);", "model"),
    # -- Go --------------------------------------------------------------------
    Case("go: a loop left open at the budget", "go",
         "package p\n\nfunc sum(xs []int) int {\n\t", "\n\treturn t\n}\n",
         "t := 0\n\tfor _, x := range xs {\n\t\tt += x\n", "length", "t := 0", "parse"),
]


@pytest.mark.parametrize("c", CASES, ids=[c.name for c in CASES])
def test_the_end_of_an_answer(c: Case) -> None:
    assert window_at("", "", c.language) is not None      # its grammar is installed
    answer, multi = run(c)
    assert (answer.text, answer.end, multi) == (c.shown, c.end, c.multiline)
    assert old_rules(c) != c.shown  # today's text rules show something else


@pytest.mark.parametrize("c", CASES, ids=[c.name for c in CASES])
def test_block_end_rules_keeps_the_text_rules(c: Case) -> None:
    answer, _ = run(c, block_end="rules")
    assert answer.text == old_rules(c)


# Cases where the text rules were right and stay so.
SAME = [
    Case("py: a complete statement stays one line", "python", "x = compute(a)", "\n", " + 1\ny = 2\n", "stop",
         " + 1", "line", multiline=False),
    Case("py: a run-on model is cut where the cursor's block ends", "python",
         "def f():\n    ", "\n", "return 1\n\ndef g():\n    pass\n\ndef h():\n    pass\n\nx = 1\ny = 2\nz = 3\n",
         "length", "return 1", "scope"),
    # a model that does not end by itself is cut where the cursor's block ends
    Case("py: the nested function, the model going on into the suffix", "python",
         PY_NESTED_PREFIX, "\n    return out\n", PY_NESTED_MIDDLE + "\n    return out\n", "length",
         "return True", "scope"),
    Case("py: a dedent the suffix does not fit", "python",
         "def f(n):\n    ", "\n    return n\n", "n += 1\nprint(n)\n", "stop", "n += 1", "scope"),
    Case("py: the model's end inside the block", "python", "def f(x):\n    ", "\n    return y\n",
         "y = x * 2\n", "stop", "y = x * 2", "model"),
    Case("js: the closer the suffix lacks is kept", "javascript", "function f() {\n  ", "",
         "return 1;\n}\n", "stop", "return 1;\n}", "model"),
    # past the cursor's block, the model writing the next definition: the
    # answer ends with the block, whether or not the model ends afterwards
    Case("py: past the block, the next method is not waited for", "python", PY_CLASS_PREFIX, PY_CLASS_SUFFIX,
         "self._key = key\n\n    def seek(self, i):\n        return i\n", "stop", "self._key = key", "scope"),
    Case("py: past the block, a decorator starts the next definition", "python", PY_CLASS_PREFIX, PY_CLASS_SUFFIX,
         "self._key = key\n\n    @property\n    def key(self):\n        return self._key\n", "stop",
         "self._key = key", "scope"),
    Case("js: past the nested function, the next one is not waited for", "javascript", JS_NESTED_PREFIX,
         "\n  return out;\n}\n", "return true;\n  }\n  function helper(x) {\n    return x;\n  }\n", "stop",
         "return true;\n  }", "scope"),
    Case("c: a language without a grammar here keeps the text rules", "cobol", "PROCEDURE DIVISION.\n    ",
         "\n", "DISPLAY 'X'.\n\nSTOP RUN.\n", "stop", "DISPLAY 'X'.", "scope"),
]


@pytest.mark.parametrize("c", SAME, ids=[c.name for c in SAME])
def test_where_the_text_rules_were_right(c: Case) -> None:
    answer, multi = run(c)
    assert (answer.text, answer.end, multi) == (c.shown, c.end, c.multiline)
    assert old_rules(c) == c.shown


def test_column_0_before_existing_text_inserts_whole_lines() -> None:
    """The data set's form: the cursor at column 0 of a non-blank line."""
    prefix, suffix = "def f(xs):\n", "    return total\n"
    raw = "    total = 0\n    for x in xs:\n        total += x\n"
    plan = ending_for(prefix, suffix, "python", "auto", MAX_LINES, "model")
    assert plan.multiline
    checker = restarted(plan)
    assert not checker.may_stop(raw)
    answer = plan.shown(raw, "stop", checker.rule)
    assert answer == Answer(raw, "model")
    # going on with the line the cursor is on: cut there
    answer = plan.shown(raw + "    return total\n", "length", checker.rule)
    assert answer == Answer(raw, "suffix")
    # without a grammar too, the text rules keep whole lines
    assert postprocess(raw + "    return total\n", prefix=prefix, suffix=suffix, multiline=True,
                       max_lines=MAX_LINES) == raw


def test_the_window_is_parsed_incrementally_and_repeatably() -> None:
    w = window_at(PY_NESTED_PREFIX, "\n    return out\n", "python")
    assert w is not None and w.errors == 0
    for _ in range(3):  # the base tree is copied, never edited in place
        assert w.fits("return True")
        assert not w.fits("x = (")
    assert w.longest_fit("a = 1\n        b = (") == ("a = 1", False)


def test_the_window_stays_near_the_cursor() -> None:
    body = "def g():\n    return 1\n\n" * 500
    w = window_at(body + "def f():\n    ", "\n    return 2\n\n" + body, "python")
    assert w is not None
    assert w.before == "def f():\n    "
    assert w.after == "\n    return 2\n"


def test_done_carries_the_ends_over_the_wire() -> None:
    from soldaemon.api import Done
    from soldaemon.protocol import decode_server, encode_server, server_to_json

    done = Done("1", ("a", "b"), "stop", ends=("model", "suffix"))
    wire = server_to_json(done)
    assert wire["ends"] == ["model", "suffix"]
    assert decode_server(encode_server(done)) == done
    assert "ends" not in server_to_json(Done("2", ("a",), "stop"))
    # a block candidate shown instead of the streamed answer: that one travels too
    replaced = Done("3", ("b = 2",), "stop", ends=("model",), streamed="a = 1")
    assert server_to_json(replaced)["streamed"] == "a = 1"
    assert decode_server(encode_server(replaced)) == replaced
    assert "streamed" not in server_to_json(done)


_PIECES = ["a", "b()", "return y", "}", ")", "x = 1", "if x:", "{", "(", "'", "else:", "for i in x:",
           "def g():", "@d", "fn(x)"]


@st.composite
def completions(draw: st.DrawFn) -> str:
    lines = draw(st.lists(st.tuples(st.sampled_from(["", "  ", "    ", "        "]),
                                    st.lists(st.sampled_from(_PIECES), max_size=3)), min_size=1, max_size=7))
    return "\n".join(ind + " ".join(parts) for ind, parts in lines)


@settings(max_examples=300, deadline=None)
@given(prefix=st.sampled_from(["def f():\n    ", "class A:\n    def m(self):\n        ", "if x:\n    ",
                               "function f() {\n  ", "", "def f(xs):\n"]),
       suffix=st.sampled_from(["", "\n", "\n    return y\n", "\n}\n", "\nprint(1)\n", "    return total\n"]),
       text=completions(), floor=st.integers(min_value=0, max_value=8))
def test_early_stop_with_a_floor_never_changes_the_result(prefix: str, suffix: str, text: str, floor: int) -> None:
    """The early stop's guarantee holds when the model decides the end."""
    final = postprocess_why(text, prefix=prefix, suffix=suffix, multiline=True, max_lines=5, floor=floor)[0]
    checker = TextEnding(prefix, suffix, True, 5, floor=floor)
    stop = next((n for n in range(1, len(text) + 1) if checker.may_stop(text[:n])), None)
    if stop is None:
        return
    for q in range(stop, len(text) + 1):
        assert postprocess_why(text[:q], prefix=prefix, suffix=suffix, multiline=True, max_lines=5,
                               floor=floor)[0] == final


def test_generation_stops_where_the_next_definition_begins() -> None:
    """The early stop: once a line past the cursor's block has begun a
    definition (its word and the first letter of its name), decoding stops,
    before the model writes that definition's body."""
    raw = "self._key = key\n\n    def seek(self, i):\n        return i\n"
    plan = ending_for(PY_CLASS_PREFIX, PY_CLASS_SUFFIX, "python", "auto", MAX_LINES, "model")
    checker = restarted(plan)
    stop = next(n for n in range(1, len(raw) + 1) if checker.may_stop(raw[:n]))
    assert raw[:stop].endswith("    def s")
    assert plan.shown(raw[:stop], "stop", checker.rule) == Answer("self._key = key", "scope")
    # a line inside the block that defines (a nested helper) goes on
    inner = "def helper():\n            return 1\n        self._key = helper()\n"
    checker = restarted(plan)
    assert not any(checker.may_stop(inner[:n]) for n in range(1, len(inner) + 1))


BODYLESS_PREFIX = "def total(xs):\n    t = 0\n    "
BODYLESS_SUFFIX = "\n    return t\n"


def test_an_opener_without_its_body_inside_the_answer_is_cut() -> None:
    """tree-sitter's Python grammar takes ``while True:`` followed by a line
    at its own indentation without an error; Python does not. The answer
    is cut before that opener (the parse alone showed all of it), and
    generation stops as soon as the line after it shows its indentation."""
    raw = "for x in xs:\n        t += x\n    while True:\n    t += 1\n    t -= 1\n"
    plan = ending_for(BODYLESS_PREFIX, BODYLESS_SUFFIX, "python", "auto", MAX_LINES, "model")
    assert plan.window is not None and plan.window.longest_fit(raw)[0] == "for x in xs:\n        t += x\n"
    checker = restarted(plan)
    stop = next(n for n in range(1, len(raw) + 1) if checker.may_stop(raw[:n]))
    assert raw[:stop].endswith("while True:\n    t") and checker.rule == "opener"
    early = plan.shown(raw[:stop], "stop", checker.rule)
    assert early == Answer("for x in xs:\n        t += x", "opener")
    plain = TextEnding(plan.prefix, plan.suffix, plan.multiline, plan.max_lines, floor=plan.floor)
    assert not any(plain.may_stop(raw[:n]) for n in range(1, len(raw) + 1))
    assert plan.shown(raw, "stop", plain.rule) == early      # the answer of the whole generation
    # the opener on the answer's first line, after the cursor's indentation
    first = "while True:\n    t += 1\n"
    checker = restarted(plan)
    stop = next(n for n in range(1, len(first) + 1) if checker.may_stop(first[:n]))
    assert plan.shown(first[:stop], "stop", checker.rule) == Answer("", "opener")
    # an opener inside a string, or one with its body, goes on
    for ok in ('s = """Note:\n    t is a sum\n    """\n    t = 1\n', "if xs:\n        t = 1\n    t += 1\n",
               "if (xs and\n        t):\n        t = 1\n"):    # the body is deeper than the `if` line
        checker = restarted(plan)
        assert not any(checker.may_stop(ok[:n]) for n in range(1, len(ok) + 1)), ok
        assert plan.window.fits(ok)


_PY_PIECES = ["t += 1", "if t:", "while True:", "for x in xs:", "return t", "else:", "# c", "s = '''a:",
              "''' ", "d = {1:", "2}", "def g():"]


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(st.tuples(st.sampled_from(["", "    ", "        ", "            "]),
                                st.sampled_from(_PY_PIECES)), min_size=1, max_size=7),
       suffix=st.sampled_from(["\n    return t\n", "\n", "\n\ndef h():\n    pass\n"]))
def test_the_early_stop_at_a_bare_opener_never_changes_the_answer(lines: list[tuple[str, str]], suffix: str) -> None:
    """Stopping at an opener without its body shows what the whole
    generation, ended by the model, would have shown."""
    raw = "\n".join(ind + piece for ind, piece in lines)
    plan = ending_for(BODYLESS_PREFIX, suffix, "python", "auto", MAX_LINES, "model")
    checker = restarted(plan)
    stop = next((n for n in range(1, len(raw) + 1) if checker.may_stop(raw[:n])), None)
    if stop is None or checker.rule != "opener":
        return
    plain = TextEnding(plan.prefix, plan.suffix, plan.multiline, plan.max_lines, floor=plan.floor)
    whole = next((n for n in range(1, len(raw) + 1) if plain.may_stop(raw[:n])), None)
    end = raw if whole is None else raw[:whole]
    assert plan.shown(raw[:stop], "stop", checker.rule).text == \
        plan.shown(end, "stop", plain.rule).text


def test_a_line_at_column_0_inside_a_docstring_starts_no_window() -> None:
    prefix = 'def f(s):\n    """Collapse blanks:\n\nbecomes one line.\n    """\n    '
    w = window_at(prefix, "\n    return s\n", "python")
    assert w is not None
    assert w.before == prefix and w.errors == 0


@pytest.mark.parametrize("text, depth", [
    ("f(a,\n  b", 1),
    ("x = '[^' + y", 0),                       # a bracket in a string
    ('x = "(" if a else ")"\ny = [1,', 1),
    ("x = 1  # (see below\ny = (", 1),         # a bracket in a comment
    ('s = """(\n[\n"""\nt = {', 1),           # in a triple-quoted string
    ("s = 'it\\'s ('\nu = (", 1),              # an escaped quote
    (r"p = r'\['" + "\nq = [", 1),             # a raw string with an escaped bracket
    ("s = 'unclosed (\nt = 1", 0),             # an unclosed one-line string ends at its line
])
def test_open_brackets_skip_strings_and_comments(text: str, depth: int) -> None:
    from soldaemon.pipeline.ending.parsed import _scan

    assert _scan(text)[0] == depth
