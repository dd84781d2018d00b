"""Realtime event models: parse what the service sends, build what we send.

The SDK's ``RealtimeServerEvent`` / ``RealtimeClientEvent`` unions do not
check their discriminator when parsing (an unknown ``type`` silently parses as
some other event), so this module rebuilds them as real discriminated unions
over the same member models. The members are taken from the SDK at import
time, so a newer SDK brings its new events along.

Everything here is synchronous and pure; nothing blocks.
"""

from __future__ import annotations

import json
import re
import secrets
import time
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Container, Union

import pydantic
from openai.types.live import SessionUsageUpdatedEvent
from openai.types.realtime import RealtimeServerEvent
from pydantic import BaseModel, Field, TypeAdapter

from voiceactors import safe_text
from voiceactors.logs import get_logger
from voiceactors.realtime.event_view import Check, EventView, compile_checks
from voiceactors.safe_text import may_hold_surrogate_escape

__all__ = [
    "EventUnion",
    "SERVER_EVENTS",
    "new_event_id",
    "parse_server_event",
    "read_server_event",
    "validate_server_event",
    "decode_frame",
    "error_summary",
    "function_call_output",
    "response_create",
    "response_cancel",
    "session_update",
]

_log = get_logger(actor="realtime")


def _union_members(union: object) -> list[type[BaseModel]]:
    """The member models of an SDK union, which may be wrapped in ``Annotated``."""
    if typing.get_origin(union) is Annotated:
        union = typing.get_args(union)[0]
    return [m for m in typing.get_args(union) if isinstance(m, type) and issubclass(m, BaseModel)]


def _type_literals(model: type[BaseModel]) -> tuple[str, ...] | None:
    """The string values a model's ``type`` field accepts, or None when it is not a Literal."""
    field = model.model_fields.get("type")
    if field is None or typing.get_origin(field.annotation) is not typing.Literal:
        return None
    values = typing.get_args(field.annotation)
    return values if all(isinstance(v, str) for v in values) else None


@dataclass(frozen=True)
class EventUnion:
    """A discriminated union over an SDK event union.

    ``by_type`` maps each ``type`` value of the models that share none of
    their values to its model; those models form ``adapter`` (a pydantic
    discriminated union, so an unknown ``type`` fails cleanly). Models that
    share a value are tried in order per value (``fallback``), models whose
    ``type`` is not a Literal last (``untyped``). The SDK today has neither.
    """

    name: str
    adapter: TypeAdapter[Any]
    by_type: dict[str, type[BaseModel]]
    fallback: dict[str, list[type[BaseModel]]]
    untyped: list[type[BaseModel]]

    @classmethod
    def build(cls, name: str, union: object, extra: tuple[type[BaseModel], ...] = ()) -> "EventUnion":
        owners: dict[str, list[type[BaseModel]]] = {}
        untyped: list[type[BaseModel]] = []
        for model in [*_union_members(union), *extra]:
            values = _type_literals(model)
            if values is None:
                untyped.append(model)
                continue
            for value in values:
                owners.setdefault(value, []).append(model)
        # a model joins the discriminated union only if none of its type values is shared
        shared = {m for ms in owners.values() if len(ms) > 1 for m in ms}
        unique = [m for m in dict.fromkeys(m for ms in owners.values() for m in ms) if m not in shared]
        by_type = {v: m for m in unique for v in _type_literals(m) or ()}
        fallback = {t: ms for t, ms in owners.items() if t not in by_type}
        members = tuple(unique)
        annotated = Annotated[Union[members], Field(discriminator="type")]  # type: ignore[valid-type]
        # a union built at runtime is no TypeForm mypy can check (mypy 1.20 both
        # reports it and calls the ignore unused, hence unused-ignore too)
        return cls(name, TypeAdapter(annotated), by_type, fallback, untyped)  # type: ignore[arg-type, unused-ignore]

    def known(self, type_: str) -> bool:
        """Whether some member model may accept this ``type`` value."""
        return type_ in self.by_type or type_ in self.fallback or bool(self.untyped)

    def validate(self, obj: object) -> BaseModel:
        """Validate a decoded event. Raises ``ValueError`` (``pydantic.ValidationError``
        is one) for a non-object, a missing or unknown ``type``, or invalid fields."""
        if not isinstance(obj, dict):
            raise ValueError(f"{self.name} event must be a JSON object")
        type_ = obj.get("type")
        if not isinstance(type_, str):
            raise ValueError(f"{self.name} event has no string 'type'")
        if type_ in self.by_type:
            validated: BaseModel = self.adapter.validate_python(obj)
            return validated
        candidates = self.fallback.get(type_, []) + self.untyped
        if not candidates:
            raise ValueError(f"unknown {self.name} event type {type_!r}")
        last: Exception | None = None
        for model in candidates:
            try:
                return model.model_validate(obj)
            except pydantic.ValidationError as exc:
                last = exc
        assert last is not None
        raise last


