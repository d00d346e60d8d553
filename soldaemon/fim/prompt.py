"""The whole prompt (:func:`make_prompt`): a place in a document and a token
budget in, the ids out, in small steps that each return a small record:
context, lead, windows, outline, healing, layout."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Sequence

from soldaemon.fim.comments import comment_header
from soldaemon.fim.encoding import encode_text
from soldaemon.fim.layout import build_prompt, encoders
from soldaemon.fim.outline import below_outline, fit_outlines, scope_outline
from soldaemon.fim.templates import FimOrder, FimTemplate
from soldaemon.fim.windows import WindowMemo, fit_prefix, fit_suffix

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from soldaemon.api import ContextChunk


@dataclass(frozen=True)
class Place:
    """Where the completion goes, and what else the prompt may show."""

    prefix: str                            # the document before the cursor
    suffix: str                            # the document after the cursor
    # other files, best first: each kept from its start while the budget lasts
    context: Sequence[ContextChunk | tuple[str, str]] = ()
    language: str | None = None            # the comment syntax of context headers (families without file separators)
    current_path: str | None = None        # this file's path, shown with other files (families with file separators)
    # where the middle starts in ``prefix`` (None: the cursor); the lead
    # ``prefix[lead_from:]`` goes after the middle token, so typing only appends
    lead_from: int | None = None


@dataclass(frozen=True)
class Budget:
    """Token budgets: a prompt is at most ``prefix + suffix + context`` tokens
    plus a lead's reserve (:func:`lead_reserve`), control tokens and paths."""

    prefix: int              # tokens: the prefix window (the text before a lead's anchor)
    suffix: int              # tokens: the suffix window
    context: int = 1024      # tokens: the outline and the context chunks
    outline: int = 0         # tokens of ``context`` the outline takes first (0: none)
    grain_lines: int = 16    # lines: the grid the prefix window's start moves on (windows.fit_prefix)

    @property
    def outline_tokens(self) -> int:
        return min(max(0, self.outline), max(0, self.context))

    @property
    def chunk_tokens(self) -> int:
        return max(0, self.context) - self.outline_tokens


@dataclass(frozen=True)
class FimPrompt:
    """A ready prompt."""

    ids: list[int]                # the model input
    prefix_text: str              # the windowed document before the cursor the model sees
    suffix_text: str              # likewise after it
    n_prefix_tokens: int          # tokens of prefix_text in ids (the lead included)
    n_suffix_tokens: int = 0
    n_context_tokens: int = 0     # all else but bos and the FIM tokens: context, headers, paths
    heal: str = ""                # what the generation must start with (token healing)
    n_middle: int = 0             # PSM with a lead: the middle token and the lead, ending ids


def heal_token(tokenizer: Any, prefix_ids: Sequence[int], prefix_text: str, *, blank: bool = False) -> str:
    """The last prefix token's text when healing should drop it, else "": an ASCII token ending
    ``prefix_text`` after text on the cursor line, or with ``blank`` (a lead's) a whitespace one."""
    if not prefix_ids:
        return ""
    text = tokenizer.decode([prefix_ids[-1]])
    line = prefix_text.rsplit("\n", 1)[-1]
    if not text or not text.isascii() or not prefix_text.endswith(text) or len(text) >= len(prefix_text):
        return ""
    if ("\n" in text or not line.strip()) and not (blank and not text.strip()):
        return ""
    return text

# Healing inside a word goes back to the word's start, at most this far (docs/quality.md).
HEAL_MAX_TOKENS = 4
HEAL_MAX_CHARS = 32


def _word_char(c: str) -> bool:
    return c.isalnum() or c == "_"


