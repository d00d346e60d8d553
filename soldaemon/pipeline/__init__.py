"""The completion pipeline shared by every engine.

:mod:`.completion` runs the stages (:class:`Pipeline`) over an engine's
model part, with type-through and the streamed preview; :mod:`.prompt` is
the prompt stage. The names below stay
importable from ``soldaemon.pipeline`` (its path before it was a package).
"""

from __future__ import annotations

from ..protocol import validate_request
from .completion import (
    HOLD_BACK,
    MAX_SHOWN,
    Clock,
    Early,
    Generation,
    ModelPart,
    Pipeline,
    Previewer,
    Shown,
    preview,
    prompt_inputs,
    remember,
    type_through,
    type_through_events,
)
from .prompt import (
    MAX_ANCHORS,
    MAX_LEAD_CHARS,
    MAX_LEAD_LINES,
    LeadAnchors,
    build_fim_prompt,
    context_selector,
    lead_from,
    path_of,
)

__all__ = [
    "HOLD_BACK", "MAX_ANCHORS", "MAX_LEAD_CHARS", "MAX_LEAD_LINES", "MAX_SHOWN", "Clock", "Early", "Generation",
    "LeadAnchors", "ModelPart", "Pipeline", "Previewer", "Shown", "build_fim_prompt", "context_selector",
    "lead_from", "path_of", "preview", "prompt_inputs", "remember", "type_through", "type_through_events",
    "validate_request",
]
