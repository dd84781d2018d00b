"""A local stand-in for the OpenAI Realtime API surface voiceactors uses.

One port serves REST (``POST /v1/realtime/client_secrets``,
``POST /v1/realtime/calls`` and ``.../calls/{id}/hangup``; a SIP call's
``.../accept``, ``.../reject`` and ``.../refer``) and the sideband
websocket (``/v1/realtime?call_id=...``), and Live sessions
(``POST /v1/live/sessions``, their hangup and attach sideband: ``live.py``). Calls play scenarios (see
``docs/simulator.md``) and record what the client sent for assertions.

Run it inside a test's nursery::

    sim = Simulator(scenario="single_tool", api_key="sk-test")
    port = await nursery.start(sim.serve, 0)
    sim.add_call("rtc_test_1")
    ... connect to sim.base_url ...
    assert sim.calls["rtc_test_1"].response_creates == 1

All timing uses ``trio.sleep``, so scenarios run under ``autojump_clock``.
"""

from __future__ import annotations

import json
import secrets
import time
from email import policy as email_policy
from email.parser import BytesParser
from typing import Annotated, Any, Union, cast

import httpx
import pydantic
import trio
import trio_websocket
from openai.types.realtime import RealtimeSessionCreateRequest, RealtimeTranscriptionSessionCreateRequest
from pydantic import Field, TypeAdapter

from voiceactors.logs import get_logger, register_secret
from voiceactors.simulator.call import CallSession, ResponseRecord, SessionSocket, SimCall, ToolCallRecord
from voiceactors.simulator.conformance import enabled_by_env as conformance_by_env
from voiceactors.simulator.live import LivePrefix, LiveSession, LiveSessions, attach_session_id
from voiceactors.simulator.http import (HttpRequest, HttpResponse, ReplayStream, json_response, open_listeners,
                                        serve_http)
from voiceactors.simulator.phone import delivery, dtmf_event, incoming_event, phone_call_view, sip_headers
from voiceactors.simulator.phone import post as post_delivery
from voiceactors.simulator.refusal_errors import Refusal
from voiceactors.simulator.scenario import Scenario, ScenarioError, as_scenario, load_scenario, scenario_names
from voiceactors.simulator.tool_source import ToolSource
from voiceactors.simulator.webrtc import (OPEN_TIMEOUT_S, LoopThread, WebRTCOfferError, WebRTCPeer, WebRTCUnavailable,
                                          find_speaker, is_media_offer)

__all__ = ["Simulator"]     # the package's __init__ is the one list of what it offers

_log = get_logger(actor="simulator")

# mypy does not read this Annotated union as a TypeForm; the adapter's type is written out
# (incremental runs disagree with cold ones on whether the ignore is used, hence unused-ignore too)
_SESSION: TypeAdapter[RealtimeSessionCreateRequest | RealtimeTranscriptionSessionCreateRequest] = TypeAdapter(
    Annotated[Union[RealtimeSessionCreateRequest, RealtimeTranscriptionSessionCreateRequest],  # type: ignore[arg-type, maybe-unrecognized-str-typeform, unused-ignore]
              Field(discriminator="type")]
)

_FAKE_SDP = "v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=voiceactors-simulator\r\nt=0 0\r\n"


def _error_body(message: str, type_: str = "invalid_request_error", code: str | None = None,
                param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "code": code, "param": param}}


_CALLS_PATH = "/v1/realtime/calls"
_SIP_CONTROLS = ("accept", "reject", "refer")
#: the simulator's own control of its phone calls (not OpenAI's API): ``voiceactors phone-call``
_PHONE_CONTROL = "/v1/simulator/phone-calls"


def _cors_headers(req: HttpRequest) -> list[tuple[str, str]]:
    """CORS for a browser page on another origin (the console): the simulator
    is a local test stand-in, so it allows whichever origin asks."""
    origin = req.headers.get("origin")
    if not origin:
        return []
    headers = [("access-control-allow-origin", origin), ("vary", "Origin"),
               ("access-control-expose-headers", "Location")]
    if req.method == "OPTIONS":
        headers += [("access-control-allow-methods", "POST, OPTIONS"),
                    ("access-control-allow-headers", "Authorization, Content-Type"),
                    ("access-control-max-age", "600")]
        if req.headers.get("access-control-request-private-network", "").lower() == "true":
            headers.append(("access-control-allow-private-network", "true"))
    return headers


