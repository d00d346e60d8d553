"""The local engine: :mod:`.local` (:class:`LocalEngine`, the Engine the
server calls: builds the model, its sessions, drafts and memory scheduler),
:mod:`.part` (the model part the pipeline drives; it owns the generation
lock, the session access, the parked run and the foreseen answer),
:mod:`.foresight` (warm and speculative FIM: the decision and the work),
:mod:`.autoselect` (``model.name: auto``/``model.draft: auto`` at start-up)."""
