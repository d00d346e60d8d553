"""Where an answer's text comes from, as one shape: a :data:`Stream` that
yields the text after each step and returns its :class:`Generation` (the
text, how it ended, its :class:`Stats`).

The model part's ``generate`` is one (a decode, or a remote engine's HTTP
stream); an answer that needs no prompt is a :class:`Source` around one: a
parked generation resumed (the local part), an answer computed ahead
(:func:`precomputed`), the rest of an answer the user typed the start of
(:func:`typed`). :class:`soldaemon.pipeline.completion.Pipeline` previews,
cuts, remembers and times them on one path. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generator, Iterator, NamedTuple

from soldaemon.api import Done, Event, FinishReason
from soldaemon.pipeline.ending import Ending


@dataclass(frozen=True)
class Stats:
    """How a generation went, for the request's timings (the fields of
    :meth:`soldaemon.pipeline.clock.Clock.timings` a model part measures)."""

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
    finish: FinishReason           # how it ended ("cancelled": see the request's cancel reason)
    stats: Stats = Stats()
    ids: tuple[int, ...] = ()      # its tokens, where the model part has them (the local one)
    logp: tuple[float, ...] | None = None   # each of ``ids``' log-probability, when asked for and known

    @property
    def whole(self) -> bool:
        """It ended on its own (an end, a cut, ``max_tokens``), not stopped
        by a cancel, a supersede or the budget."""
        return self.finish in ("stop", "length")


# The text after each step (raw, or final for a Source without an ending);
# returns the Generation when done.
Stream = Generator[str, None, Generation]


@dataclass
class Source:
    """An answer without a prompt of this request's own, previewed, cut,
    remembered and timed like a generated one."""

    text: Stream                   # see Stream
    ending: Ending | None          # the ending it was generated under (None: ``text`` is the answer as shown)
    kind: str                      # Timings.source: "resumed" | "speculative" | "type-through"
    prompt_tokens: int = 0         # its prompt, all cached: nothing of it is computed for this request
    counted: bool = True           # its Done goes into the model part's counters
    also: str | None = None        # another answer typing along goes on from (remembered, not sent)


class Early(NamedTuple):
    """Events an engine answers with before any prompt is built, passed on
    as they are (a fallback engine's answer)."""

    events: Iterator[Event]
    counted: bool        # its Done goes into the engine's counters (account)


def shown_once(text: str, finish: FinishReason, stats: Stats = Stats()) -> Stream:
    """A stream of one final text."""
    yield text
    return Generation(text, finish, stats)


def precomputed(done: Done) -> Source:
    """This very request's answer, computed ahead (speculative FIM): its
    first item, its prompt counted cached."""
    t = done.timings
    text = done.items[0] if done.items else ""
    return Source(shown_once(text, done.finish_reason, Stats(generated_tokens=t.generated_tokens)), None,
                  "speculative", prompt_tokens=t.prompt_tokens)


def typed(rests: tuple[str, ...]) -> Source:
    """The rest of the answer shown here, the user having typed its start
    (:func:`soldaemon.shown.type_through`); the rest of the streamed answer
    it replaced, when typed along too, kept for the next keystroke. Not
    counted."""
    return Source(shown_once(rests[0], "stop"), None, "type-through", counted=False,
                  also=rests[1] if len(rests) > 1 else None)
