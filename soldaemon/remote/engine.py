"""The Engine over an OpenAI-compatible streaming ``/v1/completions`` (vLLM, TGI, llama.cpp's
server; docs/remote.md): the shared :class:`Pipeline` owns prompt, type-through, ending and timings.
A cancel, the budget or the ending's stop closes the upstream socket; failures raise retryable
``remote_*`` errors and back off, meanwhile failing at once or answering locally.
``complete``/``warm`` run on the worker thread; ``info``/``diagnosis`` only read state."""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from soldaemon.api import CancelToken, CompletionRequest, Done, Engine, Event, FinishReason, Timings
from soldaemon.config import Config
from soldaemon.errors import ConfigError, RemoteBadResponse, RemoteHttpError, RemoteTimeout, RemoteUnavailable
from soldaemon.fim import FimPrompt, FimTemplate, detect_template
from soldaemon.pipeline.clock import Clock
from soldaemon.pipeline.completion import Pipeline, Settings
from soldaemon.pipeline.sources import Early, Generation, Stats, Stream
from soldaemon.pipeline.ending import Ending
from soldaemon.privacy.rules import outbound
from soldaemon.remote.endpoint import Backoff, Endpoint, read_api_key
from soldaemon.remote.probe import Probe
from soldaemon.remote.stream import CouldNotConnect, UpstreamStream

log = logging.getLogger("soldaemon.remote")

WATCH_INTERVAL_S = 0.002       # how often the watcher looks at cancel and the budget; s


@dataclass
class RemoteStats:
    prompt_tokens: int = 0         # summed over requests (daemon's count)
    cached_tokens: int = 0         # of which the engine reported reused (when it reports it)
    failures: int = 0              # requests ended by an engine failure
    fallbacks: int = 0             # requests answered by the local model
    upstream_closed: int = 0       # streams the daemon closed early (cancel, stop, budget)


class _Watch:
    """Inside its ``with``, a thread closing the followed stream on cancel or budget (``fired``)."""

    def __init__(self, cancel: CancelToken, deadline: int | None) -> None:
        self.cancel, self.deadline = cancel, deadline
        self.stream: UpstreamStream | None = None
        self.fired: str | None = None          # "cancel" | "budget"
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sol-remote-watch", daemon=True)

    def __enter__(self) -> _Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def follow(self, stream: UpstreamStream) -> None:
        """Watch ``stream`` from now on (closed at once if already fired)."""
        self.stream = stream
        if self.fired is not None:
            stream.close()

    def _run(self) -> None:
        while not self._done.wait(WATCH_INTERVAL_S):
            if self.cancel.cancelled or _past(self.deadline):
                self.fired = "cancel" if self.cancel.cancelled else "budget"
                stream = self.stream
                if stream is not None:
                    stream.close()
                log.debug("closed the upstream stream (%s)", self.fired)
                return


