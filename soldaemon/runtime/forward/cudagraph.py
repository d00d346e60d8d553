"""Decode steps and verifies replayed from CUDA graphs: at batch 1 the host's launch overhead,
not the math, sets a small model's step time. The step is written in static form (shapes never
depend on the position), one graph per (KV cache, window bucket, rows, weights epoch); outputs
never depend on whether a graph or the eager forward ran. Capture happens at warm-up and in
:meth:`GraphDecoder.recapture`, never inside a request; ``emulate=True`` runs it all off CUDA."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from soldaemon.runtime.forward.layer import ATTENTION_LOG, decoder_layer, group_mask

if TYPE_CHECKING:
    from soldaemon.runtime.forward.backend import LeanBackend

log = logging.getLogger("soldaemon.cudagraph")

_MIN_BUCKET = 256
VERIFY_ROWS = (2, 4, 8, 16)     # verify forwards are graphed at these row counts (padded up)
MAX_FAILURES = 2                # failed captures in a row before graphs are given up
GRAPH_MEMORY_RESERVE = 0.10     # share of the device's memory left free when capturing another slot's graphs
HANDOFF_S = 0.001               # s: the recapture waits this long between captures, so a waiting request gets the lock


def buckets(n_ctx: int) -> list[int]:
    """Attention window sizes: powers of two from 256, and ``n_ctx``."""
    out: list[int] = []
    b = _MIN_BUCKET
    while b < n_ctx:
        out.append(b)
        b *= 2
    out.append(n_ctx)
    return out


class GraphDecoder:
    """Static-form decode steps and verifies over a :class:`~.backend.LeanBackend`, replayed from
    CUDA graphs while :meth:`usable`; two failed captures in a row turn graphs off for good."""

    def __init__(self, backend: LeanBackend, *, max_graphs: int = 48, emulate: bool = False,
                 verify_rows: tuple[int, ...] = VERIFY_ROWS) -> None:
        """``emulate``: off CUDA, replay :class:`EmulatedGraph` stand-ins instead of reporting
        graphs unavailable. ``verify_rows``: row buckets verifies are graphed at (empty: eager)."""
        self.b = backend
        self.device = backend.device
        self.buckets = buckets(backend.n_ctx)
        self.max_graphs = max_graphs
        self.verify_rows = tuple(sorted(r for r in verify_rows if 1 < r <= backend.decode_max_tokens))
        self.emulated = emulate and self.device.type != "cuda"
        self.enabled = self.device.type == "cuda" or self.emulated
        self.failure: str | None = None if self.enabled else "not a CUDA device"
        self.failed_captures = 0                     # in a row; graphs are given up at MAX_FAILURES
        self.token = torch.zeros(1, dtype=torch.long, device=self.device)
        self.pos = torch.zeros(1, dtype=torch.long, device=self.device)
        # verify rows: per row bucket, static tokens [R], positions [R], the last real row [1], 0 … R-1
        self._rows: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        # (k_cache address, window, rows, last_q address or 0, weights epoch) → (graph, its logits),
        # least recently replayed first (evicted at max_graphs)
        self._graphs: dict[tuple[int, int, int, int, int], tuple[Any, torch.Tensor]] = {}
        self._slots: list[Any] = []                  # the pool's KV caches warm_up captured graphs for
        self.slots_captured = 0                      # of which free memory held every graph
        self.sealed = False                          # after warm_up: a missing graph is captured after the request
        # graphs a sealed decoder missed inside a request: (k_cache address, window, rows) → (cache, window, rows)
        self._pending: dict[tuple[int, int, int], tuple[Any, int, int]] = {}
        self.deferred = 0                            # forwards that ran eagerly for a missing graph (sealed)
        self.evictions = 0
        self._pool: Any = None                       # the one memory pool every graph shares (CUDA)
        self.stale = False                           # weights moved: eager until recapture()
        self._windows_used: set[int] = set()
        self.replays = 0
        self.verify_replays = 0
        self.captures = 0
        self.capture_ms = 0.0
        self.recaptures = 0
        self.layer: Callable[..., torch.Tensor] = decoder_layer   # or its compiled form (compiled.py)

    def use_layer(self, layer: Callable[..., torch.Tensor]) -> None:
        """Run ``layer`` (:func:`decoder_layer` or its compiled form) in the static step from now
        on; the other's graphs and their pool are dropped (see :meth:`invalidate`)."""
        self.layer = layer
        self._graphs.clear()
        self._pool = None

    # -- the step in static form --------------------------------------------

    def bucket(self, pos: int) -> int:
        """The captured window (a KV length) a step at ``pos`` runs in."""
        for b in self.buckets:
            if pos < b:
                return b
        raise ValueError(f"KV cache overflow: position {pos} >= n_ctx {self.b.n_ctx}")

    def _static_rows(self, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        found = self._rows.get(rows)
        if found is None:
            dev = self.device
            found = (torch.zeros(rows, dtype=torch.long, device=dev), torch.zeros(rows, dtype=torch.long, device=dev),
                     torch.zeros(1, dtype=torch.long, device=dev), torch.arange(rows, dtype=torch.long, device=dev))
            self._rows[rows] = found
        return found

    @torch.inference_mode()
    def static_step(self, window: int, cache: Any = None) -> torch.Tensor:
        """One decode step of ``self.token`` at ``self.pos`` over the first ``window`` positions of
        ``cache`` (None: the backend's): logits [1, V] float32, by the eager step's kernel."""
        return self._static(self.token, self.pos, window, None, "graph-step", cache)

    @torch.inference_mode()
    def static_rows(self, window: int, rows: int, cache: Any = None) -> torch.Tensor:
        """A verify of row bucket ``rows``'s static tokens and positions over ``window`` positions
        of ``cache``: logits [rows, V]."""
        tokens, positions, last_row, _ = self._static_rows(rows)
        return self._static(tokens, positions, window, last_row, "graph-verify", cache)

    def _static(self, tokens: torch.Tensor, positions: torch.Tensor, window: int, last_row: torch.Tensor | None,
                kind: str, cache: Any) -> torch.Tensor:
        b = self.b
        k_cache, v_cache = b.cache if cache is None else cache
        # static form: tables gathered by position, the whole window masked to key position <= pos
        cos = b.cos.index_select(0, positions)           # [T, hd]
        sin = b.sin.index_select(0, positions)
        keep = torch.arange(window, device=self.device).unsqueeze(0) <= positions.unsqueeze(1)   # [T, window]
        mask = group_mask(keep, b.n_heads // b.n_kv)
        lin = b.short_linear                             # the plan's decode kernel (static shapes)
        x = b.embed_tokens(tokens)                       # [T, D]
        last_q = b.last_q
        for i, w in enumerate(b.layers):
            x = self.layer(b.shape, w, x, lin, cos, sin, k_cache[i], v_cache[i], positions, window, mask,
                              q_out=None if last_q is None else last_q[i], q_row=last_row,
                              kind=kind if i == 0 else "", bucket=window)
        return b.head_logits(b.final_norm(x))

    # -- graphs ----------------------------------------------------------------

    def usable(self) -> bool:
        """Graphs on, not stale, and every layer resident (offload moves weights under a graph)."""
        return self.enabled and not self.stale and self.b.all_resident

    def step(self, token: int, pos: int, cache: Any = None) -> torch.Tensor | None:
        """Logits [V] for ``token`` at ``pos`` over ``cache`` (None: the backend's) through its
        graph, or None: eager. A view of the graph's output that its next replay (any document's)
        overwrites: copy to keep. With queries recorded, ``last_q`` holds this step's."""
        if not self.usable():
            return None
        cache = self.b.cache if cache is None else cache
        window = self.bucket(pos)
        graph = self._graph(cache, window, 1)
        if graph is None:
            return None
        self.token.fill_(token)
        self.pos.fill_(pos)
        out = self._replay(graph, cache)
        self.replays += 1
        return out[0]

    def verify(self, tokens: Sequence[int], pos: int, cache: Any = None) -> torch.Tensor | None:
        """Logits [T, V] for ``tokens`` at ``pos`` … through the next row bucket's graph (a view, as
        :meth:`step`), or None: no bucket holds T rows, or the padding would pass ``n_ctx``.
        Padding rows write K/V at free positions past the real ones; their logits are dropped."""
        T = len(tokens)
        rows = next((r for r in self.verify_rows if r >= T), None)
        if rows is None or not self.usable() or pos + rows > self.b.n_ctx:
            return None
        cache = self.b.cache if cache is None else cache
        window = self.bucket(pos + rows - 1)
        graph = self._graph(cache, window, rows)
        if graph is None:
            return None
        tok, positions, last_row, arange = self._static_rows(rows)
        host = torch.as_tensor(list(tokens) + [tokens[-1]] * (rows - T), dtype=torch.long)
        tok.copy_(host, non_blocking=True)
        torch.add(arange, pos, out=positions)
        last_row.fill_(T - 1)
        out = self._replay(graph, cache)
        self.verify_replays += 1
        return out[:T]

    def _replay(self, graph: tuple[Any, torch.Tensor], cache: Any) -> torch.Tensor:
        """Replay ``graph`` (captured over ``cache``): its logits, which the next replay overwrites."""
        g, out = graph
        g.replay()
        if self.b.last_q is not None:
            self.b.last_q_cache = cache[0]
        return out

    def invalidate(self) -> None:
        """The weights moved: drop every graph and the shared pool (capturing into a pool whose last
        graph is gone hits an internal assert, docs/gpu.md); eager until :meth:`recapture`."""
        self._graphs.clear()
        self._pool = None
        self.stale = True

    def owes(self) -> bool:
        """Whether :meth:`recapture` has graphs to capture."""
        return self.enabled and (self.stale or bool(self._pending))

    def recapture(self, lock: threading.Lock | None = None) -> int:
        """Outside any request: capture what requests ran eagerly for (when stale, every slot's
        graphs of the windows used; graphs a sealed decoder missed). Each capture holds ``lock``
        alone, so a request waits for one at most; if it is held at the start, nothing is done.
        Returns graphs captured."""
        todo = self._missing()
        before = self.captures
        for i, (pending, cache, window, rows) in enumerate(todo):
            if lock is not None and i > 0:
                time.sleep(HANDOFF_S)        # threading.Lock is not fair: let a waiting request take it first
            if lock is not None and not lock.acquire(blocking=i > 0):
                break
            try:
                if i == 0:
                    self.stale = False
                if not self.usable() or (pending is not None and not self._room()):
                    break                                # graphs off, or the device's memory is short
                if self._graph(cache, window, rows, capture=True) is None:   # capture failed
                    break
                if pending is not None:
                    self._pending.pop(pending, None)
            finally:
                if lock is not None:
                    lock.release()
        self.recaptures += self.captures - before
        return self.captures - before

    def _missing(self) -> list[tuple[tuple[int, int, int] | None, Any, int, int]]:
        """(its key in the pending list or None, cache, window, rows) of
        every graph :meth:`recapture` owes."""
        todo: list[tuple[tuple[int, int, int] | None, Any, int, int]] = [
            (key, *entry) for key, entry in self._pending.items()]
        if self.stale:
            windows = sorted(self._windows_used) or self.buckets[:1]
            for n, cache in enumerate(self._slots or [self.b.cache]):
                key = cache[0].data_ptr() if isinstance(cache, tuple) else id(cache)
                # slots past the first are captured while the device's memory allows (a key: room checked)
                todo += [(None if n == 0 else (key, window, rows), cache, window, rows)
                         for window in windows for rows in (1, *self.verify_rows)]
        return todo

    def _graph(self, cache: Any, window: int, rows: int, *,
               capture: bool = False) -> tuple[Any, torch.Tensor] | None:
        """``cache``'s graph of ``window`` and ``rows`` (moved to the back of the eviction order). A
        missing one is captured now, unless sealed and not ``capture``: then it is queued for
        :meth:`recapture` and None returned (eager)."""
        b = self.b
        last_q = b.last_q
        # a graph writes the tensors it was captured with and reads the weights
        # it was captured over: key on their addresses and on the weights' epoch
        key = (cache[0].data_ptr(), window, rows, 0 if last_q is None else last_q.data_ptr(), b.weights_epoch)
        found = self._graphs.pop(key, None)
        if found is not None:
            self._graphs[key] = found                # least recently used first
            return found
        if self.sealed and not capture:
            self._pending.setdefault((key[0], window, rows), (cache, window, rows))
            self.deferred += 1
            return None
        if len(self._graphs) >= self.max_graphs:
            self._graphs.pop(next(iter(self._graphs)))
            self.evictions += 1
        try:
            found = self._capture(cache, window, rows)
        except Exception as exc:  # capture is best effort: retry once, then eager for good
            self.failed_captures += 1
            self.failure = f"{type(exc).__name__}: {exc}"
            if self.failed_captures >= MAX_FAILURES:
                self.enabled = False
                self._graphs.clear()
                log.warning("CUDA graph capture failed %d times, decoding eagerly from now on: %s",
                            self.failed_captures, self.failure)
            else:
                log.warning("CUDA graph capture failed (will retry once): %s", self.failure)
            return None
        self.failed_captures = 0
        self._windows_used.add(window)
        self._graphs[key] = found
        return found

    def _capture(self, cache: Any, window: int, rows: int) -> tuple[Any, torch.Tensor]:
        """A graph of a step (``rows`` 1) or a verify, bound to ``cache``'s tensors."""
        run = (lambda: self.static_step(window, cache)) if rows == 1 else (
            lambda: self.static_rows(window, rows, cache))
        if self.emulated:
            emulated = EmulatedGraph(run, rows, self.b.vocab_size, self.device)
            self.captures += 1
            return emulated, emulated.out
        t0 = time.perf_counter()
        # The capture writes K/V at the static positions: point them at the last
        # slots of the window, then restore what was there (it may be a live cache).
        k_cache, v_cache = cache
        first = window - rows
        saved_k = k_cache[:, :, first:window].clone()
        saved_v = v_cache[:, :, first:window].clone()
        if rows == 1:
            self.pos.fill_(first)
        else:
            tok, positions, last_row, arange = self._static_rows(rows)
            torch.add(arange, first, out=positions)
            last_row.fill_(rows - 1)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):                           # warm the kernels outside the graph
                run()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # thread_local: another thread's CUDA call during the capture does not break it
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            out = run()
        k_cache[:, :, first:window] = saved_k
        v_cache[:, :, first:window] = saved_v
        torch.cuda.current_stream(self.device).synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        self.captures += 1
        self.capture_ms += ms
        log.info("captured a CUDA graph: window %d, %d rows, %.1f ms", window, rows, ms)
        return graph, out

    def warm_up(self, max_pos: int | None = None, caches: Sequence[Any] = (), *, later: bool = False) -> None:
        """Before the first request: capture each of ``caches``'s graphs (the pool's slots; default
        the backend's; windows up to ``max_pos``) while :meth:`_room` allows, then seal (no capture
        inside a request). ``later``: capture the first slot now, queue the rest for
        :meth:`recapture`."""
        if not self.usable():
            return
        self._slots = list(caches) or [self.b.cache]
        windows = [w for i, w in enumerate(self.buckets) if max_pos is None or i == 0 or self.buckets[i - 1] <= max_pos]
        per_slot = len(windows) * (1 + len(self.verify_rows))
        self.max_graphs = max(self.max_graphs, per_slot * len(self._slots))
        for n, cache in enumerate(self._slots):
            if n and later:
                key = cache[0].data_ptr() if isinstance(cache, tuple) else id(cache)
                self._pending.update({(key, w, r): (cache, w, r) for w in windows for r in (1, *self.verify_rows)})
                continue
            if n and not self._room():
                log.info("CUDA graphs: %d of %d KV slots captured (device memory)", n, len(self._slots))
                break
            for window in windows:
                for rows in (1, *self.verify_rows):
                    if self._graph(cache, window, rows, capture=True) is None:   # capture failed
                        return
            self.slots_captured += 1
        self.sealed = True

    def _room(self) -> bool:
        """More than GRAPH_MEMORY_RESERVE of the device's memory free (always, off CUDA)."""
        if self.device.type != "cuda":
            return True
        free, total = torch.cuda.mem_get_info(self.device)
        return free > GRAPH_MEMORY_RESERVE * total

    def info(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "fallback_reason": self.failure,
            "graphs": len(self._graphs),
            "captures": self.captures,
            "capture_ms": round(self.capture_ms, 1),
            "replays": self.replays,
            "verify_replays": self.verify_replays,
            "verify_rows": list(self.verify_rows),
            "stale": self.stale,
            "recaptures": self.recaptures,
            "sealed": self.sealed,
            "slots_captured": self.slots_captured,
            "deferred": self.deferred,
            "pending": len(self._pending),
            "evictions": self.evictions,
            "failed_captures": self.failed_captures,
            "attention": ATTENTION_LOG.summary(),
        }


class EmulatedGraph:
    """A CUDA graph's contract without CUDA (``emulate=True``): ``replay`` runs the static step and
    copies its logits into ``out``, the one output every replay reuses."""

    def __init__(self, run: Callable[[], torch.Tensor], rows: int, vocab_size: int, device: torch.device) -> None:
        self.run = run
        self.rows = rows
        self.out = torch.zeros(rows, vocab_size, dtype=torch.float32, device=device)  # [rows, V]

    def replay(self) -> None:
        self.out.copy_(self.run())