#: The service's events, and one of Live's: a Live call's translator
#: (``live/translate.py``) hands the session's cumulative audio usage
#: (``session.usage.updated``) to the call's protocol as it came, Realtime
#: having no event that reports seconds. The Realtime service never sends it.
SERVER_EVENTS = EventUnion.build("server", RealtimeServerEvent, extra=(SessionUsageUpdatedEvent,))


def new_event_id() -> str:
    """A fresh client event id: ``evt_`` and 20 hex characters."""
    return "evt_" + secrets.token_hex(10)


def decode_frame(raw: str | bytes) -> tuple[Any, str | None]:
    """(object, None) or (None, reason). Binary websocket frames are not events.
    Every lone surrogate an escape puts in a string is U+FFFD (``safe_text``):
    the one place the service's text comes in."""
    if isinstance(raw, (bytes, bytearray)):
        return None, "binary frame"
    try:
        return safe_text.loads(raw), None
    except (ValueError, TypeError):
        return None, "not JSON"


def error_summary(exc: Exception) -> str:
    """A short reason without payload values (field locations and error kinds only)."""
    if isinstance(exc, pydantic.ValidationError):
        parts = []
        for err in exc.errors(include_input=False, include_url=False)[:3]:
            loc = ".".join(str(p) for p in err.get("loc", ()))
            parts.append(f"{loc}: {err.get('type')}")
        return "invalid fields: " + "; ".join(parts)
    return str(exc)


def validate_server_event(obj: object) -> BaseModel:
    """Validate a decoded server event (raises ``ValueError``). The simulator uses
    it to check every event it sends."""
    return SERVER_EVENTS.validate(obj)


#: The service writes ``type`` first; reading it from the text lets an event
#: the caller ignores skip JSON decoding altogether.
_LEADING_TYPE = re.compile(r'\s*\{\s*"type"\s*:\s*"([A-Za-z0-9_.]{1,128})"')


#: Longest peer-sent ``type`` put in a ``skipped`` line.
TYPE_LOG_MAX = 64


def clip(value: Any, limit: int) -> Any:
    """``value`` cut to ``limit`` characters (with ``…``) when it is a longer string."""
    if isinstance(value, str) and len(value) > limit:
        return value[:limit - 1] + "…"
    return value


class LogBudget:
    """A token bucket for log lines a peer can trigger: ``burst`` at once,
    then ``per_s`` a second; what it refuses is counted and reported with
    the next line it allows (``suppressed``). Wall-clock monotonic time: a
    log rate, not a protocol deadline."""

    def __init__(self, burst: int = 20, per_s: float = 1.0) -> None:
        self.burst = burst
        self.per_s = per_s
        self._tokens = float(burst)
        self._at = time.monotonic()
        self._suppressed = 0

    def allow(self) -> bool:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.per_s)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        self._suppressed += 1
        return False

    def take_suppressed(self) -> int:
        count, self._suppressed = self._suppressed, 0
        return count


