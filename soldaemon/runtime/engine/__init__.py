"""The local engine: :mod:`.local` (:class:`LocalEngine`, the Engine the
server calls), :mod:`.part` (the model part the pipeline drives: KV sessions,
parked runs), :mod:`.foresight` (speculative FIM), :mod:`.autoselect`
(``model.name: auto``/``model.draft: auto`` at start-up)."""
