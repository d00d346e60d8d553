"""The llama.vscode column: the request llama.vscode sends for a cursor, its
post-processing, completion cache and speculative FIM (units, against a
table of what llama.vscode's ``src/completion.ts`` / ``src/llama-server.ts``
send), the llama-server build flags, and -- for real (``slow``) -- a
``llama-server`` built from llama-cpp-python's vendored llama.cpp answering
llama.vscode's request on the embedded 0.5B GGUF."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from soldaemon_bench.quality.llama_server import server_args
from soldaemon_bench.quality.llama_server_build import BASE_FLAGS, cpu_flags, isa_flags
from soldaemon_bench.quality.llama_vscode import (ClientSettings, LlamaVscodeClient, ResultCache, future_requests,
                                            read_context, remove_leading_spaces, request_body, shown_text,
                                            suggestion_lines, update_suggestion)
from tests.fixtures.require import require

SAMPLING = {"n_predict": 128, "top_k": 40, "top_p": 0.99, "stream": False,
            "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True}
LIMITS = {"t_max_prompt_ms": 500, "t_max_predict_ms": 500}

# (document with "|" at the cursor, the body llama.vscode sends)
REQUESTS = [
    # mid-line: the line left of the cursor is the prompt; right of it opens the suffix
    ("import os\n\ndef f(x):\n    return x| + 1\n",
     {"input_prefix": "import os\n\ndef f(x):\n", "input_suffix": " + 1\n\n", "input_extra": [],
      "prompt": "    return x", **SAMPLING, "n_indent": 4, **LIMITS}),
    # an indented empty line (after Enter): the blanks leave the prompt; n_indent keeps them
    ("def f(x):\n    |\n    return x\n",
     {"input_prefix": "def f(x):\n", "input_suffix": "\n    return x\n\n", "input_extra": [],
      "prompt": "", **SAMPLING, "n_indent": 4, **LIMITS}),
    # column 0 of the first line: prefix is one newline, no n_indent field (it is 0)
    ("|x = 1\n",
     {"input_prefix": "\n", "input_suffix": "x = 1\n\n", "input_extra": [], "prompt": "", **SAMPLING, **LIMITS}),
    # the last line, no newline after it
    ("a = 1\nb = a +|",
     {"input_prefix": "a = 1\n", "input_suffix": "\n\n", "input_extra": [], "prompt": "b = a +", **SAMPLING,
      **LIMITS}),
]


def _split(doc: str) -> tuple[str, str]:
    prefix, suffix = doc.split("|")
    return prefix, suffix


@pytest.mark.parametrize("doc, body", REQUESTS)
def test_request_body_is_llama_vscodes(doc: str, body: dict[str, Any]) -> None:
    assert request_body(read_context(*_split(doc))) == body


def test_windows_are_256_lines_before_and_64_after() -> None:
    before = "".join(f"b{i}\n" for i in range(300))
    after = "".join(f"a{i}\n" for i in range(100))
    body = request_body(read_context(before + "x", "\n" + after))
    assert body["input_prefix"] == "".join(f"b{i}\n" for i in range(44, 300))
    assert body["input_suffix"] == "\n" + "".join(f"a{i}\n" for i in range(64))
    small = ClientSettings(n_prefix=2, n_suffix=1)
    body = request_body(read_context(before + "x", "\n" + after, small), small)
    assert body["input_prefix"] == "b298\nb299\n" and body["input_suffix"] == "\na0\n"


def test_post_processing_rules() -> None:
    ctx = read_context("def f():\n    ", "\n\n    return 1\n")
    assert shown_text("return 1", ctx) is None                     # repeats the next non-empty line
    assert shown_text("   \n\n", ctx) is None                        # blank
    assert shown_text("x = 2\n    return 1\n\n", ctx) == ("x = 2\n    return 1", ["x = 2", "    return 1"])
    assert suggestion_lines("a\r\nb\n\n  \n") == ["a", "b"]
    mid = read_context("print(f(x", "))\n")
    assert shown_text("))", mid) is None                             # only the text right of the cursor
    assert update_suggestion(["y))", "z"], "))") == "y"               # the suffix cut from the first line
    assert update_suggestion(["y", "z"], "))") == "y"                 # text right of the cursor: one line
    assert update_suggestion(["y", "z"], "") == "y\nz"
    assert remove_leading_spaces("      x", 4) == "  x"
    assert remove_leading_spaces("\t\tx", 0) == "x"                  # the client's loop lets tabs through


def test_cache_answers_typing_into_a_shown_suggestion() -> None:
    cache = ResultCache(max_keys=2)
    cache.put(ResultCache.key("P", "S", "x = fo"), "o(bar)")
    assert cache.lookup("P", "S", "x = fo") == "o(bar)"
    assert cache.lookup("P", "S", "x = foo(") == "bar)"
    assert cache.lookup("P", "S", "x = fx") is None
    assert cache.lookup("P", "other", "x = foo") is None
    cache.put(ResultCache.key("P", "S", "a"), "1")
    cache.put(ResultCache.key("P", "S", "b"), "2")                    # evicts the least recently used
    assert cache.lookup("P", "S", "x = fo") is None


def test_future_requests_after_a_multi_line_suggestion() -> None:
    ctx = read_context("def f():\n    if x", "\n")
    (prefix, suffix, prompt), accept_line = future_requests(ctx, [":", "        return 1"], n_prefix=256)
    assert (prefix, suffix, prompt) == ("def f():\n    if x:\n", "\n\n", "        return 1")
    assert accept_line == "        return 1"
    (_, _, prompt1), none = future_requests(ctx, [": pass"], n_prefix=256)
    assert prompt1 == "    if x: pass" and none is None


class Scripted:
    """A stand-in server: the answer per prompt, every body it was sent."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers
        self.bodies: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.bodies.append(body)
        return {"content": self.answers.get(body["prompt"], ""), "tokens_evaluated": 10, "tokens_predicted": 3}


