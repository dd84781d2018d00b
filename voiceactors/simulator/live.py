"""The simulator's Live sessions (``docs/simulator.md`` § Live sessions).

What a server sees of OpenAI's Live API, played locally:

* ``POST /v1/live/sessions`` (``live.create``): the browser's SDP offer in
  ``transport.sdp``, the session's startup config in ``session`` (checked
  against the SDK's ``LiveCreateParams``); a media offer is answered by a
  WebRTC peer (aiortc, as for a Realtime call), a signalling-only one
  (``v=0`` alone) with a placeholder; the answer is ``LiveCreateResponse``
  (``{"session": {"id": "live_…"}, "transport": {"type": "webrtc", "sdp": …}}``);
* ``POST /v1/live/sessions/{id}/hangup``: the session closes
  (``session.closed``, ``close_requested``) and its sideband with it;
* the attach sideband, ``/v1/live/sessions/{id}/attach``: the session's
  scenario (``LIVE_SCENARIOS``) played on it — the user's and the
  assistant's transcript fragments on the session's timeline, delegations to
  "Responses" whose function calls arrive nested in ``response.event``s
  and whose response continues once every call has its
  ``function_call_output`` and a ``response.create`` came, a user who speaks
  over the work, a delegation that fails, usage, the close. A session
  rejoined after its sideband dropped goes on where it was.

Every event sent and received is held to the SDK's types
(``live_events.py``): one that does not conform is recorded in the
session's ``nonconforming`` (and one received is refused with an
``error``). Refusals, each an ``error`` naming the refused event
(``client_event_id``): an event that does not conform
(``invalid_request_error``), context with a delegation id (Responses
delegation takes none: ``invalid_value``, ``delegation_id``), context over
500 tokens (``string_above_max_length``), an output for a function call the
session never made or already answered (``invalid_tool_call_id``), a
``response.create`` with no delegated response waiting
(``no_active_delegation``), ``session.start`` on the sideband
(``session_already_started``).
"""

from __future__ import annotations

import itertools
import json
import math
import secrets
from dataclasses import dataclass, field
from typing import Any, Callable

import pydantic
import trio
import trio_websocket
from openai.types.live import LiveCreateResponse
from openai.types.live.live_create_params import LiveCreateParams
from pydantic import TypeAdapter

from voiceactors.logs import get_logger
from voiceactors.simulator import live_events as le
from voiceactors.simulator.http import HttpResponse, ReplayStream, json_response

__all__ = ["LIVE_SCENARIOS", "LivePrefix", "LiveSession", "LiveSessions", "attach_session_id"]

_log = get_logger(actor="simulator")

LivePrefix = "/v1/live/sessions"
_CREATE: TypeAdapter[LiveCreateParams] = TypeAdapter(LiveCreateParams)
#: The most a context event may carry: 500 tokens, counted as four characters each.
CONTEXT_MAX_CHARS = 2000
#: How long a step waits for the client (its outputs, its ``response.create``) before going on: as
#: long as it takes, as the service waits for tool results (a deadline would fire whenever a test's
#: fake clock jumps over the real time a socket takes).
CLIENT_WAIT_S = math.inf
#: Each delegated response's usage: (input, cached input, output) tokens.
DELEGATED_USAGE = (600, 200, 80)
_CONTEXT = frozenset({"session.thinking.append", "session.instructions.append", "session.commentary.append"})
_APPENDED = {"session.thinking.append": "session.thinking.appended",
             "session.instructions.append": "session.instructions.appended",
             "session.commentary.append": "session.commentary.appended"}