class RemoteEngine:
    """The Engine protocol over a remote engine; ``tokenizer`` is the remote model family's,
    ``local`` loads the fallback engine (at most once, in the background)."""

    def __init__(self, config: Config, tokenizer: Any, tokenizer_name: str, *,
                 local: Callable[[], Engine] | None = None) -> None:
        bc = config.backend
        if bc.url is None:
            raise ConfigError("backend.kind is \"remote\" but backend.url is not set")
        self.settings = Settings(config)      # the one config holder, the pipeline's too
        self.endpoint = Endpoint.parse(bc.url)
        self.endpoint.refuse_clear_text(bc.allow_insecure)
        self.tokenizer = tokenizer
        self.tokenizer_name = tokenizer_name
        self.template: FimTemplate = detect_template(tokenizer)
        # no healing: the engine elsewhere samples the first token
        self.pipeline = Pipeline(self.settings, self.template, tokenizer, config.model.max_context, heal=False,
                                 outbound=functools.partial(outbound, send_untitled=bc.send_untitled))
        self._headers = {"Content-Type": "application/json", "Accept": "text/event-stream",
                         "User-Agent": "soldaemon"}
        key = read_api_key(bc.api_key_env, str(bc.api_key_file) if bc.api_key_file else None)
        if key:
            self._headers["Authorization"] = f"Bearer {key}"
        elif self.endpoint.userinfo is not None:
            import base64

            self._headers["Authorization"] = "Basic " + base64.b64encode(self.endpoint.userinfo.encode()).decode()
        self.backoff = Backoff(bc.backoff_s, bc.max_backoff_s)
        probe_headers = {k: v for k, v in self._headers.items() if k in ("Authorization", "User-Agent")}
        self.probe = Probe(self.endpoint, probe_headers, bc.health_interval_s, min(bc.timeout_s, 5.0))
        self.probe.on_reachable = self.backoff.succeeded
        self.stats = RemoteStats()
        self._local_loader = local if bc.fallback_local else None
        self._local: Engine | None = None
        self._local_error: BaseException | None = None
        self._local_ready = threading.Event()
        self._local_started = False
        self._lock = threading.Lock()

    # the Engine protocol

    @property
    def config(self) -> Config:
        """The config the pipeline reads too."""
        return self.settings.config

    def info(self) -> dict[str, Any]:
        bc = self.config.backend
        models = self.probe.state.models
        return {
            "model": bc.model_name or (models[0] if len(models) == 1 else None) or f"remote ({self.tokenizer_name} family)",
            "device": f"remote {self.endpoint.shown}",
            "backend": "remote",
            "url": self.endpoint.shown,
            "fim": self.template.family,
            "tokenizer": self.tokenizer_name,
            "prompt_format": bc.prompt_format,
            "n_ctx": self.config.model.max_context,
            "fallback_local": bc.fallback_local,
        }

    def diagnosis(self) -> dict[str, Any]:
        state = self.probe.snapshot()
        local = self._local
        s = self.stats
        return {
            "active": bool(state.reachable) or local is not None,
            "ttft_optimized": False,          # the Sol runtime is not on this path (type-through is)
            "prefetch_hit_rate": None,
            "kv_fold_ratio": 0.0,
            "offloaded_layers": 0,
            "backend": "remote",
            "remote_url": self.endpoint.shown,
            "remote_reachable": state.reachable,
            "remote_checked_s_ago": round(time.monotonic() - state.checked, 1) if state.checked else None,
            "remote_error": state.error,
            "remote_models": list(state.models),
            "remote_backoff_s": round(self.backoff.remaining(), 2),
            "remote_failures": s.failures,
            "remote_fallbacks": s.fallbacks,
            "remote_upstream_closed": s.upstream_closed,
            "fallback_local": self._fallback_state(),
            "kv_hit_ratio": round(s.cached_tokens / s.prompt_tokens, 4) if s.prompt_tokens else 0.0,
            "fallback_count": 0,              # Sol's prefetch fallbacks: no prefetch here
        }

    def _fallback_state(self) -> str:
        if self._local_loader is None:
            return "off"
        if self._local is not None:
            return "ready"
        if self._local_error is not None:
            return "failed"
        return "loading" if self._local_started else "not loaded"

    def warm(self, req: CompletionRequest, cancel: CancelToken) -> Timings:
        """Build the prompt only: the engine caches its own prefixes and may be shared."""
        clock = Clock.now(req)
        prompt, prompt_ms = self.build_prompt(req)
        return clock.timings(first_ns=None, prompt_ms=prompt_ms, prompt_tokens=len(prompt.ids))

    def complete(self, req: CompletionRequest, cancel: CancelToken) -> Iterator[Event]:
        return self.pipeline.run(req, cancel, self)

    # the model part of the Pipeline

    def scope(self, req: CompletionRequest) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def early(self, req: CompletionRequest, cancel: CancelToken, deadline: int | None, typed_through: bool) -> Early | None:
        """While backing off, the local model answers (``backend.fallback_local``)."""
        if typed_through or self._local_loader is None or self.backoff.remaining() <= 0:
            return None
        return Early(self._fallback(req, cancel, self.backoff.last_error), counted=False)

    def build_prompt(self, req: CompletionRequest) -> tuple[FimPrompt, float]:
        """The prompt sent upstream; secret files never are (soldaemon.privacy.rules)."""
        return self.pipeline.build_prompt(req)

    def generating(self, req: CompletionRequest) -> contextlib.AbstractContextManager[None]:
        """Nothing to hold: the engine serves requests on its own."""
        return contextlib.nullcontext()

    def generate(self, req: CompletionRequest, prompt: FimPrompt, candidate: int, ending: Ending,
                 cancel: CancelToken, deadline: int | None, *, keep_logp: bool = False) -> Stream:
        """One candidate over the HTTP stream, yielding the raw text after each piece; a cancel, the
        budget or the ending's stop closes the stream."""
        raw = ""
        finish: FinishReason = "stop"
        chunks = first_ns = first_wall_ns = 0
        usage: dict[str, Any] = {}
        closed_by: str | None = None   # "cancel" | "budget" | "stop"
        with _Watch(cancel, deadline) as watch:
            stream = self._open(self._body(req, prompt, candidate), cancel, deadline, watch)
            if stream is None:  # cancelled or out of budget before the engine answered
                return Generation("", cancel.reason if cancel.cancelled else "budget")
            try:
                for piece in stream.pieces():
                    if piece.usage is not None:
                        usage = piece.usage
                    if piece.text:
                        if not first_ns:
                            first_ns, first_wall_ns = time.perf_counter_ns(), time.time_ns()
                        chunks += 1
                        raw += piece.text
                        yield raw
                        if ending.may_stop(raw):  # the rest would be cut: stop the engine
                            closed_by = "stop"
                            stream.close()
                            break
                    if piece.finish_reason is not None:
                        finish = "length" if piece.finish_reason == "length" else "stop"
                self.probe.note(True)
            except (RemoteUnavailable, RemoteTimeout) as exc:
                if not stream.closed:
                    self.backoff.failed(exc.message)
                    self.probe.note(False, exc.message)
                raise
            finally:
                stream.release()
        closed_by = closed_by or watch.fired
        if closed_by is not None:
            finish = {"cancel": cancel.reason, "budget": "budget", "stop": "stop"}[closed_by]  # type: ignore[assignment]
            self.stats.upstream_closed += 1
        details = usage.get("prompt_tokens_details")
        cached = details["cached_tokens"] if isinstance(details, dict) and isinstance(
            details.get("cached_tokens"), int) else 0
        return Generation(raw, finish, Stats(first_ns=first_ns, first_wall_ns=first_wall_ns, cached_tokens=cached,
                                             generated_tokens=int(usage.get("completion_tokens") or chunks)))

    def scorer(self) -> None:
        """Block candidates are not sampled upstream."""
        return None

    def recover(self, req: CompletionRequest, cancel: CancelToken, exc: Exception,
                streamed: bool, candidate: int) -> Iterator[Event] | None:
        """The local answer to a retryable failure of candidate 0 before any text, or None."""
        if not isinstance(exc, (RemoteUnavailable, RemoteTimeout, RemoteHttpError, RemoteBadResponse)):
            return None
        self.stats.failures += 1
        if self._local_loader is None or not exc.retryable or candidate != 0 or streamed or cancel.cancelled:
            return None
        log.warning("remote engine failed (%s); answering %s from the local model", exc.message, req.id)
        return self._fallback(req, cancel, exc.message)

    def account(self, t: Timings) -> None:
        self.stats.prompt_tokens += t.prompt_tokens
        self.stats.cached_tokens += t.cached_tokens

    # the request upstream

    def prompt_text(self, prompt: FimPrompt) -> str:
        """The prompt as text, control tokens spelled out, no leading bos (the engine adds one)."""
        ids = prompt.ids
        if ids and self.template.bos_id is not None and ids[0] == self.template.bos_id:
            ids = ids[1:]
        return str(self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))

    def _body(self, req: CompletionRequest, prompt: FimPrompt, candidate: int) -> dict[str, Any]:
        bc = self.config.backend
        body: dict[str, Any] = {
            "prompt": list(prompt.ids) if bc.prompt_format == "tokens" else self.prompt_text(prompt),
            "max_tokens": req.max_tokens,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "stream": True,
            "stream_options": {"include_usage": True},
            # the family's end tokens as text (the ending's stop check closes the stream anyway)
            "stop": self._stop_strings(),
        }
        if bc.model_name:
            body["model"] = bc.model_name
        if req.seed is not None:
            body["seed"] = req.seed + candidate
        return body

    def _stop_strings(self) -> list[str]:
        """At most four (the OpenAI API's limit): eos, the file separator, the other end tokens,
        and last the prompt's own FIM tokens, which a model rarely writes after the middle."""
        t = self.template
        rank = {self.tokenizer.eos_token_id: 0, t.file_sep_id: 1, t.prefix_id: 3, t.suffix_id: 3, t.middle_id: 3}
        ids = sorted(t.stop_ids, key=lambda i: (rank.get(i, 2), i))
        names = [str(n) for n in self.tokenizer.convert_ids_to_tokens(ids) if n]
        return list(dict.fromkeys(names))[:4]

    def _open(self, body: dict[str, Any], cancel: CancelToken, deadline: int | None,
              watch: _Watch) -> UpstreamStream | None:
        """An open stream after up to ``1 + backend.retries`` tries, or None when cancelled or out
        of budget first. Raises RemoteUnavailable, RemoteTimeout or RemoteHttpError."""
        bc = self.config.backend
        tries = 1 + bc.retries
        for attempt in range(tries):
            wait = self.backoff.remaining()
            if wait > 0 and attempt > 0:
                _sleep(wait, cancel, deadline)
            if cancel.cancelled or _past(deadline):
                return None
            if wait > 0 and attempt == 0:
                raise RemoteUnavailable(
                    f"the engine at {self.endpoint.shown} is unreachable ({self.backoff.last_error}); "
                    f"backing off, next try in {wait:.1f} s",
                    hint="start or fix the engine; set backend.fallback_local to answer locally meanwhile")
            stream = UpstreamStream(self.endpoint, body, self._headers,
                                    connect_timeout_s=bc.connect_timeout_s, timeout_s=bc.timeout_s)
            watch.follow(stream)
            try:
                stream.open()
            except CouldNotConnect as exc:
                cancelled = stream.closed  # closed by the watch, not by the engine
                stream.release()
                if cancelled:
                    return None
                why = str(exc)
                wait = self.backoff.failed(why)
                self.probe.note(False, why)
                log.warning("remote engine %s: %s (attempt %d of %d; back-off %.1f s)", self.endpoint.shown, why,
                            attempt + 1, tries, wait)
                continue
            except RemoteTimeout as exc:
                stream.release()
                self.backoff.failed(exc.message)
                self.probe.note(False, exc.message)
                raise
            except RemoteHttpError as exc:
                stream.release()
                if exc.retryable:
                    self.backoff.failed(exc.message)
                raise
            if stream.closed:  # cancelled while connecting or waiting for the answer
                stream.release()
                return None
            self.backoff.succeeded()
            return stream
        raise RemoteUnavailable(
            f"the engine at {self.endpoint.shown} is unreachable: {self.backoff.last_error} "
            f"({tries} attempt{'s' if tries > 1 else ''})",
            hint="start or fix the engine; set backend.fallback_local to answer locally meanwhile")

    # the local fallback

    def start_local(self) -> None:
        """Begin loading the local fallback engine in the background (once)."""
        with self._lock:
            if self._local_loader is None or self._local_started:
                return
            self._local_started = True
        loader = self._local_loader

        def load() -> None:
            try:
                self._local = loader()
                log.info("local fallback engine ready")
            except BaseException as exc:  # reported to the requests that wait for it
                self._local_error = exc
                log.error("local fallback engine failed to load: %s", exc)
            finally:
                self._local_ready.set()

        threading.Thread(target=load, name="sol-local-fallback", daemon=True).start()

    def _fallback(self, req: CompletionRequest, cancel: CancelToken, why: str) -> Iterator[Event]:
        self.start_local()
        clock = Clock.now(req)
        while not self._local_ready.wait(0.05):
            if cancel.cancelled:
                yield Done(req.id, (), cancel.reason, clock.timings())
                return
        local = self._local
        if local is None:
            raise RemoteUnavailable(f"the engine at {self.endpoint.shown} is unreachable ({why}) and the local "
                                    f"fallback model failed to load: {self._local_error}")
        self.stats.fallbacks += 1
        yield from local.complete(req, cancel)   # the pipeline remembers its answer


