"""Client events as the simulator receives them: the SDK's client-event union
(as a real discriminated union, ``realtime.events.EventUnion``), validated
the way the service validates what a client sends.

The product never parses client events (it only builds them), so this lives
with the simulator; tests use ``validate_client_event`` to check what our
server sent.
"""

from __future__ import annotations

from typing import Any

from openai.types.realtime import RealtimeClientEvent
from pydantic import BaseModel

from voiceactors.realtime.events import EventUnion, decode_frame, error_summary

__all__ = ["CLIENT_EVENTS", "validate_client_event", "parse_client_event"]

CLIENT_EVENTS = EventUnion.build("client", RealtimeClientEvent)


def validate_client_event(event: dict[str, Any]) -> BaseModel:
    """Validate a decoded client event. Raises ``ValueError`` (or
    ``pydantic.ValidationError``, a subclass) when it is not a valid client event."""
    return CLIENT_EVENTS.validate(event)


def parse_client_event(raw: str | bytes) -> tuple[BaseModel | None, str | None]:
    """Parse a client event received by the simulator: ``(model, None)`` or
    ``(None, message)`` where message is fit for an ``error`` event."""
    obj, reason = decode_frame(raw)
    if reason is not None:
        return None, f"Invalid event: {reason}"
    try:
        return CLIENT_EVENTS.validate(obj), None
    except Exception as exc:
        return None, f"Invalid event: {error_summary(exc)}"