def test_client_cache_and_speculative_fim() -> None:
    server = Scripted({"    x = f": "oo(bar)", "    x = foo(bar)": " + 1"})
    client = LlamaVscodeClient(server)
    suffix = "\n    return x\n"
    first = client.complete("def f():\n    x = f", suffix)
    client.drain()
    assert first.text == "oo(bar)" and first.requested and not first.cached
    # the speculative FIM: the state after accepting the suggestion, sent right after showing it
    assert [b["prompt"] for b in server.bodies] == ["    x = f", "    x = foo(bar)"]
    assert server.bodies[1]["n_indent"] == 4
    typed = client.complete("def f():\n    x = fo", suffix)               # typing into the suggestion
    client.drain()
    assert typed.text == "o(bar)" and typed.cached and not typed.requested
    accepted = client.complete("def f():\n    x = foo(bar)", suffix)      # answered by the speculative FIM
    client.drain()
    assert accepted.text == " + 1" and accepted.cached
    # typing into the suggestion sent nothing; the shown " + 1" starts the next speculative FIM
    assert [b["prompt"] for b in server.bodies[2:]] == ["    x = foo(bar) + 1"]
    assert client.speculative_sent == 2


def test_no_automatic_request_with_long_text_right_of_the_cursor() -> None:
    server = Scripted({})
    client = LlamaVscodeClient(server)
    answer = client.complete("x = f(", "a, b, c, d)\n")
    assert not answer.requested and answer.text == "" and server.bodies == []
    client.complete("x = f(", "a, b, c, d)\n", automatic=False)         # Ctrl+L still asks
    assert len(server.bodies) == 1


def test_cold_client_neither_caches_nor_speculates() -> None:
    server = Scripted({"    x = f": "oo(bar)"})
    client = LlamaVscodeClient(server, use_cache=False, speculative=False)
    client.complete("def f():\n    x = f", "\n")
    client.complete("def f():\n    x = fo", "\n")
    client.drain()
    assert [b["prompt"] for b in server.bodies] == ["    x = f", "    x = fo"]


CPUINFO_ZEN4 = ("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma f16c bmi2 avx512f avx512dq avx512cd avx512bw "
                "avx512vl avx512vbmi avx512_vnni avx512_bf16\n")
