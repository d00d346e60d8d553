"""The token layout of a FIM prompt per family and their encoding quirks around the FIM tokens.
Context goes after file separators (``([file_sep]path\\ncode)*``: Qwen2.5-Coder,
and StarCoder2, whose own path follows ``<fim_prefix>``), else as comment headers before the prefix.
CodeLlama follows Meta's ``infilling_prompt_tokens``: ``" " + prefix``, no ``▁`` before the suffix.
SPM (llama.cpp's ``spm_infill``) puts the suffix first, so typing only appends."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

from soldaemon.fim.encoding import encode_text
from soldaemon.fim.templates import FimOrder, FimTemplate

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def _encode_no_dummy(template: FimTemplate, tokenizer: Any, text: str) -> list[int]:
    """:func:`encode_text` without a SentencePiece tokenizer's dummy-prefix marker."""
    if not template.dummy_prefix or not text:
        return encode_text(tokenizer, text)
    sentinel = encode_text(tokenizer, "\n")
    ids = encode_text(tokenizer, "\n" + text)
    if sentinel and ids[: len(sentinel)] == sentinel:
        return ids[len(sentinel):]
    return encode_text(tokenizer, text)


def encoders(template: FimTemplate, tokenizer: Any) -> tuple[Callable[[str], list[int]], Callable[[str], list[int]]]:
    """The encoders for the first text after the PRE token and for text that follows other tokens
    (suffix, later pieces): two distinct functions."""
    if template.family == "codellama":
        return (lambda text: _encode_no_dummy(template, tokenizer, " " + text),
                lambda text: _encode_no_dummy(template, tokenizer, text))
    return lambda text: encode_text(tokenizer, text), lambda text: encode_text(tokenizer, text)


def build_prompt(
    template: FimTemplate,
    prefix_ids: Sequence[int],
    suffix_ids: Sequence[int],
    context: Sequence[tuple[str, Sequence[int]]] | None = None,
    *,
    current_path: str | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    order: FimOrder = "psm",
    lead_ids: Sequence[int] = (),
) -> list[int]:
    """The prompt ids in ``order`` from encoded parts. ``context``: ``[(path, code_ids)]`` after
    file separators where the family has them (then ``tokenizer`` is required, else ValueError),
    else code ids (comment headers) before the prefix. ``lead_ids``: the middle's typed start."""
    ids: list[int] = []
    if template.bos_id is not None:
        ids.append(template.bos_id)
    chunks = list(context or ())
    repo_level = template.file_sep_id is not None and (bool(chunks) or current_path is not None)
    if not repo_level:
        head = [t for _, code in chunks for t in code]
        ids.extend(_fim_body(template, head, prefix_ids, suffix_ids, order, lead_ids))
        return ids

    if tokenizer is None:
        raise ValueError("build_prompt: repository context needs the tokenizer to encode paths")
    sep = template.file_sep_id
    assert sep is not None
    qwen = template.family == "qwen2.5-coder"
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
    """PSM: ``PRE head prefix SUF suffix MID lead``; SPM: ``SUF suffix PRE
    head prefix lead MID``."""
    if order == "spm":
        return [template.suffix_id, *suffix_ids, template.prefix_id, *head, *prefix_ids, *lead_ids,
                template.middle_id]
    if order != "psm":
        raise ValueError(f"FIM order must be 'psm' or 'spm', not {order!r}")
    return [template.prefix_id, *head, *prefix_ids, template.suffix_id, *suffix_ids, template.middle_id,
            *lead_ids]
