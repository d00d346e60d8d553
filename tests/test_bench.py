"""The benchmark commands run end to end (tiny model, a few holes/keystrokes)
and report what they promise. Speed is not asserted here: figures come from
the benchmark on a real model (docs/bench.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from soldaemon.cli import main
from soldaemon_bench.tiny import build_tiny_model
from soldaemon_bench.holes import cut_line_holes, default_corpus
from soldaemon_bench.trace import Typist, make_trace


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


def test_holes_and_trace_are_seeded_and_real() -> None:
    files = default_corpus()
    assert len(files) >= 6
    a, b = cut_line_holes(files, 5, seed=3), cut_line_holes(files, 5, seed=3)
    assert a == b and len(a) == 5
    for hole in a:
        line = hole.prefix.rsplit("\n", 1)[-1] + hole.expected
        assert hole.expected and line.strip()
        assert hole.suffix.startswith("\n")
    trace = make_trace(files, 2, seed=1)
    assert trace == make_trace(files, 2, seed=1)
    first, second = trace[0], trace[1]
    assert second.prefix == first.prefix + first.rest[0]   # one character typed per keystroke
    assert second.rest == first.rest[1:] and second.suffix == first.suffix
    assert all(t.rest for t in trace)


def test_the_typist_keeps_its_pace_and_waits_for_a_slow_answer() -> None:
    """Keys arrive at least the pace apart; an answer slower than the pace
    delays the next key by no more than it took (the typist waits for each
    completion, then types on at once)."""
    import time

    typist = Typist(40.0)
    first = typist.next_key()
    second = typist.next_key()                   # the answer was instant: the pace holds the key back
    assert second - first >= 40e6
    time.sleep(0.1)                              # an answer slower than the pace
    before = time.perf_counter_ns()
    third = typist.next_key()
    assert third - second >= 100e6 and third - before < 40e6
    assert Typist(0.0).next_key() <= time.perf_counter_ns()


def test_bench_compares_with_generate(tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    rc = main(["bench", "--model", str(tiny_dir), "--threads", "1", "--holes", "2", "--tokens", "6",
               "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    for row in ("generate", "sol-exact", "sol ", "sol+spec"):
        assert row in text
    data = json.loads(out.read_text())
    assert data["identical"] == 2               # sol-exact = generate() token for token
    assert len(data["rows"]["generate"]["ms_per_token"]) == 2


def test_bench_trace_writes_table_and_png(tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "ttft.png"
    rc = main(["bench", "--trace", "--model", str(tiny_dir), "--threads", "1", "--lines", "1",
               "--baselines", "generate", "--baseline-every", "6", "--png", str(png)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "sol:model" in text and "generate" in text and "TTFT p50" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_trace_interrupting_typist_resumes_generations(tiny_dir: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "trace.json"
    rc = main(["bench", "--trace", "--model", str(tiny_dir), "--threads", "1", "--lines", "1",
               "--baselines", "--interrupt", "--compare-spec", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "types on at the first ghost text" in text and "sol-nospec" in text and "resumed" in text
    data = json.loads(out.read_text())["results"]
    sol = data["sol"]
    n = len(sol["ttft_ms"])
    assert n > 5 and len(data["sol-nospec"]["ttft_ms"]) == n
    # every keystroke is accounted for once: computed, type-through or resumed
    assert len(data["sol:model"]["ttft_ms"]) + sol["type_through"] + sol["resumed"] == n


def _budget_config(tmp_path: Path, path: Path) -> Path:
    """A sol_config.yaml whose memory budget holds the floor (embedding and
    norms, one KV buffer, the staging ring) and half of the layers."""
    from soldaemon.config import config_from_dict
    from soldaemon.runtime.engine.local import load_engine

    # one kernel plan for the sizing engine and the bench's (which runs with --threads 1,
    # another timing table): the layer bytes the budget is made of are the bench's own
    model = {"path": str(path), "max_context": 2048, "kv_sessions": 1, "precision": "float32"}
    plain = load_engine(config_from_dict({"model": model, "device": {"device": "cpu"}}), progress=False)
    assert plain.memory is not None
    store = plain.memory.store
    per_layer = sum(u.info.nbytes for u in store.units) // store.n_layers
    budget = (store.fixed_bytes + plain.backend.kv_bytes_per_session  # type: ignore[attr-defined]
              + (store.prefetch_depth + 2) * store.slot_bytes + store.n_layers // 2 * per_layer)
    plain.close()
    cfg = tmp_path / "sol_config.yaml"
    cfg.write_text(f"model:\n  max_context: 2048\n  kv_sessions: 1\n  precision: float32\n"
                   f"sol:\n  memory_budget: {budget / 2**20:.2f}MB\n")
    return cfg


def test_bench_with_a_budget_that_offloads_layers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Offloading empties the engine's transformers module: generate() runs
    on a separate full copy and still agrees with the offloaded engine."""
    path = build_tiny_model(tmp_path / "tiny12", layers=12, hidden=128)  # half the layers outweigh the staging ring
    cfg = _budget_config(tmp_path, path)
    out = tmp_path / "bench.json"
    rc = main(["--config", str(cfg), "bench", "--model", str(path), "--threads", "1", "--holes", "2",
               "--tokens", "6", "--json", str(out)])
    assert rc == 0
    captured = capsys.readouterr()
    data = json.loads(out.read_text())
    assert data["offloaded_layers"] > 0
    assert "separate full copy" in data["baseline"] and "offloads" in captured.out
    assert len(data["rows"]["generate"]["ms_per_token"]) == 2
    assert data["identical"] == 2               # the offloaded engine = generate() on the full copy