def heal_tokens(tokenizer: Any, ids: Sequence[int], prefix_text: str, *, blank: bool = False) -> tuple[str, int]:
    """``(text, n)``: the last ``n`` tokens for healing to drop, :func:`heal_token`'s extended back
    to its word's start (within the HEAL_MAX_* limits); ``("", 0)``: nothing to heal."""
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
    """The most tokens a lead may take on top of the prefix window."""
    return max(16, min(192, max_prefix_tokens // 4))


def line_anchor(prefix: str) -> int:
    """Where a lead on the cursor line starts: after its indentation (a blank line: its start)."""
    start = prefix.rfind("\n") + 1
    line = prefix[start:]
    if not line.strip():
        return start
    return start + len(line) - len(line.lstrip(" \t"))


class Encoders(NamedTuple):
    first: Callable[[str], list[int]]    # the first text after the prefix token
    plain: Callable[[str], list[int]]    # text after other tokens


class Context(NamedTuple):
    chunks: list[tuple[str, list[int]]]  # (path, code ids) for families with file separators
    header_ids: list[int]                # comment headers in front of the prefix, for the others


class Lead(NamedTuple):
    head: str                            # the prefix before the lead: windowed
    text: str                            # the lead ("": the middle starts at the cursor)
    ids: list[int]


class Windows(NamedTuple):
    head_text: str                       # the kept end of ``Lead.head``
    prefix_ids: list[int]
    suffix_text: str                     # the kept start of the suffix
    suffix_ids: list[int]


class Outlined(NamedTuple):
    prefix_ids: list[int]                # the outline of what the window left out above, then the window
    below_ids: list[int]                 # after the suffix window: the outline of what it left out below


class Healed(NamedTuple):
    text: str                            # what the generation must start with ("": no healing)
    prefix_ids: list[int]
    lead_ids: list[int]
    from_window: int                     # tokens healed off the window (not the lead)


def make_prompt(template: FimTemplate, tokenizer: PreTrainedTokenizerBase, place: Place, budget: Budget, *,
                order: FimOrder = "psm", heal: bool = False, memo: WindowMemo | None = None) -> FimPrompt:
    """The prompt of ``place`` within ``budget`` in ``order``, token-healed
    when ``heal`` and the family allows; ``memo`` holds recent windows."""
    enc = Encoders(*encoders(template, tokenizer))
    memo = memo if memo is not None else WindowMemo(size=0)
    context = pack_context(template, tokenizer, place, budget.chunk_tokens, enc)
    can_heal = heal and not template.dummy_prefix
    lead = split_lead(place, budget.prefix, enc.plain, can_heal)
    if context.header_ids:     # the window no longer starts right after the prefix token
        enc = Encoders(enc.plain, enc.plain)
    windows = cut_windows(tokenizer, place, lead, budget, enc, memo)
    outlined = add_outlines(tokenizer, place, lead, windows, budget, enc, memo)
    healed = heal_end(tokenizer, lead, outlined.prefix_ids, windows.head_text + lead.text, can_heal, enc.plain)
    ids = lay_out(template, tokenizer, place, context, healed, windows.suffix_ids + outlined.below_ids, order)
    n_window = len(windows.prefix_ids) - healed.from_window + len(healed.lead_ids)
    fixed = 3 + (1 if template.bos_id is not None else 0)
    return FimPrompt(
        ids=ids, prefix_text=windows.head_text + lead.text, suffix_text=windows.suffix_text,
        n_prefix_tokens=n_window, n_suffix_tokens=len(windows.suffix_ids),
        n_context_tokens=len(ids) - fixed - n_window - len(windows.suffix_ids), heal=healed.text,
        n_middle=1 + len(healed.lead_ids) if order == "psm" and place.lead_from is not None else 0)


def _chunk_fields(chunk: ContextChunk | tuple[str, str]) -> tuple[str, str]:
    return (chunk[0], chunk[1]) if isinstance(chunk, tuple) else (chunk.uri, chunk.text)


def pack_context(template: FimTemplate, tokenizer: Any, place: Place, tokens: int, enc: Encoders) -> Context:
    """``place.context`` within ``tokens``, each chunk's start up to a line end: files after
    separators, or comment headers."""
    if template.has_repo_tokens:
        return Context(_file_chunks(tokenizer, place.context, tokens), [])
    return Context([], _comment_headers(tokenizer, place, tokens, enc))


def _file_chunks(tokenizer: Any, context: Sequence[ContextChunk | tuple[str, str]],
                 tokens: int) -> list[tuple[str, list[int]]]:
    chunks: list[tuple[str, list[int]]] = []
    for item in context:
        if tokens <= 0:
            break
        path, text = _chunk_fields(item)
        overhead = 1 + len(encode_text(tokenizer, path + "\n"))
        room = tokens - overhead
        if room <= 0:
            break
        # one token kept for the newline a cut chunk may need
        kept, _ = fit_suffix(text, tokenizer, room - 1, lambda t: encode_text(tokenizer, t))
        if not kept.strip():
            continue
        if not kept.endswith("\n"):
            kept += "\n"
        code = encode_text(tokenizer, kept)
        if len(code) > room:
            continue
        chunks.append((path, code))
        tokens -= overhead + len(code)
    return chunks


def _comment_headers(tokenizer: Any, place: Place, tokens: int, enc: Encoders) -> list[int]:
    ids: list[int] = []
    for item in place.context:
        if tokens <= 0:
            break
        path, text = _chunk_fields(item)
        encode = enc.first if not ids else enc.plain
        room = tokens
        for _ in range(8):  # comment markers cost tokens: shrink and retry
            if room <= 0:
                break
            kept, _ = fit_suffix(text, tokenizer, room, enc.plain)
            if not kept.strip():
                break
            header = encode(comment_header(place.language, path, kept))
            if len(header) <= tokens:
                ids.extend(header)
                tokens -= len(header)
                break
            room -= len(header) - tokens
    return ids


def split_lead(place: Place, max_prefix_tokens: int, encode: Callable[[str], list[int]], can_heal: bool) -> Lead:
    """``place.prefix`` split at ``lead_from``, or at :func:`line_anchor` when
    the lead exceeds :func:`lead_reserve`; unsplit when no lead fits."""
    prefix, lead_from = place.prefix, place.lead_from
    if not can_heal and lead_from is not None and 0 <= lead_from <= len(prefix) and not prefix[lead_from:].strip():
        lead_from = len(prefix)
    reserve = lead_reserve(max_prefix_tokens)
    if lead_from is None or max_prefix_tokens < 2 * reserve:
        return Lead(prefix, "", [])
    if not 0 <= lead_from <= len(prefix):
        raise ValueError(f"lead_from {lead_from} is outside the prefix (0..{len(prefix)})")
    for start in dict.fromkeys((lead_from, max(lead_from, line_anchor(prefix)))):
        lead = prefix[start:]
        if not lead:
            return Lead(prefix, "", [])
        if len(lead) <= 16 * reserve:   # a cheap bound first: tokens are rarely longer than 16 characters
            ids = encode(lead)
            if len(ids) <= reserve:
                return Lead(prefix[:start], lead, ids)
    return Lead(prefix, "", [])


def cut_windows(tokenizer: Any, place: Place, lead: Lead, budget: Budget, enc: Encoders,
                memo: WindowMemo) -> Windows:
    """The prefix window (before the lead, on the grid) and the suffix window."""
    after_headers = enc.first is enc.plain       # the window's encoder: part of its key
    head_key = ("prefix", id(tokenizer), lead.head, budget.prefix, budget.grain_lines, after_headers)
    head_text, prefix_ids = memo.through(head_key, lambda: fit_prefix(
        lead.head, tokenizer, budget.prefix, budget.grain_lines, enc.first))
    suffix_text, suffix_ids = memo.through(("suffix", id(tokenizer), place.suffix, budget.suffix),
                                           lambda: fit_suffix(place.suffix, tokenizer, budget.suffix, enc.plain))
    return Windows(head_text, prefix_ids, suffix_text, suffix_ids)


def add_outlines(tokenizer: Any, place: Place, lead: Lead, windows: Windows, budget: Budget, enc: Encoders,
                 memo: WindowMemo) -> Outlined:
    """Outlines of what the windows left out, within ``budget.outline_tokens``, before the prefix
    window and after the suffix window; with a lead, read up to the anchor so typing keeps them."""
    prefix, head, suffix = place.prefix, lead.head, place.suffix
    outline_tokens = budget.outline_tokens
    cut = head[: len(head) - len(windows.head_text)]
    cut_below = suffix.startswith(windows.suffix_text) and suffix[len(windows.suffix_text):].strip()
    if outline_tokens <= 0 or not (cut.strip() or cut_below):
        return Outlined(windows.prefix_ids, [])
    seen = prefix
    if lead.text:
        line = prefix[prefix.rfind("\n") + 1:]
        seen = head[: head.rfind("\n") + 1] + line[: len(line) - len(line.lstrip(" \t"))]

    def outlines() -> tuple[str, list[int]]:
        above, below = fit_outlines(
            tokenizer, scope_outline(seen, len(cut), windows.suffix_text) if cut.strip() else [],
            below_outline(seen, suffix, len(windows.suffix_text), windows.head_text + windows.suffix_text)
            if cut_below else [], outline_tokens)
        return above + below, [len(above)]     # (the memo holds a text and ids: the split as the one id)

    both, (split,) = memo.through(("outline", id(tokenizer), seen, head, suffix, budget.prefix, budget.suffix,
                                   budget.grain_lines, outline_tokens), outlines)
    above, below = both[:split], both[split:]
    below_ids: list[int] = []
    if below:
        below_ids = enc.plain(("" if not windows.suffix_text or windows.suffix_text.endswith("\n") else "\n") + below)
        if len(below_ids) > outline_tokens:       # (estimates can be off by a token)
            below_ids = []
    prefix_ids = windows.prefix_ids
    if above:
        with_outline = enc.first(above + windows.head_text)
        if len(with_outline) <= len(prefix_ids) + outline_tokens - len(below_ids):
            prefix_ids = with_outline
    return Outlined(prefix_ids, below_ids)


def heal_end(tokenizer: Any, lead: Lead, prefix_ids: list[int], prefix_text: str, can_heal: bool,
             encode: Callable[[str], list[int]]) -> Healed:
    """The last tokens (:func:`heal_tokens`) left out, their text the generation's required start;
    a lead ending in indentation heals only its last blank."""
    if not can_heal:
        return Healed("", prefix_ids, lead.ids, 0)
    blank_end = lead.text[lead.text.rfind("\n") + 1:]
    if blank_end and not blank_end.strip():
        return Healed(lead.text[-1], prefix_ids, encode(lead.text[:-1]) if len(lead.text) > 1 else [], 0)
    text, n = heal_tokens(tokenizer, lead.ids or prefix_ids, prefix_text, blank=bool(lead.ids))
    if not text:
        return Healed("", prefix_ids, lead.ids, 0)
    if lead.ids:
        return Healed(text, prefix_ids, lead.ids[:-n], 0)
    return Healed(text, prefix_ids[:-n], lead.ids, n)


def lay_out(template: FimTemplate, tokenizer: Any, place: Place, context: Context, healed: Healed,
            suffix_ids: list[int], order: FimOrder) -> list[int]:
    """The ids in the family's layout (:func:`build_prompt`); the file's path
    alone, without other files, is left out (docs/quality.md)."""
    if template.has_repo_tokens and context.chunks:
        return build_prompt(template, healed.prefix_ids, suffix_ids, context.chunks, current_path=place.current_path,
                            tokenizer=tokenizer, order=order, lead_ids=healed.lead_ids)
    return build_prompt(template, context.header_ids + healed.prefix_ids, suffix_ids, order=order,
                        lead_ids=healed.lead_ids)
