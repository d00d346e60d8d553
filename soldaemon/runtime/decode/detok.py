"""Incremental detokenization of a generation."""

from __future__ import annotations

from typing import Any, Callable, Sequence


def generated_text(tokenizer: Any, ids: Sequence[int], heal: str) -> str:
    """The text of generated tokens as the answer has it: with token
    healing, without the prompt text they re-write (``heal``; "" until they
    are past it)."""
    whole = tokenizer.decode(list(ids), skip_special_tokens=True)
    if heal:
        return whole[len(heal):] if whole.startswith(heal) else ""
    return whole


class Detok:
    """Incremental detokenization that never splits a UTF-8 character: text
    ending in U+FFFD (an incomplete byte sequence) is held back."""

    def __init__(self, tokenizer: Any, skip: str = "") -> None:
        self.tokenizer = tokenizer
        self.skip = skip             # token healing: the prompt text the generation starts by re-writing
        self.tokens: list[int] = []
        self.current = ""

    def text(self, tokens: Sequence[int]) -> str:
        return generated_text(self.tokenizer, tokens, self.skip)

    def push(self, tokens: list[int]) -> None:
        self.tokens.extend(tokens)
        text = self.text(self.tokens)
        if text.endswith("\ufffd"):
            text = text.rstrip("\ufffd")
        self.current = text

    def stopper(self, may_stop: Callable[[str], bool]) -> Callable[[list[int]], bool]:
        """The decode loop's ``should_stop``: ``may_stop`` over the text of
        the tokens generated so far (asked again about the same tokens, as
        the loop does before drafting and after the step, it answers as
        before without asking ``may_stop``: the same text gets the same
        answer)."""
        last: list[tuple[list[int], bool]] = []

        def should_stop(tokens: list[int]) -> bool:
            if last and last[0][0] == tokens:
                return last[0][1]
            answer = may_stop(self.text(tokens))
            last[:] = [(list(tokens), answer)]
            return answer

        return should_stop
