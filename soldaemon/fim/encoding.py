"""User text to token ids, with no control token recognised inside it."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def _control_tokens(tokenizer: Any) -> list[tuple[str, int]]:
    """(content, id) of the added tokens flagged special or spelled like a
    control token (``<...>``, ``▁<...>``)."""
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
    """Token ids of ``text`` as plain text: no bos/eos, no control token. ``split_special_tokens``
    misses added tokens without the special flag, so a control token's id that comes out anyway
    makes the text re-encoded in pieces split inside each occurrence."""
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
    # a cut one character into every occurrence, overlapping ones too
    cuts = {m.start() + 1 for content, _ in present for m in re.finditer(f"(?={re.escape(content)})", text)}
    bounds = [0, *sorted(cuts), len(text)]
    out: list[int] = []
    for a, b in zip(bounds, bounds[1:]):
        if a < b:
            piece = tokenizer(text[a:b], add_special_tokens=False, split_special_tokens=True)
            out.extend(int(i) for i in piece["input_ids"])
    return out


def adds_dummy_prefix(tokenizer: Any) -> bool:
    """True when encoding "a" yields a first token starting with "▁"."""
    try:
        ids = encode_text(tokenizer, "a")
        toks = tokenizer.convert_ids_to_tokens(ids[:1])
    except Exception:  # a tokenizer we cannot probe: assume plain BPE
        return False
    return bool(toks) and isinstance(toks[0], str) and toks[0].startswith("▁")
