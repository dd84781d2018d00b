"""LiveTranslator: a Live sideband spoken to the call's Realtime protocol, without I/O.

The call's protocol (``call/protocol.py``) holds every rule of a call —
epochs, one ``response.create`` per batch, exactly-once outputs, refusals —
in Realtime's vocabulary. A Live session's sideband says the same things in
another one: the function calls of the Responses model it delegates to arrive
nested in ``response.event``s, the user's speech as transcript fragments on the
session's timeline, and the answers go back as ``response.item.create`` and
``response.create``. This module turns one into the other, both ways, so that
the protocol, the shell and the executor serve a Live call unchanged
(``docs/live.md`` has the table):

* ``from_service(frame)``: one Live server event in; the Realtime server
  events for the protocol (``to_call``) and any Live client events it asks
  for at once (``to_service``: a failed delegation's commentary) out;
* ``from_call(text)``: one Realtime client event of the protocol's in; the
  Live client events to send (``to_service``) and the server events Live does
  not send but the protocol waits for (``to_call``: the echo of an output,
  Live confirming no item; the start of words of ours spoken as commentary),
  to be handed to the protocol once ``to_service`` is written.

Rules kept here (the protocol's are the protocol's):

* a delegation's nested events are held until its response's id is known
  (``response.created``, or the delegation's ``response_id``): the function
  calls of one response are one batch, whatever order their events come in;
* a lifecycle snapshot carries no output: a response's function calls are
  the ones its item events named (the snapshot's, when it has some, too);
* the user takes the floor with speech that starts on the timeline after the
  latest delegation was made and after the assistant last began to speak:
  that is a new turn (``input_audio_buffer.speech_started``); speech the
  delegation was made from (reported late) is not;
* a delegated response that fails is answered with commentary, once: the
  Live model says so rather than wait for it;
* the session's audio usage (``session.usage.updated``, cumulative; the
  final total of ``session.closed`` too) goes to the protocol as a
  ``session.usage.updated``: Realtime has no event for seconds of audio;
* a write's output also reaches the Live model as silent context
  (``session.thinking.append``): the delegation it answered may be one the
  user spoke over, whose answer the model never speaks.

Never blocks, reads a clock or imports trio; not thread-safe (one owner).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from voiceactors import safe_text
from voiceactors.live.names import FunctionNames

__all__ = ["FAILED_DELEGATION", "TEXT_MAX", "LiveTranslator", "Translated", "realtime_usage", "write_note"]

#: The most nested events held for one delegation until its response's id is known.
HELD_MAX = 512
#: The longest text appended to a Live session at once (its limit is 500 tokens).
TEXT_MAX = 2000
#: Longest tool arguments and output quoted in a write's note.
NOTE_PART_MAX = 300
#: The commentary of a delegated response that failed.
FAILED_DELEGATION = ("The journal look-up you delegated failed and will not answer. Tell the user plainly, in one "
                     "short sentence, that it did not work this time; do not guess its answer.")
#: Realtime's statuses of a finished response, by the Responses event that ended it.
_ENDED = {"response.completed": "completed", "response.failed": "failed", "response.incomplete": "incomplete"}
_STATUSES = frozenset({"completed", "cancelled", "failed", "incomplete"})
#: A nested event of a delegation that is held until its response's id is known.
_HELD_NESTED = frozenset({"response.output_item.added", "response.output_item.done",
                          "response.function_call_arguments.done", *_ENDED})


def write_note(tool: str, arguments: str | None, output: str) -> str:
    """The silent note that a write was done (``session.thinking.append``)."""
    return (f"Done in the journal: {tool} {_clip(arguments or '{}', NOTE_PART_MAX)}, which answered "
            f"{_clip(output, NOTE_PART_MAX)}. It is done: do not make it again, and do not say it failed.")


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def realtime_usage(usage: object) -> dict[str, Any] | None:
    """A delegated response's usage (the Responses API's: input and output
    tokens, the cached part of the input) as a Realtime response's, all of it
    text: what the call's meter counts and prices (as the delegated model's,
    ``supervisor._model_of``). None when it holds no counts."""
    if not isinstance(usage, dict):
        return None
    spent_in, spent_out = _count(usage.get("input_tokens")), _count(usage.get("output_tokens"))
    if spent_in is None or spent_out is None:
        return None
    details = usage.get("input_tokens_details")
    cached = min(_count(details.get("cached_tokens")) or 0, spent_in) if isinstance(details, dict) else 0
    return {"total_tokens": spent_in + spent_out, "input_tokens": spent_in, "output_tokens": spent_out,
            "input_token_details": {"text_tokens": spent_in, "audio_tokens": 0, "cached_tokens": cached,
                                    "cached_tokens_details": {"text_tokens": cached, "audio_tokens": 0}},
            "output_token_details": {"text_tokens": spent_out, "audio_tokens": 0}}


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _dumps(event: dict[str, Any]) -> str:
    return json.dumps(event, ensure_ascii=False)


@dataclass(slots=True)
class Translated:
    """What one event became: server events for the call's protocol, client
    events for the Live service (each a JSON text)."""

    to_call: list[str] = field(default_factory=list)
    to_service: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Delegation:
    offset_ms: int = 0
    response_id: str | None = None          # the delegated response now streaming
    held: list[dict[str, Any]] = field(default_factory=list)   # nested events waiting for that id
    failed: bool = False                    # its failure was answered (once)


@dataclass(slots=True)
class _FunctionCall:
    item_id: str
    call_id: str
    name: str                               # the tool's own name (mapped back)
    arguments: str = ""
    status: str = "in_progress"

    def item(self) -> dict[str, Any]:
        return {"id": self.item_id, "type": "function_call", "object": "realtime.item", "status": self.status,
                "call_id": self.call_id, "name": self.name, "arguments": self.arguments}


@dataclass(slots=True)
class _Turn:
    """One side's words being transcribed (Live sends fragments, no end)."""

    item_id: str
    response_id: str | None = None          # an assistant turn's (a made-up id: Live has no response for it)
    parts: list[str] = field(default_factory=list)