CPUINFO_AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma f16c bmi2\n"
CPUINFO_SPR = CPUINFO_ZEN4.replace("avx512_bf16", "avx512_bf16 avx_vnni amx_bf16 amx_tile amx_int8")


def test_build_flags_match_the_cpu() -> None:
    zen4 = isa_flags(cpu_flags(CPUINFO_ZEN4))
    assert {"-DGGML_AVX512=ON", "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_BF16=ON", "-DGGML_AVX512_VBMI=ON",
            "-DGGML_AVX2=ON"} <= set(zen4)
    avx2 = isa_flags(cpu_flags(CPUINFO_AVX2))
    assert "-DGGML_AVX512=OFF" in avx2 and "-DGGML_AVX2=ON" in avx2
    assert not any("VNNI=ON" in f or "BF16=ON" in f or "AMX" in f and "=ON" in f for f in avx2)
    assert "-DGGML_AVX_VNNI=OFF" in zen4 and not any("AMX" in f and "=ON" in f for f in zen4)   # Zen 4: no AMX
    # an AMX Xeon: AVX-VNNI on, the tiles off (this llama.cpp's AMX kernels die of SIGILL there)
    spr = isa_flags(cpu_flags(CPUINFO_SPR))
    assert {"-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF", "-DGGML_AVX_VNNI=ON",
            "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_BF16=ON"} <= set(spr)
    no_avx512 = isa_flags(cpu_flags(CPUINFO_AVX2.replace("bmi2", "bmi2 avx_vnni")))
    assert "-DGGML_AVX_VNNI=ON" in no_avx512 and "-DGGML_AVX512=OFF" in no_avx512
    assert isa_flags(frozenset()) == ("-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF")
    assert "-DGGML_NATIVE=OFF" in BASE_FLAGS and "-DLLAMA_USE_PREBUILT_UI=OFF" in BASE_FLAGS
    assert not any("march" in f for f in BASE_FLAGS + zen4)


def test_server_args_are_llama_vscodes_cpu_command() -> None:
    assert server_args(Path("m.gguf"), 8012, 2) == [
        "-m", "m.gguf", "--host", "127.0.0.1", "--port", "8012", "-ub", "1024", "-b", "1024", "--ctx-size", "0",
        "--cache-reuse", "256", "-t", "2", "-tb", "2"]
    big = server_args(Path("m.gguf"), 1, 4, small_model=False, slot_dir=Path("s"))
    assert big[big.index("-ub") + 1] == "512" and big[-4:] == ["--cache-ram", "0", "--slot-save-path", "s"]


@pytest.fixture(scope="module")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from soldaemon import paths
    from soldaemon.weights.embedded import QWEN25_CODER_05B, assemble_gguf
    from soldaemon_bench.quality.llama_server import LlamaServer
    from soldaemon_bench.quality.llama_server_build import BuildError, build_server

    try:
        binary = build_server()
    except BuildError as exc:
        require(False, f"llama-server ({exc})", "apt-get install cmake g++; python -m "
                "soldaemon_bench.quality.llama_server_build")
    gguf = assemble_gguf(paths.cache_dir() / "models" / "gguf" / f"{QWEN25_CODER_05B.name}.gguf", progress=False)
    server = LlamaServer(binary, gguf, threads=2, cold=True, log_path=tmp_path_factory.mktemp("llama") / "server.log")
    with server:
        yield server


@pytest.mark.slow
def test_llama_server_answers_llama_vscodes_request(real_server: Any) -> None:
    client = LlamaVscodeClient(real_server.infill, use_cache=False, speculative=False)
    prefix = "def add(a, b):\n    return a"
    answer = client.complete(prefix, "\n\n\nprint(add(1, 2))\n")
    r = answer.response
    assert answer.requested and answer.body is not None and answer.body["prompt"] == "    return a"
    assert r["tokens_predicted"] >= 1 and r["content"].strip(), r
    assert r["tokens_evaluated"] > 10 and "timings" in r
    assert answer.text == (shown_text(r["content"], read_context(prefix, "\n\n\nprint(add(1, 2))\n")) or ("",))[0]
    assert "version" in real_server.binary.describe() or real_server.binary.version
    real_server.erase_slots()        # the quality column's cold start: every slot's cache dropped
