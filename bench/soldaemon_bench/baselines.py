"""The baselines the benchmarks compare against, shared by ``soldaemon bench``
(:mod:`soldaemon_bench.bench`) and its keystroke trace (:mod:`soldaemon_bench.trace`):
plain transformers ``generate()`` and the model it runs on.

torch is imported inside the functions that use it, so importing this module
(as the CLI does to build its parser) stays cheap.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from soldaemon.config import Config


class FirstToken:
    """A transformers streamer that notes when the first new token arrives."""

    def __init__(self) -> None:
        self.calls = 0
        self.first_ns = 0

    def put(self, value: Any) -> None:
        self.calls += 1
        if self.calls == 2 and not self.first_ns:  # call 1 is the prompt
            self.first_ns = time.perf_counter_ns()

    def end(self) -> None:
        pass


def bench_generate(model: Any, ids: list[int], n: int) -> tuple[float, float, list[int]]:
    """Plain transformers ``generate()`` of exactly ``n`` tokens, greedy, from a
    cold cache: TTFT ms, ms per token after the first, the tokens."""
    import torch

    x = torch.tensor([ids], device=model.device)
    streamer = FirstToken()
    t0 = time.perf_counter_ns()
    with torch.inference_mode():
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, streamer=streamer, pad_token_id=0)
    t1 = time.perf_counter_ns()
    ttft = (streamer.first_ns - t0) / 1e6
    return ttft, (t1 - streamer.first_ns) / 1e6 / (n - 1), out[0, len(ids):].tolist()


def baseline_model(engine: Any, config: Config) -> tuple[Any | None, str]:
    """The transformers model ``generate()`` runs on, and a note for the table.

    The engine's own module while every layer is resident. When
    ``sol.memory_budget`` offloads layers, the weight store has swapped
    those layers' parameters for empty tensors (the lean backend reads them
    from the store; the module cannot run), so the baseline gets a fresh
    full copy loaded from the same directory — outside the budget, as a
    plain transformers user would run it. When that copy cannot be loaded
    (memory), returns None and the reason: the ``generate`` row is skipped."""
    from soldaemon.errors import SolError
    from soldaemon.weights.loader import load_model

    store = engine.memory.store if getattr(engine, "memory", None) is not None else None
    released = bool(getattr(engine.backend, "released", False))
    if (store is None or not store.offloaded_layers) and not released:
        return engine.loaded.model, ""
    reasons = []
    if store is not None and store.offloaded_layers:
        reasons.append(f"sol.memory_budget offloads {store.offloaded_layers} of {store.n_layers} layers, which "
                       "empties their parameters in the engine's transformers module")
    if released:
        reasons.append(f"the engine keeps one copy of the weights, packed for its kernel plan "
                       f"({engine.backend.plan.storage}), and released the transformers module's parameters")
    why = "; ".join(reasons)
    try:
        copy = load_model(str(engine.loaded.directory), device=config.device.device, dtype="auto",
                          progress=False)
    except (SolError, MemoryError, RuntimeError) as exc:   # torch's out-of-memory is a RuntimeError
        return None, f"generate skipped: {why}, and a separate full copy could not be loaded ({exc})"
    return copy.model, f"generate runs on a separate full copy of the model (outside the budget): {why}"
