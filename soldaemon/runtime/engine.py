"""The local engine: a completion request in, a stream of events out.

A named pipeline, each stage timed: ``build_prompt`` (window, tokenize, FIM
template) → ``generate`` (prefill with KV reuse, decode, speculation, stop
checks) → ``postprocess`` (suffix overlap, brackets, line caps). Implements
:class:`soldaemon.api.Engine`; driven from one worker thread.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from ..api import CancelToken, CompletionRequest, Delta, Done, Event, Timings
from ..config import Config, effective_precision
from ..errors import BadRequest, ConfigError, ModelError
from ..fim import FimPrompt, FimTemplate, WindowMemo, detect_template, make_prompt
from ..model.loader import LoadedModel, load_model
from ..pipeline import (
    LeadAnchors,
    Shown,
    build_fim_prompt,
    context_selector,
    remember,
    type_through,
    validate_request,
)
from ..pipeline import preview as _preview  # the hold-back rule, shared with the remote engine
from ..postprocess import StopChecker, decide_multiline, postprocess
from .backend import LEAN_ARCHITECTURES, Backend, LeanBackend, make_backend
from .kernel_plan import KernelPlan, TimingTable
from .kernels import trim_heap
from .precision import choose_kernels, lean_or_float32, precision_info
from .cudagraph import GraphDecoder
from .detok import Detok, stopper
from .draft import DraftLength, DraftModel, DraftProposer, PromptLookup
from .foresight import Foreseen, answer_foreseen, precise_until, speculate, warm
from .generate import GenStats, TokenEvent, generate
from .healing import HealingSampler, TokenTexts
from .sampling import make_sampler
from ..errors import BudgetTooSmall, Cancelled
from .residency import MemoryScheduler
from .session import KVSession, SessionPool
from .timing import elapsed_ms, synchronize

log = logging.getLogger("soldaemon.engine")

@dataclass
class EngineStats:
    requests: int = 0
    prompt_tokens: int = 0         # summed over requests
    cached_tokens: int = 0         # of which reused from the KV cache
    draft_tokens: int = 0
    accepted_tokens: int = 0
    resumed: int = 0               # requests answered by resuming a parked generation

    @property
    def kv_hit_ratio(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class LocalEngine:
    """The Sol runtime on a local model (see module doc)."""

    def __init__(self, loaded: LoadedModel, config: Config, *, plan: KernelPlan | None = None,
                 timings: TimingTable | None = None, notices: tuple[str, ...] = (),
                 release: bool | None = None) -> None:
        """``plan``: the lean backend's kernels and weight storage (from
        :func:`load_engine`'s measurement); None: dense in the model's
        dtype, the HF module's own tensors (the reference math). With a
        plan, the module's parameters are released after packing: one
        resident copy of the weights. ``timings``: the table the plan was
        chosen from (shown by info()); ``notices``: config notices;
        ``release`` (default: when a plan is given) empties the module's
        parameters the packed weights do not share (False: several engines
        over one loaded module, as ``bench --quality --precisions`` builds)."""
        self.loaded = loaded
        self.config = config
        self.tokenizer = loaded.tokenizer
        self.template: FimTemplate = detect_template(loaded.tokenizer)
        if config.device.threads:
            torch.set_num_threads(config.device.threads)
        self.backend: Backend = make_backend(loaded.model, config.model.max_context, plan=plan,
                                             release=plan is not None if release is None else release)
        self.kernel_timings = timings
        self.notices = notices
        min_move = config.model.cache_reuse if isinstance(self.backend, LeanBackend) else 0
        # KV folding of parked sessions (runtime/kvfold.py) needs the lean backend's queries
        fold = config.sol.kv_folding_entropy_threshold if isinstance(self.backend, LeanBackend) else 0.0
        if fold and isinstance(self.backend, LeanBackend):
            self.backend.record_queries()
        self.pool = SessionPool(self.backend, config.model.kv_sessions, min_move=min_move, fold_threshold=fold)
        self.session: KVSession = self.pool.acquire("untitled:")  # the last used session
        # measured in warmup(); until then speculation uses the fixed draft size
        self.draft_length: DraftLength | None = None
        # model.draft_model (attach_draft_model), with its own draft sizing
        self.draft_model: DraftModel | None = None
        self.draft_model_length: DraftLength | None = None
        self.stats = EngineStats()
        self.started = time.time()
        self._lock = threading.Lock()   # one generation at a time
        # Sol's memory scheduler (runtime/residency.py): residency under
        # sol.memory_budget, prefetch, heatmap, idle release, priority pins
        self.memory: MemoryScheduler | None = None
        if isinstance(self.backend, LeanBackend):
            try:
                self.memory = MemoryScheduler(self.backend, config.sol, self._lock,
                                              kv_reserve_bytes=self.backend.kv_bytes_per_session * config.model.kv_sessions)
            except BudgetTooSmall as exc:
                raise ConfigError(f"sol.memory_budget: {exc}",
                                  hint="raise sol.memory_budget, or lower model.max_context, model.kv_sessions "
                                       "or sol.prefetch_depth") from None
        # uri → the last completion and its prompt inputs, for type-through (pipeline.Shown)
        self._shown: Shown = {}
        self.graphs: GraphDecoder | None = None   # CUDA-graph decode steps (warmup() sets it up on CUDA)
        # a superseded generation kept for the next keystroke (see _resume)
        self._parked: _Run | None = None
        self._token_texts: TokenTexts | None = None   # token healing's vocabulary index
        self.context_selector = context_selector(config.model)   # model.context: relevance
        self.lead_anchors = LeadAnchors()                         # model.fim_anchor: sticky
        self.window_memo = WindowMemo()                           # windows unchanged while typing
        self.foreseen = Foreseen()                                # completion.speculative_fim's answer

    # -- the Engine protocol -------------------------------------------------

    def info(self) -> dict[str, Any]:
        return {
            "model": self.loaded.name,
            "device": str(self.loaded.device),
            # the compute dtype (residual stream, attention, KV); the weights' format is precision.plan
            "dtype": str(getattr(self.backend, "dtype", self.loaded.dtype)).removeprefix("torch."),
            "backend": "lean" if isinstance(self.backend, LeanBackend) else "transformers",
            "precision": precision_info(self.backend, self.loaded.dtype, self.kernel_timings, self.notices),
            "fim": self.template.family,
            "n_ctx": self.backend.n_ctx,
            "threads": torch.get_num_threads(),
            "load_s": round(self.loaded.load_s, 2),
            "drafter": ("off" if not self.config.completion.speculative else
                        "draft model" if self.draft_model is not None else "prompt lookup"),
            "cuda_graphs": self.graphs.info() if self.graphs is not None else None,
            "forward_ms_by_tokens": ({t: round(c, 2) for t, c in self.draft_length.costs_ms.items()}
                                     if self.draft_length else None),
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
            "draft_acceptance": (round(length.rate, 3) if (length := self.draft_model_length
                                                               if self.draft_model else self.draft_length) else None),
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

    def memory_scope(self, req: CompletionRequest) -> contextlib.AbstractContextManager[None]:
        """Around one request: notes activity for idle release, restores
        released weights first, pins them for ``priority: high``."""
        if self.memory is None:
            return contextlib.nullcontext()
        return self.memory.request(req.priority)

    def close(self) -> None:
        """Stop the memory scheduler's idle timer and prefetch thread."""
        if self.memory is not None:
            self.memory.close()

    def warm(self, req: CompletionRequest, cancel: CancelToken) -> Timings:
        """Prefill exactly the prompt the next ``complete`` at ``req``'s
        cursor computes, leaving its answer unchanged
        (:func:`soldaemon.runtime.foresight.warm`)."""
        return warm(self, req, cancel)

    def speculate(self, req: CompletionRequest, item: str, cancel: CancelToken) -> Done | None:
        """After ``item`` was delivered for ``req``: compute the completion
        that follows accepting it, for the next request
        (``completion.speculative_fim``; :func:`soldaemon.runtime.foresight.speculate`).
        Returns None at once when the setting is off."""
        if not self.config.completion.speculative_fim:
            return None
        return speculate(self, req, item, cancel)

    def complete(self, req: CompletionRequest, cancel: CancelToken) -> Iterator[Event]:
        """Stream one completion (the Engine protocol), inside
        :meth:`memory_scope`."""
        with self.memory_scope(req):
            yield from self._complete(req, cancel)

    def _complete(self, req: CompletionRequest, cancel: CancelToken) -> Iterator[Event]:
        arrival = req.received_ns or time.perf_counter_ns()
        arrival_wall = time.time_ns() - (time.perf_counter_ns() - arrival)
        t_start = time.perf_counter_ns()
        validate_request(req)
        parked, self._parked = self._parked, None
        rest = self.type_through(req)
        if rest is not None:
            if parked is not None:
                parked.close()
            now = time.perf_counter_ns()
            ms = (now - arrival) / 1e6
            self._remember(req, rest)
            yield Delta(req.id, rest)
            yield Done(req.id, (rest,), "stop", Timings(
                queue_ms=(t_start - arrival) / 1e6, ttft_ms=ms, total_ms=ms, ttft_start_ns=arrival_wall,
                ttft_end_ns=time.time_ns(), source="type-through"))
            return
        foreseen = answer_foreseen(self, req, arrival, t_start)
        if foreseen is not None:
            if parked is not None:
                parked.close()
            yield from foreseen
            return
        if parked is not None:
            typed = parked.typed_by(req, self.session)
            if typed is None:
                parked.close()
            else:
                yield from self._resume(parked, req, typed, cancel, arrival, arrival_wall, t_start)
                return
        prompt, prompt_ms = self.build_prompt(req)
        multiline = decide_multiline(prompt.prefix_text, req.suffix, req.multiline)
        max_lines = self.config.completion.max_lines if multiline else 1
        deadline = arrival + int(req.budget_ms * 1e6) if req.budget_ms else None
        items: list[str] = []
        stats = GenStats()
        finish = "stop"
        generated_total = 0
        with self._lock:
            self.session = self.pool.acquire(req.uri)
            for candidate in range(req.n):
                checker = StopChecker(req.prefix, req.suffix, multiline, max_lines)
                decode = Detok(self.tokenizer, prompt.heal)
                sampler = make_sampler(req.temperature, req.top_p,
                                       None if req.seed is None else req.seed + candidate)
                if prompt.heal:
                    sampler = HealingSampler(sampler, self.token_texts(), prompt.heal)
                drafter: DraftProposer | None = None
                draft_length = self.draft_length
                if self.config.completion.speculative and sampler.greedy:
                    drafter = self.draft_model or PromptLookup()
                    if self.draft_model is not None:
                        draft_length = self.draft_model_length
                # A single greedy generation survives being superseded once it
                # decodes: parked, the next keystroke may resume it (_resume).
                run = _Run(req, cancel, deadline, decode, multiline, max_lines, len(prompt.ids),
                           resumable=req.n == 1 and sampler.greedy)
                run.gen = generate(
                    self.session, prompt.ids, sampler=sampler, stop_ids=self.template.stop_ids,
                    max_tokens=req.max_tokens, cancelled=run.cancelled,
                    should_stop=stopper(checker, decode),
                    deadline_ns=run.deadline, drafter=drafter,
                    draft_k=self.config.completion.draft_tokens, draft_length=draft_length,
                    # the middle token and the typed line: at decode cost (session.prefill)
                    precise_until=precise_until(prompt),
                )
                try:
                    yield from self._drive(run, stream=candidate == 0)
                except Cancelled:
                    run.finish = "cancelled"
                finish, stats = run.finish, run.stats
                generated_total += len(decode.tokens)
                if run.parked:
                    run.park(self.session)
                    self._parked = run
                else:
                    run.close()
                items.append(postprocess(decode.current, prefix=req.prefix, suffix=req.suffix,
                                         multiline=multiline, max_lines=max_lines))
                if finish in ("cancelled", "budget", "superseded"):
                    break
        if finish == "cancelled":
            finish = cancel.reason
        timings = self._timings(stats, arrival, arrival_wall, t_start, prompt_ms=prompt_ms,
                                prompt_tokens=len(prompt.ids), generated=generated_total)
        yield self._finish(req, items, finish, timings)

    def _drive(self, run: _Run, *, stream: bool) -> Iterator[Event]:
        """Pull ``run``'s token events, streaming previews of the text after
        what the user typed; park the run when it is superseded mid-decode."""
        for ev in run.gen:
            run.stats = ev.stats
            if ev.tokens:
                run.decode.push(ev.tokens)
                if stream:
                    delta = run.preview_delta()
                    if delta:
                        yield Delta(run.req.id, delta)
            if ev.finish_reason:
                run.finish = ev.finish_reason
                return
            if run.should_park():
                run.parked = True
                run.finish = "superseded"
                return

    def _resume(self, run: _Run, req: CompletionRequest, typed: str, cancel: CancelToken,
                arrival: int, arrival_wall: int, t_start: int) -> Iterator[Event]:
        """Continue a parked generation for ``req``, whose prefix is the
        parked one plus ``typed``, text the generation had already produced."""
        run.adopt(req, typed, cancel, arrival + int(req.budget_ms * 1e6) if req.budget_ms else None)
        first_ns = 0
        with self._lock:
            self.session = self.pool.acquire(req.uri)
            delta = run.preview_delta()
            if delta:
                first_ns = time.perf_counter_ns()
                yield Delta(req.id, delta)
            if run.finish == "superseded":   # still decoding when it was parked
                run.finish = "stop"
                try:
                    for ev in self._drive(run, stream=True):
                        if not first_ns:
                            first_ns = time.perf_counter_ns()
                        yield ev
                except Cancelled:
                    run.finish = "cancelled"
            if run.parked:
                run.park(self.session)
                self._parked = run
            else:
                run.close()
        finish = cancel.reason if run.finish == "cancelled" else run.finish
        text = run.decode.current[len(run.typed):]
        items = [postprocess(text, prefix=req.prefix, suffix=req.suffix, multiline=run.multiline,
                             max_lines=run.max_lines)]
        end = time.perf_counter_ns()
        first_ns = first_ns or end
        timings = Timings(
            queue_ms=(t_start - arrival) / 1e6, ttft_ms=(first_ns - arrival) / 1e6,
            decode_ms=(end - first_ns) / 1e6, total_ms=(end - arrival) / 1e6,
            prompt_tokens=run.prompt_tokens, cached_tokens=run.prompt_tokens,
            generated_tokens=len(run.decode.tokens) - run.tokens_before, ttft_start_ns=arrival_wall,
            ttft_end_ns=time.time_ns(), source="resumed")
        self.stats.resumed += 1
        yield self._finish(req, items, finish, timings)

    def _timings(self, stats: GenStats, arrival: int, arrival_wall: int, t_start: int, *, prompt_ms: float,
                 prompt_tokens: int, generated: int) -> Timings:
        end = time.perf_counter_ns()
        first = stats.first_token_ns or end
        return Timings(
            queue_ms=(t_start - arrival) / 1e6, prompt_ms=prompt_ms, prefill_ms=stats.prefill_ms,
            ttft_ms=(first - arrival) / 1e6, decode_ms=(end - first) / 1e6 if stats.first_token_ns else 0.0,
            total_ms=(end - arrival) / 1e6, prompt_tokens=prompt_tokens, cached_tokens=stats.cached_tokens,
            generated_tokens=generated, draft_tokens=stats.draft_tokens,
            accepted_tokens=stats.accepted_tokens, ttft_start_ns=arrival_wall,
            ttft_end_ns=stats.first_token_wall_ns or time.time_ns(),
        )

    def _finish(self, req: CompletionRequest, items: list[str], finish: str, timings: Timings) -> Done:
        self._account(timings)
        if finish in ("stop", "length") and items:
            self._remember(req, items[0])
        log.info("complete id=%s finish=%s source=%s prompt=%d cached=%d gen=%d prompt_ms=%.1f prefill_ms=%.1f "
                 "ttft_ms=%.1f decode_ms=%.1f total_ms=%.1f accept=%d/%d", req.id, finish, timings.source,
                 timings.prompt_tokens, timings.cached_tokens, timings.generated_tokens, timings.prompt_ms,
                 timings.prefill_ms, timings.ttft_ms, timings.decode_ms, timings.total_ms,
                 timings.accepted_tokens, timings.draft_tokens)
        return Done(req.id, tuple(items), finish, timings)  # type: ignore[arg-type]

    def warmup(self) -> None:
        """Run one short completion so that kernels, allocator pools and
        (on CUDA) graphs are ready before the first real request."""
        req = CompletionRequest(id="warmup", prefix="def add(a, b):\n    return ", suffix="\n", max_tokens=4)
        self.complete_all(req)
        if (self.config.device.cuda_graphs and isinstance(self.backend, LeanBackend)
                and self.backend.device.type == "cuda"):
            self.graphs = GraphDecoder(self.backend)
            # KVSession.decode_step replays through the backend's `graphs` when set
            self.backend.graphs = self.graphs
            self.graphs.warm_up()
            self.complete_all(req)               # one step through the graphs before the first user
        if self.config.completion.speculative:
            costs = self.measure_forward_costs()
            self.draft_length = DraftLength(costs, self.config.completion.draft_tokens)
            log.info("forward cost by tokens (ms): %s", {t: round(c, 1) for t, c in self.draft_length.costs_ms.items()})
            if self.draft_model is not None:
                step = self.draft_model.measure()
                self.draft_model_length = DraftLength(costs, self.config.completion.draft_tokens, draft_ms=step)
                log.info("draft model step: %.1f ms", step)
        self.session.truncate(0)
        self.stats = EngineStats()
        self._shown.clear()
        trim_heap()

    def forget(self) -> None:
        """Drop every per-document memory — KV caches, type-through, the
        parked generation, anchors, windows, context choices — as if just
        loaded (benchmarks run a second configuration on the same weights)."""
        with self._lock:
            if self._parked is not None:
                self._parked.close()
                self._parked = None
            for session in list(self.pool._by_key.values()):
                session.truncate(0)
            self._shown.clear()
            self.foreseen = Foreseen()
            self.lead_anchors = LeadAnchors()
            self.window_memo = WindowMemo()
            self.context_selector = context_selector(self.config.model)

    def attach_draft_model(self, draft: LoadedModel) -> None:
        """Speculate with ``draft`` (``model.draft_model``) instead of prompt
        lookup. Its tokenizer must be the target's: a draft token id means
        the same text to both models."""
        if draft.tokenizer.get_vocab() != self.tokenizer.get_vocab():
            raise ModelError(f"model.draft_model {draft.name} does not share the tokenizer of {self.loaded.name}",
                             hint="use a smaller model of the same family (same vocabulary), or no draft model")
        # the draft runs the target's kernels (its shapes are alike and smaller)
        plan = self.backend.plan if isinstance(self.backend, LeanBackend) and self.backend.released else None
        backend = make_backend(draft.model, self.backend.n_ctx, plan=plan, release=plan is not None)
        self.draft_model = DraftModel(backend, vocab_limit=self.backend.vocab_size)

    def complete_all(self, req: CompletionRequest) -> Done:
        """Run ``req`` to its end; its Done."""
        events = list(self.complete(req, CancelToken()))
        done = events[-1]
        assert isinstance(done, Done)
        return done

    def type_through(self, req: CompletionRequest) -> str | None:
        """The rest of the last completion for this document when the user
        typed its beginning (same suffix, greedy, one candidate), else None."""
        return type_through(self._shown, req)

    def _remember(self, req: CompletionRequest, text: str) -> None:
        remember(self._shown, req, text)

    def measure_forward_costs(self, sizes: tuple[int, ...] = (1, 2, 3, 5, 9)) -> dict[int, float]:
        """ms of one forward of T tokens after a 64-token context, per T
        (the median of three, each timed to the end of its device work):
        what speculation weighs its drafts against."""
        n = 64
        ids = [int(t) for t in torch.randint(0, min(self.backend.vocab_size, 30000), (n + max(sizes),))]
        session = self.session
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
        """Window, tokenize and template the request (the stage shared with
        the remote engine, :func:`soldaemon.pipeline.build_fim_prompt`).
        Returns (prompt, ms). ``make_prompt`` is looked up here at each call
        (``bench --quality --ablate outline`` swaps it)."""
        return build_fim_prompt(self.template, self.tokenizer, self.config.model, req, self.backend.n_ctx,
                                make=make_prompt, heal=self.config.completion.token_healing,
                                selector=self.context_selector,
                                anchors=self.lead_anchors, memo=self.window_memo)

    def token_texts(self) -> TokenTexts:
        """Every token's text, for token healing (built once, at warm-up)."""
        if self._token_texts is None:
            self._token_texts = TokenTexts(self.tokenizer)
        return self._token_texts

    def _account(self, t: Timings) -> None:
        s = self.stats
        s.requests += 1
        s.prompt_tokens += t.prompt_tokens
        s.cached_tokens += t.cached_tokens
        s.draft_tokens += t.draft_tokens
        s.accepted_tokens += t.accepted_tokens