def _parse_offer(req: HttpRequest) -> tuple[str, dict[str, Any] | None]:
    """(offer SDP, session or None) from the browser's ``application/sdp``
    body or the SDK's ``multipart/form-data`` (parts ``sdp`` and
    ``session``). Raises ValueError with the reason (the SDP must start
    with ``v=``)."""
    content_type = req.headers.get("content-type", "")
    kind = content_type.split(";", 1)[0].strip().lower()
    session: dict[str, Any] | None = None
    if kind == "multipart/form-data":
        head = f"Content-Type: {content_type}\r\n\r\n".encode("latin-1", "replace")
        message = BytesParser(policy=email_policy.HTTP).parsebytes(head + req.body)
        if not message.is_multipart():
            raise ValueError("The multipart body could not be parsed.")
        # decode=True: a part's payload as bytes (None when empty)
        parts = {part.get_param("name", header="content-disposition"): cast(bytes, part.get_payload(decode=True) or b"")
                 for part in message.iter_parts()}
        if "sdp" not in parts:
            raise ValueError("Missing required parameter: 'sdp'.")
        sdp = parts["sdp"].decode("utf-8", "replace")
        if "session" in parts:
            try:
                raw = json.loads(parts["session"])
            except ValueError:
                raise ValueError("The 'session' part is not JSON.") from None
            try:
                session = _SESSION.validate_python(raw).model_dump(mode="json", exclude_none=True)
            except pydantic.ValidationError as exc:
                first = exc.errors(include_input=False, include_url=False)[0]
                loc = ".".join(str(p) for p in first.get("loc", ()))
                raise ValueError(f"Invalid session: {loc}: {first.get('msg')}") from None
    else:
        # application/sdp, as the browser sends it; any other type is read as
        # SDP too (curl's default form type, in docs/operations.md)
        sdp = req.body.decode("utf-8", "replace")
    if not sdp.lstrip().startswith("v="):
        raise ValueError("The SDP offer is not valid: it must start with 'v='.")
    return sdp, session


def _bearer(headers: dict[str, str]) -> str | None:
    value = headers.get("authorization", "")
    if value[:7].lower() != "bearer ":
        return None
    return value[7:].strip() or None


