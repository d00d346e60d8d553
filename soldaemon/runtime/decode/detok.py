"""Incremental detokenization of a generation."""

from __future__ import annotations

from typing import Any

from soldaemon.fim.encoding import generated_text


class Detok:
    """Incremental detokenization that never splits a UTF-8 character: text
    ending in U+FFFD (an incomplete byte sequence) is held back."""

    def __init__(self, tokenizer: Any, skip: str = "") -> None:
        self.tokenizer = tokenizer
        self.skip = skip             # token healing: the prompt text the generation starts by re-writing
        self.tokens: list[int] = []
        self.current = ""

    def text(self, tokens: list[int]) -> str:
        return generated_text(self.tokenizer, tokens, self.skip)

    def push(self, tokens: list[int]) -> None:
        self.tokens.extend(tokens)
        text = self.text(self.tokens)
        if text.endswith("\ufffd"):
            text = text.rstrip("\ufffd")
        self.current = text