#: The Live sessions' scenarios: a list of steps each. ``user`` / ``assistant``:
#: words said (transcript fragments); ``delegate``: the calls (``name``: the
#: function as the session declared it, ``arguments``) of a delegated
#: response, then ``answer`` said once it continued; ``interrupt``: the user's
#: words right after the delegation (no continuation expected); ``fail``: the
#: delegated response fails; ``usage``: a ``session.usage.updated`` (``true``: the
#: session's seconds so far; a number: that cumulative total, as given); ``wait``:
#: seconds; ``hangup``: the session closes (``remote_hangup``).
LIVE_SCENARIOS: dict[str, list[dict[str, Any]]] = {
    "live_search": [
        {"user": "What did I write about the garden?"},
        {"delegate": [{"name": "journal_search", "arguments": {"query": "garden"}}],
         "answer": "You wrote about the garden a few times."},
        {"usage": True},
    ],
    "live_write_and_barge_in": [
        {"user": "What is on today?"},
        {"delegate": [{"name": "calendar_today", "arguments": {}}], "answer": "Here is your day."},
        {"user": "Mark the first commitment done, and look up the boat."},
        {"delegate": [{"name": "commitments_complete",
                       "arguments": {"commitment_id": "c_first", "resolution": "done"}},
                      {"name": "journal_search", "arguments": {"query": "boat"}}],
         "interrupt": "Actually, never mind the boat."},
        {"usage": True},
    ],
    "live_failed_delegation": [
        {"user": "Search the journal."},
        {"delegate": [], "fail": True},
        {"usage": True},
    ],
    "live_hangup": [
        {"user": "Bye."},
        {"assistant": "Goodbye!"},
        {"hangup": True},
    ],
}


def attach_session_id(path: str) -> str | None:
    """The session id of an attach path (``/v1/live/sessions/{id}/attach``), else None."""
    parts = path.rstrip("/").split("/")
    if len(parts) == 6 and "/".join(parts[:4]) == LivePrefix and parts[5] == "attach" and parts[4]:
        return parts[4]
    return None


@dataclass
class _Delegated:
    """A delegated response waiting for the client's outputs."""

    delegation_id: str
    call_ids: list[str]
    continued: bool = False


