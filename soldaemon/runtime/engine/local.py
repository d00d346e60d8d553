"""The local engine: a completion request in, a stream of events out.

The stages (checks, type-through, prompt, preview, post-processing,
timings) are the shared pipeline's (:mod:`soldaemon.pipeline`); this engine
loads and warms the model, builds its backend, KV session pool, drafts and
memory scheduler, and gives the pipeline its model part
(:mod:`soldaemon.runtime.engine.part`, which owns the generation lock, the
session access, the parked run and the foreseen answer: prefill with KV
reuse, decode, speculation, stop checks). Work ahead of a request (warm,
speculative FIM) is :mod:`soldaemon.runtime.engine.foresight`'s.
Implements :class:`soldaemon.api.Engine`; driven from one worker thread.
"""

from __future__ import annotations

from dataclasses import asdict, replace
import logging
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
from soldaemon.pipeline.prompt import LeadAnchors
from soldaemon.pipeline.relevance import ContextSelector
from soldaemon.runtime.forward.backend import LEAN_ARCHITECTURES, Backend, LeanBackend, make_backend
from soldaemon.policy.kernel_plan import KernelPlan, TimingTable, steps_on_blocked_copy
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
from soldaemon.runtime.engine.part import Drafts, EngineStats, LocalModelPart, Warmup
from soldaemon.errors import BudgetTooSmall
from soldaemon.runtime.memory.scheduler import MemoryScheduler
from soldaemon.runtime.kv.session import SessionPool
from soldaemon.runtime.forward.timing import elapsed_ms, synchronize
from soldaemon.runtime.memory.heap import return_free_heap

log = logging.getLogger("soldaemon.engine")

# the document of requests without one (warm-up, benchmarks): its KV session
# is the one start-up measurements and benchmarks run on
SCRATCH_URI = "untitled:"