def parse_server_event(raw: str | bytes, only: Container[str] | None = None,
                       budget: LogBudget | None = None) -> BaseModel | None:
    """Parse one websocket message from the service into its SDK model.

    Returns None, and logs one ``skipped`` line with the reason and the event
    type (never payload values; the type cut to ``TYPE_LOG_MAX``), for a
    binary frame, non-JSON, a non-object, an unknown type or a validation
    failure; with a ``budget``, only as many lines as it allows (the rest are
    counted in the next line's ``suppressed``). Never raises.

    ``only`` names the types the caller acts on: a known event of another type
    returns None without validation or log line. Validating every transcript
    delta the caller then ignores was a tenth of a busy server's CPU. When the
    text starts with its ``type`` (as the service writes it), an ignored event
    is not even decoded. (Acted-on events are decoded with ``json.loads`` and
    validated from Python objects: pydantic's own JSON parsing of the SDK's
    item unions measured 1.3–1.7× slower.)
    """
    model: BaseModel | None = _parse(raw, only, budget, checks=None)
    return model


def _keep_despite_usage(obj: dict[str, Any], exc: Exception) -> BaseModel | None:
    """A ``response.done`` whose only invalid fields are in its ``usage``: the
    event validated without it, the usage put back raw (the call's meter
    counts what it can and logs the rest). Losing the whole event would lose
    the response's end, and with it the batch's follow-up. None otherwise."""
    if obj.get("type") != "response.done" or not isinstance(exc, pydantic.ValidationError):
        return None
    response = obj.get("response")
    if not isinstance(response, dict) or "usage" not in response:
        return None
    locs = [err.get("loc", ()) for err in exc.errors(include_input=False, include_url=False)]
    if not locs or not all("response" in loc and "usage" in loc
                           and list(loc).index("usage") == list(loc).index("response") + 1 for loc in locs):
        return None
    try:
        event = SERVER_EVENTS.validate({**obj, "response": {**response, "usage": None}})
    except Exception:  # noqa: BLE001 - something else is wrong too: skipped as before
        return None
    event.response.usage = response["usage"]   # type: ignore[attr-defined]  # no validation on assignment
    return event


#: Plain checks of decoded events, from the SDK models (``event_view.compile_checks``).
SERVER_CHECKS: dict[str, Check] = compile_checks(SERVER_EVENTS.by_type)


def read_server_event(raw: str | bytes, only: Container[str], budget: LogBudget | None = None,
                      *, screened: bool = False) -> Any:
    """``parse_server_event`` for the call actor: the same skips and log
    lines, but an acted-on event that passes its check (``SERVER_CHECKS``,
    as strict as the SDK model) comes back as an ``EventView`` of its
    ``json.loads`` result, without building the model. One that does not
    pass is validated by the models (returned as the model when they
    accept it, skipped with the reason when not).

    ``screened``: ``skippable(raw, only)`` was already False for this frame
    (the hand-off asked it, ``ws_frames``): not asked again. The result is
    the same either way; the check is a regular-expression match per frame.

    A screened frame takes a short path first (the call actor's every acted-on
    frame, ~17 a tool round): text that is one JSON object from its first
    character to its last, decoded by the scanner ``json.loads`` itself uses,
    whose acted-on type passes its check, is its view in this one call (the
    general path is six calls deep). Anything else, valid or not, goes the
    general path from the start, so its result and its line are the same.
    So does text that may hold a surrogate escape (``\\ud``): the general
    path's ``decode_frame`` makes it safe."""
    if (screened and type(raw) is str and raw[:1] == "{"
            and ("\\" not in raw or not may_hold_surrogate_escape(raw))):   # no call for most frames
        try:
            obj, end = _SCAN_JSON(raw, 0)
        except (StopIteration, ValueError):
            pass
        else:
            type_ = obj.get("type") if end == len(raw) else None
            if type(type_) is str and type_ in only:
                check = SERVER_CHECKS.get(type_)
                if check is not None and check(obj):
                    return EventView(obj)
    return _parse(raw, only, budget, checks=SERVER_CHECKS, screened=screened)


