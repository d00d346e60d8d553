"""The CUDA-graph decode step: its static form (position in a tensor, K/V
written by index, attention over a masked bucket) must be the eager step's
math. On the CPU the static step runs without capture; on a CUDA machine the
``gpu`` test captures and replays real graphs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from soldaemon.runtime.forward.backend import LeanBackend
from soldaemon.runtime.forward.cudagraph import GraphDecoder, buckets
from soldaemon.runtime.kv.session import KVSession
from soldaemon_bench.tiny import build_tiny_model


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory: pytest.TempPathFactory) -> object:
    from transformers import AutoModelForCausalLM

    path = build_tiny_model(tmp_path_factory.mktemp("tiny"))
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")])])
def graph_hf(request: pytest.FixtureRequest, tiny_hf: object) -> tuple[object, bool]:
    """The tiny model and whether graphs are emulated: on the CPU through
    EmulatedGraph; on a CUDA device (``gpu``) through captured graphs."""
    if request.param == "cpu":
        return tiny_hf, True
    import copy

    return copy.deepcopy(tiny_hf).to("cuda"), False  # type: ignore[attr-defined]


def test_buckets_cover_the_context() -> None:
    assert buckets(256) == [256]
    assert buckets(1000) == [256, 512, 1000]
    assert buckets(4096) == [256, 512, 1024, 2048, 4096]


def test_static_step_is_the_eager_step(tiny_hf: object) -> None:
    backend = LeanBackend(tiny_hf, 600)
    graphs = GraphDecoder(backend)
    assert not graphs.enabled and graphs.failure == "not a CUDA device"
    session = KVSession(backend)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, backend.vocab_size, (300,), generator=gen).tolist()
    session.prefill(prompt)
    token = int(torch.randint(0, backend.vocab_size, (1,), generator=gen))
    for step in range(3):
        pos = len(session.tokens)
        k0, v0 = backend.k_cache.clone(), backend.v_cache.clone()
        eager = backend.forward(torch.tensor([token]), pos)[0]
        k_eager, v_eager = backend.k_cache[:, :, pos].clone(), backend.v_cache[:, :, pos].clone()
        backend.k_cache.copy_(k0)
        backend.v_cache.copy_(v0)
        graphs.token.fill_(token)
        graphs.pos.fill_(pos)
        window = graphs.bucket(pos)
        assert window == 512
        static = graphs.static_step(window)[0]
        torch.testing.assert_close(static, eager, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(backend.k_cache[:, :, pos], k_eager)
        torch.testing.assert_close(backend.v_cache[:, :, pos], v_eager)
        assert int(static.argmax()) == int(eager.argmax())
        session.tokens.append(token)
        token = int(eager.argmax())
    # off the GPU the session's step never goes through graphs
    assert graphs.step(token, len(session.tokens)) is None and graphs.replays == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graph_decode_matches_eager_on_cuda(tiny_hf: object) -> None:
    import copy

    model = copy.deepcopy(tiny_hf).to("cuda")  # type: ignore[attr-defined]  # not the CPU tests' module
    backend = LeanBackend(model, 1024)
    session = KVSession(backend)
    prompt = list(range(5, 300))
    logits = session.prefill(prompt).logits
    eager_tokens = []
    token = int(logits.argmax())
    for _ in range(16):
        eager_tokens.append(token)
        token = int(session.decode_step(token).argmax())
    session.truncate(len(prompt), logits)
    backend.graphs = GraphDecoder(backend)
    token = int(logits.argmax())
    graph_tokens = []
    for _ in range(16):
        graph_tokens.append(token)
        token = int(session.decode_step(token).argmax())
    assert backend.graphs.replays == 16 and backend.graphs.failure is None
    assert graph_tokens == eager_tokens


def test_gpu_latency_script_runs_its_cpu_mode(tmp_path: Path) -> None:
    """scripts/gpu_latency.py is what a GPU machine runs: keep it working
    (here on the CPU with the tiny model, where graphs are unavailable).

    Its eager tokens equal float32 ``generate()``'s only under the float32
    plan: the plan is pinned (``--precision float32``; the script reads no
    user config), not left to the kernel timings measured at start, which a
    busy machine can turn into a bfloat16 or int8 plan."""
    import json
    import os
    import subprocess
    import sys

    model = build_tiny_model(tmp_path / "tiny")
    out = tmp_path / "lat.json"
    config = tmp_path / "sol_config.yaml"
    config.write_text("model:\n  precision: bfloat16\n")    # a user's config: the check must not read it
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "scripts" / "gpu_latency.py"), "--model", str(model),
                           "--device", "cpu", "--holes", "2", "--tokens", "4", "--lines", "1", "--prefill-tokens", "64",
                           "--precision", "float32", "--json", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "SOLDAEMON_CONFIG": str(config)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "CUDA graphs: unavailable" in proc.stdout and "sol-eager" in proc.stdout
    data = json.loads(out.read_text())
    plan = data["plan"]
    assert plan["precision"] == "float32" and {plan[k] for k in ("storage", "prefill", "short", "head")} == {"float32"}
    assert data["summary"]["sol-eager"]["same_tokens"] == 2      # eager lean path = generate(), same math
    assert "sol-graphs" not in data["summary"] and data["trace"]["keystrokes"] > 5


def _ids(n: int, seed: int, vocab: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=gen).tolist()


def test_kept_logits_survive_another_documents_replays(graph_hf: tuple[object, bool]) -> None:
    """Issue 18, item 1: with folding on, documents share one compute buffer
    and so one graph per window, whose static output every replay
    overwrites. The logits a session keeps for the "prompt unchanged"
    shortcut must still be its own after another document decoded."""
    from soldaemon.runtime.kv.session import SessionPool

    hf, emulate = graph_hf
    backend = LeanBackend(hf, 600)
    backend.graphs = GraphDecoder(backend, emulate=emulate)  # type: ignore[attr-defined]
    pool = SessionPool(backend, 2, fold_threshold=0.01)
    a_prompt, b_prompt = _ids(40, 1, backend.vocab_size), _ids(50, 2, backend.vocab_size)
    a = pool.acquire("a")
    token = int(a.prefill(a_prompt).logits.argmax())
    kept = a.decode_step(token)
    expected = kept.clone()
    a_tokens = list(a.tokens)
    b = pool.acquire("b")
    token = int(b.prefill(b_prompt).logits.argmax())
    b_last = b.decode_step(token)
    assert backend.graphs.replays == 2 and backend.graphs.captures == 1  # one graph served both
    assert not torch.equal(b_last, expected)
    torch.testing.assert_close(kept, expected, rtol=0, atol=0)   # what a decode step returned stays
    a = pool.acquire("a")
    shortcut = a.prefill(a_tokens)
    assert shortcut.computed == 0                                # the "prompt unchanged" path
    torch.testing.assert_close(shortcut.logits, expected, rtol=0, atol=0)


def test_graph_steps_record_the_query_kv_folding_scores_by(graph_hf: tuple[object, bool]) -> None:
    """Issue 18, item 3: parked KV is scored by the last decode step's
    query on a GPU too (graph steps write ``last_q``), not by the last
    eager forward's."""
    hf, emulate = graph_hf
    backend = LeanBackend(hf, 600)
    backend.record_queries()
    graphs = GraphDecoder(backend, emulate=emulate)
    session = KVSession(backend)
    token = int(session.prefill(_ids(100, 3, backend.vocab_size)).logits.argmax())
    for _ in range(2):
        pos = len(session.tokens)
        k0, v0 = backend.k_cache.clone(), backend.v_cache.clone()
        backend.forward(torch.tensor([token], device=backend.device), pos)   # the eager step's queries
        assert backend.last_q is not None
        eager_q = backend.last_q.clone()
        backend.k_cache.copy_(k0)
        backend.v_cache.copy_(v0)
        backend.last_q.zero_()
        backend.last_q_cache = None
        logits = graphs.step(token, pos)
        assert logits is not None
        torch.testing.assert_close(backend.last_q, eager_q, rtol=1e-4, atol=1e-5)
        assert backend.last_q_cache is backend.k_cache
        session.tokens.append(token)
        token = int(logits.argmax())
    # recording switched off: a graph that does not write the queries is captured
    captures = graphs.captures
    backend.record_queries(False)
    graphs.step(token, len(session.tokens))
    assert graphs.captures == captures + 1
    # and on again (issue 27.6): the query buffer keeps its address, so the
    # graph captured with it is replayed, not captured again
    backend.record_queries()
    graphs.step(token, len(session.tokens))
    assert graphs.captures == captures + 1


def test_invalidate_drops_captured_graphs(graph_hf: tuple[object, bool]) -> None:
    """An idle release or restore drops every graph; the recapture after it
    replays the same logits, cycle after cycle. On CUDA this once died in
    the recapture: the shared pool's handle outlived its last graph (the
    allocator's ``use_count > 0`` assert, H200, 2026-12-04)."""
    model, emulate = graph_hf
    backend = LeanBackend(model, 600)
    graphs = GraphDecoder(backend, emulate=emulate)
    assert graphs.step(5, 0) is not None and graphs.info()["graphs"] == 1
    before = graphs.step(6, 1)
    assert before is not None
    before = before.clone()
    captures = graphs.captures
    for cycle in range(2):
        graphs.invalidate()
        assert graphs.info()["graphs"] == 0
        # stale (issue 27.6): eager steps, nothing captured inside the request ...
        assert graphs.step(6, 1) is None and graphs.captures == captures
        # ... until the recapture after it
        assert graphs.recapture() >= 1 and not graphs.stale, (cycle, graphs.failure)
        assert graphs.failure is None and graphs.enabled
        again = graphs.step(6, 1)
        assert again is not None
        torch.testing.assert_close(again, before, rtol=0, atol=0)
        captures = graphs.captures
