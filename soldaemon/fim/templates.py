"""FIM control tokens per model family, found from a tokenizer's vocabulary."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Sequence

from soldaemon.errors import NoFimTokens

from soldaemon.fim.encoding import adds_dummy_prefix

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Family = Literal["qwen2.5-coder", "starcoder2", "deepseek-coder", "codellama"]
FimOrder = Literal["psm", "spm"]


@dataclass(frozen=True)
class FimTemplate:
    """The FIM control tokens of one tokenizer."""

    family: Family
    prefix_id: int
    suffix_id: int
    middle_id: int
    stop_ids: frozenset[int]              # the family's end tokens and eos: sampled, never shown
    file_sep_id: int | None = None        # repository-level context (Qwen2.5-Coder, StarCoder2)
    bos_id: int | None = None             # families that want a bos (DeepSeek-Coder, CodeLlama)
    dummy_prefix: bool = False            # encoding puts SentencePiece's ``▁`` in front of every text

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
    stops: tuple[str, ...]
    file_sep: tuple[str, ...] = ()
    wants_bos: bool = False


_FAMILIES: tuple[_FamilySpec, ...] = (
    _FamilySpec(
        family="qwen2.5-coder",
        prefix=("<|fim_prefix|>",),
        suffix=("<|fim_suffix|>",),
        middle=("<|fim_middle|>",),
        file_sep=("<|file_sep|>",),
        stops=(
            "<|endoftext|>", "<|im_end|>", "<|fim_pad|>", "<|file_sep|>",
            "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>",
        ),
    ),
    _FamilySpec(
        family="starcoder2",
        prefix=("<fim_prefix>",),
        suffix=("<fim_suffix>",),
        middle=("<fim_middle>",),
        file_sep=("<file_sep>",),
        stops=(
            "<|endoftext|>", "<file_sep>", "<fim_prefix>", "<fim_suffix>",
            "<fim_middle>", "<fim_pad>",
        ),
    ),
    _FamilySpec(
        family="deepseek-coder",
        prefix=("<｜fim▁begin｜>",),
        suffix=("<｜fim▁hole｜>",),
        middle=("<｜fim▁end｜>",),
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


def detect_template(tokenizer: PreTrainedTokenizerBase) -> FimTemplate:
    """The first supported family whose prefix, suffix and middle tokens are all in the vocabulary;
    raises :class:`~soldaemon.errors.NoFimTokens` when none is."""
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
        return FimTemplate(
            family=spec.family,
            prefix_id=pre,
            suffix_id=suf,
            middle_id=mid,
            stop_ids=frozenset(int(s) for s in stops),
            file_sep_id=_lookup(vocab, spec.file_sep),
            bos_id=int(bos) if isinstance(bos, int) else None,
            dummy_prefix=adds_dummy_prefix(tokenizer),
        )
    name = str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)
    raise NoFimTokens(
        f"{name}: the tokenizer has no fill-in-the-middle tokens, so this model "
        "cannot complete code between a prefix and a suffix. Supported families: "
        "Qwen2.5-Coder (<|fim_prefix|>), StarCoder2 (<fim_prefix>), "
        "DeepSeek-Coder (<｜fim▁begin｜>), CodeLlama (<PRE>). An instruct- or "
        "chat-only model without these tokens cannot fill in the middle.",
        hint="use a base or FIM-trained code model of a supported family "
        "(the default embedded Qwen2.5-Coder model works)",
    )
