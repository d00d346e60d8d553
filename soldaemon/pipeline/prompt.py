"""The prompt stage of the completion pipeline, the same for every engine
(:func:`build_fim_prompt`). No torch here."""

from __future__ import annotations

import time
from typing import Any

from soldaemon.api import CompletionRequest
from soldaemon.config import ModelConfig
from soldaemon.errors import BadRequest
from soldaemon.fim import Budget, FimPrompt, FimTemplate, Place, WindowMemo, lead_reserve, line_anchor, make_prompt
from soldaemon.pipeline.relevance import ContextSelector

MAX_LEAD_LINES = 8       # lines a sticky anchor spans before it moves to the cursor line
MAX_LEAD_CHARS = 2048    # characters likewise
MAX_ANCHORS = 64         # documents whose anchor is remembered

def path_of(uri: str) -> str | None:
    """The file path a FIM prompt names for ``uri`` (None for untitled)."""
    if uri.startswith("file://"):
        return uri[len("file://"):]
    return None if uri.startswith("untitled:") else uri


def context_selector(model: ModelConfig) -> ContextSelector:
    """The engine's chooser of context snippets by relevance to the cursor."""
    return ContextSelector(max_chars=4 * model.max_context_tokens)  # ~4 characters a token in code


class LeadAnchors:
    """Each document's middle start under ``fim_anchor: sticky``: where typing began, kept while
    the text before it and the suffix are unchanged and the lead within MAX_LEAD_LINES and
    MAX_LEAD_CHARS, else the cursor line's :func:`line_anchor`."""

    def __init__(self) -> None:
        self._anchors: dict[str, tuple[str, str]] = {}   # uri → (text before the anchor, suffix)

    def anchor(self, uri: str, prefix: str, suffix: str) -> int:
        """The anchor for this request (an index into ``prefix``)."""
        kept = self._anchors.pop(uri, None)
        if kept is not None:
            head, old_suffix = kept
            a = len(head)
            if (suffix == old_suffix and prefix.startswith(head) and len(prefix) - a <= MAX_LEAD_CHARS
                    and prefix.count("\n", a) < MAX_LEAD_LINES):
                self._anchors[uri] = kept
                return a
        a = line_anchor(prefix)
        self._anchors[uri] = (prefix[:a], suffix)
        while len(self._anchors) > MAX_ANCHORS:
            self._anchors.pop(next(iter(self._anchors)))
        return a


def lead_from(model: ModelConfig, req: CompletionRequest, anchors: LeadAnchors | None) -> int | None:
    """Where ``req``'s middle starts (None: the cursor); sticky without ``anchors`` acts as line."""
    if model.fim_anchor == "cursor":
        return None
    if model.fim_anchor == "sticky" and anchors is not None:
        return anchors.anchor(req.uri, req.prefix, req.suffix)
    return line_anchor(req.prefix)


def build_fim_prompt(template: FimTemplate, tokenizer: Any, model: ModelConfig, req: CompletionRequest,
                     n_ctx: int, *, heal: bool = False, selector: ContextSelector | None = None,
                     anchors: LeadAnchors | None = None,
                     memo: WindowMemo | None = None) -> tuple[FimPrompt, float]:
    """``(prompt, ms)``: ``req`` windowed, tokenized and templated under ``model``; ``heal``: token
    healing and the lead anchor (local engines), ``selector``: context by relevance (else in order).
    Raises :class:`BadRequest` when prompt plus ``max_tokens`` exceeds ``n_ctx``."""
    t0 = time.perf_counter_ns()
    context = req.context
    # the typed line ends mid-word inside the middle: only healing makes that work
    start = lead_from(model, req, anchors) if heal else None
    windows = model.windows()
    lead = lead_reserve(windows.prefix) if start is not None else 0
    ctx_tokens = max(0, min(model.max_context_tokens,
                            n_ctx - windows.prefix - lead - windows.suffix - req.max_tokens - 16))
    if selector is not None and context:
        context = selector.select(req.uri, req.prefix, req.suffix, context)
    place = Place(req.prefix, req.suffix, context=context, language=req.language, current_path=path_of(req.uri),
                  lead_from=start)
    budget = Budget(windows.prefix, windows.suffix, context=ctx_tokens, outline=windows.outline)
    prompt = make_prompt(template, tokenizer, place, budget, order=model.fim_order, heal=heal, memo=memo)
    if len(prompt.ids) + req.max_tokens + 1 >= n_ctx:
        raise BadRequest(
            f"prompt of {len(prompt.ids)} tokens + max_tokens {req.max_tokens} does not fit "
            f"model.max_context {n_ctx}",
            hint="lower max_tokens or send less context",
        )
    return prompt, (time.perf_counter_ns() - t0) / 1e6
