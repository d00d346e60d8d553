"""Where an answer's text comes from, as one shape: a :data:`Stream` yielding the text after each
step and returning its :class:`Generation`. A model part's ``generate`` is one; a prompt-less
answer (a parked run resumed, :func:`precomputed`, :func:`typed`) is a :class:`Source` around one.
Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generator, Iterator, NamedTuple

from soldaemon.api import Done, Event, FinishReason
from soldaemon.pipeline.ending import Ending


@dataclass(frozen=True)
class Stats:
    """What a model part measures of a generation, for :meth:`.clock.Clock.timings`."""

    first_ns: int = 0              # perf_counter_ns at its first token (0: none came)
    first_wall_ns: int = 0         # the same instant in time_ns (0: derived)
    prefill_ms: float = 0.0        # the prompt's forward, ms
    cached_tokens: int = 0         # prompt tokens reused from a cache
    generated_tokens: int = 0      # tokens generated for this request
    draft_tokens: int = 0          # speculative tokens proposed
    accepted_tokens: int = 0       # of which accepted


@dataclass(frozen=True)
class Generation:
    """One generation, as its stream returns it when done."""

    raw: str                       # the text generated
    finish: FinishReason           # stopped by a cancel: the token's reason
    stats: Stats = Stats()
    ids: tuple[int, ...] = ()      # its tokens, where the model part has them
    logp: tuple[float, ...] | None = None   # per ``ids``, when asked for and known

    @property
    def whole(self) -> bool:
        """Ended on its own (end, cut, ``max_tokens``), not by cancel, supersede or budget."""
        return self.finish in ("stop", "length")


# Yields the text after each step (final for a Source without an ending); returns the Generation.
Stream = Generator[str, None, Generation]


@dataclass
class Source:
    """An answer without a prompt of this request's own, handled like a generated one."""

    text: Stream
    ending: Ending | None          # the one it was generated under (None: ``text`` is shown as is)
    kind: str                      # Timings.source: "resumed" | "speculative" | "type-through"
    prompt_tokens: int = 0         # its prompt, counted all cached
    counted: bool = True           # its Done goes into the model part's counters
    also: str | None = None        # another answer typing along goes on from (remembered, not sent)


class Early(NamedTuple):
    """A fallback engine's events, passed on as they are."""

    events: Iterator[Event]
    counted: bool        # its Done goes into the engine's counters (account)


def shown_once(text: str, finish: FinishReason, stats: Stats = Stats()) -> Stream:
    """A stream of one final text."""
    yield text
    return Generation(text, finish, stats)


def precomputed(done: Done) -> Source:
    """This request's answer computed ahead (speculative FIM): its first item, prompt cached."""
    t = done.timings
    text = done.items[0] if done.items else ""
    return Source(shown_once(text, done.finish_reason, Stats(generated_tokens=t.generated_tokens)), None,
                  "speculative", prompt_tokens=t.prompt_tokens)


def typed(rests: tuple[str, ...]) -> Source:
    """The rest of the shown answer whose start the user typed
    (:func:`soldaemon.shown.type_through`); ``also``: the rest of the streamed answer it replaced.
    Not counted."""
    return Source(shown_once(rests[0], "stop"), None, "type-through", counted=False,
                  also=rests[1] if len(rests) > 1 else None)
