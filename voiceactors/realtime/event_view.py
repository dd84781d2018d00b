"""A light, read-only attribute view of a decoded server event.

The call actor acts on ~17 events per tool round; validating each with the
SDK's pydantic models was a seventh of a busy server's CPU. ``EventView``
wraps the ``json.loads`` result instead and reads like the SDK model does:
``event.type``, ``event.response.id``, ``getattr(item, "type", None)``; a
missing field reads as None, a nested object is a view, a list a tuple (of
views for its objects). Handlers written against the SDK models work on
both, as long as they read fields by attribute and treat a missing field as
None.

``SHAPES`` is the part of each acted-on event the protocol reads: the
objects it descends into (which must be objects), the strings it uses
(which must be strings, or absent) and the keys it files things under
(which must be present). A frame that does not fit is left to the SDK
models (``events.read_server_event``): they coerce what they can, and what
they refuse is skipped with its reason, as before.
"""

from __future__ import annotations

from typing import Any

__all__ = ["EventView", "SHAPES", "fits"]


class EventView:
    """Read-only attribute access to a decoded JSON object (see the module doc).
    ``hasattr`` is always true: every missing field reads as None."""

    __slots__ = ("_fields",)

    def __init__(self, fields: dict[str, Any]) -> None:
        object.__setattr__(self, "_fields", fields)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):          # copy, pickle and friends: not fields
            raise AttributeError(name)
        value = self._fields.get(name)
        kind = type(value)
        if kind is dict:
            return EventView(value)
        if kind is list:
            return tuple(EventView(v) if type(v) is dict else v for v in value)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("an EventView is read-only")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EventView) and other._fields == self._fields

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"EventView(type={self._fields.get('type')!r})"   # never the payload (logs)

    def to_dict(self) -> dict[str, Any]:
        """A copy of the decoded object."""
        return dict(self._fields)


#: A string the protocol files things under: it must be present.
KEY = "key"
#: A string the protocol reads: absent, null or a string.
TEXT = "text"

_ITEM: dict[str, Any] = {"type": TEXT, "id": TEXT, "call_id": TEXT, "name": TEXT, "arguments": TEXT,
                         "status": TEXT, "role": TEXT}
_RESPONSE: dict[str, Any] = {"id": TEXT, "status": TEXT, "output": [_ITEM]}
_TRANSCRIPT: dict[str, Any] = {"transcript": TEXT, "item_id": TEXT}

#: What the protocol reads of each event it acts on (``call_protocol.HANDLED_EVENTS``):
#: a dict is an object that must be there, ``[shape]`` a list of such objects
#: (absent or null allowed).
SHAPES: dict[str, dict[str, Any]] = {
    "response.created": {"response": _RESPONSE},
    "response.done": {"response": _RESPONSE},
    "response.output_item.added": {"response_id": KEY, "item": _ITEM},
    "response.output_item.done": {"response_id": KEY, "item": _ITEM},
    "response.function_call_arguments.done": {"response_id": KEY, "call_id": TEXT, "name": TEXT,
                                              "item_id": TEXT, "arguments": TEXT},
    "input_audio_buffer.speech_started": {},
    "conversation.item.added": {"item": _ITEM},
    "conversation.item.created": {"item": _ITEM},
    "conversation.item.done": {"item": _ITEM},
    "error": {"error": {"event_id": TEXT, "code": TEXT, "type": TEXT}},
    "conversation.item.input_audio_transcription.completed": _TRANSCRIPT,
    "response.output_audio_transcript.done": _TRANSCRIPT,
    "response.output_text.done": {"text": TEXT, "item_id": TEXT},
}


def _fits(obj: dict[str, Any], shape: dict[str, Any]) -> bool:
    for name, want in shape.items():
        value = obj.get(name)
        if want is TEXT:
            if value is not None and type(value) is not str:
                return False
        elif want is KEY:
            if type(value) is not str:
                return False
        elif type(want) is dict:
            if type(value) is not dict or not _fits(value, want):
                return False
        elif value is not None:   # [shape]
            if type(value) is not list:
                return False
            for element in value:
                if type(element) is not dict or not _fits(element, want[0]):
                    return False
    return True


def fits(obj: dict[str, Any]) -> bool:
    """Whether a decoded event of a type in ``SHAPES`` has what the protocol
    reads in the form it reads it (False for a type not in ``SHAPES``)."""
    type_ = obj.get("type")
    shape = SHAPES.get(type_) if type(type_) is str else None
    return shape is not None and _fits(obj, shape)
