"""Decoding: the generation loop with draft verification (:mod:`.generate`), the draft model
(:mod:`.draft`), sampling and token healing (:mod:`.sampling`), second choices (:mod:`.second`)."""
