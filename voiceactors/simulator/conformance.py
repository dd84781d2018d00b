"""Events held to the SDK's types exactly (``docs/simulator.md`` § Conformance).

The SDK's models accept any field they do not declare (``extra="allow"``)
and coerce what they can (``"1"`` for an integer), so an event that passes
``EventUnion.validate`` may still carry a misspelt field or a wrongly typed
value the real service would refuse (it answers an undeclared parameter
with ``unknown_parameter``). Here the event's JSON text is validated by the
SDK's discriminated union in pydantic's strict mode, and every field the
models did not declare, at any depth, is named.

With conformance on (``Simulator(conformance=True)``, or the environment
variable ``VOICEACTORS_SIM_CONFORMANCE=1`` for every simulator the process
makes), each event that fails is recorded in its call's ``nonconforming``
and in this module's process-wide list (``recorded`` / ``take``), which the
test suite's fixture turns into a failed test.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import pydantic
from pydantic import BaseModel

from voiceactors.realtime.events import SERVER_EVENTS, EventUnion, error_summary
from voiceactors.simulator.client_events import CLIENT_EVENTS

__all__ = ["ENV_FLAG", "Direction", "Nonconforming", "NonconformingEvent", "enabled_by_env", "conformance_error",
           "undeclared_fields", "check_server_event", "client_error", "record", "recorded", "take"]

#: Set to ``1`` to turn conformance on for every simulator made without an explicit choice.
ENV_FLAG = "VOICEACTORS_SIM_CONFORMANCE"
#: At most this many failures are kept process-wide (a long-running demo with the flag on stays bounded).
_KEPT = 1000


class Direction(StrEnum):
    SERVER = "server"   # an event the simulator sent
    CLIENT = "client"   # an event a client (our server) sent the simulator


@dataclass(frozen=True)
class Nonconforming:
    """One event that did not conform: whose, which way, its type and why
    (field locations and error kinds, never payload values)."""

    call_id: str
    direction: Direction
    type: str | None
    reason: str


class NonconformingEvent(ValueError):
    """A server event the simulator was about to send does not conform (a simulator bug)."""


def enabled_by_env() -> bool:
    return os.environ.get(ENV_FLAG, "").strip().lower() in {"1", "true", "yes", "on"}


def undeclared_fields(value: Any, path: str = "") -> list[str]:
    """The dotted paths of every field no model declared, at any depth of a
    validated model (what ``extra="allow"`` kept in ``model_extra``)."""
    found: list[str] = []
    if isinstance(value, BaseModel):
        found += [f"{path}.{name}".lstrip(".") for name in (value.model_extra or {})]
        for name in type(value).model_fields:
            found += undeclared_fields(getattr(value, name), f"{path}.{name}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found += undeclared_fields(item, f"{path}[{index}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            found += undeclared_fields(item, f"{path}.{key}")
    return found


def conformance_error(union: EventUnion, obj: Any) -> tuple[str | None, str | None]:
    """``(reason, undeclared)``: both None when ``obj`` (a decoded event)
    validates strictly, as JSON, against ``union`` and declares nothing the
    models do not. ``undeclared`` is the first undeclared field's path (the
    ``param`` of the service's ``unknown_parameter``)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
        return "not an event object with a string type", None
    if obj["type"] not in union.by_type:
        return f"unknown {union.name} event type", None
    try:
        model = union.adapter.validate_json(json.dumps(obj), strict=True)
    except pydantic.ValidationError as exc:
        return error_summary(exc), None
    extra = undeclared_fields(model)
    if extra:
        return "undeclared fields: " + ", ".join(extra[:5]), extra[0]
    return None, None


def check_server_event(obj: dict[str, Any]) -> None:
    """Raise ``NonconformingEvent`` when a server event does not conform."""
    reason, _ = conformance_error(SERVER_EVENTS, obj)
    if reason is not None:
        raise NonconformingEvent(f"server event {obj.get('type')!r} does not conform: {reason}")


def client_error(obj: Any) -> tuple[str | None, str | None]:
    """``conformance_error`` for a client event."""
    return conformance_error(CLIENT_EVENTS, obj)


_found: list[Nonconforming] = []


def record(entry: Nonconforming) -> None:
    if len(_found) < _KEPT:
        _found.append(entry)


def recorded() -> list[Nonconforming]:
    return list(_found)


def take() -> list[Nonconforming]:
    """Every failure recorded since the last ``take``, and forget them."""
    found = list(_found)
    _found.clear()
    return found
