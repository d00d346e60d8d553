"""The local engine: a completion request in, a stream of events out.

A named pipeline, each stage timed: ``build_prompt`` (window, tokenize, FIM
template) → ``generate`` (prefill with KV reuse, decode, speculation, stop
checks) → ``postprocess`` (suffix overlap, brackets, line caps). Implements
:class:`soldaemon.api.Engine`; driven from one worker thread.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from ..api import CancelToken, CompletionRequest, Delta, Done, Event, Timings
from ..config import Config
from ..errors import BadRequest
from ..fim import FimPrompt, FimTemplate, detect_template, make_prompt
from ..model.loader import LoadedModel, load_model
from ..postprocess import StopChecker, decide_multiline, postprocess
from .backend import Backend, LeanBackend, make_backend
from .draft import DraftLength, PromptLookup
from .generate import GenStats, generate
from .sampling import make_sampler
from .session import Cancelled, KVSession, SessionPool

log = logging.getLogger("soldaemon.engine")

# Characters a preview holds back at its end: post-processing may still drop
# them (trailing blanks, closers the suffix already has).
_HOLD_BACK = " \t)]}>\"'`;,"


@dataclass
class EngineStats:
    requests: int = 0
    prompt_tokens: int = 0         # summed over requests
    cached_tokens: int = 0         # of which reused from the KV cache
    draft_tokens: int = 0
    accepted_tokens: int = 0

    @property
    def kv_hit_ratio(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class LocalEngine:
    """The Sol runtime on a local model (see module doc)."""

    def __init__(self, loaded: LoadedModel, config: Config) -> None:
        self.loaded = loaded
        self.config = config
        self.tokenizer = loaded.tokenizer
        self.template: FimTemplate = detect_template(loaded.tokenizer)
        if config.device.threads:
            torch.set_num_threads(config.device.threads)
        self.backend: Backend = make_backend(loaded.model, config.model.max_context,
                                             decode_dtype=resolve_decode_dtype(config.model.decode_dtype, loaded))
        min_move = config.model.cache_reuse if isinstance(self.backend, LeanBackend) else 0
        self.pool = SessionPool(self.backend, config.model.kv_sessions, min_move=min_move)
        self.session: KVSession = self.pool.acquire("untitled:")  # the last used session
        # measured in warmup(); until then speculation uses the fixed draft size
        self.draft_length: DraftLength | None = None
        self.stats = EngineStats()
        self.started = time.time()
        self._lock = threading.Lock()   # one generation at a time
        # uri → (prefix, suffix, completion) of the last completion, for type-through
        self._shown: dict[str, tuple[str, str, str]] = {}

    # -- the Engine protocol -------------------------------------------------

    def info(self) -> dict[str, Any]:
        return {
            "model": self.loaded.name,
            "device": str(self.loaded.device),
            "dtype": str(self.loaded.dtype).removeprefix("torch."),
            "backend": "lean" if isinstance(self.backend, LeanBackend) else "transformers",
            "decode_dtype": str(getattr(self.backend, "decode_dtype", None) or self.loaded.dtype).removeprefix("torch."),
            "fim": self.template.family,
            "n_ctx": self.backend.n_ctx,
            "threads": torch.get_num_threads(),
            "load_s": round(self.loaded.load_s, 2),
            "forward_ms_by_tokens": ({t: round(c, 2) for t, c in self.draft_length.costs_ms.items()}
                                     if self.draft_length else None),
        }

    def diagnosis(self) -> dict[str, Any]:
        return {
            "active": True,
            "ttft_optimized": True,          # KV prefix reuse + chunked prefill are on
            "prefetch_hit_rate": None,       # no weight offload: every layer resident
            "kv_fold_ratio": 0.0,
            "offloaded_layers": 0,
            "kv_hit_ratio": round(self.stats.kv_hit_ratio, 4),
            "fallback_count": 0,             # no prefetch: nothing can fall back
            "draft_acceptance": round(self.draft_length.rate, 3) if self.draft_length else None,
        }

    def debug_snapshots(self) -> dict[str, Any]:
        """The ``debug`` message's snapshots. No memory scheduler yet: every
        layer is resident, nothing is prefetched, so both are empty."""
        return {"heatmap": {}, "prefetch": {}}

    def warm(self, req: CompletionRequest, cancel: CancelToken) -> Timings:
        t0 = req.received_ns or time.perf_counter_ns()
        prompt, prompt_ms = self.build_prompt(req)
        t1 = time.perf_counter_ns()
        with self._lock:
            self.session = self.pool.acquire(req.uri)
            try:
                pre = self.session.prefill(prompt.ids, cancelled=lambda: cancel.cancelled)
            except Cancelled:
                return Timings(prompt_ms=prompt_ms, prompt_tokens=len(prompt.ids))
        t2 = time.perf_counter_ns()
        return Timings(prompt_ms=prompt_ms, prefill_ms=(t2 - t1) / 1e6, total_ms=(t2 - t0) / 1e6,
                       prompt_tokens=len(prompt.ids), cached_tokens=pre.cached)

    def complete(self, req: CompletionRequest, cancel: CancelToken) -> Iterator[Event]:
        arrival = req.received_ns or time.perf_counter_ns()
        arrival_wall = time.time_ns() - (time.perf_counter_ns() - arrival)
        t_start = time.perf_counter_ns()
        self._validate(req)
        rest = self.type_through(req)
        if rest is not None:
            now = time.perf_counter_ns()
            ms = (now - arrival) / 1e6
            self._remember(req, rest)
            yield Delta(req.id, rest)
            yield Done(req.id, (rest,), "stop", Timings(
                queue_ms=(t_start - arrival) / 1e6, ttft_ms=ms, total_ms=ms, ttft_start_ns=arrival_wall,
                ttft_end_ns=time.time_ns(), source="type-through"))
            return
        prompt, prompt_ms = self.build_prompt(req)
        multiline = decide_multiline(prompt.prefix_text, req.suffix, req.multiline)
        max_lines = self.config.completion.max_lines if multiline else 1
        deadline = arrival + int(req.budget_ms * 1e6) if req.budget_ms else None
        items: list[str] = []
        stats = GenStats()
        finish = "stop"
        emitted = ""
        generated_total = 0
        with self._lock:
            self.session = self.pool.acquire(req.uri)
            for candidate in range(req.n):
                checker = StopChecker(req.prefix, req.suffix, multiline, max_lines)
                decode = _Detok(self.tokenizer)
                sampler = make_sampler(req.temperature, req.top_p,
                                       None if req.seed is None else req.seed + candidate)
                drafter = PromptLookup() if self.config.completion.speculative and sampler.greedy else None
                try:
                    for ev in generate(
                        self.session, prompt.ids, sampler=sampler, stop_ids=self.template.stop_ids,
                        max_tokens=req.max_tokens, cancelled=lambda: cancel.cancelled,
                        should_stop=lambda toks: checker.check(decode.text(toks)),
                        deadline_ns=deadline, drafter=drafter,
                        draft_k=self.config.completion.draft_tokens, draft_length=self.draft_length,
                    ):
                        stats = ev.stats
                        if ev.tokens:
                            decode.push(ev.tokens)
                            if candidate == 0:
                                preview = _preview(decode.current, multiline)
                                if preview.startswith(emitted) and len(preview) > len(emitted):
                                    yield Delta(req.id, preview[len(emitted):])
                                    emitted = preview
                        if ev.finish_reason:
                            finish = ev.finish_reason
                except Cancelled:
                    finish = "cancelled"
                generated_total += len(decode.tokens)
                items.append(postprocess(decode.current, prefix=req.prefix, suffix=req.suffix,
                                         multiline=multiline, max_lines=max_lines))
                if finish in ("cancelled", "budget"):
                    break
        if finish == "cancelled":
            finish = cancel.reason
        end = time.perf_counter_ns()
        first = stats.first_token_ns or end
        timings = Timings(
            queue_ms=(t_start - arrival) / 1e6, prompt_ms=prompt_ms, prefill_ms=stats.prefill_ms,
            ttft_ms=(first - arrival) / 1e6, decode_ms=(end - first) / 1e6 if stats.first_token_ns else 0.0,
            total_ms=(end - arrival) / 1e6, prompt_tokens=len(prompt.ids), cached_tokens=stats.cached_tokens,
            generated_tokens=generated_total, draft_tokens=stats.draft_tokens,
            accepted_tokens=stats.accepted_tokens, ttft_start_ns=arrival_wall,
            ttft_end_ns=stats.first_token_wall_ns or time.time_ns(),
        )
        self._account(timings)
        if finish in ("stop", "length") and items:
            self._remember(req, items[0])
        log.info("complete id=%s finish=%s prompt=%d cached=%d gen=%d prompt_ms=%.1f prefill_ms=%.1f "
                 "ttft_ms=%.1f decode_ms=%.1f total_ms=%.1f accept=%d/%d", req.id, finish,
                 timings.prompt_tokens, timings.cached_tokens, timings.generated_tokens, timings.prompt_ms,
                 timings.prefill_ms, timings.ttft_ms, timings.decode_ms, timings.total_ms,
                 timings.accepted_tokens, timings.draft_tokens)
        yield Done(req.id, tuple(items), finish, timings)  # type: ignore[arg-type]

    def warmup(self) -> None:
        """Run one short completion so that kernels, allocator pools and
        (on CUDA) graphs are ready before the first real request."""
        req = CompletionRequest(id="warmup", prefix="def add(a, b):\n    return ", suffix="\n", max_tokens=4)
        for _ in self.complete(req, CancelToken()):
            pass
        if self.config.completion.speculative:
            self.draft_length = DraftLength(self.measure_forward_costs(), self.config.completion.draft_tokens)
            log.info("forward cost by tokens (ms): %s", {t: round(c, 1) for t, c in self.draft_length.costs_ms.items()})
        self.session.truncate(0)
        self.stats = EngineStats()
        self._shown.clear()

    def type_through(self, req: CompletionRequest) -> str | None:
        """The rest of the last completion for this document when the user
        typed its beginning (same suffix, greedy, one candidate), else None."""
        last = self._shown.get(req.uri)
        if last is None or req.n != 1 or req.temperature > 0:
            return None
        prefix, suffix, text = last
        if req.suffix != suffix or not req.prefix.startswith(prefix):
            return None
        typed = req.prefix[len(prefix):]
        if not typed or not text.startswith(typed) or len(typed) >= len(text):
            return None
        rest = text[len(typed):]
        return rest if rest.strip() else None

    def _remember(self, req: CompletionRequest, text: str) -> None:
        self._shown.pop(req.uri, None)
        if text:
            self._shown[req.uri] = (req.prefix, req.suffix, text)
            while len(self._shown) > 64:
                self._shown.pop(next(iter(self._shown)))

    def measure_forward_costs(self, sizes: tuple[int, ...] = (1, 2, 3, 5, 9)) -> dict[int, float]:
        """ms of one forward of T tokens after a 64-token context, per T
        (the median of three): what speculation weighs its drafts against."""
        n = 64
        ids = [int(t) for t in torch.randint(0, min(self.backend.vocab_size, 30000), (n + max(sizes),))]
        session = self.session
        session.truncate(0)
        session.prefill(ids[:n])
        costs: dict[int, float] = {}
        for t in sizes:
            samples = []
            for _ in range(3):
                t0 = time.perf_counter_ns()
                session.verify(ids[n:n + t])
                samples.append((time.perf_counter_ns() - t0) / 1e6)
                session.truncate(n)
            costs[t] = sorted(samples)[1]
        session.truncate(0)
        return costs

    # -- stages --------------------------------------------------------------

    def build_prompt(self, req: CompletionRequest) -> tuple[FimPrompt, float]:
        """Window, tokenize and template the request. Returns (prompt, ms)."""
        t0 = time.perf_counter_ns()
        mc = self.config.model
        prompt = make_prompt(
            self.template, self.tokenizer, req.prefix, req.suffix,
            max_prefix_tokens=mc.max_prefix_tokens, max_suffix_tokens=mc.max_suffix_tokens,
            context=req.context, language=req.language, current_path=_path_of(req.uri),
            order=mc.fim_order,
        )
        if len(prompt.ids) + req.max_tokens + 1 >= self.backend.n_ctx:
            raise BadRequest(
                f"prompt of {len(prompt.ids)} tokens + max_tokens {req.max_tokens} does not fit "
                f"model.max_context {self.backend.n_ctx}",
                hint="lower max_tokens or send less context",
            )
        return prompt, (time.perf_counter_ns() - t0) / 1e6

    def _validate(self, req: CompletionRequest) -> None:
        if req.max_tokens < 1:
            raise BadRequest(f"max_tokens must be >= 1, got {req.max_tokens}")
        if req.n < 1 or req.n > 8:
            raise BadRequest(f"n must be in 1..8, got {req.n}")
        if req.n > 1 and req.temperature <= 0:
            raise BadRequest("n > 1 needs temperature > 0 (greedy gives one answer)")
        if not 0 < req.top_p <= 1:
            raise BadRequest(f"top_p must be in (0, 1], got {req.top_p}")

    def _account(self, t: Timings) -> None:
        s = self.stats
        s.requests += 1
        s.prompt_tokens += t.prompt_tokens
        s.cached_tokens += t.cached_tokens
        s.draft_tokens += t.draft_tokens
        s.accepted_tokens += t.accepted_tokens


class _Detok:
    """Incremental detokenization that never splits a UTF-8 character: text
    ending in U+FFFD (an incomplete byte sequence) is held back."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.current = ""

    def text(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def push(self, tokens: list[int]) -> None:
        self.tokens.extend(tokens)
        text = self.text(self.tokens)
        if text.endswith("\ufffd"):
            text = text.rstrip("\ufffd")
        self.current = text


def _preview(raw: str, multiline: bool) -> str:
    text = raw if multiline else raw.split("\n", 1)[0]
    return text.rstrip(_HOLD_BACK)


def resolve_decode_dtype(name: str, loaded: LoadedModel) -> torch.dtype | None:
    """``model.decode_dtype`` → the dtype of the short-forward weight copy, or
    None for "same"."""
    if name == "same":
        return None
    if name == "auto":
        on_cpu_fp32 = loaded.device.type == "cpu" and loaded.dtype == torch.float32
        return torch.float16 if on_cpu_fp32 else None
    return {"float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def _path_of(uri: str) -> str | None:
    if uri.startswith("file://"):
        return uri[len("file://"):]
    return None if uri.startswith("untitled:") else uri


def load_engine(config: Config, *, progress: bool = True) -> LocalEngine:
    """Prepare, load and warm the configured model."""
    mc = config.model
    loaded = load_model(str(mc.path) if mc.path else None, device=config.device.device, dtype=mc.dtype,
                        progress=progress)
    engine = LocalEngine(loaded, config)
    engine.warmup()
    return engine