def test_bench_trace_generate_under_a_budget_that_offloads_layers(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The trace's generate() baseline runs on the separate full copy too
    (the engine's own module has empty offloaded layers)."""
    path = build_tiny_model(tmp_path / "tiny12", layers=12, hidden=128)  # half the layers outweigh the staging ring
    cfg = _budget_config(tmp_path, path)
    out = tmp_path / "trace.json"
    rc = main(["--config", str(cfg), "bench", "--trace", "--model", str(path), "--threads", "1", "--lines", "1",
               "--baselines", "generate", "--baseline-every", "8", "--json", str(out)])
    assert rc == 0
    captured = capsys.readouterr()
    assert "separate full copy" in captured.err
    gen = json.loads(out.read_text())["results"]["generate"]
    assert gen["ttft_ms"] and all(t > 0 for t in gen["ttft_ms"]) and sum(gen["generated"]) > 0


def test_bench_skips_generate_when_no_full_copy_fits(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The same budget; the second copy's load fails as it would without
    memory for it: the generate row is left out, the reason printed, and
    agreement is reported against sol-exact instead."""
    import soldaemon.weights.loader as loader
    from soldaemon.errors import OutOfMemory

    path = build_tiny_model(tmp_path / "tiny12", layers=12, hidden=128)  # half the layers outweigh the staging ring
    cfg = _budget_config(tmp_path, path)
    real_load = loader.load_model
    loads: list[str | None] = []

    def load_once(p: str | None = None, **kw: object) -> object:
        loads.append(p)
        if len(loads) > 1:          # the engine's own load goes through; the baseline's copy does not fit
            raise OutOfMemory("the model needs about 0.1 GiB but only 0.0 GiB of RAM is free")
        return real_load(p, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(loader, "load_model", load_once)
    monkeypatch.setattr("soldaemon.runtime.engine.local.load_model", load_once)
    out = tmp_path / "bench.json"
    rc = main(["--config", str(cfg), "bench", "--model", str(path), "--threads", "1", "--holes", "1",
               "--tokens", "4", "--json", str(out)])
    assert rc == 0 and len(loads) == 2
    text = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert "generate skipped" in data["baseline"] and "only 0.0 GiB of RAM is free" in text
    assert "generate" not in data["rows"] and data["identical"] is None
    # no reference weights either (the engine keeps only its packed copy): agreement against sol
    assert "sol-exact" not in data["rows"] and "vs sol " in text and len(data["rows"]["sol"]["ms_per_token"]) == 1


def test_bench_trace_refuses_a_negative_pace(tiny_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["bench", "--trace", "--model", str(tiny_dir), "--lines", "1", "--pace-ms", "-5"])
    assert rc != 0
    assert "--pace-ms must be >= 0" in capsys.readouterr().err