#: The scanner of ``json.loads`` (``JSONDecoder().scan_once``: the C one), for
#: ``read_server_event``'s short path: ``loads`` = skip leading whitespace, this,
#: then refuse anything but whitespace after it.
# (an attribute JSONDecoder's __init__ sets, which typeshed does not declare)
_SCAN_JSON: Callable[[str, int], tuple[Any, int]] = vars(json.JSONDecoder())["scan_once"]


def skippable(raw: str | bytes, only: Container[str]) -> bool:
    """True for a frame the readers skip unread, with no line and no effect:
    text whose leading ``type`` is a known server event not in ``only``
    (deltas, audio buffer and rate-limit events)."""
    leading = _LEADING_TYPE.match(raw) if type(raw) is str else None
    return leading is not None and leading.group(1) not in only and SERVER_EVENTS.known(leading.group(1))


def _parse(raw: str | bytes, only: Container[str] | None, budget: LogBudget | None,
           checks: dict[str, Check] | None, screened: bool = False) -> Any:
    """Both readers' one path (see ``parse_server_event``); with ``checks``,
    an acted-on event that passes its check comes back as an ``EventView``."""
    if only is not None and not screened and skippable(raw, only):
        return None
    obj, reason = decode_frame(raw)
    type_ = obj.get("type") if isinstance(obj, dict) else None
    if reason is None:
        if not isinstance(obj, dict):
            reason = "not an object"
        elif not isinstance(type_, str):
            reason = "no type"
        elif (checks is not None and only is not None and type_ in only
              and (check := checks.get(type_)) is not None and check(obj)):
            return EventView(obj)
        elif not SERVER_EVENTS.known(type_):
            _skipped(budget, "info", "unknown type", type_)
            return None
        elif only is not None and type_ not in only:
            return None
        else:
            try:
                return SERVER_EVENTS.validate(obj)
            except Exception as exc:  # never fatal: the service may be newer than our SDK
                kept = _keep_despite_usage(obj, exc)
                if kept is not None:
                    return kept
                reason = error_summary(exc)
    _skipped(budget, "warning", reason, type_ if isinstance(type_, str) else None)
    return None


def _skipped(budget: LogBudget | None, level: str, reason: str, type_: str | None) -> None:
    if budget is not None and not budget.allow():
        return
    suppressed = budget.take_suppressed() if budget is not None else 0
    getattr(_log, level)("realtime.event_skipped", reason=clip(reason, 200), type=clip(type_, TYPE_LOG_MAX),
                         **({"suppressed": suppressed} if suppressed else {}))


# -- builders: every event we send carries a fresh event_id so an error can name it


def function_call_output(call_id: str, output: str) -> dict[str, Any]:
    """``conversation.item.create`` carrying a tool result (``output`` is a string)."""
    return {
        "type": "conversation.item.create",
        "event_id": new_event_id(),
        "item": {"type": "function_call_output", "call_id": call_id, "output": output},
    }


def system_message(text: str) -> dict[str, Any]:
    """``conversation.item.create`` of a system message (``input_text``): a
    note for the model, never spoken, that starts no response."""
    return {
        "type": "conversation.item.create",
        "event_id": new_event_id(),
        "item": {"type": "message", "role": "system", "content": [{"type": "input_text", "text": text}]},
    }


def response_create(response: dict[str, Any] | None = None) -> dict[str, Any]:
    """``response.create``; ``response`` optionally overrides response parameters."""
    event: dict[str, Any] = {"type": "response.create", "event_id": new_event_id()}
    if response:
        event["response"] = response
    return event


def response_cancel(response_id: str | None = None) -> dict[str, Any]:
    """``response.cancel`` for ``response_id`` (or whatever response is active)."""
    event: dict[str, Any] = {"type": "response.cancel", "event_id": new_event_id()}
    if response_id:
        event["response_id"] = response_id
    return event


def session_update(session: dict[str, Any]) -> dict[str, Any]:
    """``session.update``; ``session`` gets ``type: realtime`` when it has no type."""
    body = dict(session)
    body.setdefault("type", "realtime")
    return {"type": "session.update", "event_id": new_event_id(), "session": body}
