"""Fill-in-the-middle prompts, built at the token level.

A FIM model is prompted with the text before the cursor (the *prefix*), the text
after it (the *suffix*) and three special tokens that mark them; it then
generates the *middle*. Each model family spells those tokens differently.
:func:`detect_template` finds the family from the tokenizer's special tokens;
:func:`make_prompt` windows the document to a token budget and builds the
prompt ids.

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
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal, Sequence

from soldaemon.errors import NoFimTokens

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from soldaemon.api import ContextChunk

Family = Literal["qwen2.5-coder", "starcoder2", "deepseek-coder", "codellama"]
FimOrder = Literal["psm", "spm"]

SUPPORTED_FAMILIES: tuple[Family, ...] = (
    "qwen2.5-coder",
    "starcoder2",
    "deepseek-coder",
    "codellama",
)


@dataclass(frozen=True)
class FimTemplate:
    """The FIM control tokens of one tokenizer.

    ``stop_ids`` are all the family's end tokens that exist in this vocabulary
    plus the tokenizer's eos: generation stops when one is sampled (it is never
    shown). ``bos_id`` is set only for families that expect a bos in front of a
    FIM prompt (DeepSeek-Coder, CodeLlama) and only when the tokenizer has one.
    ``repo_name_id``/``file_sep_id`` are set for families with repository-level
    tokens (Qwen2.5-Coder, StarCoder2). ``dummy_prefix`` is True when the
    tokenizer puts a word-boundary marker (SentencePiece ``▁``) in front of
    every text it encodes; :func:`make_prompt` compensates for it.
    """

    family: Family
    prefix_id: int
    suffix_id: int
    middle_id: int
    stop_ids: frozenset[int]
    repo_name_id: int | None = None
    file_sep_id: int | None = None
    bos_id: int | None = None
    dummy_prefix: bool = False

    @property
    def has_repo_tokens(self) -> bool:
        """True when repository context can be given with file separators."""
        return self.file_sep_id is not None


@dataclass(frozen=True)
class _FamilySpec:
    family: Family
    # Each token may have several spellings (the first one found is used).
    prefix: tuple[str, ...]
    suffix: tuple[str, ...]
    middle: tuple[str, ...]
    repo_name: tuple[str, ...]
    file_sep: tuple[str, ...]
    stops: tuple[str, ...]
    wants_bos: bool


_FAMILIES: tuple[_FamilySpec, ...] = (
    _FamilySpec(
        family="qwen2.5-coder",
        prefix=("<|fim_prefix|>",),
        suffix=("<|fim_suffix|>",),
        middle=("<|fim_middle|>",),
        repo_name=("<|repo_name|>",),
        file_sep=("<|file_sep|>",),
        stops=(
            "<|endoftext|>", "<|im_end|>", "<|fim_pad|>", "<|file_sep|>",
            "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>",
        ),
        wants_bos=False,
    ),
    _FamilySpec(
        family="starcoder2",
        prefix=("<fim_prefix>",),
        suffix=("<fim_suffix>",),
        middle=("<fim_middle>",),
        repo_name=("<repo_name>",),
        file_sep=("<file_sep>",),
        stops=(
            "<|endoftext|>", "<file_sep>", "<fim_prefix>", "<fim_suffix>",
            "<fim_middle>", "<fim_pad>",
        ),
        wants_bos=False,
    ),
    _FamilySpec(
        family="deepseek-coder",
        prefix=("<｜fim▁begin｜>",),
        suffix=("<｜fim▁hole｜>",),
        middle=("<｜fim▁end｜>",),
        repo_name=(),
        file_sep=(),
        stops=(
            "<｜end▁of▁sentence｜>", "<|EOT|>", "<｜fim▁begin｜>", "<｜fim▁hole｜>",
            "<｜fim▁end｜>",
        ),
        wants_bos=True,
    ),
    _FamilySpec(
        family="codellama",
        # The released tokenizers spell them with a leading "▁".
        prefix=("▁<PRE>", "<PRE>"),
        suffix=("▁<SUF>", "<SUF>"),
        middle=("▁<MID>", "<MID>"),
        repo_name=(),
        file_sep=(),
        stops=("▁<EOT>", "<EOT>", "</s>", "▁<PRE>", "<PRE>", "▁<SUF>", "<SUF>", "▁<MID>", "<MID>"),
        wants_bos=True,
    ),
)


def _lookup(vocab: dict[str, int], spellings: Sequence[str]) -> int | None:
    for s in spellings:
        tid = vocab.get(s)
        if tid is not None:
            return int(tid)
    return None


def _tokenizer_name(tokenizer: Any) -> str:
    name = getattr(tokenizer, "name_or_path", "") or ""
    return str(name) if name else type(tokenizer).__name__


def detect_template(tokenizer: PreTrainedTokenizerBase) -> FimTemplate:
    """Find the FIM family of ``tokenizer`` from its vocabulary.

    A family matches when its prefix, suffix and middle tokens all exist in the
    vocabulary (added tokens included). Families are tried in the order of
    :data:`SUPPORTED_FAMILIES`. Raises :class:`~soldaemon.errors.NoFimTokens`
    when none matches.
    """
    vocab: dict[str, int] = dict(tokenizer.get_vocab())
    for spec in _FAMILIES:
        pre = _lookup(vocab, spec.prefix)
        suf = _lookup(vocab, spec.suffix)
        mid = _lookup(vocab, spec.middle)
        if pre is None or suf is None or mid is None:
            continue
        stops = {tid for s in spec.stops if (tid := vocab.get(s)) is not None}
        eos = tokenizer.eos_token_id
        if isinstance(eos, int):
            stops.add(eos)
        bos = tokenizer.bos_token_id if spec.wants_bos else None
        template = FimTemplate(
            family=spec.family,
            prefix_id=pre,
            suffix_id=suf,
            middle_id=mid,
            stop_ids=frozenset(int(s) for s in stops),
            repo_name_id=_lookup(vocab, spec.repo_name),
            file_sep_id=_lookup(vocab, spec.file_sep),
            bos_id=int(bos) if isinstance(bos, int) else None,
            dummy_prefix=_adds_dummy_prefix(tokenizer),
        )
        return template
    name = _tokenizer_name(tokenizer)
    raise NoFimTokens(
        f"{name}: the tokenizer has no fill-in-the-middle tokens, so this model "
        "cannot complete code between a prefix and a suffix. Supported families: "
        "Qwen2.5-Coder (<|fim_prefix|>), StarCoder2 (<fim_prefix>), "
        "DeepSeek-Coder (<｜fim▁begin｜>), CodeLlama (<PRE>). An instruct- or "
        "chat-only model without these tokens cannot fill in the middle.",
        hint="use a base or FIM-trained code model of a supported family "
        "(the default embedded Qwen2.5-Coder model works)",
    )


# ---------------------------------------------------------------------------
# Tokenizing user text


def _control_tokens(tokenizer: Any) -> list[tuple[str, int]]:
    """(content, id) of the added tokens that act as control tokens: those
    flagged special, and those spelled like one (``<...>``, ``▁<...>``) even
    when a converted tokenizer lost the flag. Plain added tokens (runs of
    spaces, single characters) are not control tokens."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    out: list[tuple[str, int]] = []
    for tid, tok in decoder.items():
        content = str(getattr(tok, "content", tok))
        bare = content.lstrip("▁")
        looks = len(bare) > 2 and bare.startswith("<") and bare.endswith(">")
        if content and (bool(getattr(tok, "special", False)) or looks):
            out.append((content, int(tid)))
    return out