def _past(deadline: int | None) -> bool:
    return deadline is not None and time.perf_counter_ns() >= deadline


def _sleep(seconds: float, cancel: CancelToken, deadline: int | None) -> None:
    """Wait ``seconds``, or until cancelled or past the deadline."""
    end = time.monotonic() + seconds
    while not cancel.cancelled and not _past(deadline) and (left := end - time.monotonic()) > 0:
        time.sleep(min(left, 0.01))


def load_remote_engine(config: Config, *, local: Callable[[], Engine] | None = None,
                       progress: bool = True) -> RemoteEngine:
    """The remote engine for ``config.backend``, probed once (down is logged, not fatal).
    ``local`` builds the fallback engine: loaded lazily, or at once when the engine is down."""
    from soldaemon.weights.loader import load_tokenizer

    bc = config.backend
    source = bc.tokenizer or config.model.path
    tokenizer, name = load_tokenizer(str(source) if source else None, progress=progress)
    engine = RemoteEngine(config, tokenizer, name, local=local)
    state = engine.probe.probe_now()
    if state.reachable:
        log.info("remote engine %s reachable; models: %s", engine.endpoint.shown, ", ".join(state.models) or "?")
        if bc.model_name and state.models and bc.model_name not in state.models:
            log.warning("backend.model_name %r is not among the engine's models (%s)", bc.model_name,
                        ", ".join(state.models))
    else:
        log.warning("remote engine %s not reachable now (%s); requests will try it", engine.endpoint.shown,
                    state.error)
        if bc.fallback_local:
            engine.start_local()
    return engine
