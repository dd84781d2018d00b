"""``/api/voice/connect``: every request to it answered here, in one place.

Why here, at the ASGI layer, and not as a Quart route: a connect is the
costliest request the server gets in numbers (a capacity step's join, a
burst), and Quart's request machinery (its request context, the werkzeug
request and headers, the hooks, routing, ``jsonify``, the response object,
``finalize_request``) was about a millisecond of a connect's ~6 ms of CPU.
So ``ConnectHandler`` is the route: every method, every body, every
refusal. What it shares with the app is declared once elsewhere:

* the guards: the app's one ordered list (``guards.py``: body limit, Host
  and Origin, browser guard, token, rate limit), the list Quart's request
  hook applies to every other request;
* the answers' shapes: ``ApiError`` and the messages of ``errors.py``,
  ``jsonify``'s bytes (``errors.json_body``), the ``Connection: close`` of a
  refusal given before the body was read (``errors.REFUSED_UNREAD``), the
  ``X-Request-Id`` and ``Cache-Control`` every API answer carries, its
  ``http.request`` line and metric;
* the route's pieces (``routes.json_object``, ``call_id_of``,
  ``openai_key``, ``linked.py``, ``mcp_credentials.py``).

Two transports bring it requests; neither decides anything:

* hypercorn's: ``asgi.ClosingHTTPConnection`` hands it every request to
  the path (after the requests-in-flight cap and the early 429, as for
  every request);
* a connection's first read, below hypercorn (``FirstReadConnect``, asked
  by ``serving.py`` at accept as the early 429 is): a ``POST`` to the path
  whole in that read is parsed by h11 as hypercorn parses it, given to the
  app's ASGI callable as hypercorn would give it, and the app's answer is
  written as hypercorn writes it (h11's rules, its ``date``/``server``
  headers).
  Why: hypercorn's connection (three tasks, h11 both ways, its ASGI
  stream) was about a third of a plain connect's CPU once Quart was out of
  it.

``tests/test_connect_handler.py`` holds the answers (status, headers, body,
log line, metric) Quart's route gave, recorded, for every kind of request,
and checks them through both transports.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Mapping
from urllib.parse import unquote

import h11
import structlog
import trio

from voiceactors import voice_config, metrics, tracing
from voiceactors.agents import CallAgents
from voiceactors.call.call_context import LinkedContext
from voiceactors.messages import BrainState, Connect, ConnectOutcome, GetBrain
from voiceactors.http import continuation, guards, linked, mcp_credentials
from voiceactors.http.errors import (AT_CAPACITY, INTERNAL, REFUSED_UNREAD, REGISTRY_DOWN, RUNTIME_UNAVAILABLE,
                                     TOO_LARGE, ApiError, json_body, status_message)
from voiceactors.http.request_ids import request_id_for
from voiceactors.http.routes import (QUICK_ASK_S, VoiceState, ask_actor, call_agents, call_id_of, json_object,
                                     openai_key, read_config)
from voiceactors.http.targets import target_path
from voiceactors.logs import get_logger
from voiceactors.runtime import Runtime
from voiceactors.settings import Settings

CONNECT_PATH = "/api/voice/connect"
#: the methods the route takes (any other: 405), as the OpenAPI document lists them
METHODS = frozenset({"POST"})
#: the metric's route label of a request to the path with another method (Quart's: no rule matched)
UNMATCHED = "unmatched"
_CONNECTED_BODY = json_body({"status": "connected"})

_log = get_logger(actor="http")

Receive = Callable[[], Awaitable[Mapping[str, Any]]]
Send = Callable[[Mapping[str, Any]], Awaitable[None]]
#: the supervisor's answers but "connected", as the route's ``ApiError``s
_REFUSALS = {ConnectOutcome.AT_CAPACITY: (503, AT_CAPACITY), ConnectOutcome.REGISTRY_DOWN: (503, REGISTRY_DOWN)}


class ConnectHandler:
    """The connect route, an ASGI callable for every request to ``CONNECT_PATH``."""

    def __init__(self, voice: VoiceState, checks: tuple[guards.Guard, ...], body_timeout_s: float) -> None:
        self._voice = voice                  # the settings and the live runtime
        self.guards = checks                 # the app's, the list Quart's hook applies (guards.declared)
        self._body_limit = voice.settings.body_limit
        self._body_timeout_s = body_timeout_s

    async def __call__(self, scope: Mapping[str, Any], receive: Receive, send: Send) -> None:
        started = trio.current_time()
        inbound = guards.ScopeInbound(scope)
        method = inbound.method
        request_id = request_id_for(inbound.header("x-request-id") or "")
        with structlog.contextvars.bound_contextvars(request_id=request_id), \
                tracing.span("http.request", **{"http.request.method": method[:16],
                                                "http.route": CONNECT_PATH}) as span:
            try:
                guards.check(self.guards, inbound)
                if method not in METHODS:
                    raise ApiError(405, status_message(405), {"Allow": ", ".join(sorted(METHODS))})
                body = await self._body(receive)
                if body is None:
                    return                   # the client went away: no answer (Quart's request was cancelled)
                status, answer, extra = 200, await self._connect(body), {}
            except ApiError as error:
                status, answer, extra = error.status, json_body({"error": error.message}), error.headers
            except Exception as error:  # noqa: BLE001 - the detail is logged; the client learns it failed
                _log.error("http.unhandled_error", error_type=type(error).__name__, exc_info=error)
                status, answer, extra = 500, json_body({"error": INTERNAL}), {}
            metrics.http_request(CONNECT_PATH if method in METHODS else UNMATCHED, status)
            if span is not None:
                span.set_attribute("http.response.status_code", status)
            _log.info("http.request", method=method, path=inbound.path, status=status,
                      duration_ms=round((trio.current_time() - started) * 1000, 1), request_id=request_id)
        await send({"type": "http.response.start", "status": status,
                    "headers": _headers(status, len(answer), extra, request_id)})
        await send({"type": "http.response.body", "body": answer, "more_body": False})

    async def _body(self, receive: Receive) -> bytes | None:
        """The request body (413 past the body limit, 408 after the app's
        body timeout, as Quart's request raises them); None when the client
        disconnected first."""
        body = b""
        with trio.move_on_after(self._body_timeout_s):
            while True:
                message = await receive()
                if message.get("type") != "http.request":
                    return None
                body += bytes(message.get("body", b""))
                if len(body) > self._body_limit:
                    raise ApiError(413, TOO_LARGE)
                if not message.get("more_body", False):
                    return body
        raise ApiError(408, status_message(408))

    async def _connect(self, raw: bytes) -> bytes:
        """The answer's body for a connect whose guards passed: the call
        started (or already live), or the ``ApiError`` that says why not."""
        settings = self._voice.settings
        body = json_object(raw, required=True)
        call_id = call_id_of(body.get("call_id"))
        greeting, requested = linked.body_greeting(body), linked.body_context(body)
        credentials = mcp_credentials.credentials_of(body)
        continues = continuation.body_continues(body)
        earlier = await continuation.ended_call(continues, settings)
        openai_key(settings)
        runtime = self._voice.runtime
        if runtime is None:
            raise ApiError(500, RUNTIME_UNAVAILABLE)
        link = await linked.verified(requested, settings)
        continued = await continuation.continuation(continues, earlier, runtime)
        call_context = LinkedContext(await _base_instruction(runtime), link, greeting,
                                     session=read_config(voice_config.session_settings, settings),
                                     continuation=continued, agents=await _agents(settings, runtime))
        if credentials is not None:
            await mcp_credentials.open_call(runtime, call_id, credentials)
        answer = await supervisor_answer(runtime, self._voice.settings.connect_timeout_s, call_id, call_context)
        if answer in _REFUSALS:
            raise ApiError(*_REFUSALS[answer])
        if answer != ConnectOutcome.CONNECTED:
            _log.error("http.connect_unexpected_reply", call_id=call_id, reply=str(answer)[:64])
            raise ApiError(500, RUNTIME_UNAVAILABLE)
        if link is None and continued is None:
            return _CONNECTED_BODY
        return json_body({"status": "connected", **linked.context_view(link),
                          **continuation.continuation_view(continued)})



async def supervisor_answer(runtime: Runtime, connect_timeout_s: float, call_id: str,
                            call_context: LinkedContext) -> Any:
    """The supervisor's answer to a call to start (the connect's, and the
    phone webhook's once it accepted a call): in this step when it can
    (``Runtime.connect_now``), with a shared registry in this task
    (``connect_leased``: the lease's await), else asked through its inbox."""
    answer = runtime.connect_now(call_id, call_context) if runtime.connect_now is not None else None
    if answer is None and runtime.connect_leased is not None:
        answer = await runtime.connect_leased(call_id, call_context)
    if answer is not None:
        return answer
    try:
        return await ask_actor(runtime.calls, lambda r: Connect(call_id, r, context=call_context),
                               connect_timeout_s + QUICK_ASK_S)
    except trio.TooSlowError:
        _log.error("http.connect_timed_out", call_id=call_id)
        raise ApiError(500, RUNTIME_UNAVAILABLE) from None


async def _agents(settings: Settings, runtime: Runtime) -> CallAgents:
    """The call's agents and the session's full tool list (the MCP sources'
    asked of the hub only when there are sources), for its handoffs."""
    sources = await mcp_credentials.source_tools(runtime, settings.tool_name_style) if runtime.mcp is not None else []
    return call_agents(settings, sources)


async def _base_instruction(runtime: Runtime) -> str | None:
    """The brain's current instruction for a new call's ``session.update``s
    (selection, linked context); None when there is none yet (never waits).
    Read in this step (``Runtime.brain_now``: what ``GetBrain`` would answer
    at once), not asked: an ask per connect was two scheduler turns and a
    channel, a measurable share of a connect's CPU."""
    if runtime.brain_now is not None:
        brain: BrainState = runtime.brain_now()
        return brain.instruction if brain.ready else None
    try:
        brain = await ask_actor(runtime.brain, GetBrain, QUICK_ASK_S)
    except (trio.TooSlowError, ApiError):
        return None
    return brain.instruction if brain.ready else None


def _headers(status: int, length: int, extra: Mapping[str, str], request_id: str) -> list[tuple[bytes, bytes]]:
    """An API answer's headers as Quart sends them: its own, the error's,
    ``Connection: close`` for a refusal before the body was read
    (``errors.py``), then the request id and ``Cache-Control``
    (``app.py``'s ``_finish``)."""
    headers = [(b"content-type", b"application/json"), (b"content-length", str(length).encode())]
    headers += [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in extra.items()]
    if status in REFUSED_UNREAD:
        headers.append((b"connection", b"close"))
    headers += [(b"x-request-id", request_id.encode("latin-1")), (b"cache-control", b"no-store")]
    return headers


# --- below hypercorn ------------------------------------------------------------

ServerHeaders = Callable[[], list[tuple[bytes, bytes]]]
AsgiApp = Callable[[Mapping[str, Any], Receive, Send], Awaitable[None]]


class FirstReadConnect:
    """A transport for ``POST /api/voice/connect`` whole in its connection's
    first read, below hypercorn (``serving.serve_connection`` asks it): the
    request parsed by h11 as hypercorn parses it, given to ``app`` (its
    ASGI callable, the same that hypercorn calls) with the scope hypercorn
    would make, and the app's answer written as hypercorn writes it through
    h11 (``answer_bytes``; ``server_headers``: its ``date`` and ``server``). Anything else —
    another request, more or less than one whole HTTP/1.1 request in the
    read, a connection from a trusted proxy (its peer is not its client:
    ``forwarded.py``) — goes to hypercorn as it came. Only the connect is
    taken: it is the request whose CPU counts (a burst of joins), and
    nothing of its answer streams."""

    def __init__(self, app: Any, server_headers: ServerHeaders) -> None:
        self._app = app
        self._server_headers = server_headers

    def watching(self, address: str) -> bool:
        """Whether a connection from ``address`` is worth reading first (per accept)."""
        proxies = getattr(self._app, "trusted_proxies", None)
        return not (proxies and proxies.trusts(address))

    async def answer(self, peer: Any, local: Any, data: bytes) -> tuple[bytes, bool] | None:
        """The response's bytes and whether to close after them, or None
        (hypercorn serves the connection, ``data`` included)."""
        if _posted_path(data) != CONNECT_PATH or not self.watching(str(peer[0])):
            return None
        parsed = _one_request(data)
        if parsed is None:
            return None
        connection, request, body = parsed
        messages: list[Mapping[str, Any]] = []
        await self._app(_scope(request, peer, local), _received(body), _kept_in(messages))
        start = next((m for m in messages if m.get("type") == "http.response.start"), None)
        if start is None:
            return b"", True                 # no answer (not one this app gives): the connection ends
        body = b"".join(bytes(m.get("body", b"")) for m in messages if m.get("type") == "http.response.body")
        headers = [*start.get("headers", ()), *self._server_headers()]
        return answer_bytes(connection, int(start["status"]), headers, body)


def _scope(request: h11.Request, peer: Any, local: Any) -> dict[str, Any]:
    """The ASGI scope hypercorn makes of ``request`` (``HTTPStream.handle``)."""
    path, _, query = request.target.partition(b"?")
    return {"type": "http", "http_version": "1.1", "asgi": {"spec_version": "2.1", "version": "3.0"},
            "method": request.method.decode("ascii"), "scheme": "http", "path": unquote(path.decode("ascii")),
            "raw_path": path,
            "query_string": query, "root_path": "", "headers": list(request.headers), "client": tuple(peer[:2]),
            "server": tuple(local[:2]), "extensions": {"http.response.trailers": {}}}


def _received(body: bytes) -> Receive:
    """The app's ``receive``: the whole body, then a disconnect."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> Mapping[str, Any]:
        return pending.pop() if pending else {"type": "http.disconnect"}
    return receive


def _kept_in(messages: list[Mapping[str, Any]]) -> Send:
    async def send(message: Mapping[str, Any]) -> None:
        messages.append(message)
    return send


def answer_bytes(connection: h11.Connection, status: int, headers: list[tuple[bytes, bytes]],
             body: bytes) -> tuple[bytes, bool]:
    """What h11 writes for a fixed-length answer to the request
    ``connection`` has read, and whether the connection closes after it.
    h11's rules: a client that asked to close gets its ``connection`` tokens
    (keep-alive dropped, close added) as ``Connection`` headers last; a
    ``connection: close`` of the app's closes too. Written here rather than
    by ``h11.Connection.send``: its header validation was a measurable share
    of a connect's CPU (``tests/test_connect_handler.py`` compares the two)."""
    tokens = {token.strip().lower() for name, value in headers if name.lower() == b"connection"
              for token in value.split(b",") if token.strip()}
    if connection.their_state is h11.MUST_CLOSE:          # the client asked to close
        kept = [(name, value) for name, value in headers if name.lower() != b"connection"]
        headers = kept + [(b"Connection", token) for token in sorted((tokens - {b"keep-alive"}) | {b"close"})]
        tokens.add(b"close")
    head = b"".join(b"%s: %s\r\n" % (name, value) for name, value in headers)
    return b"HTTP/1.1 %d \r\n%s\r\n%s" % (status, head, body), b"close" in tokens


def _posted_path(data: bytes) -> str | None:
    """The routed path (``targets.py``) of the POST whose request line
    starts ``data``; None for any other method or a line not all here."""
    if not data.startswith(b"POST "):
        return None
    end = data.find(b" ", 5)
    return target_path(data[5:end]) if end > 5 else None


def _one_request(data: bytes) -> tuple[h11.Connection, h11.Request, bytes] | None:
    """``data`` as exactly one whole HTTP/1.1 request and its body, read by
    h11 as hypercorn reads it (the connection, ready to answer it); None
    for anything else (h11's errors too)."""
    connection = h11.Connection(h11.SERVER)
    try:
        connection.receive_data(data)
        request = connection.next_event()
        if not isinstance(request, h11.Request) or request.http_version != b"1.1":
            return None
        body = b""
        while True:
            event = connection.next_event()
            if isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            else:
                return None             # not all here
    except h11.RemoteProtocolError:
        return None
    if connection.trailing_data[0]:
        return None                     # another request behind it: hypercorn serves them in order
    return connection, request, body
