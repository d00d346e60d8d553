"""Incremental detokenization of a generation, and the stop check over it."""

from __future__ import annotations

from typing import Any, Callable

from soldaemon.pipeline.candidates import generated_text
from soldaemon.pipeline.syntax import opens_without_body
from soldaemon.pipeline.stopcheck import StopChecker


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


def stopper(checker: StopChecker, decode: Detok) -> Callable[[list[int]], bool]:
    return lambda tokens: checker.check(decode.text(tokens))


def end_holder(prefix: str, suffix: str, decode: Detok) -> Callable[[list[int]], bool]:
    """``completion.hold_end``: whether the text of ``tokens`` ends on a
    block opener whose body ``suffix`` does not hold (then the model's end
    token is refused; generate.refuse_end)."""
    return lambda tokens: opens_without_body(prefix, decode.text(tokens), suffix)