class LiveTranslator:
    """One Live sideband's translation (see the module doc).

    ``names``: the session's function-name table. ``is_write(tool)``: whether
    a tool writes (its output's note). ``instructions``: the instructions the
    session was created with (an update appends only what changed).
    """

    def __init__(self, names: FunctionNames, *, is_write: Callable[[str], bool] = lambda tool: False,
                 instructions: str = "") -> None:
        self.names = names
        self._is_write = is_write
        self.instructions = instructions
        self._delegations: dict[str, _Delegation] = {}
        self._calls: dict[str, dict[str, _FunctionCall]] = {}   # response id -> call id -> its call
        self._by_item: dict[str, _FunctionCall] = {}            # item id -> call
        self._by_call_id: dict[str, _FunctionCall] = {}
        self._words: dict[str, str] = {}        # our commentary's event id -> its made-up response id
        self._floor_ms = 0                      # speech starting here or later is a new turn
        self._user: _Turn | None = None         # the user's turn being transcribed (until the reply or the next)
        self._user_open = False                 # ... and it holds the floor (no delegation or reply since)
        self._assistant: _Turn | None = None    # the assistant's
        self._last_item: str | None = None      # the conversation's latest item (previous_item_id)
        self._n = 0

    # ------------------------------------------------------------ ids

    def _id(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}_live_{self._n}"

    def _server(self, kind: str, **fields: Any) -> str:
        return _dumps({"type": kind, "event_id": self._id("event"), **fields})

    # ------------------------------------------------- from the service

    def from_service(self, frame: str | bytes) -> Translated:
        """The translation of one Live server event (a frame that is not a
        JSON object with a known type becomes nothing)."""
        out = Translated()
        if isinstance(frame, (bytes, bytearray)):
            return out
        try:
            event = safe_text.loads(frame)
        except (ValueError, TypeError):
            return out
        if not isinstance(event, dict):
            return out
        handler = _SERVICE_HANDLERS.get(event.get("type"))  # type: ignore[arg-type]
        if handler is not None:
            handler(self, event, out)
        return out

    def _on_delegation(self, event: dict[str, Any], out: Translated) -> None:
        delegation = event.get("delegation")
        if not isinstance(delegation, dict) or delegation.get("target") != "responses":
            return
        offset = event.get("offset_ms")
        state = self._delegation(delegation.get("id"))
        state.offset_ms = offset if isinstance(offset, int) else state.offset_ms
        self._user_open = False        # the user's words so far made this delegation
        self._floor_ms = max(self._floor_ms, state.offset_ms)
        response_id = delegation.get("response_id")
        if isinstance(response_id, str) and response_id and state.response_id is None:
            state.response_id = response_id
            self._release(state, out)

    def _delegation(self, delegation_id: Any) -> _Delegation:
        key = delegation_id if isinstance(delegation_id, str) else ""
        state = self._delegations.get(key)
        if state is None:
            state = self._delegations[key] = _Delegation()
        return state

    def _on_response_event(self, event: dict[str, Any], out: Translated) -> None:
        nested = event.get("event")
        if not isinstance(nested, dict):
            return
        state = self._delegation(event.get("delegation_id"))
        kind = nested.get("type")
        if kind == "response.created":
            response = nested.get("response")
            rid = response.get("id") if isinstance(response, dict) else None
            if not isinstance(rid, str) or not rid:
                return
            state.response_id = rid
            self._calls.setdefault(rid, {})
            out.to_call.append(self._server("response.created", response={
                "id": rid, "object": "realtime.response", "status": "in_progress", "output": []}))
            self._release(state, out)
        elif kind == "error":
            self._delegation_failed(state, out)
        elif kind in _HELD_NESTED:
            if state.response_id is None:
                response = nested.get("response")
                rid = response.get("id") if isinstance(response, dict) else None
                if kind in _ENDED and isinstance(rid, str) and rid:
                    state.response_id = rid      # a lifecycle snapshot names it: the held ones are its
                    self._release(state, out)
                else:
                    if len(state.held) < HELD_MAX:     # a peer that never names the response: bounded
                        state.held.append(nested)
                    return
            self._nested(state, nested, out)

    def _release(self, state: _Delegation, out: Translated) -> None:
        held, state.held = state.held, []
        for nested in held:
            self._nested(state, nested, out)

    def _nested(self, state: _Delegation, nested: dict[str, Any], out: Translated) -> None:
        rid = state.response_id
        assert rid is not None
        kind = nested.get("type")
        if kind in ("response.output_item.added", "response.output_item.done"):
            call = self._function_call(rid, nested.get("item"), done=kind == "response.output_item.done")
            if call is not None:
                index = nested.get("output_index")
                out.to_call.append(self._server(kind, response_id=rid, item=call.item(),
                                                output_index=index if isinstance(index, int) else 0))
        elif kind == "response.function_call_arguments.done":
            known = self._by_item.get(nested.get("item_id"))  # type: ignore[arg-type]
            arguments = nested.get("arguments")
            if known is None or not isinstance(arguments, str):
                return          # its item's events carry the arguments too
            index = nested.get("output_index")
            out.to_call.append(self._server(kind, response_id=rid, item_id=known.item_id, call_id=known.call_id,
                                            name=known.name, arguments=arguments,
                                            output_index=index if isinstance(index, int) else 0))
        elif kind in _ENDED:
            self._response_ended(state, rid, nested, out)

    def _function_call(self, rid: str, item: Any, *, done: bool) -> _FunctionCall | None:
        """The function call an output item names (kept per response), or
        None for any other item (the delegated model's text is the service's
        to hand to the Live model)."""
        if not isinstance(item, dict) or item.get("type") != "function_call":
            return None
        call_id, name = item.get("call_id"), item.get("name")
        if not isinstance(call_id, str) or not call_id or not isinstance(name, str):
            return None
        item_id = item.get("id")
        calls = self._calls.setdefault(rid, {})
        call = calls.get(call_id)
        if call is None:
            call = _FunctionCall(item_id if isinstance(item_id, str) and item_id else f"item_{call_id}",
                                 call_id, self.names.tool_name(name))
            calls[call_id] = call
            self._by_item[call.item_id] = call
            self._by_call_id[call_id] = call
        arguments, status = item.get("arguments"), item.get("status")
        if isinstance(arguments, str):
            call.arguments = arguments
        if status in ("in_progress", "completed", "incomplete"):
            call.status = status
        elif done:
            call.status = "completed"
        return call

    def _response_ended(self, state: _Delegation, rid: str, nested: dict[str, Any], out: Translated) -> None:
        kind = nested.get("type")
        response = nested.get("response")
        status = _ENDED[kind]  # type: ignore[index]
        if isinstance(response, dict):
            for item in response.get("output") or ():
                self._function_call(rid, item, done=True)
            if response.get("status") in _STATUSES:
                status = response["status"]
        output = [call.item() for call in self._calls.get(rid, {}).values()]
        done: dict[str, Any] = {"id": rid, "object": "realtime.response", "status": status, "output": output}
        usage = realtime_usage(response.get("usage")) if isinstance(response, dict) else None
        if usage is not None:
            done["usage"] = usage
        out.to_call.append(self._server("response.done", response=done))
        if status == "failed":
            self._delegation_failed(state, out)

    def _delegation_failed(self, state: _Delegation, out: Translated) -> None:
        if state.failed:
            return
        state.failed = True
        out.to_service.append(_dumps({"type": "session.commentary.append", "event_id": self._id("evt"),
                                      "content": FAILED_DELEGATION, "delegation_id": None}))

    # the conversation's turns, from the transcript fragments

    def _on_input_delta(self, event: dict[str, Any], out: Translated) -> None:
        start, delta = event.get("start_ms"), event.get("delta")
        if not isinstance(start, int) or not isinstance(delta, str):
            return
        if not self._user_open and start >= self._floor_ms:
            # the user takes the floor: a new turn (and the end of the assistant's)
            self._end_assistant_turn(out)
            self._end_user_turn(out)
            self._user_open = True
            self._user = _Turn(self._id("item"))
            out.to_call.append(self._server("input_audio_buffer.speech_started", audio_start_ms=start,
                                            item_id=self._user.item_id))
            out.to_call.append(self._item_added({"id": self._user.item_id, "type": "message", "role": "user",
                                                 "object": "realtime.item", "status": "completed",
                                                 "content": [{"type": "input_audio"}]}))
        if self._user is not None:   # a late fragment belongs to the turn, until the assistant answers it
            self._user.parts.append(delta)

    def _on_output_delta(self, event: dict[str, Any], out: Translated) -> None:
        start, delta = event.get("start_ms"), event.get("delta")
        if not isinstance(start, int) or not isinstance(delta, str):
            return
        if self._assistant is None:
            # the assistant answers: the user's turn is over (its transcript, in order, before the reply's)
            self._end_user_turn(out)
            self._user_open = False
            self._floor_ms = max(self._floor_ms, start)
            self._assistant = _Turn(self._id("item"), self._id("resp_speech"))
            out.to_call.append(self._item_added({"id": self._assistant.item_id, "type": "message",
                                                 "role": "assistant", "object": "realtime.item",
                                                 "status": "completed", "content": [{"type": "output_audio"}]}))
        self._assistant.parts.append(delta)

    def _on_closed(self, event: dict[str, Any], out: Translated) -> None:
        self._end_user_turn(out)
        self._end_assistant_turn(out)
        self._on_usage(event, out)      # the final cumulative seconds, after the session's finalization

    def _item_added(self, item: dict[str, Any]) -> str:
        frame = self._server("conversation.item.added", item=item, previous_item_id=self._last_item)
        self._last_item = item["id"]
        return frame

    def _end_user_turn(self, out: Translated) -> None:
        turn, self._user = self._user, None
        text = "".join(turn.parts).strip() if turn is not None else ""
        if turn is not None and text:
            out.to_call.append(self._server(
                "conversation.item.input_audio_transcription.completed", item_id=turn.item_id, content_index=0,
                transcript=text, usage={"type": "duration", "seconds": 0}))

    def _end_assistant_turn(self, out: Translated) -> None:
        turn, self._assistant = self._assistant, None
        text = "".join(turn.parts).strip() if turn is not None else ""
        if turn is not None and text:
            out.to_call.append(self._server(
                "response.output_audio_transcript.done", response_id=turn.response_id, item_id=turn.item_id,
                output_index=0, content_index=0, transcript=text))

    def _on_usage(self, event: dict[str, Any], out: Translated) -> None:
        # the session's cumulative seconds of audio: Realtime has no event for
        # them, so the protocol reads Live's own (its meter keeps the highest
        # total: a repeated or late report counts nothing)
        usage = event.get("usage")
        if isinstance(usage, dict):
            out.to_call.append(self._server("session.usage.updated", usage=usage))

    def _on_commentary_appended(self, event: dict[str, Any], out: Translated) -> None:
        rid = self._words.pop(event.get("client_event_id") or "", None)
        if rid is not None:
            out.to_call.append(self._server("response.done", response={
                "id": rid, "object": "realtime.response", "status": "completed", "output": []}))

    def _on_error(self, event: dict[str, Any], out: Translated) -> None:
        error = event.get("error")
        if not isinstance(error, dict):
            return
        refused = error.get("client_event_id") or event.get("client_event_id")
        rid = self._words.pop(refused, None) if isinstance(refused, str) else None
        if rid is not None:     # our words' made-up response ends with the refusal of its commentary
            out.to_call.append(self._server("response.done", response={
                "id": rid, "object": "realtime.response", "status": "failed", "output": []}))
        body: dict[str, Any] = {"type": str(error.get("type") or "error"), "message": str(error.get("message") or "")}
        for key in ("code", "param"):
            if isinstance(error.get(key), str):
                body[key] = error[key]
        if isinstance(refused, str):
            body["event_id"] = refused
        out.to_call.append(self._server("error", error=body))

    # ---------------------------------------------------- from the call

    def from_call(self, text: str) -> Translated:
        """The translation of one client event of the call's protocol."""
        out = Translated()
        event = json.loads(text)
        handler = _CALL_HANDLERS.get(event.get("type"))
        if handler is not None:
            handler(self, event, out)
        return out

    def _item_create(self, event: dict[str, Any], out: Translated) -> None:
        item = event.get("item") or {}
        if item.get("type") == "function_call_output":
            call_id, output = item["call_id"], item["output"]
            out.to_service.append(_dumps({"type": "response.item.create", "event_id": event.get("event_id"),
                                          "item": {"type": "function_call_output", "call_id": call_id,
                                                   "output": output}}))
            call = self._by_call_id.get(call_id)
            if call is not None and self._is_write(call.name) and not _is_error(output):
                out.to_service.append(self._thinking(write_note(call.name, call.arguments, output)))
            out.to_call.append(self._item_added({"id": self._id("item"), "type": "function_call_output",
                                                 "object": "realtime.item", "status": "completed",
                                                 "call_id": call_id, "output": output}))
        elif item.get("type") == "message" and item.get("role") == "system":
            text = "".join(part.get("text", "") for part in item.get("content") or () if isinstance(part, dict))
            if text:
                out.to_service.append(self._thinking(text, event.get("event_id")))

    def _response_create(self, event: dict[str, Any], out: Translated) -> None:
        words = (event.get("response") or {}).get("instructions")
        if not words:
            out.to_service.append(_dumps({"type": "response.create", "event_id": event.get("event_id")}))
            return
        # words of ours (a greeting, an acknowledgement, a farewell): the Live
        # model speaks them from commentary; their made-up response ends when
        # the service takes the commentary in
        rid = self._id("resp_words")
        self._words[event["event_id"]] = rid
        out.to_service.append(_dumps({"type": "session.commentary.append", "event_id": event["event_id"],
                                      "content": _clip(self._changed_part(words), TEXT_MAX), "delegation_id": None}))
        out.to_call.append(self._server("response.created", response={
            "id": rid, "object": "realtime.response", "status": "in_progress", "output": []}))

    def _session_update(self, event: dict[str, Any], out: Translated) -> None:
        instructions = (event.get("session") or {}).get("instructions")
        if not isinstance(instructions, str):
            return
        changed = self._changed_part(instructions)
        self.instructions = instructions
        if changed:
            out.to_service.append(_dumps({"type": "session.instructions.append", "event_id": event.get("event_id"),
                                          "content": _clip(changed, TEXT_MAX), "delegation_id": None}))

    def _changed_part(self, text: str) -> str:
        """``text`` without what it shares at its start with the session's
        instructions (Live's are fixed at creation: only the rest is news)."""
        known, common = self.instructions, 0
        limit = min(len(known), len(text))
        while common < limit and known[common] == text[common]:
            common += 1
        if common == len(text):
            return ""         # nothing the session does not have
        if common < 200:      # little in common: the whole text is news
            return text.strip()
        # from the start of the line the texts part at: a section, not half a word
        start = text.rfind("\n", 0, common) + 1
        return text[start:].strip()

    def _thinking(self, text: str, event_id: str | None = None) -> str:
        return _dumps({"type": "session.thinking.append", "event_id": event_id or self._id("evt"),
                       "content": _clip(text, TEXT_MAX), "delegation_id": None})


def _is_error(output: str) -> bool:
    try:
        body = json.loads(output)
    except ValueError:
        return False
    return isinstance(body, dict) and "error" in body


_SERVICE_HANDLERS: dict[str, Callable[[LiveTranslator, dict[str, Any], Translated], None]] = {
    "session.delegation.created": LiveTranslator._on_delegation,
    "response.event": LiveTranslator._on_response_event,
    "session.input_transcript.delta": LiveTranslator._on_input_delta,
    "session.output_transcript.delta": LiveTranslator._on_output_delta,
    "session.commentary.appended": LiveTranslator._on_commentary_appended,
    "error": LiveTranslator._on_error,
    "session.closed": LiveTranslator._on_closed,
    "session.usage.updated": LiveTranslator._on_usage,
}

_CALL_HANDLERS: dict[str, Callable[[LiveTranslator, dict[str, Any], Translated], None]] = {
    "conversation.item.create": LiveTranslator._item_create,
    "response.create": LiveTranslator._response_create,
    "session.update": LiveTranslator._session_update,
}
