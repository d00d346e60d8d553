"""``soldaemon bench --quality``: the holes, the scorers on hand-made cases,
and the command end to end on the tiny model (quality figures come from the
real model, docs/quality.md)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from soldaemon.cli import main
from soldaemon.errors import BadRequest
from soldaemon_bench.tiny import build_tiny_model
from soldaemon_bench.holes import Hole, cut_holes, default_corpus
from soldaemon_bench.quality import edit_similarity, exact_match, first_line_match, levenshtein, parses, score

SRC = '''\
def area(w, h):
    """Area of a rectangle.

    Not a place for holes.
    """
    if w < 0 or h < 0:
        raise ValueError("negative size")
    result = w * h
    return result
'''


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


def test_scorers_on_hand_made_cases() -> None:
    assert exact_match("x = 1  \n", "x = 1")                 # trailing blanks do not count
    assert not exact_match("x = 1\ny = 2", "x = 1")
    assert first_line_match("x = 1\ny = 3", "x = 1\ny = 2")
    assert not first_line_match("x = 2\ny = 2", "x = 1\ny = 2")
    assert not first_line_match("", "x")
    assert levenshtein("kitten", "sitting") == 3 and levenshtein("", "abc") == 3
    assert edit_similarity("abc", "abc") == 1.0
    assert edit_similarity("", "abcd") == 0.0
    assert edit_similarity("abcx", "abcd") == pytest.approx(0.75)
    assert parses("def f():\n    return ", "1 + 2", "\n")
    assert not parses("def f():\n    return ", "(1 + 2", "\n")
    hole = Hole("f.py", 2, "def f():\n    return (", "\n", "a, b)", "line")
    s = score(hole, "a, b)")
    assert s.exact and s.first_line and s.edit_sim == 1.0 and s.parses
    s = score(hole, "a, b")                                   # bracket missing: close, but it breaks the file
    assert not s.exact and not s.parses and 0.7 < s.edit_sim < 1.0


def test_holes_are_seeded_inside_bodies_and_never_in_docstrings(tmp_path: Path) -> None:
    src = tmp_path / "area.py"
    src.write_text(SRC)
    holes = cut_holes([src], 6, seed=1, min_rest=3)
    assert holes == cut_holes([src], 6, seed=1, min_rest=3)
    assert {h.kind for h in holes} == {"line", "block"}
    for h in holes:
        assert h.prefix + h.expected + h.suffix == SRC       # the hole is exactly the removed text
        assert h.line >= 6                                    # below the docstring
        ast.parse(h.prefix + h.expected + h.suffix)
        if h.kind == "block":
            assert 2 <= h.expected.count("\n") + 1 <= 6 and h.suffix.startswith("\n")
    files = default_corpus()
    real = cut_holes(files, 20, seed=0)
    assert len(real) == 20 and sum(h.kind == "block" for h in real) == 10
    assert len({h.path for h in real}) >= 6                   # not all from the biggest file


def test_bench_quality_end_to_end(tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, png = tmp_path / "q.json", tmp_path / "q.png"
    rc = main(["bench", "--quality", "--model", str(tiny_dir), "--threads", "1", "--holes", "4", "--tokens", "6",
               "--json", str(out), "--png", str(png)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "| sol |" in text and "| raw |" in text and "exact match %" in text
    data = json.loads(out.read_text())
    assert len(data["holes"]) == 4
    for h in data["holes"]:
        for col in ("sol", "raw"):
            o = h["out"][col]
            assert o["exact"] == exact_match(o["text"], h["expected"])   # scores match the texts
            assert o["e2e_ms"] > 0
    assert data["summary"]["sol"]["all"]["n"] == 4
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_quality_bad_corpus_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["bench", "--quality", "--corpus", str(tmp_path / "missing.py")])
    assert rc != 0
    assert "missing.py" in capsys.readouterr().err


def test_bench_quality_with_sibling_context(tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "shapes.py").write_text(
        'from util import scale\n\n\ndef grow(w, h, factor):\n    """Grow a rectangle.\n\n    Not here.\n    """\n'
        '    if factor <= 0:\n        raise ValueError("bad factor")\n    width = scale(w, factor)\n'
        '    height = scale(h, factor)\n    return width, height\n')
    (pkg / "util.py").write_text("def scale(value, factor):\n    return value * factor\n\n\n"
                                 "def clamp(value, lo, hi):\n    return max(lo, min(hi, value))\n")
    out = tmp_path / "q.json"
    rc = main(["bench", "--quality", "--model", str(tiny_dir), "--threads", "1", "--holes", "2", "--tokens", "4",
               "--corpus", str(pkg / "shapes.py"), "--context", "siblings", "--baselines", "--ablate", "healing",
               "speculation", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "| sol+ctx |" in text and "| sol -healing |" in text and "| sol -speculation |" in text
    data = json.loads(out.read_text())
    for h in data["holes"]:
        plain, rel, order = h["out"]["sol"], h["out"]["sol+ctx"], h["out"]["sol+ctx[order]"]
        # the sibling file is sent; as sent it always goes in, by relevance only for what the code uses
        assert order["prompt_tokens"] > plain["prompt_tokens"]
        assert rel["prompt_tokens"] >= plain["prompt_tokens"]
    # the holes' code calls `scale` (defined in util.py); nothing uses `clamp`
    assert any(h["out"]["sol+ctx"]["prompt_tokens"] > h["out"]["sol"]["prompt_tokens"] for h in data["holes"])
    assert all(h["out"]["sol+ctx"]["prompt_tokens"] < h["out"]["sol+ctx[order]"]["prompt_tokens"]
               for h in data["holes"])


def test_bench_quality_functional_holes_report_pass_at_1(tiny_dir: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOLDAEMON_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "q.json"
    rc = main(["bench", "--quality", "--model", str(tiny_dir), "--threads", "1", "--holes", "2", "--tokens", "4",
               "--functional", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "pass@1 %" in text and "decode tok/s" in text
    data = json.loads(out.read_text())
    for h in data["holes"]:
        # the tiny model's gibberish never passes CPython's tests; the raw column neither
        assert h["out"]["sol"]["passed"] is False and h["out"]["raw"]["passed"] is False
    assert data["summary"]["sol"]["all"]["pass_at_1"] == 0.0


def test_model_columns_are_parsed_and_named() -> None:
    from soldaemon.config import Config
    from soldaemon.errors import BadRequest
    from soldaemon_bench.quality.columns import model_configs

    cols = model_configs(Config.default(), ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b+qwen2.5-coder-0.5b"])
    assert [(label, target) for label, target, _ in cols] == [("sol[0.5b]", "qwen2.5-coder-0.5b"),
                                                              ("sol[1.5b+0.5b]", "qwen2.5-coder-1.5b")]
    assert cols[0][2].model.draft == "off" and cols[1][2].model.draft == "qwen2.5-coder-0.5b"
    with pytest.raises(BadRequest, match="not an embedded model"):
        model_configs(Config.default(), ["qwen-7b"])


def test_decode_rate_counts_tokens_after_the_first() -> None:
    from soldaemon_bench.quality import Column

    col = Column("c")
    hole = Hole("f.py", 1, "x = ", "\n", "1")
    col.add(hole, "1", 110.0, 10, 11, 10.0, python=True)      # 10 tokens in 100 ms
    col.add(hole, "1", 50.0, 10, 1, 50.0, python=True)        # one token: no decode
    assert col.decode_rate([0, 1]) == pytest.approx(100.0)


def test_columns_against_float32_give_the_kernel_plans_quality_record() -> None:
    """`bench --quality --precisions float32` prints, per column, the holes
    right only on one side: pass@1 where a hole ran its tests, exact match
    elsewhere — the record kernel_plan.QUALITY holds."""
    from soldaemon_bench.quality.report import agreement, paired
    from soldaemon_bench.quality.scores import Column, Score

    def col(name: str, right: list[tuple[bool, bool | None]]) -> Column:
        c = Column(name)
        for exact, passed in right:
            c.texts.append(str((exact, passed)))
            c.scores.append(Score(exact, exact, 1.0 if exact else 0.0, True, passed))
        return c

    ref = col("sol[float32]", [(True, None), (True, None), (False, True), (False, False), (False, None)])
    # line holes by exact match: one lost, one kept; block holes by their tests: one lost
    # (float32's passed), one won (an exact match that passes, where float32 failed)
    sol = col("sol", [(False, None), (True, None), (False, False), (True, True), (False, None)])
    q = paired(sol, ref)
    assert (q.lost, q.won, q.n) == (2, 1, 5)
    lines = agreement([sol, ref])
    assert lines[1] == ("sol: 2/5 completions identical to sol[float32]; "
                        "+20.0 points against float32 on 5 holes (2 lost, 1 won, sign test p 0.50)")
    assert agreement([sol]) == []


def test_bench_windows_default_to_what_the_daemon_serves() -> None:
    """Without --max-prefix-tokens / --max-suffix-tokens every bench mode
    measures the served model's own windows (they were 384/128 whatever the
    daemon served, so `bench --quality` measured a smaller prompt than an
    editor gets)."""
    import argparse

    from soldaemon.config import Config
    from soldaemon_bench.bench import add_arguments
    from soldaemon_bench.header import with_windows

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = Config.default()
    assert with_windows(config, parser.parse_args([])) is config
    assert config.model.windows("qwen2.5-coder-0.5b").prefix == 768
    one = with_windows(config, parser.parse_args(["--max-prefix-tokens", "512"])).model
    assert (one.max_prefix_tokens, one.max_suffix_tokens) == (512, "auto")
    both = with_windows(config, parser.parse_args(["--max-prefix-tokens", "900", "--max-suffix-tokens", "64"]))
    assert both.model.windows("qwen2.5-coder-1.5b") == type(both.model.windows())(900, 64, 128)


JS_LIB = '''\
'use strict';

/**
 * Parse one option flag.
 * @param {string} flags
 */
class Option {
  constructor(flags, description) {
    this.flags = flags;
    this.description = description || '';
    this.required = flags.includes('<'); // a value must follow
    this.optional = flags.includes('[');
  }

  name() {
    if (this.long) {
      return this.long.replace(/^--/, '');
    }
    return this.short.replace(/^-/, '');
  }

  help(width) {
    const lines = [];
    for (const word of this.description.split(' ')) {
      lines.push(word.padEnd(width));
    }
    const text = `${this.flags}
  ${lines.join(' ')}`;
    return text.trim();
  }
}

const camel = (str) => {
  return str.split('-').reduce((acc, word) => {
    return acc + word[0].toUpperCase() + word.slice(1);
  });
};

exports.Option = Option;
exports.camel = camel;
'''


def _package(root: Path) -> Path:
    """An npm package folder: its own JavaScript, a test, a minified build."""
    pkg = root / "optparse-lite"
    (pkg / "lib").mkdir(parents=True)
    (pkg / "test").mkdir()
    (pkg / "package.json").write_text(json.dumps({"name": "optparse-lite", "version": "1.0.0",
                                                  "main": "lib/option.js"}))
    (pkg / "lib" / "option.js").write_text(JS_LIB)
    (pkg / "test" / "option.test.js").write_text("test('x', () => { expect(1).toBe(1); });\n")
    (pkg / "lib" / "bundle.js").write_text("var a=" + "1+" * 400 + "1;\n")
    return pkg


def test_javascript_holes_from_an_npm_package_are_whole_statements_never_strings_or_comments(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``npm:SPEC`` packs the package with npm (a local folder: offline),
    keeps its hand-written JavaScript, and cut_holes cuts line and block
    holes from the statements of its function bodies, in JavaScript."""
    from soldaemon_bench import corpus
    from soldaemon_bench.corpus import npm_package_files, resolve_corpus

    pkg = _package(tmp_path)
    fetched: list[str] = []
    fetch = corpus._fetch
    monkeypatch.setattr(corpus, "_fetch", lambda spec, folder: fetched.append(spec) or fetch(spec, folder))
    cache = tmp_path / "build" / "cache"            # a folder named like a skipped one above the cache is fine
    files = npm_package_files(str(pkg), root=cache)
    assert [f.name for f in files] == ["option.js"]                 # no test, no minified build
    assert npm_package_files(str(pkg), root=cache) == files and len(fetched) == 1   # fetched once, then cached
    holes = cut_holes(files, 12, seed=3, min_rest=3)
    assert holes == cut_holes(files, 12, seed=3, min_rest=3)
    assert {h.kind for h in holes} == {"line", "block"} and {h.language for h in holes} == {"javascript"}
    lines = JS_LIB.splitlines()
    template = {lines.index("    const text = `${this.flags}") + 1, lines.index("  ${lines.join(' ')}`;") + 1}
    for h in holes:
        assert h.prefix + h.expected + h.suffix == JS_LIB
        assert h.line > 6                                          # below the doc comment, inside a body
        first = lines[h.line - 1].strip()
        assert not first.startswith(("//", "/*", "*")) and h.line not in template
        if h.kind == "block":
            assert h.expected == h.expected.strip() and 2 <= h.expected.count("\n") + 1 <= 6
            assert h.suffix.startswith("\n") and not set(range(h.line, h.line + h.expected.count("\n") + 1)) & template
    with pytest.raises(BadRequest, match="npm pack failed"):
        resolve_corpus(["npm:" + str(tmp_path / "no-such-package")])
    with pytest.raises(BadRequest, match="is not a file"):
        resolve_corpus([str(tmp_path / "missing.js")])
    with pytest.raises(BadRequest, match="neither Python nor JavaScript"):
        resolve_corpus([str(pkg / "package.json")])


