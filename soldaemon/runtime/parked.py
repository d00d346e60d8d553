"""One local generation in flight, and parking it.

A single greedy generation that is superseded after its first token is
parked (suspended, its KV session kept) so that the next keystroke, when the
user typed what it had already produced, resumes it instead of starting
over (:meth:`soldaemon.runtime.engine.LocalEngine.early`).
"""

from __future__ import annotations

from typing import Iterator

from ..api import CancelToken, CompletionRequest
from ..pipeline.stages import preview as preview_of
from ..postprocess import decide_multiline
from .detok import Detok
from .generate import GenStats, TokenEvent
from .session import KVSession


class Run:
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
        """The new preview characters of the text after what was typed."""
        preview = preview_of(self.decode.current[len(self.typed):], self.multiline)
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
