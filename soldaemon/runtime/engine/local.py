"""The local engine (:class:`soldaemon.api.Engine`, driven from one worker thread): loads and
warms the model, builds its backend, KV pool, drafts and memory scheduler, and runs the shared
pipeline (:mod:`soldaemon.pipeline`) over its model part (:mod:`.part`, which owns the generation
lock and the sessions). Work ahead of a request is :mod:`.foresight`'s.
"""

from __future__ import annotations

from dataclasses import asdict, replace
import logging
import statistics
import threading
import time
from typing import Any, Callable, Iterator

import torch

from soldaemon.api import CancelToken, CompletionRequest, Done, Event, Timings
from soldaemon.config import Config
from soldaemon.config.sections import GENERIC_WINDOWS, WINDOWS_BY_MODEL, PromptWindows
from soldaemon.errors import ConfigError, ModelError
from soldaemon.fim import FimPrompt, FimTemplate, detect_template
from soldaemon.weights.loader import LoadedModel, load_model
from soldaemon.pipeline.completion import Pipeline, Settings
from soldaemon.runtime.forward.backend import Backend, LeanBackend, make_backend
from soldaemon.policy.kernel_plan import KernelPlan, TimingTable, Workload, steps_on_blocked_copy
from soldaemon.runtime.forward.kernels import compute_dtype_for, verify_exact_kernels
from soldaemon.runtime.engine.autoselect import choose_draft, choose_embedded
from soldaemon.runtime.forward.precision import choose_kernels, lean_or_float32, may_keep_blocked_copy, precision_info
from soldaemon.runtime.forward.compiled import CompileChoice, choose_layer
from soldaemon.runtime.forward.cudagraph import GraphDecoder
from soldaemon.runtime.forward.retime import BackgroundRetime
from soldaemon.policy.draft import DraftLength
from soldaemon.policy.windows import Fitted, fit_windows, prompt_ms
from soldaemon.runtime.decode.draft import DraftModel
from soldaemon.runtime.engine.foresight import ahead_of, speculate, warm
from soldaemon.runtime.engine.part import Drafts, LocalModelPart
from soldaemon.errors import BudgetTooSmall
from soldaemon.runtime.memory.scheduler import MemoryScheduler
from soldaemon.runtime.kv.session import KVSession, SessionPool
from soldaemon.runtime.forward.timing import timed
from soldaemon.runtime.memory.heap import return_free_heap

log = logging.getLogger("soldaemon.engine")

# the document of requests without one; start-up measurements run on its KV session
SCRATCH_URI = "untitled:"


