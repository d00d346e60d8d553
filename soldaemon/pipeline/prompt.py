"""The prompt stage of the completion pipeline: the request's window,
context and lead anchor, tokenized and templated
(:func:`build_fim_prompt`), the same for every engine. Nothing here imports
torch.
"""

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
    """The engine's context chooser: snippets of the request's chunks by
    relevance to the cursor (soldaemon/pipeline/relevance.py)."""
    return ContextSelector(max_chars=4 * model.max_context_tokens)  # ~4 characters a token in code


class LeadAnchors:
    """Where the middle of each document's prompt starts (``model.fim_anchor:
    sticky``; :attr:`soldaemon.fim.Place.lead_from`).

    The anchor is where the user began typing on a line (after its
    indentation, :func:`soldaemon.fim.line_anchor`): it stays put while
    the text before it and the whole suffix are unchanged and the lead
    spans at most :data:`MAX_LEAD_LINES` lines and
    :data:`MAX_LEAD_CHARS` characters, so a run of typing -- Enter
    included -- only ever appends to the prompt. Otherwise it moves to the
    cursor line's. One entry per document, the newest
    :data:`MAX_ANCHORS` kept."""

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
    """Where ``req``'s middle starts under ``model.fim_anchor`` (None: at
    the cursor); ``sticky`` without ``anchors`` acts as ``line``."""
    if model.fim_anchor == "cursor":
        return None
    if model.fim_anchor == "sticky" and anchors is not None:
        return anchors.anchor(req.uri, req.prefix, req.suffix)
    return line_anchor(req.prefix)


def build_fim_prompt(template: FimTemplate, tokenizer: Any, model: ModelConfig, req: CompletionRequest,
                     n_ctx: int, *, heal: bool = False, selector: ContextSelector | None = None,
                     anchors: LeadAnchors | None = None,
                     memo: WindowMemo | None = None) -> tuple[FimPrompt, float]:
    """Window, tokenize and template ``req`` (``model``'s budgets and FIM
    order, outline budget) with :func:`soldaemon.fim.make_prompt`; ``heal``: token healing (a local engine only: it
    needs to constrain the first token); ``selector``: context chosen by
    relevance to the cursor, else the
    request's chunks in order; ``anchors``: the per-document anchors of
    ``model.fim_anchor: sticky`` (see :class:`LeadAnchors`); the anchor
    applies only with ``heal`` (else the middle starts at the cursor);
    ``memo``: recent windows (:class:`soldaemon.fim.WindowMemo`). Returns (prompt, ms). Raises :class:`BadRequest` when
    the prompt plus ``max_tokens`` does not fit ``n_ctx`` tokens."""
    t0 = time.perf_counter_ns()
    context = req.context
    # The anchored layout needs token healing: the typed line ends mid-word
    # inside the middle (without healing llama.cpp matched the typed rest of
    # the line on 8/88 keystrokes instead of 13/88, docs/bench.md).
    start = lead_from(model, req, anchors) if heal else None
    windows = model.windows()
    lead = lead_reserve(windows.prefix) if start is not None else 0
    # context gets what the window budgets, the lead and the completion leave of n_ctx
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
