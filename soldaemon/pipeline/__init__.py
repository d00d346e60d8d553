"""The completion pipeline shared by every engine: :mod:`.completion` runs the stages
(:class:`Pipeline`) with type-through and the streamed preview; :mod:`.prompt` is the prompt stage.
"""
