"""Fill-in-the-middle prompts, built at the token level.

A FIM model is prompted with the text before the cursor (the *prefix*), the text
after it (the *suffix*) and three special tokens that mark them; it then
generates the *middle*. Each model family spells those tokens differently.
:func:`detect_template` finds the family from the tokenizer's special tokens;
:func:`make_prompt` windows the document (a :class:`Place`) to a token
:class:`Budget` and builds the prompt ids.

Contracts that the rest of the daemon relies on:

* **No injection.** User text is tokenized with special tokens *not* parsed
  (:func:`encode_text`): a document that contains the literal string
  ``<|fim_prefix|>`` produces ordinary text tokens, never the control token.
  Control tokens enter a prompt only through :func:`build_prompt`.
* **PSM or SPM order.** A prompt is ``[bos?] PRE prefix SUF suffix MID`` (PSM,
  the default) or ``[bos?] SUF suffix PRE prefix MID`` (SPM, llama.cpp's
  ``spm_infill`` layout), after any repository context. The KV cache of the
  previous keystroke is reused up to the first changed token: with PSM that is
  the cursor, and the suffix after it is recomputed; with SPM the text before
  the cursor comes last, so typing only appends.
* **Stable window.** :func:`window_prefix` cuts the start of the prefix on a
  coarse grid of lines counted from the start of the file: typing on the last
  line never moves the cut unless the token budget forces it.
* Nothing is cached at module level; every function is pure given the
  tokenizer (a caller may lend :func:`make_prompt` a :class:`WindowMemo`).

Per-family prompt layouts (``[X]`` is the control token X, ``{x}`` text tokens):

* Qwen2.5-Coder: ``[<|fim_prefix|>]{prefix}[<|fim_suffix|>]{suffix}[<|fim_middle|>]``;
  with repository context, as documented by Qwen:
  ``[<|repo_name|>]{name}\\n([<|file_sep|>]{path}\\n{code})*[<|file_sep|>]{path}\\n``
  followed by the FIM part.
* StarCoder2: ``[<fim_prefix>]{prefix}[<fim_suffix>]{suffix}[<fim_middle>]``; with
  context, as in the StarCoder2 paper (section 5):
  ``[<repo_name>]{name}([<file_sep>]{path}\\n{code})*[<file_sep>][<fim_prefix>]{path}\\n{prefix}...``.
* DeepSeek-Coder: ``[bos][<｜fim▁begin｜>]{prefix}[<｜fim▁hole｜>]{suffix}[<｜fim▁end｜>]``;
  it has no file separator, so context goes in front of the prefix as comments
  (:func:`comment_header`), as DeepSeek's own repository-level examples do.
* CodeLlama: ``[bos][<PRE>]{" " + prefix}[<SUF>]{suffix}[<MID>]`` -- the token
  sequence of CodeLlama's reference ``infilling_prompt_tokens`` and of
  ``CodeLlamaTokenizer`` (rendered as text: ``<s><PRE> {prefix} <SUF>{suffix} <MID>``):
  the prefix is encoded with one leading space (SentencePiece's word-boundary
  marker) and the suffix without one. The spaces before ``<SUF>`` and ``<MID>``
  in the textual rendering belong to those tokens (``▁<SUF>``, ``▁<MID>``), not
  to the text. Context goes in front of the prefix as comments. (transformers
  5's ``CodeLlamaTokenizer`` puts a ``▁`` in front of the suffix as well; Meta's
  reference encodes the suffix without it, and so do we.)

The code is split by concern: :mod:`.templates` (families and their
tokens), :mod:`.encoding` (text to ids), :mod:`.layout` (the token layout),
:mod:`.comments`, :mod:`.windows` (budgets, the stable grid, the memo),
:mod:`.outline` and :mod:`.prompt` (:func:`make_prompt`).
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
