"""The token layout of a FIM prompt per family (PSM or SPM, repository
context); the family's quirks of encoding the text around the FIM tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

from soldaemon.fim.encoding import encode_text
from soldaemon.fim.templates import FimOrder, FimTemplate

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


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


def prefix_encoder(template: FimTemplate, tokenizer: Any) -> Callable[[str], list[int]]:
    """The encoder for the first text after the PRE token."""
    if template.family == "codellama":
        return lambda text: _encode_no_dummy(template, tokenizer, " " + text)
    return lambda text: encode_text(tokenizer, text)


def plain_encoder(template: FimTemplate, tokenizer: Any) -> Callable[[str], list[int]]:
    """The encoder for text that follows other tokens (suffix, later pieces)."""
    if template.family == "codellama":
        return lambda text: _encode_no_dummy(template, tokenizer, text)
    return lambda text: encode_text(tokenizer, text)


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
