"""``ToolEffect``: whether a tool only reads the journal or changes it.

Its own module, importing nothing, so that the call's pure core
(``call/protocol.py``, which imports no trio) and the tool registry
below it share one type.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["READ", "WRITE", "ToolEffect", "tool_effect"]


class ToolEffect(StrEnum):
    """A write runs exactly once (the write log); a read may run again, so
    its arguments are recorded. A member is its string (the record's
    ``effect`` field is the same bytes)."""

    READ = "read"
    WRITE = "write"


READ, WRITE = ToolEffect.READ, ToolEffect.WRITE
_EFFECTS = {effect.value: effect for effect in ToolEffect}


def tool_effect(value: object) -> ToolEffect | None:
    """The effect a record line's (or the shared mirror's) ``effect`` field
    names; None for anything else (an MCP source's tool: not ours to know)."""
    return _EFFECTS.get(value) if isinstance(value, str) else None
