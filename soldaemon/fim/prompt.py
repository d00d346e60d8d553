"""The whole prompt: windows, context, outline, lead and healing put
together (:func:`make_prompt`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from soldaemon.fim.comments import comment_header
from soldaemon.fim.encoding import encode_text
from soldaemon.fim.layout import _plain_encoder, _prefix_encoder, build_prompt
from soldaemon.fim.outline import below_outline, fit_outlines, scope_outline
from soldaemon.fim.templates import FimOrder, FimTemplate
from soldaemon.fim.windows import WindowMemo, _memoized, _window_prefix, _window_suffix

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from soldaemon.api import ContextChunk


@dataclass(frozen=True)
class FimPrompt:
    """A ready prompt. ``ids`` is the model input. ``prefix_text`` and
    ``suffix_text`` are the windowed document parts the model sees (context
    excluded); ``n_prefix_tokens``/``n_suffix_tokens`` their token counts in
    ``ids``; ``n_context_tokens`` counts everything else in ``ids`` except the
    bos and the three FIM tokens: context chunks, comment headers, file
    separators, path and repository-name tokens."""

    ids: list[int]
    prefix_text: str
    suffix_text: str
    n_prefix_tokens: int
    n_suffix_tokens: int = 0
    n_context_tokens: int = 0
    heal: str = ""
    # PSM with ``lead_from``: the middle token and the lead's tokens, the end
    # of ``ids`` (what typing on the line changes; the lead is also counted
    # in n_prefix_tokens); else 0
    n_middle: int = 0


def heal_token(tokenizer: Any, prefix_ids: Sequence[int], prefix_text: str, *, blank: bool = False) -> str:
    """The text of the prompt's last prefix token when token healing should
    drop it (:mod:`soldaemon.runtime.decode.healing`): the token is ASCII (every
    byte of it is a token of its own, so some token always agrees), it ends
    ``prefix_text`` with text before it, and the cursor line has text
    before the cursor and the token no newline -- or, with ``blank`` (the
    token is the lead's, after the middle token), the token is whitespace:
    indentation ends a middle in a token the model never saw there (``"
    " * 8`` where the code it was trained on has ``" " * 7`` + ``" self"``).
    Else ""."""
    if not prefix_ids:
        return ""
    text = tokenizer.decode([prefix_ids[-1]])
    line = prefix_text.rsplit("\n", 1)[-1]
    if not text or not text.isascii() or not prefix_text.endswith(text) or len(text) >= len(prefix_text):
        return ""
    if ("\n" in text or not line.strip()) and not (blank and not text.strip()):
        return ""
    return text

# Healing inside a word goes back to the word's start, at most this far: a
# word split into pieces (``" ret" + "u"`` for ``retu``) leaves the model after
# a piece it never saw there (``" return"`` is one token), and dropping only the
# last piece still leaves it after ``" ret"`` (docs/quality.md, session 24).
HEAL_MAX_TOKENS = 4
HEAL_MAX_CHARS = 32


def _word_char(c: str) -> bool:
    return c.isalnum() or c == "_"


def heal_tokens(tokenizer: Any, ids: Sequence[int], prefix_text: str, *, blank: bool = False) -> tuple[str, int]:
    """``(text, n)``: the prompt's last ``n`` tokens, whose text ``text``
    ends ``prefix_text``, for token healing to drop. The last token as
    :func:`heal_token` decides; then, while the text dropped so far starts
    inside a word (the token before it ends with a letter, digit or ``_``
    and so does not end the word), that token too: the prompt then ends
    where the word starts, at a boundary the model saw in training, and
    the first generated tokens must agree with the whole dropped text. At
    most :data:`HEAL_MAX_TOKENS` tokens and :data:`HEAL_MAX_CHARS`
    characters, on the cursor line only, never all of ``prefix_text``.
    ``("", 0)``: nothing to heal."""
    text = heal_token(tokenizer, ids, prefix_text, blank=blank)
    n = 1 if text else 0
    while text and n < min(HEAL_MAX_TOKENS, len(ids)) and _word_char(text[0]):
        before = tokenizer.decode([ids[-n - 1]])
        longer = before + text
        if (not before or not before.isascii() or "\n" in before or not _word_char(before[-1])
                or len(longer) > HEAL_MAX_CHARS or len(longer) >= len(prefix_text)
                or not prefix_text.endswith(longer)):
            break
        text, n = longer, n + 1
    return text, n


def lead_reserve(max_prefix_tokens: int) -> int:
    """The most tokens a lead (:func:`make_prompt`'s ``lead_from``) may
    take, on top of the prefix window: a quarter of ``max_prefix_tokens``,
    between 16 and 192."""
    return max(16, min(192, max_prefix_tokens // 4))


def line_anchor(prefix: str) -> int:
    """Where a lead on the cursor line starts: after the line's indentation
    when something is typed on it; at the line's start when it is blank (the
    cursor after Enter). Measured on the embedded model, a typed line
    anchored after its indentation matches more often (docs/quality.md); a
    blank line's indentation goes into the middle, tokenized as the code
    after it would be, its last blank healed (:func:`make_prompt`): the
    prefix then ends at a line's end, as the model mostly saw it."""
    start = prefix.rfind("\n") + 1
    line = prefix[start:]
    if not line.strip():
        return start
    return start + len(line) - len(line.lstrip(" \t"))


def _split_lead(prefix: str, lead_from: int | None, max_prefix_tokens: int,
                encode: Callable[[str], list[int]]) -> tuple[str, str, list[int]]:
    """``(head, lead, lead ids)``: ``prefix`` split at ``lead_from``, or at
    the cursor line's anchor (:func:`line_anchor`) when the lead does not
    fit its reserve; not
    split (lead "") when ``lead_from`` is None, the budget is too small to
    spare a reserve, or not even the cursor line fits."""
    reserve = lead_reserve(max_prefix_tokens)
    if lead_from is None or max_prefix_tokens < 2 * reserve:
        return prefix, "", []
    if not 0 <= lead_from <= len(prefix):
        raise ValueError(f"lead_from {lead_from} is outside the prefix (0..{len(prefix)})")
    for start in dict.fromkeys((lead_from, max(lead_from, line_anchor(prefix)))):
        lead = prefix[start:]
        if not lead:
            return prefix, "", []
        if len(lead) <= 16 * reserve:   # a cheap bound first: tokens are rarely longer than 16 characters
            ids = encode(lead)
            if len(ids) <= reserve:
                return prefix[:start], lead, ids
    return prefix, "", []


def _chunk_fields(chunk: ContextChunk | tuple[str, str]) -> tuple[str, str]:
    if isinstance(chunk, tuple):
        return chunk[0], chunk[1]
    return chunk.uri, chunk.text


def make_prompt(
    template: FimTemplate,
    tokenizer: PreTrainedTokenizerBase,
    prefix: str,
    suffix: str,
    *,
    max_prefix_tokens: int,
    max_suffix_tokens: int,
    context: Sequence[ContextChunk | tuple[str, str]] = (),
    max_context_tokens: int = 1024,
    language: str | None = None,
    current_path: str | None = None,
    repo_name: str | None = None,
    grain_lines: int = 16,
    order: FimOrder = "psm",
    max_outline_tokens: int = 0,
    heal: bool = False,
    lead_from: int | None = None,
    memo: WindowMemo | None = None,
) -> FimPrompt:
    """Window ``prefix``/``suffix`` to their budgets and build the prompt ids.

    ``context`` items are ``ContextChunk`` or ``(path, text)``; they are used in
    order, each kept from its start (cut at a line end) until
    ``max_context_tokens`` is spent (a chunk that would get no room is
    dropped). With file separators they are laid out as the family documents;
    otherwise each becomes a :func:`comment_header` in ``language`` in front
    of the prefix. ``current_path``/``repo_name`` only matter for families
    with file separators, and only when there is other context (chunks or a
    ``repo_name``): a lone file gets the plain FIM layout.

    When the window leaves out the start of the prefix, an *outline* of what
    it left out (:func:`scope_outline`: the headers of the scopes enclosing
    the cursor, the definitions of names used near the cursor, the imports)
    goes right in front of the window, in file order, within
    ``max_outline_tokens`` (kept from ``max_context_tokens`` before the
    chunks take theirs: the file's own structure comes first): the model
    then knows which class and function it is in even when their first
    lines are far above (measured in docs/quality.md).
    When the suffix window leaves out the end of the suffix, the same budget
    also holds an outline of what it left out (:func:`below_outline`: the
    attributes the methods below use that the windows never name, the
    definitions below of names used near the cursor, the nearest other
    definitions), right after the suffix window; the two sides' items are
    ranked together (:func:`fit_outlines`). Both count as context. With a
    lead they are taken from the lines above the anchor's and the cursor
    line's indentation only, so typing after the anchor keeps them (and
    the suffix's cached keys with them); ``memo`` keeps them too.

    ``heal``: token healing (:mod:`soldaemon.runtime.decode.healing`) -- when the
    cursor is after text on its line, the prefix's last token (inside a
    word: its pieces back to the word's start, :func:`heal_tokens`) is left
    out of ``ids`` and its text returned as ``FimPrompt.heal``; the generation
    must then start with that text (families whose tokens decode alone
    faithfully only: not SentencePiece's dummy-prefix ones).

    ``lead_from``: where the middle starts, an index into ``prefix`` at or
    before the cursor (None: at the cursor). The *lead*, ``prefix[lead_from:]``
    (the cursor line so far after its indentation, :func:`line_anchor`, or
    the lines typed since the anchor), goes
    after the middle token as the start of the middle, and the generation
    continues it -- the layout of llama.cpp's ``/infill`` ``prompt`` field.
    Typing then only appends to the prompt: the text before the anchor and
    the whole suffix stay in the KV cache, where with the middle starting at
    the cursor every keystroke recomputes the suffix. The text before the
    anchor is windowed to ``max_prefix_tokens``; the lead comes on top, up
    to :func:`lead_reserve` tokens: a longer lead moves the anchor to the
    cursor line's (:func:`line_anchor`), and a line longer than that puts
    the middle at the cursor. SPM keeps the lead at the end of the prefix
    (typing only appends there anyway).

    ``memo``: the caller's :class:`WindowMemo`; the windows of a text
    before the anchor and of a suffix seen by a recent call are taken from
    it instead of tokenized again (while typing on a line both are
    unchanged).

    The prompt is at most ``max_prefix_tokens + max_suffix_tokens +
    max_context_tokens`` tokens (plus the lead's reserve with ``lead_from``)
    plus the control tokens, the bos and (with
    file separators) the tokens of ``current_path`` and ``repo_name``.
    ``n_prefix_tokens`` counts the window only; the outline counts as
    context.
    """
    enc_first = _prefix_encoder(template, tokenizer)
    enc_plain = _plain_encoder(template, tokenizer)

    # the outline's part of the context budget is kept from the chunks: the file's own structure first
    outline_budget = min(max(0, max_outline_tokens), max(0, max_context_tokens))
    ctx_budget = max(0, max_context_tokens) - outline_budget
    repo = template.has_repo_tokens
    chunks: list[tuple[str, list[int]]] = []
    header_ids: list[int] = []
    for item in context:
        if ctx_budget <= 0:
            break
        path, text = _chunk_fields(item)
        if repo:
            overhead = 1 + len(encode_text(tokenizer, path + "\n"))
            room = ctx_budget - overhead
            if room <= 0:
                break
            # One token of room is kept for the newline a cut chunk may need.
            kept, _ = _window_suffix(text, tokenizer, room - 1, lambda t: encode_text(tokenizer, t))
            if not kept.strip():
                continue
            if not kept.endswith("\n"):
                kept += "\n"
            code = encode_text(tokenizer, kept)
            if len(code) > room:
                continue
            chunks.append((path, code))
            ctx_budget -= overhead + len(code)
        else:
            enc = enc_first if not header_ids else enc_plain
            room = ctx_budget
            for _ in range(8):  # comment markers cost tokens: shrink and retry
                if room <= 0:
                    break
                kept, _ = _window_suffix(text, tokenizer, room, enc_plain)
                if not kept.strip():
                    break
                hids = enc(comment_header(language, path, kept))
                if len(hids) <= ctx_budget:
                    header_ids.extend(hids)
                    ctx_budget -= len(hids)
                    break
                room -= len(hids) - ctx_budget

    enc_prefix = enc_plain if header_ids else enc_first
    can_heal = heal and not template.dummy_prefix
    if not can_heal and lead_from is not None and 0 <= lead_from <= len(prefix) and not prefix[lead_from:].strip():
        lead_from = len(prefix)   # a blank line's indentation is a middle's start only when it can be healed
    head, lead, lead_ids = _split_lead(prefix, lead_from, max_prefix_tokens, enc_plain)
    head_key = ("prefix", id(tokenizer), head, max_prefix_tokens, grain_lines, bool(header_ids))
    head_text, prefix_ids = _memoized(memo, head_key, lambda: _window_prefix(
        head, tokenizer, max_prefix_tokens, grain_lines, enc_prefix))
    prefix_text = head_text + lead
    suffix_text, suffix_ids = _memoized(memo, ("suffix", id(tokenizer), suffix, max_suffix_tokens),
                                        lambda: _window_suffix(suffix, tokenizer, max_suffix_tokens, enc_plain))
    cut = head[: len(head) - len(head_text)]
    n_window = len(prefix_ids)
    below_ids: list[int] = []
    cut_below = suffix.startswith(suffix_text) and suffix[len(suffix_text):].strip()
    if outline_budget > 0 and (cut.strip() or cut_below):
        # with a lead: the lines above the anchor's and the cursor line's indentation -- typing after the
        # anchor (on the line, or on the lines of a typing run) changes nothing
        seen = prefix
        if lead:
            line = prefix[prefix.rfind("\n") + 1:]
            seen = head[: head.rfind("\n") + 1] + line[: len(line) - len(line.lstrip(" \t"))]

        def outlines() -> tuple[str, list[int]]:
            above, below = fit_outlines(
                tokenizer, scope_outline(seen, len(cut), suffix_text) if cut.strip() else [],
                below_outline(seen, suffix, len(suffix_text), head_text + suffix_text) if cut_below else [],
                outline_budget)
            return above + below, [len(above)]     # (the memo holds a text and ids: the split as the one id)

        both, (split,) = _memoized(memo, ("outline", id(tokenizer), seen, head, suffix, max_prefix_tokens,
                                          max_suffix_tokens, grain_lines, outline_budget), outlines)
        above, below = both[:split], both[split:]
        if below:
            below_ids = enc_plain(("" if not suffix_text or suffix_text.endswith("\n") else "\n") + below)
            if len(below_ids) > outline_budget:       # (estimates can be off by a token)
                below_ids = []
        if above:
            with_outline = enc_prefix(above + head_text)
            if len(with_outline) <= len(prefix_ids) + outline_budget - len(below_ids):
                prefix_ids = with_outline
    healed = ""
    blank_end = lead[lead.rfind("\n") + 1:]
    if can_heal and blank_end and not blank_end.strip():
        # the lead ends in indentation (a blank cursor line): its blanks but
        # the last one, as the code that follows would tokenize them, and the
        # last one healed -- the first token is that blank and a word
        lead_ids = enc_plain(lead[:-1]) if len(lead) > 1 else []
        healed = lead[-1]
    elif can_heal:
        healed, n_healed = heal_tokens(tokenizer, lead_ids or prefix_ids, prefix_text, blank=bool(lead_ids))
        if healed and lead_ids:
            lead_ids = lead_ids[:-n_healed]
        elif healed:
            prefix_ids = prefix_ids[:-n_healed]
            n_window -= n_healed
    n_window += len(lead_ids)

    if repo and (chunks or repo_name is not None):
        ids = build_prompt(
            template, prefix_ids, suffix_ids + below_ids, chunks,
            current_path=current_path, repo_name=repo_name, tokenizer=tokenizer, order=order, lead_ids=lead_ids,
        )
    elif repo:
        # The file's own path alone, without other files, is left out: measured
        # on the embedded model, ``<|file_sep|>path`` in front of a lone file
        # turned right answers wrong (docs/quality.md).
        ids = build_prompt(template, prefix_ids, suffix_ids + below_ids, order=order, lead_ids=lead_ids)
    else:
        ids = build_prompt(template, header_ids + prefix_ids, suffix_ids + below_ids, order=order, lead_ids=lead_ids)
    fixed = 3 + (1 if template.bos_id is not None else 0)
    return FimPrompt(
        ids=ids,
        prefix_text=prefix_text,
        suffix_text=suffix_text,
        n_prefix_tokens=n_window,
        n_suffix_tokens=len(suffix_ids),
        n_context_tokens=len(ids) - fixed - n_window - len(suffix_ids),
        heal=healed,
        n_middle=1 + len(lead_ids) if order == "psm" and lead_from is not None else 0,
    )