class LocalEngine:
    """The Sol runtime on a local model (see module doc)."""

    def __init__(self, loaded: LoadedModel, config: Config, *, plan: KernelPlan | None = None,
                 timings: TimingTable | None = None,
                 release: bool | None = None, served: str | None = None) -> None:
        """``plan``: the lean backend's kernels and weight storage (from
        :func:`load_engine`'s measurement); None: dense in the model's
        dtype, the HF module's own tensors (the reference math). With a
        plan, the module's parameters are released after packing: one
        resident copy of the weights. ``timings``: the table the plan was
        chosen from (shown by info());
        ``release`` (default: when a plan is given) empties the module's
        parameters the packed weights do not share (False: several engines
        over one loaded module, as ``bench --quality --precisions`` builds).
        ``served``: the embedded model's name (None: a path): an ``"auto"``
        prompt window in any config given to this engine is that model's."""
        self.served_model = served
        self.loaded = loaded
        self.fitted: Fitted | None = None      # "auto" windows fitted to this machine's prefill (warmup)
        # the one config holder the pipeline and the model part read too
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
        # Sol's memory scheduler (runtime/memory/scheduler.py): residency under
        # sol.memory_budget, prefetch, heatmap, idle release, priority pins
        self.memory: MemoryScheduler | None = None
        if isinstance(self.backend, LeanBackend):
            try:
                self.memory = MemoryScheduler(self.backend, config.sol, lock,
                                              kv_reserve_bytes=self.backend.kv_bytes_per_session * config.model.kv_sessions)
            except BudgetTooSmall as exc:
                raise ConfigError(f"sol.memory_budget: {exc}",
                                  hint="raise sol.memory_budget, or lower model.max_context, model.kv_sessions "
                                       "or sol.prefetch_depth") from None
        # the stages shared with every engine, and their per-document memory
        self.pipeline = Pipeline(self.settings, self.template, self.tokenizer, self.backend.n_ctx, heal=True)
        # what the pipeline asks of the model: sessions, drafts, counters, parked run, foreseen answer
        self.part = LocalModelPart(self.pool, self.tokenizer, self.template, self.settings, lock=lock,
                                   memory=self.memory)
        self.layer_compile: CompileChoice | None = None   # the graphs' layer compiled or not (warmup())
        # model.name / model.draft as load_engine resolved them (auto: the figures that decided)
        self.model_choice: dict[str, Any] | None = None
        # re-times a table timed under load once the machine is quiet (load_engine starts it)
        self.retime: BackgroundRetime | None = None

    @property
    def graphs(self) -> GraphDecoder | None:
        """The CUDA-graph decode steps the backend replays through (warm-up
        sets them up on CUDA; the backend holds them, the one owner)."""
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
            "kv_hit_ratio": round(self.stats.kv_hit_ratio, 4),
            "fallback_count": store.stats.fallbacks if store else 0,
            "draft_acceptance": (round(length.rate, 3) if (length := self.part.draft_model_length
                                                               if self.part.draft_model else self.part.draft_length)
                                 else None),
        }

    def debug_snapshots(self) -> dict[str, Any]:
        """The ``debug`` message's snapshots: the layer heatmap over
        ``sol.layer_heatmap_window`` and the prefetcher's state (hit rate,
        fallbacks, residency plan and its predicted cost, measured device
        bytes, KV folding). Called from the server's loop thread."""
        if self.memory is None:
            return {"heatmap": {}, "prefetch": {"kv": self.pool.kv_stats()}}
        prefetch = self.memory.store.snapshot_prefetch()
        prefetch["kv"] = self.pool.kv_stats()
        prefetch["idle_release_s"] = self.memory.idle_release_s if self.memory.idle_release else 0
        prefetch["idle_releases"] = self.memory.releases
        return {"heatmap": self.memory.store.snapshot_heatmap(), "prefetch": prefetch}

    def close(self) -> None:
        """Stop the memory scheduler's idle timer and prefetch thread, and
        the background kernel timing."""
        if self.retime is not None:
            self.retime.stop()
        if self.memory is not None:
            self.memory.close()

    def warm(self, req: CompletionRequest, cancel: CancelToken) -> Timings:
        """Prefill exactly the prompt the next ``complete`` at ``req``'s
        cursor computes, leaving its answer unchanged
        (:func:`soldaemon.runtime.engine.foresight.warm`)."""
        return warm(self.pipeline, self.part, req, cancel)

    def work_ahead(self, req: CompletionRequest, done: Done) -> Callable[[CancelToken], Done | None] | None:
        """After ``done`` was delivered for ``req``: the lowest-priority work
        to do next -- compute the completion that follows accepting it, for
        the next request (speculative FIM,
        :func:`soldaemon.runtime.engine.foresight.ahead_of`) -- or None.
        The work returns the speculation's Done (None: cancelled before it
        began); the server runs it only while idle."""
        ahead = ahead_of(self.config.completion, req, done)
        if ahead is None:
            return None
        return lambda cancel: speculate(self.pipeline, self.part, ahead, cancel)

    def complete(self, req: CompletionRequest, cancel: CancelToken) -> Iterator[Event]:
        """Stream one completion (the Engine protocol): the shared pipeline
        (:class:`soldaemon.pipeline.Pipeline`) over this engine's model
        part (:class:`soldaemon.runtime.engine.part.LocalModelPart`), inside
        the part's memory scope."""
        return self.pipeline.run(req, cancel, self.part)

    def warmup(self) -> Warmup:
        """Run one short completion so that kernels, allocator pools and
        (on CUDA) graphs are ready before the first real request; measure
        what speculation weighs its drafts against. Returns what it
        measured, which the model part drafts with from then on."""
        req = CompletionRequest(id="warmup", prefix="def add(a, b):\n    return ", suffix="\n", max_tokens=4)
        self.complete_all(req)
        captured = 0
        if (self.config.device.cuda_graphs and isinstance(self.backend, LeanBackend)
                and self.backend.device.type == "cuda"):
            graphs = GraphDecoder(self.backend)
            # KVSession.decode_step replays through the backend's `graphs` when set
            self.backend.graphs = graphs
            self.layer_compile = choose_layer(graphs)   # compiled where faster (runtime/forward/compiled.py)
            graphs.warm_up(caches=self.pool.caches(), later=True)   # the other KV slots' after a request
            captured = graphs.captures
            self.complete_all(req)               # one step through the graphs before the first user
        self.choose_step_copy()
        self._fit_windows()
        drafts, costs = self._measured_drafts()
        record = Warmup(drafts, costs, captured, bool(getattr(self.backend, "steps_on_rows", False)))
        self.pool.acquire(SCRATCH_URI).truncate(0)
        self.part.warmed(record)
        self.forget_shown()
        return_free_heap()
        return record

    def _fit_windows(self) -> None:
        """The ``"auto"`` prompt windows: the model's own, shrunk where this
        machine's kernels, as the backend runs them now, would read a cold
        prompt of that size too slowly (policy/windows.py)."""
        b, table = self.backend, self.kernel_timings
        if not isinstance(b, LeanBackend) or table is None:
            return
        tuned = WINDOWS_BY_MODEL.get(self.served_model or "", GENERIC_WINDOWS)
        per_token = prompt_ms(table, b.plan, 1024) / 1024
        self.fitted = fit_windows(tuned.prefix, tuned.suffix, tuned.outline, per_token)
        log.info("prompt windows prefix %d, suffix %d, outline %d: %s", self.fitted.prefix, self.fitted.suffix,
                 self.fitted.outline, self.fitted.why)
        self.settings.adapt_again()

    def _measured_drafts(self) -> tuple[Drafts, dict[int, float] | None]:
        """Draft sizing from forward costs measured now (speculation on),
        and those costs."""
        drafts, cc = Drafts(model=self.part.draft_model), self.config.completion
        if not cc.speculative:
            return drafts, None
        costs = self.measure_forward_costs()
        drafts = Drafts(model=drafts.model, length=DraftLength(costs, cc.draft_tokens))
        log.info("forward cost by tokens (ms): %s", {t: round(c, 1) for t, c in costs.items()})
        if drafts.model is not None:
            step = drafts.model.measure()
            drafts = Drafts(drafts.model, drafts.length, DraftLength(costs, cc.draft_tokens, draft_ms=step))
            log.info("draft model step: %.1f ms", step)
        return drafts, costs

    def use_kernels(self, plan: KernelPlan) -> str | None:
        """Swap ``plan``'s kernels in between requests (the kernel
        re-timing, :mod:`soldaemon.runtime.forward.retime`): None when
        swapped, else why not. What the old kernels computed (KV, parked
        and foreseen answers) is dropped, and the forward costs drafts are
        sized by are measured again (one piece under the lock)."""
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
                    self.part.use_drafts(self._measured_drafts()[0])
                    self.pool.acquire(SCRATCH_URI).truncate(0)
        return why

    @property
    def stats(self) -> EngineStats:
        """The model part's counters (requests, tokens, drafts, resumed runs)."""
        return self.part.stats

    def forget(self) -> None:
        """Drop every per-document memory — KV caches, type-through, the
        parked generation, the foreseen answer, anchors, windows, context
        choices — as if just loaded (benchmarks run a second configuration
        on the same weights)."""
        self.part.forget()
        self.pipeline.forget()

    def forget_shown(self, uri: str | None = None) -> None:
        """Forget the completion shown at ``uri`` (None: everywhere): the
        next request there is answered by the model, not by type-through."""
        if uri is None:
            self.pipeline.documents.shown.clear()
        else:
            self.pipeline.forget(uri)

    def attach_draft_model(self, draft: LoadedModel) -> None:
        """Speculate with ``draft`` (``model.draft_model``) instead of prompt
        lookup. Its tokenizer must be the target's: a draft token id means
        the same text to both models."""
        if draft.tokenizer.get_vocab() != self.tokenizer.get_vocab():
            raise ModelError(f"model.draft_model {draft.name} does not share the tokenizer of {self.loaded.name}",
                             hint="use a smaller model of the same family (same vocabulary), or no draft model")
        # the draft runs the target's kernels (its shapes are alike and smaller)
        plan = self.backend.plan if isinstance(self.backend, LeanBackend) and self.backend.released else None
        if plan is not None and plan.rows is not None:
            plan = replace(plan, rows=None)      # the draft keeps one copy: its forwards are mostly steps
        backend = make_backend(draft.model, self.backend.n_ctx, plan=plan, release=plan is not None)
        if self.memory is not None and isinstance(backend, LeanBackend):
            # the residency planner keeps room for the pair (sol.memory_budget)
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
        """Decode steps on the blocked copy too where real steps, after a
        256-token context, measured faster there in alternating rounds
        (:func:`steps_on_blocked_copy`; the same bits either way); where
        they did not, the copy is dropped (one layout for every forward).
        CPU only, and only where the plan keeps the copy."""
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
                samples = []
                for _ in range(steps):
                    t0 = time.perf_counter_ns()
                    session.verify(ids[n:n + 1])
                    samples.append(elapsed_ms(t0, b.device))
                    session.truncate(n)
                medians[on].append(sorted(samples)[steps // 2])
        b.steps_on_rows = steps_on_blocked_copy(medians[False], medians[True])
        session.truncate(0)
        log.info("decode step on the one copy %s ms, on the blocked copy %s ms: %s",
                 [round(m, 1) for m in medians[False]], [round(m, 1) for m in medians[True]],
                 "every forward reads the blocked copy" if b.steps_on_rows else "the blocked copy is dropped")
        if not b.steps_on_rows:
            b.drop_row_copy("real decode steps were not faster on it")
        elif self.memory is None or (not self.memory.idle_release and self.memory.budget is None):
            # nothing reads the plain copy of the layers now (the store never offloads without a budget)
            freed = b.keep_only_row_copy()
            return_free_heap()
            log.info("the plain copy of the layers freed (%.0f MB): one copy resident", freed / 2**20)

    def measure_forward_costs(self, sizes: tuple[int, ...] = (1, 2, 3, 5, 9)) -> dict[int, float]:
        """ms of one forward of T tokens after a 64-token context, per T
        (the median of three, each timed to the end of its device work):
        what speculation weighs its drafts against."""
        n = 64
        ids = [int(t) for t in torch.randint(0, min(self.backend.vocab_size, 30000), (n + max(sizes),))]
        session = self.pool.acquire(SCRATCH_URI)
        session.truncate(0)
        session.prefill(ids[:n])
        costs: dict[int, float] = {}
        for t in sizes:
            samples = []
            for _ in range(3):
                synchronize(self.backend.device)
                t0 = time.perf_counter_ns()
                session.verify(ids[n:n + t])
                samples.append(elapsed_ms(t0, self.backend.device))   # after the kernels, not their launch
                session.truncate(n)
            costs[t] = sorted(samples)[1]
        session.truncate(0)
        return costs

    # -- stages --------------------------------------------------------------

    def build_prompt(self, req: CompletionRequest) -> tuple[FimPrompt, float]:
        """Window, tokenize and template the request (the pipeline's
        stage, with token healing when ``completion.token_healing``).
        Returns (prompt, ms)."""
        return self.pipeline.build_prompt(req)

    @property
    def config(self) -> Config:
        """The engine's config now (``settings``'s, which the pipeline and
        the model part read)."""
        return self.settings.config

    @config.setter
    def config(self, config: Config) -> None:
        """A new config applies from the next request on, to the engine, the
        pipeline and the model part alike (one holder)."""
        self.settings.use(config)

    def _served(self, config: Config) -> Config:
        """``config`` with its ``"auto"`` prompt windows this engine's: the
        served model's own, fitted to this machine once warm (so a bench
        column or a reload that swaps the config measures the windows the
        daemon serves)."""
        own = None if self.fitted is None else PromptWindows(self.fitted.prefix, self.fitted.suffix,
                                                             self.fitted.outline)
        if self.served_model is None:
            return config if own is None else replace(config, model=config.model.served_by(None, own))
        return replace(config, model=config.model.served_by(self.served_model, own),
                       completion=config.completion.served_by(self.served_model))

    # The pipeline's per-document memory, under the names the quality
    # benchmark and the tests use.

    @property
    def lead_anchors(self) -> LeadAnchors:
        return self.pipeline.documents.anchors

    @property
    def context_selector(self) -> ContextSelector | None:
        return self.pipeline.documents.selector

    @context_selector.setter
    def context_selector(self, selector: ContextSelector | None) -> None:
        self.pipeline.documents.selector = selector


def load_engine(config: Config, *, progress: bool = True) -> LocalEngine:
    """Prepare, load and warm the configured model: weights read in their
    stored dtype, packed once into the kernel plan's format."""
    mc = config.model
    name, auto = (None, None) if mc.path else choose_embedded(config, progress=progress)
    # "auto" settings are the served model's (model.name auto is decided only now); the prompt's
    # "auto" windows stay for the engine, which fits them to this machine (LocalEngine._fit_windows)
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
        draft = (load_model(str(mc.draft_model), device=config.device.device, dtype="stored", progress=progress)
                 if mc.draft_model is not None else
                 load_model(None, name=draft_name, device=config.device.device, dtype="stored", progress=progress))
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
