"""Fill-in-the-middle prompts, built at the token level.

:func:`detect_template` finds a tokenizer's FIM family; :func:`make_prompt`
windows a :class:`Place` to a token :class:`Budget` and builds the ids.

* **No injection.** User text is encoded with special tokens not parsed
  (:func:`encode_text`); control tokens enter only through :func:`build_prompt`.
* **PSM or SPM order** (per-family layouts: :mod:`.layout`).
* **Stable window.** :func:`window_prefix` cuts the prefix on a coarse grid of
  lines, so typing on the last line does not move the cut.
* Every function is pure given the tokenizer (a caller may lend
  :func:`make_prompt` a :class:`WindowMemo`).
"""

from __future__ import annotations

from soldaemon.fim.comments import DEFAULT_LINE_COMMENT, comment_header
from soldaemon.fim.encoding import encode_text
from soldaemon.fim.layout import build_prompt
from soldaemon.fim.outline import below_outline, fit_outlines, scope_outline
from soldaemon.fim.prompt import (Budget, FimPrompt, Place, heal_token, heal_tokens, lead_reserve, line_anchor,
                                  make_prompt)
from soldaemon.fim.templates import SUPPORTED_FAMILIES, Family, FimOrder, FimTemplate, detect_template
from soldaemon.fim.windows import WindowMemo, window_prefix, window_suffix

__all__ = [
    "Budget",
    "DEFAULT_LINE_COMMENT",
    "SUPPORTED_FAMILIES",
    "Family",
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
    "heal_token",
    "heal_tokens",
    "lead_reserve",
    "line_anchor",
    "make_prompt",
    "scope_outline",
    "window_prefix",
    "window_suffix",
]
