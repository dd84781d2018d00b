"""A Live session's events as the service sends them, held to the SDK's types.

Builders of the Live server events the simulator's Live sessions send (and
the protocol tests play): a delegation, the delegated Responses model's
stream nested in ``response.event``s, the transcript fragments, usage, the
close, errors. Every one is checked, strictly and as JSON, against the SDK's
unions (``openai.types.live.ConnectServerEvent``; a nested event against
``openai.types.responses.ResponseStreamEvent``), and so is every client event
a Live sideband is sent (``ConnectClientEvent``): ``live_server_error`` /
``live_client_error`` say why one does not conform (None when it does), with
the checks of ``conformance.py``. Not the product: the product's client
events are built in ``voiceactors/live/translate.py``.
"""

from __future__ import annotations

import itertools
from typing import Any

from openai.types.live import ConnectClientEvent, ConnectServerEvent
from openai.types.responses import ResponseStreamEvent

from voiceactors.realtime.events import EventUnion
from voiceactors.simulator.conformance import conformance_error

__all__ = ["LIVE_CLIENT_EVENTS", "LIVE_SERVER_EVENTS", "RESPONSES_EVENTS", "LIVE_MODEL", "RESPONSES_MODEL",
           "commentary_appended", "delegation_created", "error_event", "function_call_item", "input_delta",
           "live_client_error", "live_server_error", "nested", "output_delta", "response_created",
           "response_ended", "arguments_done", "item_added", "item_done", "responses_error", "session_closed",
           "session_resource", "usage_updated"]

LIVE_SERVER_EVENTS = EventUnion.build("live server", ConnectServerEvent)
LIVE_CLIENT_EVENTS = EventUnion.build("live client", ConnectClientEvent)
RESPONSES_EVENTS = EventUnion.build("responses stream", ResponseStreamEvent)

LIVE_MODEL = "gpt-live-1"
RESPONSES_MODEL = "gpt-5.4-mini"

_ids = itertools.count(1)


def _event_id() -> str:
    return f"event_sim_{next(_ids)}"


def live_server_error(event: dict[str, Any]) -> str | None:
    """Why a Live server event does not conform (its nested Responses
    event too), or None."""
    reason, _ = conformance_error(LIVE_SERVER_EVENTS, event)
    if reason is None and event.get("type") == "response.event":
        reason, _ = conformance_error(RESPONSES_EVENTS, event.get("event"))
        if reason is not None:
            reason = f"nested {event['event'].get('type')!r}: {reason}"
    return reason


def live_client_error(event: dict[str, Any]) -> str | None:
    """Why a Live client event (one a sideband sends) does not conform, or None."""
    reason, _ = conformance_error(LIVE_CLIENT_EVENTS, event)
    return reason


# ------------------------------------------------------------ the session

def session_resource(session_id: str, *, instructions: str | None = None, expires_at: int = 0) -> dict[str, Any]:
    resource: dict[str, Any] = {"id": session_id, "expires_at": expires_at, "model": LIVE_MODEL, "status": "active"}
    if instructions is not None:
        resource["instructions"] = instructions
    return resource


def usage_updated(seconds: float) -> dict[str, Any]:
    return {"type": "session.usage.updated", "event_id": _event_id(), "usage": {"seconds": seconds}}


def session_closed(session_id: str, reason: str, seconds: float) -> dict[str, Any]:
    return {"type": "session.closed", "event_id": _event_id(), "reason": reason,
            "session": session_resource(session_id), "usage": {"seconds": seconds}}


def error_event(code: str, message: str, *, client_event_id: str | None = None,
          error_type: str = "invalid_request_error") -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": message, "type": error_type}
    if client_event_id is not None:
        body["client_event_id"] = client_event_id
    return {"type": "error", "event_id": _event_id(), "error": body}


def commentary_appended(client_event_id: str | None, at_ms: int) -> dict[str, Any]:
    event: dict[str, Any] = {"type": "session.commentary.appended", "event_id": _event_id(),
                             "start_ms": at_ms, "end_ms": at_ms}
    if client_event_id is not None:
        event["client_event_id"] = client_event_id
    return event


def input_delta(text: str, start_ms: int, end_ms: int | None = None) -> dict[str, Any]:
    return {"type": "session.input_transcript.delta", "event_id": _event_id(), "delta": text,
            "start_ms": start_ms, "end_ms": end_ms if end_ms is not None else start_ms + 300}


def output_delta(text: str, start_ms: int, end_ms: int | None = None) -> dict[str, Any]:
    return {"type": "session.output_transcript.delta", "event_id": _event_id(), "delta": text,
            "start_ms": start_ms, "end_ms": end_ms if end_ms is not None else start_ms + 300}


# ------------------------------------------------------------ delegation

def delegation_created(delegation_id: str, offset_ms: int, response_id: str | None = None) -> dict[str, Any]:
    delegation: dict[str, Any] = {"id": delegation_id, "target": "responses", "type": "delegation"}
    if response_id is not None:
        delegation["response_id"] = response_id
    return {"type": "session.delegation.created", "event_id": _event_id(), "delegation": delegation,
            "offset_ms": offset_ms}


def nested(delegation_id: str | None, event: dict[str, Any]) -> dict[str, Any]:
    """A Responses streaming event as the Live sideband carries it."""
    wrapped: dict[str, Any] = {"type": "response.event", "event_id": _event_id(), "event": event}
    if delegation_id is not None:
        wrapped["delegation_id"] = delegation_id
    return wrapped


def _response(response_id: str, status: str) -> dict[str, Any]:
    # a lifecycle snapshot: no input, instructions, tools or output (the service clears them)
    return {"id": response_id, "object": "response", "created_at": 0, "model": RESPONSES_MODEL, "output": [],
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "status": status}


def response_created(response_id: str, seq: int = 0) -> dict[str, Any]:
    return {"type": "response.created", "response": _response(response_id, "in_progress"), "sequence_number": seq}


def response_ended(response_id: str, status: str = "completed", seq: int = 0,
                   usage: tuple[int, int, int] | None = None) -> dict[str, Any]:
    """``response.completed``, ``.failed`` or ``.incomplete`` (by ``status``);
    ``usage``: (input, cached input, output) tokens."""
    response = _response(response_id, status)
    if usage is not None:
        spent_in, cached, spent_out = usage
        response["usage"] = {"input_tokens": spent_in,
                             "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
                             "output_tokens": spent_out, "output_tokens_details": {"reasoning_tokens": 0},
                             "total_tokens": spent_in + spent_out}
    return {"type": f"response.{status}", "response": response, "sequence_number": seq}


def function_call_item(call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def item_added(call_id: str, name: str, output_index: int = 0, seq: int = 0) -> dict[str, Any]:
    return {"type": "response.output_item.added", "output_index": output_index, "sequence_number": seq,
            "item": function_call_item(call_id, name, "", "in_progress")}


def item_done(call_id: str, name: str, arguments: str, output_index: int = 0, seq: int = 0) -> dict[str, Any]:
    return {"type": "response.output_item.done", "output_index": output_index, "sequence_number": seq,
            "item": function_call_item(call_id, name, arguments)}


def arguments_done(call_id: str, arguments: str, output_index: int = 0, seq: int = 0) -> dict[str, Any]:
    return {"type": "response.function_call_arguments.done", "item_id": f"fc_{call_id}",
            "output_index": output_index, "arguments": arguments, "sequence_number": seq}


def responses_error(message: str, code: str | None = "server_error", seq: int = 0) -> dict[str, Any]:
    return {"type": "error", "code": code, "message": message, "sequence_number": seq}
