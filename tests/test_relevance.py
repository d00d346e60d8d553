"""Context chosen by relevance to the cursor (soldaemon/pipeline/relevance.py) and its
use in the prompt (pipeline.build_fim_prompt, pipeline.context_selector)."""

from __future__ import annotations

from soldaemon.api import CompletionRequest, ContextChunk
from soldaemon.config import config_from_dict
from soldaemon.fim import detect_template
from soldaemon.pipeline.prompt import build_fim_prompt, context_selector
from soldaemon.pipeline.relevance import ContextSelector, choose, imports_of, pack, rank, split_snippets
from soldaemon_bench.tiny import build_tokenizer

GEOMETRY = '''import math


def circle_area(radius):
    return math.pi * radius ** 2


def polygon_perimeter(sides, length):
    return sides * length


class Canvas:
    def __init__(self, width, height):
        self.width = width
        self.height = height
'''

UNRELATED = '''def parse_header(line):
    key, _, value = line.partition(":")
    return key.strip().lower(), value.strip()


def read_headers(stream):
    headers = {}
    for line in stream:
        if not line.strip():
            break
        key, value = parse_header(line)
        headers[key] = value
    return headers
'''

PREFIX = '''from geometry import circle_area


def report(shapes):
    total = 0.0
    for radius in shapes:
        total += circle_area(radius)
    canvas = Canvas(10, 20)
    print(total, canv'''
SUFFIX = "\n    return total\n"


def test_snippets_are_top_level_definitions() -> None:
    parts = split_snippets(GEOMETRY)
    heads = [text.lstrip().split("\n", 1)[0] for _, text in parts]
    # a definition starts each snippet; the short import block joins the next one
    assert heads == ["import math", "def polygon_perimeter(sides, length):", "class Canvas:"]
    assert parts[0][1].rstrip().endswith("return math.pi * radius ** 2")
    # every line of the file is in exactly one snippet, in order
    assert "".join(text for _, text in parts).strip() == GEOMETRY.strip()


def test_imports_are_read() -> None:
    stems, names = imports_of("import os.path\nfrom .scanner import make_scanner as ms\nimport { a, b } from './util.js'\n")
    assert {"path", "scanner", "util"} <= stems
    assert {"make_scanner", "ms", "a", "b"} <= names


def test_the_definitions_of_names_near_the_cursor_rank_first() -> None:
    chunks = [ContextChunk("file:///p/http.py", UNRELATED), ContextChunk("file:///p/geometry.py", GEOMETRY)]
    ranked = rank(PREFIX, SUFFIX, chunks)
    assert ranked[0].uri.endswith("geometry.py")
    top2 = [r.text for r in ranked[:2]]
    assert any("def circle_area" in t for t in top2) and any("class Canvas" in t for t in top2)
    assert ranked[0].relevant and ranked[1].relevant
    # only definitions of names the cursor's code uses count: not the unrelated
    # file, not the rest of the imported module
    assert [r.relevant for r in ranked[2:]] == [False] * (len(ranked) - 2)
    chosen = pack(choose(ranked, 10_000))
    assert [c.uri for c in chosen] == ["file:///p/geometry.py"]
    assert "def circle_area" in chosen[0].text and "class Canvas" in chosen[0].text
    assert "def polygon_perimeter" not in chosen[0].text


def test_names_the_file_defines_itself_bring_no_context() -> None:
    own = PREFIX.replace("from geometry import circle_area\n", "def circle_area(r):\n    return 3 * r * r\n\n"
                         "class Canvas:\n    pass\n")
    chunks = [ContextChunk("file:///p/geometry.py", GEOMETRY)]
    assert choose(rank(own, SUFFIX, chunks), 10_000) == []


def test_the_budget_keeps_the_best_and_the_layout_keeps_file_order() -> None:
    chunks = [ContextChunk("file:///p/geometry.py", GEOMETRY)]
    ranked = rank(PREFIX, SUFFIX, chunks)
    small = choose(ranked, 80)
    assert len(small) == 1 and sum(len(s.text) for s in small) <= 80
    both = pack(choose(ranked, 10_000))
    text = both[0].text
    assert text.index("def circle_area") < text.index("class Canvas")   # file order, not score order


def test_the_choice_is_stable_while_typing_on_one_line() -> None:
    sel = ContextSelector(max_chars=400)
    chunks = (ContextChunk("file:///p/http.py", UNRELATED), ContextChunk("file:///p/geometry.py", GEOMETRY))
    first = sel.select("file:///p/report.py", PREFIX, SUFFIX, chunks)
    for typed in ["a", "as", "as.width", "as.width + read_headers"]:
        assert sel.select("file:///p/report.py", PREFIX + typed, SUFFIX, chunks) == first


def test_a_much_better_choice_replaces_the_kept_one() -> None:
    sel = ContextSelector(max_chars=400)
    chunks = (ContextChunk("file:///p/http.py", UNRELATED), ContextChunk("file:///p/geometry.py", GEOMETRY))
    first = sel.select("file:///p/report.py", PREFIX, SUFFIX, chunks)
    assert "circle_area" in first[0].text
    moved = "def load(stream):\n    headers = read_headers(stream)\n    key, value = parse_header(line)\n    "
    second = sel.select("file:///p/report.py", moved, "\n", chunks)
    assert second and second[0].uri.endswith("http.py")
    # an edited candidate (its snippet changed) is chosen afresh, not kept stale
    edited = (ContextChunk("file:///p/geometry.py", GEOMETRY.replace("radius ** 2", "radius * radius")),)
    third = sel.select("file:///p/report.py", PREFIX, SUFFIX, edited)
    assert "radius * radius" in third[0].text


def test_the_prompt_carries_the_relevant_snippet_only() -> None:
    tok = build_tokenizer()
    template = detect_template(tok)
    config = config_from_dict({"model": {"max_prefix_tokens": 256, "max_suffix_tokens": 64,
                                         "max_context_tokens": 512, "max_context": 2048}})
    req = CompletionRequest(id="1", uri="file:///p/report.py", prefix=PREFIX, suffix=SUFFIX, language="python",
                            context=(ContextChunk("file:///p/http.py", UNRELATED),
                                     ContextChunk("file:///p/geometry.py", GEOMETRY)))
    prompt, _ = build_fim_prompt(template, tok, config.model, req, 2048, selector=context_selector(config.model))
    text = tok.decode(prompt.ids)
    assert "def circle_area" in text and "class Canvas" in text
    assert "parse_header" not in text
    # without a selector (the quality bench's sol+ctx[order]) the chunks go as sent
    prompt2, _ = build_fim_prompt(template, tok, config.model, req, 2048, selector=None)
    assert "parse_header" in tok.decode(prompt2.ids)