def encode_text(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids of ``text`` as plain text: no bos/eos added and no control
    token recognised inside it.

    Uses ``split_special_tokens=True``. Because that flag is shared mutable
    state inside the Rust tokenizer (another thread could flip it) and does not
    cover added tokens that lost their ``special`` flag, the result is checked:
    when ``text`` contains the spelling of a control token and that token's id
    came out, the text is re-encoded in pieces split inside each occurrence, so
    no piece contains a whole control token (the tokenization around those
    spots then differs slightly -- with a SentencePiece tokenizer each piece
    also gets its word-boundary marker -- which is harmless). The check costs
    a few substring searches.
    """
    if not text:
        return []
    enc = tokenizer(text, add_special_tokens=False, split_special_tokens=True)
    ids = [int(i) for i in enc["input_ids"]]
    present = [(c, tid) for c, tid in _control_tokens(tokenizer) if c in text]
    if not present:
        return ids
    bad = {tid for _, tid in present}
    if not bad.intersection(ids):
        return ids
    # Split inside every occurrence of an added token's content.
    cuts: set[int] = set()
    for content, _ in present:
        start = text.find(content)
        while start >= 0:
            cuts.add(start + 1)
            start = text.find(content, start + 1)
    out: list[int] = []
    last = 0
    for cut in sorted(cuts) + [len(text)]:
        piece = text[last:cut]
        last = cut
        if piece:
            penc = tokenizer(piece, add_special_tokens=False, split_special_tokens=True)
            out.extend(int(i) for i in penc["input_ids"])
    return out


def _adds_dummy_prefix(tokenizer: Any) -> bool:
    """True when encoding "a" yields a first token starting with "▁"."""
    try:
        ids = encode_text(tokenizer, "a")
        toks = tokenizer.convert_ids_to_tokens(ids[:1])
    except Exception:  # a tokenizer we cannot probe: assume plain BPE
        return False
    return bool(toks) and isinstance(toks[0], str) and toks[0].startswith("▁")


def _encode_no_dummy(template: FimTemplate, tokenizer: Any, text: str) -> list[int]:
    """Like :func:`encode_text`, without the dummy-prefix marker a SentencePiece
    tokenizer puts in front of ``text``: the text is encoded after a newline
    sentinel whose tokens are then removed."""
    if not template.dummy_prefix or not text:
        return encode_text(tokenizer, text)
    sentinel = encode_text(tokenizer, "\n")
    ids = encode_text(tokenizer, "\n" + text)
    if sentinel and ids[: len(sentinel)] == sentinel:
        return ids[len(sentinel):]
    return encode_text(tokenizer, text)


def _prefix_encoder(template: FimTemplate, tokenizer: Any) -> Callable[[str], list[int]]:
    """The encoder for the first text after the PRE token."""
    if template.family == "codellama":
        return lambda text: _encode_no_dummy(template, tokenizer, " " + text)
    return lambda text: encode_text(tokenizer, text)


def _plain_encoder(template: FimTemplate, tokenizer: Any) -> Callable[[str], list[int]]:
    """The encoder for text that follows other tokens (suffix, later pieces)."""
    if template.family == "codellama":
        return lambda text: _encode_no_dummy(template, tokenizer, text)
    return lambda text: encode_text(tokenizer, text)


# ---------------------------------------------------------------------------
# Prompt assembly


def build_prompt(
    template: FimTemplate,
    prefix_ids: Sequence[int],
    suffix_ids: Sequence[int],
    context: Sequence[tuple[str, Sequence[int]]] | None = None,
    *,
    current_path: str | None = None,
    repo_name: str | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    order: FimOrder = "psm",
    lead_ids: Sequence[int] = (),
) -> list[int]:
    """The prompt ids in PSM order, or SPM order with ``order="spm"`` (see
    the module docstring for each family).

    ``prefix_ids``/``suffix_ids`` are the already tokenized, already windowed
    document parts (for CodeLlama, ``prefix_ids`` must encode ``" " + prefix``;
    :func:`make_prompt` does that).

    ``context`` is ``[(path, code_ids), ...]``: other files, placed before the
    FIM part. With file separators (Qwen2.5-Coder, StarCoder2) each becomes
    ``file_sep`` + tokens of ``path + "\\n"`` + ``code_ids``; ``code_ids``
    should encode text ending in a newline. ``current_path`` and ``repo_name``
    are used by those families only. Their strings are tokenized with
    ``tokenizer``, which is then required (``ValueError`` otherwise).

    ``lead_ids``: the already typed start of the middle (:func:`make_prompt`'s
    ``lead_from``), after the middle token in PSM, at the end of the prefix
    in SPM.

    Families without file separators (DeepSeek-Coder, CodeLlama) put each
    ``code_ids`` verbatim right after the PRE token, in front of the prefix;
    the paths are not used, so the caller formats each chunk with
    :func:`comment_header` first (:func:`make_prompt` does).
    """
    ids: list[int] = []
    if template.bos_id is not None:
        ids.append(template.bos_id)
    chunks = list(context or ())
    repo_level = template.file_sep_id is not None and (
        bool(chunks) or current_path is not None or repo_name is not None
    )
    if not repo_level:
        head: list[int] = []
        for _, code in chunks:
            head.extend(code)
        ids.extend(_fim_body(template, head, prefix_ids, suffix_ids, order, lead_ids))
        return ids

    if tokenizer is None:
        raise ValueError("build_prompt: repository context needs the tokenizer to encode paths")
    sep = template.file_sep_id
    assert sep is not None
    qwen = template.family == "qwen2.5-coder"
    if repo_name is not None and template.repo_name_id is not None:
        ids.append(template.repo_name_id)
        ids.extend(encode_text(tokenizer, repo_name + ("\n" if qwen else "")))
    for path, code in chunks:
        ids.append(sep)
        ids.extend(encode_text(tokenizer, path + "\n"))
        ids.extend(code)
    path_ids = encode_text(tokenizer, current_path + "\n") if current_path else []
    ids.append(sep)
    if qwen:
        ids.extend(path_ids)
        ids.extend(_fim_body(template, [], prefix_ids, suffix_ids, order, lead_ids))
    else:  # StarCoder2: the path goes right after <fim_prefix>
        ids.extend(_fim_body(template, path_ids, prefix_ids, suffix_ids, order, lead_ids))
    return ids


def _fim_body(template: FimTemplate, head: Sequence[int], prefix_ids: Sequence[int],
              suffix_ids: Sequence[int], order: FimOrder, lead_ids: Sequence[int] = ()) -> list[int]:
    """PSM: ``PRE head prefix SUF suffix MID lead``. SPM (llama.cpp's
    ``spm_infill`` layout): ``SUF suffix PRE head prefix lead MID`` — the
    text before the cursor comes last, so typing only appends to the prompt
    and everything before the cursor stays reusable in the KV cache.
    ``lead``: the start of the middle, already typed (see :func:`make_prompt`)."""
    if order == "spm":
        return [template.suffix_id, *suffix_ids, template.prefix_id, *head, *prefix_ids, *lead_ids,
                template.middle_id]
    if order != "psm":
        raise ValueError(f"FIM order must be 'psm' or 'spm', not {order!r}")
    return [template.prefix_id, *head, *prefix_ids, template.suffix_id, *suffix_ids, template.middle_id,
            *lead_ids]


# Line-comment markers by LSP language id; block markers for the rest.
_LINE_COMMENT: dict[str, str] = {}
for _lang in (
    "python", "ruby", "shellscript", "sh", "bash", "zsh", "perl", "r", "yaml", "toml",
    "dockerfile", "makefile", "powershell", "coffeescript", "elixir", "julia", "nim",
    "cmake", "nix", "graphql", "tcl",
):
    _LINE_COMMENT[_lang] = "#"
for _lang in (
    "c", "cpp", "csharp", "java", "javascript", "javascriptreact", "typescript",
    "typescriptreact", "go", "rust", "swift", "kotlin", "scala", "dart", "php",
    "objective-c", "objective-cpp", "groovy", "zig", "jsonc", "fsharp", "proto",
    "solidity", "scss", "less", "d", "vala", "verilog", "systemverilog", "glsl", "hlsl",
    "cuda", "cuda-cpp",
):
    _LINE_COMMENT[_lang] = "//"
for _lang in ("sql", "lua", "haskell", "elm", "ada", "plsql", "purescript", "vhdl"):
    _LINE_COMMENT[_lang] = "--"
for _lang in ("clojure", "lisp", "scheme", "racket", "commonlisp", "ini", "asm"):
    _LINE_COMMENT[_lang] = ";"
for _lang in ("latex", "tex", "erlang", "matlab", "prolog"):
    _LINE_COMMENT[_lang] = "%"
_LINE_COMMENT["vb"] = "'"
_LINE_COMMENT["fortran"] = "!"
_BLOCK_COMMENT: dict[str, tuple[str, str]] = {
    "html": ("<!--", "-->"),
    "xml": ("<!--", "-->"),
    "markdown": ("<!--", "-->"),
    "vue": ("<!--", "-->"),
    "svelte": ("<!--", "-->"),
    "css": ("/*", "*/"),
    "ocaml": ("(*", "*)"),
}
DEFAULT_LINE_COMMENT = "#"


def comment_header(language: str | None, path: str, text: str) -> str:
    """``text`` from file ``path`` as a comment block in ``language`` (an LSP
    language id), for families that have no file separator token.

    Line-comment languages get ``{c} Path: {path}`` followed by every line of
    ``text`` prefixed with ``{c} `` (``{c}`` alone for an empty line);
    languages with only block comments get one block whose closing marker is
    defused inside ``text``. Unknown languages use ``#``. The result ends with
    a newline; empty ``text`` gives just the path line.
    """
    lang = (language or "").lower()
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    block = _BLOCK_COMMENT.get(lang)
    if block is not None:
        start, end = block
        broken = end[0] + " " + end[1:]
        body = "".join(line.replace(end, broken) + "\n" for line in lines)
        return f"{start} Path: {path}\n{body}{end}\n"
    c = _LINE_COMMENT.get(lang, DEFAULT_LINE_COMMENT)
    out = [f"{c} Path: {path}\n"]
    for line in lines:
        out.append(f"{c} {line}\n" if line.strip() else f"{c}\n")
    return "".join(out)


# ---------------------------------------------------------------------------
# Windowing


def _split_lines(text: str) -> list[str]:
    """Lines of ``text`` split on "\\n" only, each keeping its "\\n"; the last
    element is the text after the last newline (possibly empty)."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + [parts[-1]]


def _count_tokens(tokenizer: Any, texts: Sequence[str]) -> list[int]:
    """Estimated token counts of ``texts`` (special tokens may or may not be
    parsed; it does not matter for a budget estimate). Uses the Rust backend
    directly when there is one, one text at a time: ``encode_batch``'s thread
    pool costs more than it saves on the few cores a laptop spares."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "encode"):
        return [len(backend.encode(t, add_special_tokens=False).ids) if t else 0 for t in texts]
    return [len(tokenizer(t, add_special_tokens=False)["input_ids"]) if t else 0 for t in texts]


def _offsets(tokenizer: Any, text: str) -> list[tuple[int, int]]:
    enc = tokenizer(
        text, add_special_tokens=False, split_special_tokens=True, return_offsets_mapping=True
    )
    return [(int(a), int(b)) for a, b in enc["offset_mapping"]]


_BATCH = 8  # chunks counted per tokenizer call


def _tail_fit(tokenizer: Any, lines: list[str], max_tokens: int, grain: int) -> int | None:
    """Where to cut so that lines[cut:] is estimated to fit in ``max_tokens``:
    the smallest multiple of ``grain`` that fits if one does (at most the
    index of the last line), else the smallest fitting line index after the
    last grid line, else None (not even the last line fits).

    Counts whole grid chunks (walking back from the end until the budget is
    spent, 1, 2, 4, then ``_BATCH`` chunks per tokenizer call), then single lines
    of the last chunk only when no grid line fits.
    """
    last = len(lines) - 1
    starts = list(range(0, last + 1, grain))
    total = 0
    best: int | None = None
    k = len(starts)
    batch = 1
    while k > 0:
        lo = max(0, k - batch)
        batch = min(2 * batch, _BATCH)
        texts = [
            "".join(lines[starts[j]: starts[j + 1] if j + 1 < len(starts) else len(lines)])
            for j in range(lo, k)
        ]
        counts = _count_tokens(tokenizer, texts)
        for j in range(k - 1, lo - 1, -1):
            total += counts[j - lo]
            if total > max_tokens:
                k = 0
                break
            best = starts[j]
        else:
            k = lo
    if best is not None:
        return best
    first = starts[-1]
    counts = _count_tokens(tokenizer, lines[first:])
    total = 0
    fine: int | None = None
    for j in range(last, first - 1, -1):
        total += counts[j - first]
        if total > max_tokens:
            break
        fine = j
    return fine


def _head_fit(tokenizer: Any, lines: list[str], max_tokens: int, grain: int) -> int:
    """The largest k such that lines[:k] is estimated to fit: whole chunks of
    ``grain`` lines first, then single lines of the chunk that overflows."""
    total = 0
    pos = 0
    batch = 1
    while pos < len(lines):
        bounds = [
            (a, min(len(lines), a + grain))
            for a in range(pos, min(len(lines), pos + grain * batch), grain)
        ]
        batch = min(2 * batch, _BATCH)
        counts = _count_tokens(tokenizer, ["".join(lines[a:b]) for a, b in bounds])
        for (a, b), n in zip(bounds, counts):
            if total + n > max_tokens:
                line_counts = _count_tokens(tokenizer, lines[a:b])
                for j, m in zip(range(a, b), line_counts):
                    if total + m > max_tokens:
                        return j
                    total += m
                return b
            total += n
        pos = bounds[-1][1]
    return len(lines)


def _effective_grain(grain_lines: int, max_tokens: int) -> int:
    """``grain_lines``, lowered for small budgets to ``max_tokens // 64`` (at
    least 1): with about 8 tokens a line, stability then costs at most about
    an eighth of the budget. Depends on the budget only, so it is as stable
    as the grid itself."""
    return max(1, min(grain_lines, max_tokens // 64))


def _window_prefix(
    prefix: str,
    tokenizer: Any,
    max_tokens: int,
    grain_lines: int,
    encode: Callable[[str], list[int]],
) -> tuple[str, list[int]]:
    """``window_prefix`` that also returns ``encode(text)`` (verified to fit)."""
    if max_tokens <= 0 or not prefix:
        return "", encode("")
    grain = _effective_grain(grain_lines, max_tokens)
    lines = _split_lines(prefix)
    last = len(lines) - 1
    cut = _tail_fit(tokenizer, lines, max_tokens, grain)
    if cut is not None:
        while cut <= last:
            text = "".join(lines[cut:])
            ids = encode(text)
            if len(ids) <= max_tokens:
                return text, ids
            nxt = -(-(cut + 1) // grain) * grain
            cut = nxt if nxt <= last else cut + 1
    # Not even the cursor line fits: keep the tail of it, cut inside the line.
    line = lines[last]
    offs = _offsets(tokenizer, line)
    k = max(0, len(offs) - max_tokens)
    while k <= len(offs):
        start = offs[k][0] if k < len(offs) else len(line)
        text = line[start:]
        ids = encode(text)
        if len(ids) <= max_tokens:
            return text, ids
        k += 1
    return "", encode("")


def window_prefix(
    prefix: str,
    tokenizer: PreTrainedTokenizerBase,
    max_tokens: int,
    *,
    grain_lines: int = 16,
) -> str:
    """The end of ``prefix`` that fits in ``max_tokens`` tokens.

    The cut is at a line start whose index (counted from the start of
    ``prefix``, which is the start of the file) is a multiple of
    ``grain_lines``: the earliest such line whose tail fits. Typing on the last
    line therefore keeps the cut where it is until the budget forces it one
    grain further (and the KV cache of the window stays valid). For small
    budgets the grain is lowered to ``max_tokens // 64`` lines (at least 1) so
    that stability costs at most about an eighth of the budget. If no grid
    line lies between the fitting line and the cursor line, the earliest
    fitting line is used (then a new line may move the cut); if not even the
    cursor line fits, the cut falls inside it, at a token boundary. The result
    is checked by tokenizing it whole: ``len(encode_text(result)) <=
    max_tokens``. Returns the whole prefix when it fits, "" when
    ``max_tokens <= 0``.
    """
    text, _ = _window_prefix(
        prefix, tokenizer, max_tokens, grain_lines, lambda t: encode_text(tokenizer, t)
    )
    return text


def _window_suffix(
    suffix: str,
    tokenizer: Any,
    max_tokens: int,
    encode: Callable[[str], list[int]],
) -> tuple[str, list[int]]:
    if max_tokens <= 0 or not suffix:
        return "", encode("")
    lines = _split_lines(suffix)
    if lines[-1] == "":
        lines.pop()
    k = _head_fit(tokenizer, lines, max_tokens, 16)
    while k > 0:
        text = "".join(lines[:k])
        ids = encode(text)
        if len(ids) <= max_tokens:
            return text, ids
        k -= 1
    # Not even the first line fits: cut inside it at a token boundary.
    line = lines[0]
    offs = _offsets(tokenizer, line)
    n = min(len(offs), max_tokens)
    while n > 0:
        text = line[: offs[n - 1][1]]
        ids = encode(text)
        if len(ids) <= max_tokens:
            return text, ids
        n -= 1
    return "", encode("")


def window_suffix(suffix: str, tokenizer: PreTrainedTokenizerBase, max_tokens: int) -> str:
    """The start of ``suffix`` that fits in ``max_tokens`` tokens, cut at a line
    end (the kept lines keep their newlines). If the first line alone does not
    fit, it is cut at a token boundary. ``len(encode_text(result)) <=
    max_tokens`` always holds."""
    text, _ = _window_suffix(suffix, tokenizer, max_tokens, lambda t: encode_text(tokenizer, t))
    return text


# ---------------------------------------------------------------------------
# What the window cut off: an outline of the enclosing scopes


_IMPORT = re.compile(r"^(import\s|from\s+\S+\s+import\s|#include\s|use\s|using\s|require\b|package\s)")
_DEF = re.compile(r"^\s*(?:async\s+)?(?:export\s+)?(?:pub(?:\(\w+\))?\s+)?"
                  r"(?:def|class|function|fn|func|struct|enum|interface|trait|type|impl)\s+(\w+)")
_IDENT = re.compile(r"[A-Za-z_]\w*")


def _indent_width(line: str) -> int:
    return len(line[: len(line) - len(line.lstrip(" \t"))].expandtabs(4))


def _statement_end(lines: list[str], i: int, max_lines: int = 6) -> int:
    """The index after the last line of the statement starting at line
    ``i``: continuation lines follow while a bracket is open or the line
    ends with a backslash (at most ``max_lines`` lines in all)."""
    depth = 0
    j = i
    while j < len(lines) and j - i < max_lines:
        text = lines[j].rstrip()
        for ch in text:
            if ch in "([{":
                depth += 1
            elif ch in ")]}" and depth > 0:
                depth -= 1
        j += 1
        if depth == 0 and not text.endswith("\\"):
            break
    return j


def scope_outline(prefix: str, n_cut: int, suffix: str, *, near_lines: int = 12) -> list[tuple[int, str]]:
    """Statements from the first ``n_cut`` characters of ``prefix`` (the part
    the window left out) worth showing the model, as ``(priority, text)`` in
    file order; lower numbers matter more:

    0. the headers of the scopes that enclose the cursor: walking up from the
       cursor line, each non-blank line indented less than every line below it
       (``class``/``def``/``if`` ...), with its continuation lines;
    1. the definitions (``def``/``class``/``function``/``fn``/... line and its
       continuation) of names used in the last ``near_lines`` lines of the
       prefix or the first lines of ``suffix``;
    2. top-level import statements.

    Pure; each returned text ends with a newline.
    """
    lines = _split_lines(prefix)
    cut_lines = len(_split_lines(prefix[:n_cut])) - 1  # lines wholly in the cut part
    if cut_lines <= 0:
        return []
    in_string = _string_lines(lines[:cut_lines])
    pri: dict[int, int] = {}
    cursor = lines[-1]
    limit = _indent_width(cursor) if cursor.strip() else len(cursor.expandtabs(4))
    for i in range(len(lines) - 2, -1, -1):
        if limit == 0:
            break
        line = lines[i]
        if line.strip() and _indent_width(line) < limit and not (i < cut_lines and i in in_string):
            limit = _indent_width(line)
            if i < cut_lines and _looks_like_header(line):
                pri[i] = 0
    near = "".join(lines[-near_lines:]) + "".join(_split_lines(suffix)[:near_lines // 2])
    names = set(_IDENT.findall(near))
    for i in range(cut_lines):
        line = lines[i]
        if i in in_string:
            continue
        m = _DEF.match(line)
        if m and m.group(1) in names:
            pri.setdefault(i, 1)
        elif _IMPORT.match(line):
            pri.setdefault(i, 2)
    out: list[tuple[int, str]] = []
    covered = -1
    for i in sorted(pri):
        if i < covered:
            continue
        covered = min(_statement_end(lines, i), cut_lines)
        text = "".join(lines[i:covered])
        out.append((pri[i], text if text.endswith("\n") else text + "\n"))
    # a name defined several times (nested helpers): the last definition only
    last = {text: k for k, (_, text) in enumerate(out)}
    return [item for k, item in enumerate(out) if last[item[1]] == k]


_HEADER_WORDS = ("if", "elif", "else", "for", "while", "with", "try", "except", "finally", "match", "case",
                 "switch", "do", "loop", "unsafe", "impl", "namespace", "module", "async", "export", "public",
                 "private", "protected", "static")


def _looks_like_header(line: str) -> bool:
    """A line that opens a scope: a definition, a control keyword, or a line
    ending with ``:`` or ``{`` (a comment after it aside)."""
    stripped = line.strip()
    if _DEF.match(line):
        return True
    word = _IDENT.match(stripped)
    if word and word.group(0) in _HEADER_WORDS:
        return True
    code = stripped.split(" #", 1)[0].split(" //", 1)[0].rstrip()
    return code.endswith((":", "{"))


def _string_lines(lines: list[str]) -> set[int]:
    """Indices of lines inside (or opening or closing) a triple-quoted
    string, by counting the quotes: a cheap guard against taking a
    docstring's text for code."""
    out: set[int] = set()
    quote: str | None = None
    for i, line in enumerate(lines):
        pos = 0
        touched = quote is not None
        while True:
            if quote is None:
                hits = [(line.find(q, pos), q) for q in ('"""', "'''")]
                hits = [(k, q) for k, q in hits if k >= 0]
                if not hits:
                    break
                k, quote = min(hits)
                touched = True
                pos = k + 3
            else:
                k = line.find(quote, pos)
                if k < 0:
                    break
                quote = None
                pos = k + 3
        if touched:
            out.add(i)
    return out


def _fit_outline(tokenizer: Any, items: list[tuple[int, str]], max_tokens: int) -> str:
    """The outline lines that fit ``max_tokens``, the most important first,
    shown in file order."""
    if max_tokens <= 0 or not items:
        return ""
    counts = _count_tokens(tokenizer, [line for _, line in items])
    keep: set[int] = set()
    total = 0
    for k in sorted(range(len(items)), key=lambda k: (items[k][0], -k)):
        if total + counts[k] <= max_tokens:
            keep.add(k)
            total += counts[k]
    return "".join(items[k][1] for k in sorted(keep))


# ---------------------------------------------------------------------------
# The whole thing


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
    drop it (:mod:`soldaemon.runtime.healing`): the token is ASCII (every
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


class WindowMemo:
    """The last few prefix and suffix windows :func:`make_prompt` computed,
    by their inputs (the text, the budget, the tokenizer): an object the
    caller owns (an engine keeps one), never module state. At most
    ``size`` entries, least recently used dropped."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._entries: dict[tuple[Any, ...], tuple[str, tuple[int, ...]]] = {}
        self.hits = 0

    def get(self, key: tuple[Any, ...]) -> tuple[str, list[int]] | None:
        found = self._entries.pop(key, None)
        if found is None:
            return None
        self._entries[key] = found
        self.hits += 1
        return found[0], list(found[1])

    def put(self, key: tuple[Any, ...], text: str, ids: Sequence[int]) -> None:
        self._entries.pop(key, None)
        self._entries[key] = (text, tuple(ids))
        while len(self._entries) > self.size:
            self._entries.pop(next(iter(self._entries)))


def _memoized(memo: WindowMemo | None, key: tuple[Any, ...],
              compute: Callable[[], tuple[str, list[int]]]) -> tuple[str, list[int]]:
    if memo is None:
        return compute()
    found = memo.get(key)
    if found is not None:
        return found
    text, ids = compute()
    memo.put(key, text, ids)
    return text, list(ids)


def lead_reserve(max_prefix_tokens: int) -> int:
    """The most tokens a lead (:func:`make_prompt`'s ``lead_from``) may
    take, on top of the prefix window: a quarter of ``max_prefix_tokens``,
    between 16 and 192."""
    return max(16, min(192, max_prefix_tokens // 4))


def line_anchor(prefix: str) -> int:
    """Where a lead on the cursor line starts: after the line's indentation
    (``len(prefix)`` when the line so far is blank). Measured on the
    embedded model, a middle that starts with indentation derails it
    (docs/quality.md); the indentation stays in front of the middle token,
    where the model was trained to see it."""
    start = prefix.rfind("\n") + 1
    line = prefix[start:]
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
    ``max_outline_tokens`` and what ``max_context_tokens`` has left after
    the chunks: the model then knows which class and function it is in even
    when their first lines are far above (measured in docs/quality.md).

    ``heal``: token healing (:mod:`soldaemon.runtime.healing`) -- when the
    cursor is after text on its line, the prefix's last token is left out
    of ``ids`` and its text returned as ``FimPrompt.heal``; the generation
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

    ctx_budget = max(0, max_context_tokens)
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
    head, lead, lead_ids = _split_lead(prefix, lead_from, max_prefix_tokens, enc_plain)
    head_key = ("prefix", id(tokenizer), head, max_prefix_tokens, grain_lines, bool(header_ids))
    head_text, prefix_ids = _memoized(memo, head_key, lambda: _window_prefix(
        head, tokenizer, max_prefix_tokens, grain_lines, enc_prefix))
    prefix_text = head_text + lead
    suffix_text, suffix_ids = _memoized(memo, ("suffix", id(tokenizer), suffix, max_suffix_tokens),
                                        lambda: _window_suffix(suffix, tokenizer, max_suffix_tokens, enc_plain))
    cut = head[: len(head) - len(head_text)]
    n_window = len(prefix_ids)
    outline_budget = min(max_outline_tokens, ctx_budget)
    if outline_budget > 0 and cut.strip():
        outline = _fit_outline(tokenizer, scope_outline(prefix, len(cut), suffix_text), outline_budget)
        if outline:
            with_outline = enc_prefix(outline + head_text)
            if len(with_outline) <= len(prefix_ids) + outline_budget:  # (estimates can be off by a token)
                prefix_ids = with_outline
    healed = ""
    if heal and not template.dummy_prefix:
        healed = heal_token(tokenizer, lead_ids or prefix_ids, prefix_text, blank=bool(lead_ids))
    if healed and lead_ids:
        lead_ids = lead_ids[:-1]
    elif healed:
        prefix_ids = prefix_ids[:-1]
        n_window -= 1
    n_window += len(lead_ids)

    if repo and (chunks or repo_name is not None):
        ids = build_prompt(
            template, prefix_ids, suffix_ids, chunks,
            current_path=current_path, repo_name=repo_name, tokenizer=tokenizer, order=order, lead_ids=lead_ids,
        )
    elif repo:
        # The file's own path alone, without other files, is left out: measured
        # on the embedded model, ``<|file_sep|>path`` in front of a lone file
        # turned right answers wrong (docs/quality.md).
        ids = build_prompt(template, prefix_ids, suffix_ids, order=order, lead_ids=lead_ids)
    else:
        ids = build_prompt(template, header_ids + prefix_ids, suffix_ids, order=order, lead_ids=lead_ids)
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
