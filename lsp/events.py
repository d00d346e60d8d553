"""Editor events about a shown completion, as the daemon counts them, under the ``sol/`` names
and Copilot's (docs/editors.md lists them); an item is recognised by the ``sol.accepted``
command on it. Pure: no I/O."""

from __future__ import annotations

from typing import Any

from soldaemon.protocol import CompletionEvent

ACCEPT_COMMAND = "sol.accepted"

# notification → the daemon's event kind
NOTIFICATIONS: dict[str, str] = {
    "sol/didShowCompletion": "shown",
    "textDocument/didShowCompletion": "shown",
    "sol/didPartiallyAcceptCompletion": "partial",
    "textDocument/didPartiallyAcceptCompletion": "partial",
    "sol/didRejectCompletion": "rejected",
}
MAX_ITEM_INDEX = 7          # the protocol's max_n - 1


def plain(value: Any) -> Any:
    """``value`` with pygls' namedtuples turned into plain dicts and lists."""
    if hasattr(value, "_asdict"):
        return {k: plain(v) for k, v in value._asdict().items()}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def event_target(params: Any) -> tuple[str, int, int | None] | None:
    """``(request id, item index, accepted length)`` from ``{"item": <item with our command>}``
    or ``{"id", "index"}``, else None; the length excludes the line before the cursor."""
    data = plain(params)
    if not isinstance(data, dict):
        return None
    accepted = data.get("acceptedLength", data.get("accepted_length"))
    accepted = accepted if isinstance(accepted, int) and not isinstance(accepted, bool) and accepted >= 0 else None
    rid: Any = data.get("id")
    index: Any = data.get("index", 0)
    item = data.get("item")
    if isinstance(item, dict):
        command = item.get("command")
        args = command.get("arguments") if isinstance(command, dict) else None
        if isinstance(args, list) and len(args) >= 2:
            rid, index = args[0], args[1]
            before = args[2] if len(args) >= 3 else 0
            if accepted is not None and isinstance(before, int) and not isinstance(before, bool) and before > 0:
                accepted = max(0, accepted - before)     # counted from the range start: the line prefix off
    if not isinstance(rid, str) or not rid or isinstance(index, bool) or not isinstance(index, int) \
            or not 0 <= index <= MAX_ITEM_INDEX:
        return None
    return rid, index, accepted


def to_event(kind: str, params: Any) -> CompletionEvent | None:
    """The daemon's ``event`` frame, or None when ``params`` name no item of ours."""
    target = event_target(params)
    if target is None:
        return None
    rid, index, accepted = target
    return CompletionEvent(rid, kind, index, accepted if kind == "partial" else None)  # type: ignore[arg-type]
