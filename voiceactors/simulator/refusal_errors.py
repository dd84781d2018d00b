"""What the service answers when it refuses a client event: the ``error``
event's shape per code (``docs/simulator.md`` § Refusals).

A refusal is armed by a scenario's ``refuse`` step or by
``Simulator.refuse_next``; the next client events it matches are answered
with an ``error`` naming their ``event_id`` and are not applied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ErrorShape", "KNOWN_CODES", "Refusal", "SESSION_EXPIRED", "ANY_EVENT", "OUTPUT_EVENT", "error_body"]

#: the matcher of every client event
ANY_EVENT = "any"
#: the matcher of a ``conversation.item.create`` whose item is a ``function_call_output``
OUTPUT_EVENT = "function_call_output"
SESSION_EXPIRED = "session_expired"


@dataclass(frozen=True)
class ErrorShape:
    """An error's ``type`` and ``message`` (``{response_id}``, ``{call_id}`` and
    ``{code}`` are filled in) and ``param``."""

    type: str
    message: str
    param: str | None = None


#: The codes the service is known to send in reply to a client event, as it
#: shapes them. Any other code gets ``UNKNOWN_CODE``'s shape.
KNOWN_CODES: dict[str, ErrorShape] = {
    "conversation_already_has_active_response": ErrorShape(
        "invalid_request_error",
        "Conversation already has an active response in progress: {response_id}. "
        "Wait until the response is finished before creating a new one."),
    "invalid_tool_call_id": ErrorShape(
        "invalid_request_error", "Tool call ID '{call_id}' not found in conversation.", "item.call_id"),
    SESSION_EXPIRED: ErrorShape("invalid_request_error", "Your session hit the maximum duration of 60 minutes."),
    # seen in a failed response's status_details; the REST API's 429 says rate_limit_exceeded
    "inference_rate_limit_exceeded": ErrorShape(
        "invalid_request_error", "Too many requests are being processed right now; try again later."),
    "rate_limit_exceeded": ErrorShape("invalid_request_error", "Rate limit reached; try again later."),
}
UNKNOWN_CODE = ErrorShape("invalid_request_error", "The request could not be completed ({code}).")


@dataclass
class Refusal:
    """An armed refusal: the next ``times`` client events ``event`` matches
    get an ``error`` with ``code``. ``type``/``message`` override the code's
    shape; ``echo_event_id`` False leaves the error's ``event_id`` null."""

    event: str
    code: str
    times: int = 1
    type: str | None = None
    message: str | None = None
    echo_event_id: bool = True

    @classmethod
    def from_step(cls, spec: dict[str, Any]) -> "Refusal":
        return cls(spec.get("event", ANY_EVENT), spec["code"], int(spec.get("times", 1)), spec.get("type"),
                   spec.get("message"), bool(spec.get("event_id", True)))

    def matches(self, event: dict[str, Any]) -> bool:
        if self.event == ANY_EVENT:
            return True
        if self.event == OUTPUT_EVENT:
            item = event.get("item")
            return (event.get("type") == "conversation.item.create" and isinstance(item, dict)
                    and item.get("type") == OUTPUT_EVENT)
        return event.get("type") == self.event


def error_body(code: str, *, event_id: str | None, response_id: str | None = None, call_id: str | None = None,
               type_: str | None = None, message: str | None = None) -> dict[str, Any]:
    """The ``error`` object of an ``error`` event refusing with ``code``."""
    shape = KNOWN_CODES.get(code, UNKNOWN_CODE)
    text = message if message is not None else shape.message.format(
        response_id=response_id or "", call_id=call_id or "", code=code)
    return {"type": type_ or shape.type, "code": code, "message": text, "param": shape.param,
            "event_id": event_id}