def test_bench_quality_on_javascript_sends_its_language(tiny_dir: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "js.json"
    pkg = _package(tmp_path)
    rc = main(["bench", "--quality", "--model", str(tiny_dir), "--threads", "1", "--holes", "4", "--tokens", "6",
               "--corpus", str(pkg / "lib" / "option.js"), "--json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert {h["language"] for h in data["holes"]} == {"javascript"} and len(data["holes"]) == 4
    assert all(h["out"]["sol"]["parses"] is None for h in data["holes"])   # Python's parse says nothing here
    rc = main(["bench", "--quality", "--functional", "--corpus", str(pkg / "lib" / "option.js")])
    assert rc != 0 and "--functional" in capsys.readouterr().err


def test_bench_quality_ablates_the_blocked_copy_with_an_engine_of_its_own(
        tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "calc.py"
    src.write_text("def area(w, h):\n    if w < 0:\n        raise ValueError('w')\n    total = w * h\n"
                   "    return total\n\n\ndef grow(w, factor):\n    size = w * factor\n    return size\n")
    out = tmp_path / "q.json"
    rc = main(["bench", "--quality", "--model", str(tiny_dir), "--threads", "1", "--holes", "2", "--tokens", "6",
               "--corpus", str(src), "--ablate", "blocked_copy", "--json", str(out)])
    assert rc == 0
    assert "sol -blocked_copy: " in capsys.readouterr().err     # its own engine, loaded with the copy off
    data = json.loads(out.read_text())
    assert data["holes"]
    for h in data["holes"]:
        # either layout runs the same kernels' bits: the same answers
        assert h["out"]["sol -blocked_copy"]["text"] == h["out"]["sol"]["text"]
