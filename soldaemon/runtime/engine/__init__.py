"""The local engine: :mod:`.local` (the Engine the server calls), :mod:`.part` (the model part
the pipeline drives; it owns the generation lock and the sessions), :mod:`.foresight` (warm and
speculative FIM), :mod:`.autoselect` (``model.name``/``model.draft: auto`` at start-up)."""