class _Run:
    """One generation in flight: the suspended token generator and what the
    engine needs to stream, finish — or park and later resume — it."""

    def __init__(self, req: CompletionRequest, cancel: CancelToken, deadline_ns: int | None, decode: Detok,
                 multiline: bool, max_lines: int, prompt_tokens: int, *, resumable: bool) -> None:
        self.req = req
        self.cancel = cancel
        self.deadline_ns = deadline_ns
        self.decode = decode
        self.multiline = multiline
        self.max_lines = max_lines
        self.prompt_tokens = prompt_tokens
        self.resumable = resumable
        self.gen: Iterator[TokenEvent] = iter(())
        self.stats = GenStats()
        self.finish = "stop"
        self.parked = False
        self.typed = ""              # what the user typed of this generation's text
        self.emitted = ""            # preview streamed to the current request
        self.tokens_before = 0       # tokens generated before the current request adopted it

    def cancelled(self) -> bool:
        """What the generator sees: a supersede does not stop a resumable
        generation that is decoding; the engine parks it instead."""
        return self.cancel.cancelled and not self.should_park()

    def should_park(self) -> bool:
        return (self.resumable and self.cancel.cancelled and self.cancel.reason == "superseded"
                and self.stats.first_token_ns > 0)

    def deadline(self) -> int | None:
        return self.deadline_ns

    def preview_delta(self) -> str:
        preview = _preview(self.decode.current[len(self.typed):], self.multiline)
        if preview.startswith(self.emitted) and len(preview) > len(self.emitted):
            delta = preview[len(self.emitted):]
            self.emitted = preview
            return delta
        return ""

    def typed_by(self, req: CompletionRequest, session: KVSession | None) -> str | None:
        """The text ``req`` typed along this parked generation, or None when
        it cannot take the generation over: another document or suffix, a
        prefix that does not extend this one by text the generation already
        produced, other sampling, or a KV cache used since."""
        old = self.req
        if (req.uri != old.uri or req.suffix != old.suffix or req.n != 1 or req.temperature > 0
                or req.context != old.context or req.multiline != old.multiline or req.language != old.language
                or session is None or session is not self.session or session.version != self.session_version):
            return None
        if not req.prefix.startswith(old.prefix):
            return None
        typed = req.prefix[len(old.prefix):]
        if len(typed) < len(self.typed) or not self.decode.current.startswith(typed):
            return None
        if decide_multiline(req.prefix, req.suffix, req.multiline) != self.multiline:
            return None
        if self.finish != "superseded" and len(typed) >= len(self.decode.current):
            return None
        return typed

    def park(self, session: KVSession) -> None:
        """Left suspended; ``session`` holds its prompt and tokens."""
        self.session, self.session_version = session, session.version

    session: KVSession | None = None
    session_version = -1

    def adopt(self, req: CompletionRequest, typed: str, cancel: CancelToken, deadline_ns: int | None) -> None:
        self.req, self.typed, self.cancel, self.deadline_ns = req, typed, cancel, deadline_ns
        self.emitted = ""
        self.parked = False
        self.tokens_before = len(self.decode.tokens)

    def close(self) -> None:
        close = getattr(self.gen, "close", None)
        if close is not None:
            close()


def load_engine(config: Config, *, progress: bool = True) -> LocalEngine:
    """Prepare, load and warm the configured model: weights read in their
    stored dtype, packed once into the kernel plan's format."""
    mc = config.model
    precision, notices = effective_precision(mc)
    for notice in notices:
        log.warning("config: %s", notice)
    loaded = load_model(str(mc.path) if mc.path else None, device=config.device.device, dtype="stored",
                        progress=progress)
    plan, table = choose_kernels(loaded, precision, progress=progress)
    engine = LocalEngine(loaded, config, plan=plan, timings=table, notices=tuple(notices))
    trim_heap()       # the module's released parameters and the timing runs' tensors
    if mc.draft_model is not None:
        draft = load_model(str(mc.draft_model), device=config.device.device, dtype="stored", progress=progress)
        lean_or_float32(draft)
        engine.attach_draft_model(draft)
    engine.warmup()
    return engine
