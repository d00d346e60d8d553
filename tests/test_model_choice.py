"""``model.name: auto`` and ``model.draft: auto`` wired to the kernel
timings: the figures come from the kernel plan's tables, the doctor reads
the same tables without torch, a draft is attached only where the plan's
predicted costs say it pays."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from soldaemon.doctor import plan as plan_check
from soldaemon.config import Config, config_from_dict
from soldaemon.weights.embedded import EMBEDDED_MODELS, QWEN25_CODER_05B, QWEN25_CODER_15B
from soldaemon.policy.kernel_plan import PLAN_FORMAT, KernelPlan, TimingTable, choose_plan
from soldaemon.runtime.engine import autoselect as model_choice
from soldaemon.runtime.forward.kernels import layer_shapes

TABLES = Path(__file__).parent / "data" / "kernel_tables"


def test_registry_shapes_are_the_converted_models_shapes() -> None:
    # what the GGUF headers say (checked when pinned: docs/model.md)
    assert layer_shapes(QWEN25_CODER_05B.shapes.config()) == [(896, 896), (128, 896), (128, 896), (896, 896),
                                                             (4864, 896), (4864, 896), (896, 4864)]
    assert QWEN25_CODER_15B.shapes.config().num_hidden_layers == 28
    # about 0.49 and 1.54 billion weights in the products and embeddings
    assert 0.45e9 < QWEN25_CODER_05B.shapes.weight_count() < 0.65e9
    assert 1.4e9 < QWEN25_CODER_15B.shapes.weight_count() < 1.9e9


def _cache_with(tmp_path: Path, tables: list[Path]) -> Path:
    folder = tmp_path / "kernel-plans"
    folder.mkdir(parents=True)
    for i, t in enumerate(tables):      # as a daemon of this version caches it
        doc = json.loads(t.read_text())
        (folder / f"t{i}.json").write_text(json.dumps({**doc, "format": PLAN_FORMAT}))
    return tmp_path


def test_doctor_names_the_model_auto_serves_from_cached_tables(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_check, "is_installed", lambda m: True)
    zen4 = TABLES / "zen4_avx512_bf16.json"
    zen4_15b = TABLES / "zen4_avx512_bf16_1.5b.json"
    flags = tuple(json.loads(zen4.read_text())["table"]["machine"]["cpu_flags"])
    only_05b = plan_check.model_report(flags, root=_cache_with(tmp_path / "a", [zen4]))
    assert only_05b["verdict"] == "ok"
    assert "serves qwen2.5-coder-0.5b" in only_05b["detail"]
    assert "not timed yet: qwen2.5-coder-1.5b" in only_05b["detail"]
    # both timed on this 2-core Zen 4: neither fits 250 ms; the 0.5B is the fastest
    both = plan_check.model_report(flags, root=_cache_with(tmp_path / "b", [zen4, zen4_15b]))
    assert "serves qwen2.5-coder-0.5b" in both["detail"] and "no model fits" in both["detail"]
    generous = plan_check.model_report(flags, plan_check.LatencyBudget(ttft_ms=4000, decode_ms=60),
                                       root=_cache_with(tmp_path / "c", [zen4, zen4_15b]))
    assert "serves qwen2.5-coder-1.5b" in generous["detail"]
    empty = plan_check.model_report(flags, root=tmp_path / "nothing")
    assert empty["verdict"] == "info" and "first start" in empty["detail"]


def _plan(step: float, verify: float, cold: float = 100.0) -> KernelPlan:
    return KernelPlan("int8", "int8-dynamic", "int8", "int8", "int8-dynamic", cold_ms=cold, step_ms=step,
                      verify_ms=verify)


def test_a_draft_is_attached_only_where_the_plan_says_it_pays() -> None:
    # a GPU-like plan: a 9-row verify costs about one step; the draft's step is cheap
    assert model_choice.draft_pays(_plan(4.3, 4.9), _plan(2.1, 2.4), max_k=8)
    # this 2-core Zen 4, quiet (the recorded tables): a 9-row verify of the 1.5B costs 2 steps,
    # the 0.5B's step 0.4 of the 1.5B's -- predicted to pay at the 0.7 prior
    plans = {}
    for name in ("zen4_avx512_bf16", "zen4_avx512_bf16_1.5b"):
        recorded = json.loads((TABLES / f"{name}.json").read_text())["table"]
        plans[name] = choose_plan(TimingTable.from_dict(recorded))
    assert model_choice.draft_pays(plans["zen4_avx512_bf16_1.5b"], plans["zen4_avx512_bf16"], max_k=8)
    # the same machine busy (timed at load 4): a verify of 6.6 steps never pays
    assert not model_choice.draft_pays(_plan(56.0, 372.0), _plan(18.4, 30.8), max_k=8)
    # a draft as slow as the target never pays
    assert not model_choice.draft_pays(_plan(10.0, 11.0), _plan(10.0, 11.0), max_k=8)


def _candidates(plans: dict[str, KernelPlan]) -> list[model_choice.Candidate]:
    return [model_choice.Candidate(n, EMBEDDED_MODELS[n], p, 10**9) for n, p in plans.items()]


def test_auto_serves_the_15b_with_its_draft_on_a_gpu_like_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = {"qwen2.5-coder-0.5b": _plan(2.1, 2.4, cold=14.0), "qwen2.5-coder-1.5b": _plan(4.3, 4.9, cold=31.0)}
    monkeypatch.setattr(model_choice, "candidates", lambda *a, **k: _candidates(gpu))
    monkeypatch.setattr(model_choice, "device_free_bytes", lambda device: (64 << 30, 64 << 30))
    config = config_from_dict({"device": {"device": "cpu"}})
    name, why = model_choice.choose_embedded(config)
    assert name == "qwen2.5-coder-1.5b" and why is not None and why["within_budget"]
    assert [f["name"] for f in why["figures"]] == ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]
    draft, reason = model_choice.choose_draft(config, name)
    assert draft == "qwen2.5-coder-0.5b" and "pays" in reason
    # memory for one model only: no draft
    monkeypatch.setattr(model_choice, "device_free_bytes", lambda device: (4 << 30, 64 << 30))
    assert model_choice.choose_draft(config, name)[0] is None
    off = config_from_dict({"device": {"device": "cpu"}, "model": {"draft": "off"}})
    assert model_choice.choose_draft(off, name) == (None, "off")


def test_a_named_model_is_served_without_measuring(monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*_a: object, **_k: object) -> list[model_choice.Candidate]:
        raise AssertionError("measured although model.name names the model")

    monkeypatch.setattr(model_choice, "candidates", never)
    config = config_from_dict({"model": {"name": "qwen2.5-coder-0.5b"}})
    assert model_choice.choose_embedded(config) == ("qwen2.5-coder-0.5b", None)


@pytest.mark.parametrize("served, file, windows", [
    ("qwen2.5-coder-0.5b", {}, (768, 256, 0)),
    ("qwen2.5-coder-1.5b", {}, (1024, 256, 128)),
    ("qwen2.5-coder-0.5b", {"max_prefix_tokens": 900, "max_outline_tokens": 32}, (900, 256, 32)),
])
def test_load_engine_gives_the_served_model_its_windows(monkeypatch: pytest.MonkeyPatch, served: str,
                                                        file: dict[str, object], windows: tuple[int, ...]) -> None:
    """``model.name: auto`` is decided inside load_engine: the engine is told
    the chosen model (``served``), so its ``"auto"`` windows (and so its
    pipeline's and the bench's columns') are that model's until it fits them
    to the machine once warm (tests/test_windows.py); a number from the file
    is kept."""
    from soldaemon.runtime.engine import local

    seen: dict[str, object] = {}

    class Engine:
        def __init__(self, _loaded: object, config: Config, **k: object) -> None:
            seen["config"], seen["served"] = config, k.get("served")

        def warmup(self) -> None:
            pass

    monkeypatch.setattr(local, "choose_embedded", lambda config, progress=False: (served, None))
    monkeypatch.setattr(local, "load_model", lambda *a, **k: object())
    monkeypatch.setattr(local, "choose_kernels", lambda *a, **k: (None, None))
    monkeypatch.setattr(local, "may_keep_blocked_copy", lambda *a: False)
    monkeypatch.setattr(local, "choose_draft", lambda *a, **k: (None, "off"))
    monkeypatch.setattr(local, "LocalEngine", Engine)
    local.load_engine(config_from_dict({"model": file}), progress=False)
    config = seen["config"]
    assert isinstance(config, Config) and seen["served"] == served
    mc = config.model.served_by(served)          # what the engine's Settings resolve before warm-up
    assert (mc.max_prefix_tokens, mc.max_suffix_tokens, mc.max_outline_tokens) == windows
    assert config.model.name == "auto"          # the name stays as configured


def _triple(config: Config) -> tuple[int, int, int]:
    w = config.model.windows()
    return w.prefix, w.suffix, w.outline


def test_a_config_given_to_a_running_engine_gets_the_served_models_windows(tmp_path: Path) -> None:
    """A bench column or a reload sets a config whose windows may be
    ``auto``; the engine reads them as its served model's (the trace's
    speculation-off column and ``bench --quality`` without ``--models`` ran
    the 0.5B at the generic 1024/256/128 until 2026-12-04, b77bf1e)."""
    from soldaemon.runtime.engine.local import LocalEngine
    from soldaemon_bench.tiny import build_tiny_model
    from soldaemon.weights.loader import load_model

    loaded = load_model(str(build_tiny_model(tmp_path / "tiny")), device="cpu", dtype="auto", progress=False)
    engine = LocalEngine(loaded, Config.default(), served="qwen2.5-coder-0.5b")
    assert _triple(engine.config) == (768, 256, 0)
    engine.config = Config.default().with_overrides({"completion.speculative": False}, source="test")
    assert _triple(engine.config) == (768, 256, 0)
    assert engine.pipeline.config is engine.config and not engine.config.completion.speculative
    engine.config = Config.default().with_overrides({"model.max_suffix_tokens": 64}, source="test")
    assert _triple(engine.config) == (768, 64, 0)            # a number set wins
    unnamed = LocalEngine(loaded, Config.default(), release=False)         # a path model: generic
    assert _triple(unnamed.config) == (1024, 256, 128)