class LocalEngine:
    """The Sol runtime on a local model."""

    def __init__(self, loaded: LoadedModel, config: Config, *, plan: KernelPlan | None = None,
                 timings: TimingTable | None = None,
                 release: bool | None = None, served: str | None = None) -> None:
        """``plan``: the lean backend's kernels and storage (None: the HF module's own tensors);
        ``timings``: the table it was chosen from. ``release`` (default: with a plan) frees the
        module's parameters the packed weights do not share; False lets several engines share one
        module. ``served``: the embedded model's name, whose ``"auto"`` windows apply."""
        self.served_model = served
        self.loaded = loaded
        self.fitted: Fitted | None = None      # "auto" windows fitted to this machine's prefill (warmup)
        # the one config holder, shared with the pipeline and the model part
        self.settings = Settings(config, adapt=self._served)
        config = self.settings.config
        self.tokenizer = loaded.tokenizer
        self.template: FimTemplate = detect_template(loaded.tokenizer)
        if config.device.threads:
            torch.set_num_threads(config.device.threads)
        self.backend: Backend = make_backend(loaded.model, config.model.max_context, plan=plan,
                                             release=plan is not None if release is None else release)
        self.kernel_timings = timings
        # KV folding of parked sessions (runtime/kv/fold.py) needs the lean backend's queries
        fold = config.sol.kv_folding_entropy_threshold if isinstance(self.backend, LeanBackend) else 0.0
        if fold and isinstance(self.backend, LeanBackend):
            self.backend.record_queries()
        self.pool = SessionPool(self.backend, config.model.kv_sessions, fold_threshold=fold)
        self.pool.acquire(SCRATCH_URI)     # the first session takes the cache the backend was built with
        self.started = time.time()
        lock = threading.Lock()   # one generation at a time: the model part's, lent to the memory scheduler
        self.memory: MemoryScheduler | None = None
        if isinstance(self.backend, LeanBackend):
            try:
                self.memory = MemoryScheduler(self.backend, config.sol, lock,
                                              kv_reserve_bytes=self.backend.kv_bytes_per_session * config.model.kv_sessions)
            except BudgetTooSmall as exc:
                raise ConfigError(f"sol.memory_budget: {exc}",
                                  hint="raise sol.memory_budget, or lower model.max_context, model.kv_sessions "
                                       "or sol.prefetch_depth") from None
        self.pipeline = Pipeline(self.settings, self.template, self.tokenizer, self.backend.n_ctx, heal=True)
        self.part = LocalModelPart(self.pool, self.tokenizer, self.template, self.settings, lock=lock,
                                   memory=self.memory)
        self.layer_compile: CompileChoice | None = None   # the graphs' layer compiled or not (warmup())
        # model.name / model.draft as load_engine resolved them (auto: the figures that decided)
        self.model_choice: dict[str, Any] | None = None
        # re-times a table timed under load once the machine is quiet (load_engine starts it)
        self.retime: BackgroundRetime | None = None

    @property
    def graphs(self) -> GraphDecoder | None:
        """The backend's CUDA-graph decode steps (set up by warm-up on CUDA), or None."""
        graphs = self.backend.graphs
        return graphs if isinstance(graphs, GraphDecoder) else None

    # -- the Engine protocol -------------------------------------------------

    def info(self) -> dict[str, Any]:
        return {
            "model": self.loaded.name,
            "device": str(self.loaded.device),
            # the compute dtype (residual stream, attention, KV); the weights' format is precision.plan
            "dtype": str(getattr(self.backend, "dtype", self.loaded.dtype)).removeprefix("torch."),
            "backend": "lean" if isinstance(self.backend, LeanBackend) else "transformers",
            "precision": precision_info(self.backend, self.loaded.dtype, self.kernel_timings,
                                        self.retime.result if self.retime is not None else None),
            "fim": self.template.family,
            "windows": asdict(self.fitted) if self.fitted is not None else None,
            "n_ctx": self.backend.n_ctx,
            "threads": torch.get_num_threads(),
            "load_s": round(self.loaded.load_s, 2),
            "model_choice": self.model_choice,
            "drafter": ("off" if not self.config.completion.speculative else
                        "draft model" if self.part.draft_model is not None else "prompt lookup"),
            "cuda_graphs": self.graphs.info() if self.graphs is not None else None,
            "layer_compile": asdict(self.layer_compile) if self.layer_compile is not None else None,
            "attention_cudnn": (choice.summary() if (choice := getattr(self.backend, "attention_choice", None))
                                else None),
            "forward_ms_by_tokens": ({t: round(c, 2) for t, c in self.part.draft_length.costs_ms.items()}
                                     if self.part.draft_length else None),
        }

    def diagnosis(self) -> dict[str, Any]:
        store = self.memory.store if self.memory else None
        hit_rate = store.stats.hit_rate if store else None
        return {
            "active": True,
            "ttft_optimized": True,          # KV prefix reuse + chunked prefill are on
            # share of offloaded-layer uses whose prefetch had landed; None: nothing offloaded yet
            "prefetch_hit_rate": None if hit_rate is None else round(hit_rate, 4),
            "kv_fold_ratio": self.pool.kv_stats()["fold_ratio"],
            "offloaded_layers": store.offloaded_layers if store else 0,
            "kv_hit_ratio": round(self.part.stats.kv_hit_ratio, 4),
            "fallback_count": store.stats.fallbacks if store else 0,
            "draft_acceptance": (round(length.rate, 3) if (length := self.part.draft_model_length
                                                               if self.part.draft_model else self.part.draft_length)
                                 else None),
        }

    def debug_snapshots(self) -> dict[str, Any]:
        """The ``debug`` message's layer heatmap and prefetcher state; called from the server's
        loop thread."""
        if self.memory is None:
            return {"heatmap": {}, "prefetch": {"kv": self.pool.kv_stats()}}
        prefetch = self.memory.store.snapshot_prefetch()
        prefetch["kv"] = self.pool.kv_stats()
        prefetch["idle_release_s"] = self.memory.idle_release_s if self.memory.idle_release else 0
        prefetch["idle_releases"] = self.memory.releases
        return {"heatmap": self.memory.store.snapshot_heatmap(), "prefetch": prefetch}

    def close(self) -> None:
        """Stop the memory scheduler's threads and the background kernel timing."""
        if self.retime is not None:
            self.retime.stop()
        if self.memory is not None:
            self.memory.close()

    def warm(self, req: CompletionRequest, cancel: CancelToken) -> Timings:
        """Prefill the prompt the next ``complete`` at ``req``'s cursor computes, leaving its
        answer unchanged."""
        return warm(self.pipeline, self.part, req, cancel)

    def work_ahead(self, req: CompletionRequest, done: Done) -> Callable[[CancelToken], Done | None] | None:
        """After ``done`` for ``req``: work that computes the completion following its acceptance
        (run only while idle; returns that Done, None if cancelled before it began), or None."""
        ahead = ahead_of(self.config.completion, req, done)
        if ahead is None:
            return None
        return lambda cancel: speculate(self.pipeline, self.part, ahead, cancel)

    def complete(self, req: CompletionRequest, cancel: CancelToken) -> Iterator[Event]:
        """Stream one completion: the shared pipeline over this engine's model part."""
        return self.pipeline.run(req, cancel, self.part)

    def warmup(self) -> Drafts:
        """Ready kernels, allocator pools and CUDA graphs with one short completion, choose the
        step copy, fit the windows and measure draft costs; returns what the part drafts with."""
        req = CompletionRequest(id="warmup", prefix="def add(a, b):\n    return ", suffix="\n", max_tokens=4)
        self.complete_all(req)
        if (self.config.device.cuda_graphs and isinstance(self.backend, LeanBackend)
                and self.backend.device.type == "cuda"):
            graphs = GraphDecoder(self.backend)
            # KVSession.decode_step replays through the backend's `graphs` once set
            self.backend.graphs = graphs
            self.layer_compile = choose_layer(graphs)   # compiled where faster (runtime/forward/compiled.py)
            graphs.warm_up(caches=self.pool.caches(), later=True)   # the other KV slots' after a request
            self.complete_all(req)               # one step through the graphs before the first user
        self.choose_step_copy()
        self._fit_windows()
        drafts = self._measured_drafts()
        self.pool.acquire(SCRATCH_URI).truncate(0)
        self.part.warmed(drafts)
        self.forget_shown()
        return_free_heap()
        return drafts

    def _fit_windows(self) -> None:
        """Fit the ``"auto"`` prompt windows to the kernels the backend runs now."""
        b, table = self.backend, self.kernel_timings
        if not isinstance(b, LeanBackend) or table is None:
            return
        tuned = WINDOWS_BY_MODEL.get(self.served_model or "", GENERIC_WINDOWS)
        per_token = prompt_ms(table, b.plan, 1024) / 1024
        self.fitted = fit_windows(tuned.prefix, tuned.suffix, tuned.outline, per_token)
        log.info("prompt windows prefix %d, suffix %d, outline %d: %s", self.fitted.prefix, self.fitted.suffix,
                 self.fitted.outline, self.fitted.why)
        self.settings.adapt_again()

    def _measured_drafts(self) -> Drafts:
        """Draft sizing from forward costs measured now (speculation on)."""
        drafts, cc = Drafts(model=self.part.draft_model), self.config.completion
        if not cc.speculative:
            return drafts
        costs = self.measure_forward_costs()
        drafts = Drafts(model=drafts.model, length=DraftLength(costs, cc.draft_tokens))
        log.info("forward cost by tokens (ms): %s", {t: round(c, 1) for t, c in costs.items()})
        if drafts.model is not None:
            step = drafts.model.measure()
            drafts = Drafts(drafts.model, drafts.length, DraftLength(costs, cc.draft_tokens, draft_ms=step))
            log.info("draft model step: %.1f ms", step)
        return drafts

    def use_kernels(self, plan: KernelPlan) -> str | None:
        """Swap ``plan``'s kernels in between requests: None when swapped, else why not. What
        the old kernels computed is dropped and the windows and draft costs are measured again."""
        backend = self.backend
        if not isinstance(backend, LeanBackend):
            return "the transformers fallback runs no kernel plan"
        if self.config.completion.speculative and plan.verify_exact is False:
            return "speculation is on and this plan's verify would not give the decode steps' bits"
        why = self.part.swap(lambda: backend.use_kernels(plan))
        if why is None:
            self.pipeline.forget()
            with self.part.between_requests():        # the windows change between requests, as the kernels did
                self._fit_windows()
            if self.config.completion.speculative:
                with self.part.between_requests():
                    self.part.use_drafts(self._measured_drafts())
                    self.pool.acquire(SCRATCH_URI).truncate(0)
        return why

    def forget(self) -> None:
        """Drop every per-document memory (KV, type-through, parked and foreseen answers,
        anchors, context choices), as if just loaded."""
        self.part.forget()
        self.pipeline.forget()

    def forget_shown(self, uri: str | None = None) -> None:
        """Forget the completion shown at ``uri`` (None: everywhere), so the model answers next."""
        if uri is None:
            self.pipeline.documents.shown.clear()
        else:
            self.pipeline.forget(uri)

    def attach_draft_model(self, draft: LoadedModel) -> None:
        """Speculate with ``draft`` instead of prompt lookup. Raises ModelError unless it shares
        the target's vocabulary, ConfigError when sol.memory_budget cannot hold the pair."""
        if draft.tokenizer.get_vocab() != self.tokenizer.get_vocab():
            raise ModelError(f"model.draft_model {draft.name} does not share the tokenizer of {self.loaded.name}",
                             hint="use a smaller model of the same family (same vocabulary), or no draft model")
        # the draft runs the target's kernels (its shapes are alike and smaller)
        plan = self.backend.plan if isinstance(self.backend, LeanBackend) and self.backend.released else None
        if plan is not None and plan.rows is not None:
            plan = replace(plan, rows=None)      # the draft keeps one copy: its forwards are mostly steps
        backend = make_backend(draft.model, self.backend.n_ctx, plan=plan, release=plan is not None)
        if self.memory is not None and isinstance(backend, LeanBackend):
            try:
                self.memory.reserve(backend.weight_bytes() + backend.kv_bytes_per_session, "the draft model")
            except BudgetTooSmall as exc:
                raise ConfigError(f"sol.memory_budget cannot hold {self.loaded.name} and its draft model "
                                  f"{draft.name}: {exc}",
                                  hint="raise sol.memory_budget, or model.draft: off") from None
        self.part.use_drafts(Drafts(model=DraftModel(backend, vocab_limit=self.backend.vocab_size)))

    def complete_all(self, req: CompletionRequest) -> Done:
        """Run ``req`` to its end; its Done."""
        events = list(self.complete(req, CancelToken()))
        done = events[-1]
        assert isinstance(done, Done)
        return done

    def choose_step_copy(self, rounds: int = 4, steps: int = 4) -> None:
        """Time real decode steps on both copies and keep one (:func:`steps_on_blocked_copy`,
        with the prompt time the table predicts the blocked copy saves): the blocked copy for
        every forward, or the plain one. CPU plans with a blocked copy only."""
        b = self.backend
        if not isinstance(b, LeanBackend) or b.rows_layers is None or b.device.type != "cpu":
            return
        n = 256
        ids = [int(t) for t in torch.randint(0, min(b.vocab_size, 30000), (n + 1,))]
        session = self.pool.acquire(SCRATCH_URI)
        session.truncate(0)
        session.prefill(ids[:n])
        medians: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(rounds):
            for on in (False, True):
                b.steps_on_rows = on
                medians[on].append(statistics.median_high(_verify_ms(session, ids[n:n + 1]) for _ in range(steps)))
        saved = 0.0
        if self.kernel_timings is not None:
            tokens = Workload.prompt_tokens
            saved = (prompt_ms(self.kernel_timings, replace(b.plan, rows=None), tokens)
                     - prompt_ms(self.kernel_timings, b.plan, tokens))
        b.steps_on_rows = steps_on_blocked_copy(medians[False], medians[True], saved)
        session.truncate(0)
        log.info("decode step on the one copy %s ms, on the blocked copy %s ms; a %d-token prompt %.0f ms "
                 "faster on it: %s", [round(m, 1) for m in medians[False]], [round(m, 1) for m in medians[True]],
                 Workload.prompt_tokens, saved,
                 "every forward reads the blocked copy" if b.steps_on_rows else "the blocked copy is dropped")
        if not b.steps_on_rows:
            b.drop_row_copy(f"a cold completion was not faster on it ({Workload.decode_steps} real decode "
                            f"steps against a prompt {saved:.0f} ms faster)")
        elif self.memory is None or (not self.memory.idle_release and self.memory.budget is None):
            # nothing reads the plain copy of the layers now (the store never offloads without a budget)
            freed = b.keep_only_row_copy()
            return_free_heap()
            log.info("the plain copy of the layers freed (%.0f MB): one copy resident", freed / 2**20)

    def measure_forward_costs(self, sizes: tuple[int, ...] = (1, 2, 3, 5, 9)) -> dict[int, float]:
        """ms of one forward of T tokens after a 64-token context, per T in ``sizes`` (median of
        three, timed to the end of device work): what speculation weighs its drafts against."""
        n = 64
        ids = [int(t) for t in torch.randint(0, min(self.backend.vocab_size, 30000), (n + max(sizes),))]
        session = self.pool.acquire(SCRATCH_URI)
        session.truncate(0)
        session.prefill(ids[:n])
        costs = {t: statistics.median_high(_verify_ms(session, ids[n:n + t]) for _ in range(3)) for t in sizes}
        session.truncate(0)
        return costs

    # -- stages --------------------------------------------------------------

    def build_prompt(self, req: CompletionRequest) -> tuple[FimPrompt, float]:
        """The pipeline's prompt stage; returns (prompt, ms)."""
        return self.pipeline.build_prompt(req)

    @property
    def config(self) -> Config:
        """The engine's config now (``settings``'s)."""
        return self.settings.config

    @config.setter
    def config(self, config: Config) -> None:
        """Applies from the next request on, to the engine, pipeline and model part alike."""
        self.settings.use(config)

    def _served(self, config: Config) -> Config:
        """``config`` with the served model's ``"auto"`` settings and this engine's fitted
        windows, so a swapped-in config gets the windows the daemon serves."""
        own = None if self.fitted is None else PromptWindows(self.fitted.prefix, self.fitted.suffix,
                                                             self.fitted.outline)
        if self.served_model is None:
            return config if own is None else replace(config, model=config.model.served_by(None, own))
        return replace(config, model=config.model.served_by(self.served_model, own),
                       completion=config.completion.served_by(self.served_model))