@dataclass
class LiveSession:
    """One Live session: its config, its scenario's progress, what the
    client sent (for assertions), and its state."""

    session_id: str
    config: dict[str, Any]
    steps: list[dict[str, Any]]
    started_at: float
    step: int = 0
    closed: bool = False
    close_reason: str | None = None
    attaches: int = 0
    received: list[dict[str, Any]] = field(default_factory=list)
    sent: list[dict[str, Any]] = field(default_factory=list)
    nonconforming: list[str] = field(default_factory=list)
    outputs: dict[str, list[str]] = field(default_factory=dict)     # call id -> every output received
    issued: set[str] = field(default_factory=set)                   # call ids the session made
    response_creates: int = 0
    waiting: _Delegated | None = None
    delegations: int = 0
    peer: Any = None            # the browser's WebRTC peer (a media offer)
    socket: trio_websocket.WebSocketConnection | None = None
    changed: trio.Event = field(default_factory=trio.Event)

    def now_ms(self) -> int:
        return max(0, int((trio.current_time() - self.started_at) * 1000))

    def seconds(self) -> float:
        return float(int(trio.current_time() - self.started_at))

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [event for event in self.received if event.get("type") == kind]

    def declared(self) -> set[str]:
        delegation = self.config.get("delegation") or {}
        tools = (delegation.get("responses") or {}).get("tools") or []
        return {tool["name"] for tool in tools if isinstance(tool, dict) and isinstance(tool.get("name"), str)}

    def _changed(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def wait_until(self, ready: Callable[[LiveSession], bool], timeout: float = math.inf) -> bool:
        with trio.move_on_after(timeout):
            while not ready(self):
                await self.changed.wait()
            return True
        return False


class LiveSessions:
    """The simulator's Live sessions: REST, the attach sideband, their scenarios."""

    def __init__(self, scenario: str = "live_search", word_s: float = 0.05) -> None:
        self.scenario = scenario
        self.word_s = word_s          # the pace of the words said (one transcript fragment each)
        self.sessions: dict[str, LiveSession] = {}
        self.hangups: list[str] = []
        self.handshakes: list[dict[str, Any]] = []
        self._streams: dict[str, ReplayStream] = {}    # session id -> its sideband's stream (bursts)

    # ------------------------------------------------------------ REST

    def create_error(self, body: bytes) -> tuple[dict[str, Any] | None, HttpResponse | None]:
        """The create's parameters, or the 400 that refuses them."""
        try:
            params = json.loads(body or b"{}")
        except ValueError:
            return None, json_response(400, _error_body("We could not parse the JSON body of your request."))
        try:
            _CREATE.validate_python(params)
        except pydantic.ValidationError as exc:
            first = exc.errors(include_input=False, include_url=False)[0]
            loc = ".".join(str(p) for p in first.get("loc", ()))
            return None, json_response(400, _error_body(f"Invalid parameter: {loc}: {first.get('msg')}",
                                                        code="invalid_value", param=loc))
        if not isinstance(params, dict) or not str(params["transport"]["sdp"]).startswith("v="):
            return None, json_response(400, _error_body("Invalid SDP offer.", code="invalid_offer",
                                                        param="transport.sdp"))
        return params, None

    def add(self, config: dict[str, Any], scenario: str | None = None) -> LiveSession:
        """A new session playing ``scenario`` (the simulator's default when None)."""
        session_id = "live_sim_" + secrets.token_hex(12)
        session = LiveSession(session_id, config, list(LIVE_SCENARIOS[scenario or self.scenario]),
                              trio.current_time())
        self.sessions[session_id] = session
        return session

    def created(self, session: LiveSession, answer: str) -> HttpResponse:
        body = {"session": {"id": session.session_id}, "transport": {"type": "webrtc", "sdp": answer}}
        LiveCreateResponse.model_validate(body)
        return json_response(200, body)

    async def hangup(self, session_id: str) -> HttpResponse:
        session = self.sessions.get(session_id)
        if session is None:
            return json_response(404, _error_body(f"Session '{session_id}' not found.", code="session_not_found"))
        self.hangups.append(session_id)
        await self.close(session, "close_requested")
        return HttpResponse(200, b"", "application/json")

    async def close(self, session: LiveSession, reason: str) -> None:
        """The session ends: ``session.closed`` on its sideband, which its
        attach task then closes (not awaited here: a hangup is answered at once)."""
        if session.closed:
            return
        session.closed, session.close_reason = True, reason
        socket = session.socket
        if socket is not None:
            try:
                await _send(session, socket, le.session_closed(session.session_id, reason, session.seconds()))
            except trio_websocket.ConnectionClosed:
                pass
        if session.peer is not None:
            await session.peer.close()
        session._changed()

    # ------------------------------------------------------------ the sideband

    def attach_answer(self, session_id: str, key_ok: bool) -> tuple[int, dict[str, Any] | None]:
        if not key_ok:
            return 401, _error_body("Incorrect API key provided.", code="invalid_api_key")
        session = self.sessions.get(session_id)
        if session is None:
            return 404, _error_body(f"Session '{session_id}' not found.", code="session_not_found")
        if session.closed:
            return 410, _error_body(f"Session '{session_id}' has ended.", code="session_closed")
        if session.socket is not None:
            return 409, _error_body("This session already has a sideband connection.", code="conflict")
        return 101, None

    async def attach(self, session_id: str, request: trio_websocket.WebSocketRequest, key_ok: bool,
                     stream: ReplayStream | None = None) -> None:
        status, error = self.attach_answer(session_id, key_ok)
        self.handshakes.append({"session_id": session_id, "status": status})
        if status != 101:
            await request.reject(status, extra_headers=[(b"content-type", b"application/json")],
                                 body=json.dumps(error).encode())
            return
        session = self.sessions[session_id]
        socket = await request.accept()
        session.socket = socket
        if stream is not None:
            self._streams[session_id] = stream
        session.attaches += 1
        log = _log.bind(session_id=session_id)
        log.info("simulator.live_attached", attach=session.attaches, step=session.step)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read, session, socket, nursery.cancel_scope)
                nursery.start_soon(self._close_when_closed, session, socket, nursery.cancel_scope)
                await self._play(session, socket)
                await trio.sleep_forever()     # the script is over: the session stays until closed
        except trio_websocket.ConnectionClosed:
            pass
        finally:
            if session.socket is socket:
                session.socket = None
                self._streams.pop(session_id, None)
            session._changed()
            log.info("simulator.live_detached", closed=session.closed)

    async def _close_when_closed(self, session: LiveSession, socket: trio_websocket.WebSocketConnection,
                                 scope: trio.CancelScope) -> None:
        await session.wait_until(lambda s: s.closed)
        with trio.move_on_after(5):
            await socket.aclose(1000)
        scope.cancel()

    async def _read(self, session: LiveSession, socket: trio_websocket.WebSocketConnection,
                    scope: trio.CancelScope) -> None:
        try:
            while True:
                text = await socket.get_message()
                await self._received(session, socket, text)
        except trio_websocket.ConnectionClosed:
            scope.cancel()

    async def _received(self, session: LiveSession, socket: trio_websocket.WebSocketConnection,
                        text: str | bytes) -> None:
        try:
            event = json.loads(text)
        except ValueError:
            event = None
        if not isinstance(event, dict):
            session.nonconforming.append("client: not a JSON object")
            await _send(session, socket, le.error_event("invalid_json", "The event is not a JSON object."))
            return
        session.received.append(event)
        session._changed()
        kind, event_id = event.get("type"), event.get("event_id")
        reason = le.live_client_error(event)
        if kind == "session.start":
            await self._refuse(session, socket, event_id, "session_already_started",
                               "Do not send session.start on an attached sideband.")
        elif reason is not None:
            session.nonconforming.append(f"client {kind!r}: {reason}")
            await self._refuse(session, socket, event_id, "invalid_request_error", reason)
        elif kind in _CONTEXT:
            await self._context(session, socket, event)
        elif kind == "response.item.create":
            await self._output(session, socket, event)
        elif kind == "response.create":
            waiting = session.waiting
            if waiting is None or waiting.continued:
                await self._refuse(session, socket, event_id, "no_active_delegation",
                                   "No delegated response is waiting for tool results.")
            else:
                session.response_creates += 1
                waiting.continued = True
                session._changed()
        elif kind == "session.close":
            await self.close(session, "close_requested")

    async def _context(self, session: LiveSession, socket: trio_websocket.WebSocketConnection,
                       event: dict[str, Any]) -> None:
        event_id = event.get("event_id")
        if event.get("delegation_id") is not None:
            await self._refuse(session, socket, event_id, "invalid_value",
                               "Non-null delegation IDs are not accepted with Responses delegation.",
                               param="delegation_id")
        elif len(event["content"]) > CONTEXT_MAX_CHARS:
            await self._refuse(session, socket, event_id, "string_above_max_length",
                               "The content is longer than 500 tokens.", param="content")
        else:
            at = session.now_ms()
            appended: dict[str, Any] = {"type": _APPENDED[event["type"]], "event_id": f"event_{secrets.token_hex(6)}",
                                        "start_ms": at, "end_ms": at}
            if event_id is not None:
                appended["client_event_id"] = event_id
            await _send(session, socket, appended)

    async def _output(self, session: LiveSession, socket: trio_websocket.WebSocketConnection,
                      event: dict[str, Any]) -> None:
        item = event["item"]
        call_id = item.get("call_id") if isinstance(item, dict) else None
        if (not isinstance(item, dict) or item.get("type") != "function_call_output" or call_id not in session.issued
                or call_id in session.outputs):
            await self._refuse(session, socket, event.get("event_id"), "invalid_tool_call_id",
                               f"No function call waits for an output with call_id {call_id!r}.", param="item.call_id")
            return
        session.outputs[call_id] = [item["output"]]
        session._changed()

    async def _burst(self, session: LiveSession, socket: trio_websocket.WebSocketConnection,
                     events: list[dict[str, Any]]) -> None:
        """Send ``events`` in one socket write (the connection's stream corked meanwhile)."""
        stream = self._streams.get(session.session_id)
        if stream is not None:
            stream.cork()
        try:
            for event in events:
                await _send(session, socket, event)
        finally:
            if stream is not None:
                await stream.uncork()

    async def _refuse(self, session: LiveSession, socket: trio_websocket.WebSocketConnection, event_id: Any,
                      code: str, message: str, param: str | None = None) -> None:
        error = le.error_event(code, message, client_event_id=event_id if isinstance(event_id, str) else None)
        if param is not None:
            error["error"]["param"] = param
        await _send(session, socket, error)

    # ------------------------------------------------------------ the scenario

    async def _play(self, session: LiveSession, socket: trio_websocket.WebSocketConnection) -> None:
        while session.step < len(session.steps) and not session.closed:
            await self._step(session, socket, session.steps[session.step])
            session.step += 1
            session._changed()

    async def _step(self, session: LiveSession, socket: trio_websocket.WebSocketConnection,
                    step: dict[str, Any]) -> None:
        if "user" in step:
            await self._say(session, socket, le.input_delta, step["user"])
        elif "assistant" in step:
            await self._say(session, socket, le.output_delta, step["assistant"])
        elif "delegate" in step:
            await self._delegate(session, socket, step)
        elif "usage" in step:
            seconds = session.seconds() if step["usage"] is True else float(step["usage"])
            await _send(session, socket, le.usage_updated(seconds))
        elif "wait" in step:
            await trio.sleep(float(step["wait"]))
        elif "hangup" in step:
            await self.close(session, "remote_hangup")

    async def _say(self, session: LiveSession, socket: trio_websocket.WebSocketConnection,
                   make: Callable[..., dict[str, Any]], text: str) -> None:
        _voice(session, make, text, before=True)
        pace_ms = int(self.word_s * 1000)
        for word in _fragments(text):
            at = session.now_ms()
            await _send(session, socket, make(word, at, at + pace_ms))
            await trio.sleep(self.word_s)
        _voice(session, make, text, before=False)

    async def _delegate(self, session: LiveSession, socket: trio_websocket.WebSocketConnection,
                        step: dict[str, Any]) -> None:
        waiting = session.waiting
        if waiting is None:      # not a delegation rejoined mid-way: a new one
            session.delegations += 1
            n = session.delegations
            did, rid = f"del_sim_{n}", f"resp_sim_{n}_1"
            waiting = session.waiting = _Delegated(did, [f"call_sim_{n}_{i}" for i in range(len(step["delegate"]))])
            events = [le.delegation_created(did, session.now_ms()), le.nested(did, le.response_created(rid, 0))]
            seq = itertools.count(1)
            for index, (call_id, call) in enumerate(zip(waiting.call_ids, step["delegate"])):
                arguments = json.dumps(call.get("arguments", {}))
                session.issued.add(call_id)
                events += [le.nested(did, le.item_added(call_id, call["name"], index, next(seq))),
                           le.nested(did, le.arguments_done(call_id, arguments, index, next(seq))),
                           le.nested(did, le.item_done(call_id, call["name"], arguments, index, next(seq)))]
            if step.get("fail"):
                events += [le.nested(did, le.responses_error("The delegated response failed.", seq=next(seq))),
                           le.nested(did, le.response_ended(rid, "failed", next(seq)))]
            else:
                events.append(le.nested(did, le.response_ended(rid, "completed", next(seq), usage=DELEGATED_USAGE)))
            if step.get("interrupt"):
                # the user speaks over the work at once: in the same write as the
                # delegation, so the client reads both before its tools can answer
                at = session.now_ms() + 1
                events += [le.input_delta(word, at, at + 200) for word in _fragments(step["interrupt"])]
            await self._burst(session, socket, events)
        if step.get("fail"):
            session.waiting = None
            await session.wait_until(lambda s: bool(s.of_type("session.commentary.append")), CLIENT_WAIT_S)
            return
        if step.get("interrupt"):
            await session.wait_until(lambda s: all(c in s.outputs for c in waiting.call_ids), CLIENT_WAIT_S)
            session.waiting = None
            return
        answered = await session.wait_until(
            lambda s: all(c in s.outputs for c in waiting.call_ids) and waiting.continued, CLIENT_WAIT_S)
        session.waiting = None
        if answered:
            rid = f"resp_sim_{session.delegations}_2"
            await _send(session, socket, le.nested(waiting.delegation_id, le.response_created(rid)))
            await _send(session, socket, le.nested(waiting.delegation_id,
                                                   le.response_ended(rid, usage=DELEGATED_USAGE)))
            if step.get("answer"):
                await self._say(session, socket, le.output_delta, step["answer"])


def _voice(session: LiveSession, make: Callable[..., dict[str, Any]], text: str, *, before: bool) -> None:
    """The browser's peer (a media offer's) hears the assistant's words,
    spoken once said (``webrtc.Voice``, which takes Realtime's events), and
    stops at the user's (a barge-in); nothing goes on its data channel."""
    peer = session.peer
    if peer is None:
        return
    if make is le.output_delta:
        peer.voice_event({"type": "output_audio_buffer.started"} if before else
                         {"type": "response.output_audio_transcript.done", "transcript": text})
    elif before:
        peer.voice_event({"type": "input_audio_buffer.speech_started"})


def _fragments(text: str) -> list[str]:
    words = text.split(" ")
    return [word if i == 0 else " " + word for i, word in enumerate(words)]


async def _send(session: LiveSession, socket: trio_websocket.WebSocketConnection, event: dict[str, Any]) -> None:
    reason = le.live_server_error(event)
    if reason is not None:
        session.nonconforming.append(f"server {event.get('type')!r}: {reason}")
    session.sent.append(event)
    await socket.send_message(json.dumps(event))


def _error_body(message: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "code": code, "param": param}}