class Simulator:
    """The simulated service. ``scenario`` (name, path, object or Scenario) is
    the default for calls added without one; ``api_key`` is the one standard
    key accepted (None accepts any non-``ek_`` key); ``auto_calls`` lets any
    call id join (for the CLI); ``gone_status`` (404 or 410) answers joins of
    ended calls; ``host`` is where ``serve`` listens.

    ``speech``: a browser call's replies are spoken by ``espeak-ng`` where
    it is installed (False: always the tone).

    For benchmarks: ``validate_sent=False`` skips validating every sent event
    against the SDK's models (most of the simulator's own CPU per event; keep
    it on in tests, where it catches simulator bugs); ``timestamps=True``
    records ``SimCall.sent_at`` / ``received_at``; ``coalesce_writes=False``
    sends every server event as its own websocket frame in its own socket
    write on a TCP_NODELAY socket (the default writes everything queued for
    a connection in one write: cheaper for the simulator, kinder to the
    peer than the real service).

    ``conformance``: hold every event sent and received to the SDK's types
    exactly (strict types, no undeclared field; ``simulator/conformance.py``),
    recording each that fails in ``SimCall.nonconforming`` and process-wide;
    None (the default) reads ``VOICEACTORS_SIM_CONFORMANCE``.

    ``live_scenario``: what a new Live session plays (``live.LIVE_SCENARIOS``)."""

    def __init__(self, scenario: Any = None, api_key: str | None = "sk-test", *, auto_calls: bool = False,
                 gone_status: int = 404, host: str = "127.0.0.1", validate_sent: bool = True,
                 timestamps: bool = False, speech: bool = True, coalesce_writes: bool = True,
                 conformance: bool | None = None, live_scenario: str = "live_search") -> None:
        self.scenario = as_scenario(scenario)
        # None: the environment decides (the test suite's runs can turn it on for every simulator)
        self.conformance = conformance_by_env() if conformance is None else conformance
        self.coalesce_writes = coalesce_writes
        self.speech = speech                           # a browser call's replies spoken by espeak-ng, when installed
        self.validate_sent = validate_sent
        self.timestamps = timestamps
        self.api_key = api_key
        self.auto_calls = auto_calls
        self.gone_status = gone_status
        self.host = host
        self.port: int | None = None
        self.calls: dict[str, SimCall] = {}
        self.client_secret_requests: list[dict[str, Any]] = []
        self.minted: list[str] = []
        self.hangups: list[str] = []
        self.handshakes: list[dict[str, Any]] = []        # every sideband handshake: call_id, status
        self._mint_faults: list[int | str] = []
        self._nursery: trio.Nursery | None = None      # while serving: runs the browser calls' peers
        self._webrtc: LoopThread | None = None         # aiortc's asyncio thread, started by the first offer
        self.peers: dict[str, WebRTCPeer] = {}         # call_id -> its browser peer
        # a slow MCP tool source whose pace the calls' ``slow_tool`` steps set (tool_source.py)
        self.tool_source: ToolSource | None = None
        self.live = LiveSessions(live_scenario)          # Live sessions (simulator/live.py)
        register_secret(api_key)

    # -- running

    @property
    def base_url(self) -> str:
        """``http://host:port/v1`` (after ``serve`` has started)."""
        if self.port is None:
            raise RuntimeError("simulator not started: await nursery.start(sim.serve, 0) first")
        return f"http://{self.host}:{self.port}/v1"

    async def serve(self, port: int = 0, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled; ``task_status.started(bound_port)``. Raises
        ``OSError`` when the port cannot be bound. Cancelling drops every open
        connection (clients see an abnormal close)."""

        listeners, bound = await open_listeners(self.host, port)
        await self.serve_listeners(listeners, bound, task_status=task_status)

    async def serve_listeners(self, listeners: list[trio.SocketListener], bound: int, *,
                              task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """``serve`` on listeners already open (``http.open_listeners``), so a
        caller can report a port it cannot bind before anything starts."""
        self.port = bound
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await nursery.start(serve_http, self._rest, self._websocket, listeners)
                _log.info("simulator.listening", url=self.base_url)
                task_status.started(bound)
        finally:
            self._nursery = None
            with trio.CancelScope(shield=True):
                await self._stop_webrtc()

    # -- set-up and control

    def add_call(self, call_id: str, scenario: Any = None, *, gone_status: int | None = None) -> SimCall:
        """Register ``call_id`` as joinable (playing ``scenario``, else the
        simulator's default). Returns its record (also ``sim.calls[call_id]``)."""
        chosen = self.scenario if scenario is None else as_scenario(scenario)
        call = SimCall(call_id, chosen, gone_status or self.gone_status, timestamps=self.timestamps)
        call.tool_source = self.tool_source
        self.calls[call_id] = call
        return call

    def fail_next_mint(self, status: int | str = 500, times: int = 1) -> None:
        """Make the next ``times`` client-secret requests fail: an HTTP status
        (OpenAI-shaped error body), ``"timeout"`` (never answer),
        ``"garbage"`` (200 with a non-JSON body) or ``"lone_surrogate"`` (200,
        a secret whose value carries the escape ``\\udc80``)."""
        self._mint_faults.extend([status] * times)

    async def end_call(self, call_id: str, code: int = 1000) -> None:
        """End a call as the service does (hangup, 60-minute limit): the live
        sideband closes with ``code``; later joins get the gone status."""
        call = self.calls[call_id]
        call.closed = True
        call.close_code = code
        call.notify()
        if call.connection is not None:
            await call.connection.end(code)

    def drop(self, call_id: str) -> None:
        """Drop the call's live sideband without a close frame (client sees 1006)."""
        call = self.calls[call_id]
        if call.connection is not None:
            call.connection.drop()

    def drop_on_next_output(self, call_id: str, *, applied: bool = False) -> None:
        """Drop the call's sideband (no close frame: the client sees 1006) when
        its next ``function_call_output`` arrives, before it is confirmed with
        ``conversation.item.added``. ``applied=False``: the service never got
        it (recorded in ``call.lost_outputs``; the call id stays pending, so a
        resend is accepted). ``applied=True``: it was applied, only the
        confirmation was lost (recorded in ``call.outputs`` and answered, so a
        resend meets ``duplicate_tool_call_output``). Fires once."""
        self.calls[call_id].output_fault = "applied" if applied else "lost"

    def reject_next_response_create(self, call_id: str, times: int = 1) -> None:
        """Answer the call's next ``times`` ``response.create`` events with
        ``conversation_already_has_active_response`` (echoing their
        ``event_id``) even when no response is active, as the service does
        for a response whose ``response.created`` the client never saw.
        Refused events still count in ``call.response_creates``."""
        self.calls[call_id].reject_creates += times

    def refuse_next(self, call_id: str, event: str, code: str, *, times: int = 1, type_: str | None = None,
                    message: str | None = None, echo_event_id: bool = True) -> None:
        """Refuse the call's next ``times`` client events that ``event``
        matches (a client event type, ``"function_call_output"`` or
        ``"any"``) with an ``error`` of ``code``, unapplied: the scenario
        step ``refuse`` (``refusals.py``, docs/simulator.md § Refusals)."""
        self.calls[call_id].refusals.append(Refusal(event, code, times, type_, message, echo_event_id))

    async def expire_session(self, call_id: str, *, close: int = 1001, close_after_s: float = 0.0) -> None:
        """The call's session hits the service's cap now (the scenario step
        ``session_cap``): ``error`` ``session_expired``, every client event
        refused with it, then the sideband closes with ``close``."""
        call = self.calls[call_id]
        if call.connection is None:
            call.expired = True
            await self.end_call(call_id, close)
            return
        await call.connection.expire(close, close_after_s)

    async def inject(self, call_id: str, message: str | bytes | dict[str, Any]) -> None:
        """Send a raw message on the call's live sideband, unvalidated (for
        tests of malformed or unknown events). No-op when not connected."""
        call = self.calls[call_id]
        session = call.connection
        if session is None:
            return
        data = json.dumps(message) if isinstance(message, dict) else message
        await session.send_raw(data)

    # -- REST

    def _standard_key_ok(self, key: str | None) -> bool:
        if not key or key.startswith("ek_"):
            return False
        return self.api_key is None or key == self.api_key

    async def _rest(self, req: HttpRequest) -> HttpResponse:
        path = req.path.rstrip("/")
        if path == _PHONE_CONTROL or path.startswith(_PHONE_CONTROL + "/"):
            return await self._phone_control(req, path)
        if path == _CALLS_PATH or path.startswith(_CALLS_PATH + "/"):
            response = await self._calls_rest(req, path)
            response.headers.extend(_cors_headers(req))
            return response
        return await self._rest_post(req, path)

    async def _calls_rest(self, req: HttpRequest, path: str) -> HttpResponse:
        if req.method == "OPTIONS":
            return HttpResponse(204, b"", "text/plain")   # a CORS preflight (headers added by _rest)
        if req.method == "POST" and path == _CALLS_PATH:
            return await self._create_call(req)
        return await self._rest_post(req, path)

    async def _rest_post(self, req: HttpRequest, path: str) -> HttpResponse:
        parts = path.split("/")
        if req.method != "POST":
            return json_response(404, _error_body(f"Invalid URL ({req.method} {req.path})"))
        key = _bearer(req.headers)
        if not self._standard_key_ok(key):
            return json_response(401, _error_body("Incorrect API key provided.", code="invalid_api_key"))
        if path == "/v1/realtime/client_secrets":
            return await self._client_secrets(req)
        if len(parts) == 6 and parts[:4] == ["", "v1", "realtime", "calls"] and parts[5] == "hangup":
            return await self._hangup(parts[4])
        if len(parts) == 6 and parts[:4] == ["", "v1", "realtime", "calls"] and parts[5] in _SIP_CONTROLS:
            return await self._sip_control(parts[4], parts[5], req)
        if path == LivePrefix:
            return await self._create_live(req)
        if len(parts) == 6 and "/".join(parts[:4]) == LivePrefix and parts[5] == "hangup":
            return await self.live.hangup(parts[4])
        return json_response(404, _error_body(f"Invalid URL (POST {req.path})"))

    async def _create_live(self, req: HttpRequest) -> HttpResponse:
        """``POST /v1/live/sessions`` (``live.create``, simulator/live.py): a
        media offer is answered by a WebRTC peer, as for a Realtime call."""
        params, refused = self.live.create_error(req.body)
        if refused is not None:
            return refused
        assert params is not None
        session = self.live.add(params["session"])
        offer, answer = params["transport"]["sdp"], _FAKE_SDP
        if is_media_offer(offer):
            try:
                session.peer, answer = await self._answer_offer(session.session_id, offer)
            except WebRTCUnavailable as exc:
                del self.live.sessions[session.session_id]
                return json_response(501, _error_body(str(exc), type_="server_error", code="webrtc_unavailable"))
            except WebRTCOfferError as exc:
                del self.live.sessions[session.session_id]
                return json_response(400, _error_body(str(exc), code="invalid_offer"))
            self.peers[session.session_id] = session.peer
            assert self._nursery is not None
            self._nursery.start_soon(self._run_live_peer, session)
        _log.info("simulator.live_created", session_id=session.session_id, media=session.peer is not None)
        return self.live.created(session, answer)

    async def _run_live_peer(self, session: LiveSession) -> None:
        """A Live session's browser peer: the session's close closes it; the
        browser leaving ends the session (``remote_hangup``)."""
        peer = session.peer
        async with trio.open_nursery() as nursery:
            async def close_when_closed() -> None:
                await session.wait_until(lambda s: s.closed)
                await peer.close()
                nursery.cancel_scope.cancel()

            nursery.start_soon(close_when_closed)
            await peer.closed.wait()
            if peer.closed_by != "local":
                await self.live.close(session, "remote_hangup")
            nursery.cancel_scope.cancel()

    async def _client_secrets(self, req: HttpRequest) -> HttpResponse:
        fault: int | str | None = None
        if self._mint_faults:
            fault = self._mint_faults.pop(0)
            if fault == "timeout":
                await trio.sleep_forever()
            if fault == "garbage":
                return HttpResponse(200, b"<html>upstream hiccup", "text/html")
            if fault != "lone_surrogate":
                return json_response(int(fault), _error_body("The server had an error.", "server_error"))
        try:
            body = json.loads(req.body or b"{}")
        except ValueError:
            return json_response(400, _error_body("We could not parse the JSON body of your request."))
        if not isinstance(body, dict):
            return json_response(400, _error_body("The request body must be a JSON object."))
        record = {"body": body, "at": trio.current_time(), "status": 400}
        self.client_secret_requests.append(record)
        unknown = sorted(set(body) - {"expires_after", "session"})
        if unknown:
            return json_response(400, _error_body(f"Unknown parameter: '{unknown[0]}'.",
                                                  code="unknown_parameter", param=unknown[0]))
        seconds = 600
        expires = body.get("expires_after")
        if expires is not None:
            asked = expires.get("seconds", 600) if isinstance(expires, dict) else None
            anchor = expires.get("anchor", "created_at") if isinstance(expires, dict) else None
            if anchor != "created_at" or not isinstance(asked, int) or not 10 <= asked <= 7200:
                return json_response(400, _error_body(
                    "expires_after must be {anchor: created_at, seconds: 10..7200}.",
                    code="invalid_value", param="expires_after"))
            seconds = asked
        session_in = body.get("session", {"type": "realtime"})
        try:
            session = _SESSION.validate_python(session_in)
        except pydantic.ValidationError as exc:
            first = exc.errors(include_input=False, include_url=False)[0]
            loc = ".".join(str(p) for p in first.get("loc", ()))
            return json_response(400, _error_body(f"Invalid session: {loc}: {first.get('msg')}",
                                                  code="invalid_value", param=f"session.{loc}".rstrip(".")))
        value = "ek_" + secrets.token_hex(16) + ("\udc80" if fault == "lone_surrogate" else "")
        register_secret(value)
        self.minted.append(value)
        record["status"] = 200
        expires_at = int(time.time()) + seconds
        out_session = {**session.model_dump(mode="json", exclude_none=True), "id": "sess_" + secrets.token_hex(8),
                       "object": "realtime.session" if session.type == "realtime" else "realtime.transcription_session",
                       "expires_at": 0}
        return json_response(200, {"value": value, "expires_at": expires_at, "session": out_session})

    async def _create_call(self, req: HttpRequest) -> HttpResponse:
        """The browser's WebRTC offer (``POST /v1/realtime/calls``): registers a
        new call with the default scenario. A real offer (media sections) gets
        a real answer from a WebRTC peer (``simulator_webrtc``; 501 without the
        webrtc extra); a signalling-only one (``v=0`` alone) a placeholder SDP."""
        key = _bearer(req.headers)
        if not key or not (key in self.minted or self._standard_key_ok(key)):
            return json_response(401, _error_body("Incorrect API key provided.", code="invalid_api_key"))
        try:
            offer, session = _parse_offer(req)
        except ValueError as exc:
            return json_response(400, _error_body(str(exc), code="invalid_offer"))
        call_id = "rtc_sim_" + secrets.token_hex(12)
        answer, peer = _FAKE_SDP, None
        if is_media_offer(offer):
            try:
                peer, answer = await self._answer_offer(call_id, offer)
            except WebRTCUnavailable as exc:
                _log.info("simulator.webrtc_offer", outcome="unavailable", status=501)
                return json_response(501, _error_body(str(exc), type_="server_error", code="webrtc_unavailable"))
            except WebRTCOfferError as exc:
                _log.info("simulator.webrtc_offer", outcome="invalid", status=400)
                return json_response(400, _error_body(str(exc), code="invalid_offer"))
            _log.info("simulator.webrtc_offer", outcome="answered", status=201, call_id=call_id)
        call = self.add_call(call_id)
        if session is not None:
            call.session = session
        if peer is not None:
            call.peer = peer
            self.peers[call_id] = peer
            assert self._nursery is not None
            self._nursery.start_soon(self._run_peer, call, peer)
        headers = [("location", f"/v1/realtime/calls/{call_id}")]
        return HttpResponse(201, answer.encode(), "application/sdp", headers)

    # -- WebRTC (browser calls)

    async def _answer_offer(self, call_id: str, offer: str) -> tuple[WebRTCPeer, str]:
        if self._nursery is None:
            raise WebRTCUnavailable("the simulator is not serving")
        if self._webrtc is None:
            self._webrtc = LoopThread()
        speaker = find_speaker() if self.speech else None
        return await WebRTCPeer.answer(self._webrtc, call_id, offer, speaker=speaker)

    async def _run_peer(self, call: SimCall, peer: WebRTCPeer) -> None:
        """A browser call's peer for its life: client events from its data
        channel go to the live sideband session; the call's end closes the
        peer; the browser leaving (channel closed, connection failed) ends
        the call like a hangup."""
        log = _log.bind(call_id=call.call_id)

        async def close_when_call_ends() -> None:
            await call.wait_until(lambda c: c.closed)
            await peer.close()

        async def give_up_unopened() -> None:
            with trio.move_on_after(OPEN_TIMEOUT_S):
                await peer.channel_open.wait()
                return
            log.info("simulator.webrtc_open_timeout", after_s=OPEN_TIMEOUT_S)
            peer.closed_by = "open_timeout"
            await self.end_call(call.call_id, 1000)   # and so the peer closes

        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._peer_inbox, call, peer)
            nursery.start_soon(close_when_call_ends)
            nursery.start_soon(give_up_unopened)
            await peer.closed.wait()
            nursery.cancel_scope.cancel()
        log.info("simulator.webrtc_closed", closed_by=peer.closed_by, channel_events=peer.channel_sent)
        if peer.closed_by == "remote" and not call.closed:
            await self.end_call(call.call_id, 1000)
        await peer.close()

    async def _peer_inbox(self, call: SimCall, peer: WebRTCPeer) -> None:
        async for raw in peer.inbox:
            try:
                obj = json.loads(raw)
            except ValueError:
                obj = None
            if isinstance(obj, dict):
                call.channel_received.append(obj)
            session = call.connection
            if session is None:
                event_id = obj.get("event_id") if isinstance(obj, dict) else None
                peer.channel_error("The simulator plays a call only while its sideband is joined.",
                                   "sideband_not_joined", event_id if isinstance(event_id, str) else None)
                continue
            await session.handle_client_message(raw)

    async def _stop_webrtc(self) -> None:
        """Close every peer and stop aiortc's thread (bounded)."""
        if self._webrtc is None:
            return
        with trio.move_on_after(5.0):
            async with trio.open_nursery() as nursery:
                for peer in self.peers.values():
                    nursery.start_soon(peer.close)
        loop, self._webrtc = self._webrtc, None
        await trio.to_thread.run_sync(loop.stop)

    async def _hangup(self, call_id: str) -> HttpResponse:
        call = self.calls.get(call_id)
        if call is None or call.closed:
            return json_response(404, _error_body(f"Call '{call_id}' not found.", code="call_id_not_found"))
        self.hangups.append(call_id)
        await self.end_call(call_id, 1000)
        return HttpResponse(200, b"", "application/json")

    # -- phone calls (SIP)

    def place_phone_call(self, scenario: Any = None) -> SimCall:
        """A call to the project's SIP address, pending until a client
        accepts it (``POST …/calls/{id}/accept``) or rejects it; its webhook is
        ``simulator.phone.delivery(incoming_event(call.call_id, headers), secret)``."""
        call = self.add_call("rtc_sip_" + secrets.token_hex(12), scenario)
        call.sip = True
        return call

    async def send_dtmf(self, call_id: str, keys: str) -> None:
        """The caller presses ``keys`` on the keypad: one
        ``input_audio_buffer.dtmf_event_received`` each on the live sideband."""
        for key in keys:
            await self.inject(call_id, dtmf_event(key))

    async def place_and_deliver(self, server_url: str, secret: str, caller: str | None, *,
                                asserted: str | None = None, headers: list[tuple[str, str]] | None = None,
                                scenario: Any = None) -> tuple[SimCall, int, Any]:
        """Place a phone call from ``caller`` (None: withheld) and post its
        signed webhook to ``server_url``: (the call, the answer's status, its JSON body or text)."""
        call = self.place_phone_call(scenario)
        event = incoming_event(call.call_id, sip_headers(caller, asserted=asserted, extra=headers))
        answer = await post_delivery(server_url, delivery(event, secret))
        try:
            body: Any = answer.json()
        except ValueError:
            body = answer.text[:500]
        _log.info("simulator.phone_call_placed", call_id=call.call_id, webhook_status=answer.status_code)
        return call, answer.status_code, body

    async def _phone_control(self, req: HttpRequest, path: str) -> HttpResponse:
        """``POST /v1/simulator/phone-calls`` (place a call and post its
        webhook), ``GET …/{id}`` (what became of it), ``POST …/{id}/dtmf``
        (the caller presses keys)."""
        if not self._standard_key_ok(_bearer(req.headers)):
            return json_response(401, _error_body("Incorrect API key provided.", code="invalid_api_key"))
        parts = path[len(_PHONE_CONTROL):].strip("/").split("/") if path != _PHONE_CONTROL else []
        try:
            body = json.loads(req.body or b"{}") if req.method == "POST" else {}
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return json_response(400, _error_body("The request body must be a JSON object."))
        if req.method == "POST" and not parts:
            server, secret, caller = body.get("server"), body.get("secret"), body.get("from")
            extra = body.get("headers") or []
            if not isinstance(server, str) or not isinstance(secret, str) or not (caller is None or isinstance(caller, str)):
                return json_response(400, _error_body("server, secret (strings) and from (a number or null) are required."))
            if not isinstance(extra, list) or not all(isinstance(h, list) and len(h) == 2 for h in extra):
                return json_response(400, _error_body("headers must be a list of [name, value] pairs."))
            try:
                scenario = load_scenario(body["scenario"]) if body.get("scenario") else None
            except ScenarioError as exc:
                return json_response(400, _error_body(str(exc)))
            try:
                placed, status, answer = await self.place_and_deliver(
                    server, secret, caller, asserted=body.get("asserted"), scenario=scenario,
                    headers=[(str(n), str(v)) for n, v in extra])
            except httpx.HTTPError as exc:
                return json_response(502, _error_body(f"The server could not be reached: {type(exc).__name__}."))
            return json_response(200, {"call_id": placed.call_id, "webhook": {"status": status, "answer": answer}})
        call = self.calls.get(parts[0]) if parts else None
        if call is None or not call.sip:
            return json_response(404, _error_body("No such phone call.", code="call_id_not_found"))
        if req.method == "GET" and len(parts) == 1:
            return json_response(200, phone_call_view(call))
        if req.method == "POST" and parts[1:] == ["dtmf"] and isinstance(body.get("keys"), str):
            await self.send_dtmf(call.call_id, body["keys"])
            return json_response(200, phone_call_view(call))
        return json_response(404, _error_body(f"Invalid URL ({req.method} {req.path})"))

    async def _sip_control(self, call_id: str, action: str, req: HttpRequest) -> HttpResponse:
        """accept / reject / refer of a SIP call (the standard key checked by the caller)."""
        call = self.calls.get(call_id)
        if call is None or not call.sip or call.closed:
            return json_response(404, _error_body(f"Call '{call_id}' not found.", code="call_id_not_found"))
        try:
            body = json.loads(req.body or b"{}")
        except ValueError:
            return json_response(400, _error_body("We could not parse the JSON body of your request."))
        if not isinstance(body, dict):
            return json_response(400, _error_body("The request body must be a JSON object."))
        pending = call.accepted is None
        if action == "accept":
            if not pending:
                return json_response(409, _error_body("This call was already accepted.", code="conflict"))
            try:
                session = _SESSION.validate_python(body)
            except pydantic.ValidationError as exc:
                first = exc.errors(include_input=False, include_url=False)[0]
                loc = ".".join(str(p) for p in first.get("loc", ()))
                return json_response(400, _error_body(f"Invalid session: {loc}: {first.get('msg')}",
                                                      code="invalid_value", param=loc))
            call.accepted = body
            call.session = session.model_dump(mode="json", exclude_none=True)
            _log.info("simulator.sip_accepted", call_id=call_id)
            return HttpResponse(200, b"", "application/json")
        if action == "reject":
            if not pending:
                return json_response(409, _error_body("An accepted call cannot be rejected.", code="conflict"))
            status = body.get("status_code", 603)
            if not isinstance(status, int) or not 400 <= status <= 699:
                return json_response(400, _error_body("status_code must be a SIP status 400..699.",
                                                      code="invalid_value", param="status_code"))
            call.rejected_with = status
            _log.info("simulator.sip_rejected", call_id=call_id, status=status)
            await self.end_call(call_id, 1000)
            return HttpResponse(200, b"", "application/json")
        target = body.get("target_uri")
        if pending or not isinstance(target, str) or not target.startswith(("sip:", "sips:", "tel:")):
            return json_response(400, _error_body("target_uri must be a sip: or tel: URI of an accepted call.",
                                                  code="invalid_value", param="target_uri"))
        call.referred_to = target
        _log.info("simulator.sip_referred", call_id=call_id)
        await self.end_call(call_id, 1000)      # the caller is transferred: the session ends
        return HttpResponse(200, b"", "application/json")

    # -- websocket

    def _check_handshake(self, meta: HttpRequest) -> tuple[int, dict[str, Any] | None, SimCall | None]:
        """(status, error body, call): status 101 means accept."""
        key = _bearer(meta.headers)
        call_id = meta.query.get("call_id", "")
        if meta.path.rstrip("/") != "/v1/realtime":
            return 404, _error_body(f"Invalid URL (GET {meta.path})"), None
        refused = self.key_refusal(key, call_id)
        if refused is not None:
            return *refused, None
        if "openai-beta" in meta.headers:
            return 400, _error_body("The OpenAI-Beta header selects the beta protocol; "
                                    "this simulator speaks GA only.", code="beta_header"), None
        if "model" in meta.query:
            return 400, _error_body("Do not pass model= when joining a call.", code="unknown_parameter",
                                    param="model"), None
        if not call_id:
            return 400, _error_body("Missing call_id.", code="missing_required_parameter", param="call_id"), None
        return self.join_answer(call_id)

    def key_refusal(self, key: str | None, call_id: str) -> tuple[int, dict[str, Any]] | None:
        """Why a sideband join of ``call_id`` with bearer ``key`` is refused
        for its key (status, error body), or None when the key may join."""
        if key is None:
            return 401, _error_body("Missing bearer authentication.", code="invalid_api_key")
        if key.startswith("ek_"):
            # an ephemeral key cannot join a call's sideband: the call is not found for it
            return 404, _error_body(f"Call '{call_id}' not found.", code="call_id_not_found")
        if not self._standard_key_ok(key):
            return 401, _error_body("Incorrect API key provided.", code="invalid_api_key")
        return None

    def join_answer(self, call_id: str) -> tuple[int, dict[str, Any] | None, SimCall | None]:
        """The answer to a sideband join of ``call_id`` by a key that may
        join: (status, error body, call), 101 to accept. Also what an
        in-memory sideband (``call/memory_transport.py``) is answered in tests."""
        call = self.calls.get(call_id)
        if call is None and self.auto_calls:
            call = self.add_call(call_id)
        if call is None:
            return 404, _error_body(f"Call '{call_id}' not found.", code="call_id_not_found"), None
        if call.sip and call.accepted is None and not call.closed:
            return 404, _error_body(f"Call '{call_id}' has not been accepted.", code="call_id_not_found"), call
        if call.closed:
            code = "call_id_not_found" if call.gone_status == 404 else "call_ended"
            return call.gone_status, _error_body(f"Call '{call_id}' has ended.", code=code), call
        if call.connection is not None and not call.supersede_sideband:
            return 409, _error_body("This call already has a sideband connection.", code="conflict"), call
        return 101, None, call

    def session_for(self, call: SimCall, socket: SessionSocket,
                    stream: ReplayStream | None = None) -> CallSession:
        """The session serving ``call`` on a newly accepted connection
        (``socket``: what ``CallSession`` reads and writes), with this
        simulator's checks; a sideband the call still has is superseded."""
        if call.connection is not None and call.supersede_sideband:
            call.connection.supersede()
        return CallSession(call, socket, call.scenario, validate_sent=self.validate_sent, stream=stream,
                           coalesce_writes=self.coalesce_writes, conformance=self.conformance)

    async def _websocket(self, request: trio_websocket.WebSocketRequest, meta: HttpRequest) -> None:
        live_session = attach_session_id(meta.path)
        if live_session is not None:     # a Live session's attach sideband (simulator/live.py)
            await self.live.attach(live_session, request, self._standard_key_ok(_bearer(meta.headers)), meta.stream)
            return
        status, error, call = self._check_handshake(meta)
        call_id = meta.query.get("call_id", "")
        self.handshakes.append({"call_id": call_id, "status": status})
        log = _log.bind(call_id=call_id)
        if status != 101:
            log.info("simulator.connection", outcome="rejected", status=status)
            await request.reject(status, extra_headers=[(b"content-type", b"application/json")],
                                 body=json.dumps(error).encode())
            return
        assert call is not None
        ws = await request.accept()
        session = self.session_for(call, ws, meta.stream)
        log.info("simulator.connection", outcome="accepted", connection=call.connections + 1,
                 scenario=call.scenario.name, step=call.step_index)
        await session.run()
        log.info("simulator.connection_ended", ended_by=session.ended_by, peer_close=session.peer_close,
                 close_code=call.close_code if session.ended_by == "close" else None)

