"""Prometheus metrics for ``GET /metrics``, one registry per :class:`Metrics`. Live gauges
and engine counters are read at scrape time through callables, so they cannot drift.
Names and labels are documented in docs/protocol.md §7."""

from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from soldaemon.api import Done

# seconds; batch-1 TTFT lives between a few ms (GPU, cached) and seconds (CPU)
TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0)
E2E_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)


class _ReadCollector(Collector):
    """The metrics read at scrape time: the engine's counters, and ``sol_accept_rate`` only once
    a client reported a shown event (many never send one, and 0 there would be a lie)."""

    def __init__(self, metrics: Metrics, engine_stats: Callable[[], Mapping[str, Any]]) -> None:
        self._metrics = metrics
        self._engine_stats = engine_stats

    def collect(self) -> Iterator[Metric]:
        fallback = CounterMetricFamily(
            "sol_fallback", "Prefetches not ready in time: the synchronous path was taken (engine).")
        fallback.add_metric([], float(self._engine_stats().get("fallback_count", 0) or 0))
        yield fallback
        rate = self._metrics.accept_rate()
        if rate is not None:
            gauge = GaugeMetricFamily("sol_accept_rate", "Accepted / shown completions since start, counting "
                                      "only clients that report shown events (absent before the first).")
            gauge.add_metric([], rate)
            yield gauge


class Metrics:
    """The daemon's metrics. ``live`` (queue depth, in-flight, connections) and
    ``engine_stats`` (at least ``fallback_count`` when kept) are called at scrape time on the
    event loop thread."""

    def __init__(self, live: Callable[[], Mapping[str, int]],
                 engine_stats: Callable[[], Mapping[str, Any]] = lambda: {}) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("sol_requests", "Requests ended, by kind and outcome "
                                "(finish reason, or error code).", ["kind", "outcome"], registry=r)
        self.ttft = Histogram("sol_ttft_seconds", "Arrival to first token, completions.",
                              buckets=TTFT_BUCKETS, registry=r)
        self.e2e = Histogram("sol_e2e_seconds", "Arrival to done, completions.",
                             buckets=E2E_BUCKETS, registry=r)
        self.prompt_tokens = Counter("sol_prompt_tokens", "Prompt tokens.", registry=r)
        self.cached_tokens = Counter("sol_cached_tokens", "Prompt tokens whose KV was reused.", registry=r)
        self.generated_tokens = Counter("sol_generated_tokens", "Generated tokens.", registry=r)
        self.client_errors = Counter("sol_client_errors", "Error frames sent for bad client input.",
                                     ["code"], registry=r)
        self.events = Counter("sol_completion_events", "Editor events (shown, accepted, partial, rejected).",
                              ["kind"], registry=r)
        self.accepted_chars = Counter("sol_accepted_chars", "Characters accepted by partial accepts "
                                      "(a word, a line).", registry=r)
        self._event_totals: dict[str, int] = {}
        for name, doc in (("queue_depth", "Requests waiting for the inference worker."),
                          ("in_flight", "Requests queued or running."),
                          ("connections", "Open websocket connections.")):
            gauge = Gauge(f"sol_{name}", doc, registry=r)
            gauge.set_function(lambda name=name: float(live().get(name, 0)))  # type: ignore[misc]
        Gauge("sol_kv_cache_hit_ratio", "Prompt tokens whose KV was reused / all prompt tokens, since start.",
              registry=r).set_function(
            lambda: self._cached_total / self._prompt_total if self._prompt_total else 0.0)
        r.register(_ReadCollector(self, engine_stats))
        self._prompt_total = 0
        self._cached_total = 0

    def record_done(self, kind: str, done: Done) -> None:
        """Count a request that ended with ``done`` (histograms: completions only)."""
        t = done.timings
        self.requests.labels(kind, done.finish_reason).inc()
        self.prompt_tokens.inc(t.prompt_tokens)
        self.cached_tokens.inc(t.cached_tokens)
        self.generated_tokens.inc(t.generated_tokens)
        self._prompt_total += t.prompt_tokens
        self._cached_total += t.cached_tokens
        if kind == "complete":
            if t.generated_tokens > 0 and t.ttft_ms > 0:
                self.ttft.observe(t.ttft_ms / 1000.0)
            if done.finish_reason in ("stop", "length", "budget"):
                self.e2e.observe(t.total_ms / 1000.0)

    def record_event(self, kind: str, accepted_chars: int | None = None) -> None:
        """Count an editor event; a ``partial`` one also counts its characters."""
        self.events.labels(kind).inc()
        self._event_totals[kind] = self._event_totals.get(kind, 0) + 1
        if kind == "partial" and accepted_chars:
            self.accepted_chars.inc(accepted_chars)

    def accept_rate(self) -> float | None:
        """Accepted / shown since start; ``None`` (unknown, not 0) before anything was shown."""
        shown = self._event_totals.get("shown", 0)
        return min(1.0, self._event_totals.get("accepted", 0) / shown) if shown else None

    def event_counts(self) -> dict[str, Any]:
        """The event totals and the accept rate, for ``health``."""
        counts: dict[str, Any] = {kind: self._event_totals.get(kind, 0)
                                  for kind in ("shown", "accepted", "partial", "rejected")}
        rate = self.accept_rate()
        counts["accept_rate"] = round(rate, 4) if rate is not None else None
        return counts

    def render(self) -> tuple[bytes, str]:
        """The Prometheus text exposition and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
