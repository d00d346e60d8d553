"""Fill-in-the-middle prompts at the token level: :func:`detect_template` finds the FIM family,
:func:`make_prompt` windows a :class:`Place` to a :class:`Budget`, PSM or SPM (:mod:`.layout`).
User text never yields a control token (:func:`encode_text`): they come only from build_prompt.
The prefix window is cut on a coarse grid of lines, so typing on the last line keeps the cut.
Every function is pure given the tokenizer (a caller may lend a :class:`WindowMemo`)."""

from __future__ import annotations

from soldaemon.fim.comments import comment_header
from soldaemon.fim.encoding import encode_text
from soldaemon.fim.layout import build_prompt
from soldaemon.fim.outline import below_outline, fit_outlines, scope_outline
from soldaemon.fim.prompt import Budget, FimPrompt, Place, heal_tokens, lead_reserve, line_anchor, make_prompt
from soldaemon.fim.templates import FimOrder, FimTemplate, detect_template
from soldaemon.fim.windows import WindowMemo

__all__ = [
    "Budget",
    "FimOrder",
    "FimPrompt",
    "FimTemplate",
    "Place",
    "WindowMemo",
    "below_outline",
    "build_prompt",
    "comment_header",
    "detect_template",
    "encode_text",
    "fit_outlines",
    "heal_tokens",
    "lead_reserve",
    "line_anchor",
    "make_prompt",
    "scope_outline",
]
