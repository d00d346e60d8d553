"""Decoding: the generation loop with verification of drafts
(:mod:`.generate`), drafting (:mod:`.draft`), sampling, token healing and
incremental detokenizing."""