def _verify_ms(session: KVSession, tokens: list[int]) -> float:
    """ms of a verify of ``tokens`` on ``session`` (to the end of its kernels, not their launch),
    then ``session`` truncated back."""
    n = len(session.tokens)
    ms = timed(lambda: session.verify(tokens), session.backend.device)[1]
    session.truncate(n)
    return ms


def load_engine(config: Config, *, progress: bool = True) -> LocalEngine:
    """Load the configured model (and draft) in their stored dtype, pack the weights once into
    the measured kernel plan's format, warm up, and start a background re-timing if wanted."""
    mc = config.model
    name, auto = (None, None) if mc.path else choose_embedded(config, progress=progress)
    # "auto" settings are the served model's; the engine fits the "auto" windows itself
    config = replace(config, completion=config.completion.served_by(name))
    loaded = load_model(str(mc.path) if mc.path else None, name=name, device=config.device.device,
                        dtype="stored", progress=progress)
    row_copy = may_keep_blocked_copy(loaded, config)
    plan, table = choose_kernels(loaded, mc.precision, progress=progress, row_copy=row_copy,
                                 speculative=config.completion.speculative)
    if plan is not None and plan.verify_exact is False and config.completion.speculative:
        # a verify would not give the decode steps' bits: speculation could change an answer
        if mc.precision == "auto":
            log.warning("speculation off: no kernel measured here gives a verify the decode steps' bits "
                        "(plan: %s; docs/kernels.md)", plan.describe())
            config = replace(config, completion=replace(config.completion, speculative=False))
        else:
            log.warning("model.precision %s: a speculative verify does not give the decode steps' bits, so "
                        "speculation may change an answer (completion.speculative: false keeps them)", mc.precision)
    engine = LocalEngine(loaded, config, plan=plan, timings=table, served=name)
    return_free_heap()       # the module's released parameters and the timing runs' tensors
    draft_name, why = (None, "model.draft_model") if mc.draft_model else choose_draft(config, name or "",
                                                                                     progress=progress)
    if mc.draft_model is not None or draft_name is not None:
        # a model.draft_model path, else the embedded model choose_draft named (draft_name is None with a path)
        draft = load_model(None if mc.draft_model is None else str(mc.draft_model), name=draft_name,
                           device=config.device.device, dtype="stored", progress=progress)
        lean_or_float32(draft)
        try:
            engine.attach_draft_model(draft)
        except ConfigError as exc:
            if mc.draft != "auto" or mc.draft_model is not None:
                raise
            draft_name, why = None, f"no room for the pair: {exc.message}"   # auto: serve without it
        return_free_heap()
    log.info("draft model: %s (%s)", draft_name or (mc.draft_model and str(mc.draft_model)) or "none", why)
    engine.model_choice = {"name": name or str(mc.path), "auto": auto, "draft": draft_name, "draft_reason": why}
    engine.warmup()
    if (plan is not None and table is not None and BackgroundRetime.wanted(table, plan, loaded.device)
            and isinstance(backend := engine.backend, LeanBackend)):
        # against the plan serving after the warm-up (which may have dropped the blocked copy)
        engine.retime = BackgroundRetime(loaded.model.config, loaded.device,
                                         compute_dtype_for(loaded.device, loaded.dtype), table, backend.plan,
                                         row_copy=backend.rows_layers is not None,
                                         turn=engine.part.between_requests, swap=engine.use_kernels,
                                         exact=(verify_exact_kernels(loaded.model.config)
                                                if config.completion.speculative else None))
        engine.retime.start()
    return engine
