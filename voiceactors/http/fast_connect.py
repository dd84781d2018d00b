"""``POST /api/voice/connect``'s common case answered at the ASGI layer, without Quart.

Why: a connect is the costliest request the server gets in numbers (a
capacity step's join, a burst), and Quart's request machinery (its request
context, the werkzeug request and headers, the hooks, routing, ``jsonify``,
the response object, ``finalize_request``) was about a millisecond of a
connect's ~6 ms of CPU. The route itself is
synchronous for a plain connect (``Runtime.connect_now``, ``brain_now``, the
key kept in memory), so the whole answer can be given from the ASGI scope.

Which requests: ``POST /api/voice/connect`` (the path Quart routes, in any
spelling of the target: ``targets.py``) whose body is exactly
``{"call_id": "<valid id>"}`` (declared JSON, a ``Content-Length`` within the
body limit, no ``Transfer-Encoding`` or ``Expect``), that every guard lets
through (the Host and Origin check, the browser guard, the bearer token when
one is required, the rate limit) and that the runtime can answer (a key
configured, ``connect_now`` answering in its step or, with a shared registry
— ``--redis``, every worker —, ``connect_leased`` in the request's task, the
call's lease won there). Those get what Quart would
give (the same status, body, headers, ``http.request`` line and metric).
Everything else — a context, a greeting, credentials, a refusal of any
guard, bad JSON, a config that cannot be read — is
handed to Quart untouched (the body's messages replayed), so every error
and refusal keeps its one implementation there. The rate limit's token is
taken only once it is certain this path answers (given back if
the supervisor declines), so a connect never draws two. Redis not answering
gives the route's 503 (``registry_down``), the same bytes.

``tests/test_fast_connect.py`` sends every kind of request both ways (this
path on and off) and compares the answers, and pins the app's request hooks
this path stands in for (a new guard must be added here too).

Below hypercorn (``FirstReadConnect``, asked by ``serving.py`` at accept as
the early 429 is): a plain connect whole in its connection's first read is
answered without hypercorn's connection either.
"""

from __future__ import annotations

import contextvars
import json
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import h11
import structlog
import trio

from voiceactors import config, metrics
from voiceactors.call.call_context import LinkedContext
from voiceactors.messages import ConnectOutcome
from voiceactors.http import auth, in_flight
from voiceactors.http.errors import AT_CAPACITY, REFUSED_UNREAD, REGISTRY_DOWN, RUNTIME_UNAVAILABLE
from voiceactors.http.hosts import HostPolicy, host_refusal
from voiceactors.http.ratelimit import RateLimiter, TokenFailures, bucket_key, client_address
from voiceactors.http.request_ids import request_id_for
from voiceactors.http.routes import CALL_ID_RE
from voiceactors.http.targets import scope_path, target_path
from voiceactors.logs import get_logger
from voiceactors.settings import Settings

CONNECT_PATH = "/api/voice/connect"
#: the request headers read here; a request repeating one of them goes to Quart
_READ = frozenset({b"host", b"origin", b"sec-fetch-site", b"content-type", b"content-length", b"transfer-encoding",
                   b"expect", b"authorization", b"x-request-id"})
_CONNECTED_BODY = b'{"status":"connected"}\n'    # Quart's jsonify of the route's answer, byte for byte

_log = get_logger(actor="http")

Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
#: a reply: its status, its headers (as the app sends them, before the server's own) and its body
Reply = tuple[int, list[tuple[bytes, bytes]], bytes]
#: what the route answers for each outcome but "connected" (Quart's ``ApiError``s, the same bytes)
_REFUSALS = {ConnectOutcome.AT_CAPACITY: (503, AT_CAPACITY), ConnectOutcome.REGISTRY_DOWN: (503, REGISTRY_DOWN)}


@dataclass(frozen=True)
class _Asking:
    """A plain connect past every check, its rate-limit token taken: what
    the supervisor is asked and how the answer is logged."""

    runtime: Any
    call_id: str
    context: LinkedContext
    key: Any                 # the rate limit's bucket (None: not limited)
    request_id: str
    started: float


def _json_body(value: Any) -> bytes:
    """What Quart's ``jsonify`` writes (compact, not ASCII-escaped, a newline)."""
    return (json.dumps(value, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


class FastConnect:
    """The plain connect's answer for one app: ``serve`` answers it, or
    returns the messages it read for Quart to be given again."""

    def __init__(self, settings: Settings, voice: Any, limiter: RateLimiter, failures: TokenFailures) -> None:
        self._settings = settings
        self._voice = voice                 # routes.VoiceState: the live runtime
        self._hosts = HostPolicy.from_settings(settings)
        self._limiter = limiter
        self._failures = failures
        self._token_required = auth.token_required(settings)

    def wants(self, scope: Any) -> bool:
        return scope.get("method") == "POST" and scope_path(scope) == CONNECT_PATH and self.can_answer()

    def can_answer(self) -> bool:
        """The runtime answers a connect in its step (``connect_now``) or,
        with a shared registry (``--redis``), in the request's task
        (``connect_leased``: the lease's await in it); asked first."""
        runtime = self._voice.runtime
        return runtime is not None and runtime.brain_now is not None and (
            runtime.connect_now is not None or runtime.connect_leased is not None)

    def in_step(self) -> bool:
        """The answer comes in the caller's step (no shared registry)."""
        runtime = self._voice.runtime
        return runtime is not None and runtime.connect_now is not None

    async def serve(self, scope: Any, receive: Receive, send: Send) -> list[Any] | None:
        """Answer the request (None), or hand it on: the messages read from
        ``receive`` so far, to be replayed to Quart (an empty list: none)."""
        started = trio.current_time()
        headers = self._headers(scope)
        if headers is None or not self._passes_guards(scope, headers):
            return []
        length = int(headers[b"content-length"])
        read: list[Any] = []
        body = b""
        while True:
            message = await receive()
            read.append(message)
            if message.get("type") != "http.request":
                return read
            body += message.get("body", b"")
            if len(body) > length:
                return read
            if not message.get("more_body", False):
                break
        reply = self._reply(scope, headers, body, started) if self.in_step() else (
            await self._reply_leased(scope, headers, body, started))
        if reply is None:
            return read
        status, response_headers, response_body = reply
        await send({"type": "http.response.start", "status": status, "headers": response_headers})
        await send({"type": "http.response.body", "body": response_body, "more_body": False})
        return None

    def answer_now(self, scope: Any, body: bytes) -> Reply | None:
        """The whole request in hand (``scope`` and its ``body``): its reply,
        given in this step, or None for the usual way (nothing done)."""
        started = trio.current_time()
        headers = self._headers(scope)
        if headers is None or not self._passes_guards(scope, headers):
            return None
        return self._reply(scope, headers, body, started)

    async def answer_leased(self, scope: Any, body: bytes) -> Reply | None:
        """``answer_now`` with a shared registry: the lease won in this task
        (its request ids bound only while it is asked)."""
        started = trio.current_time()
        headers = self._headers(scope)
        if headers is None or not self._passes_guards(scope, headers):
            return None
        return await self._reply_leased(scope, headers, body, started)

    def _reply(self, scope: Any, headers: dict[bytes, bytes], body: bytes, started: float) -> Reply | None:
        asking = self._asking(scope, headers, body, started) if self.in_step() else None
        if asking is None:
            return None
        structlog.contextvars.bind_contextvars(request_id=asking.request_id)
        return self._settled(asking, asking.runtime.connect_now(asking.call_id, asking.context))

    async def _reply_leased(self, scope: Any, headers: dict[bytes, bytes], body: bytes,
                            started: float) -> Reply | None:
        asking = self._asking(scope, headers, body, started)
        if asking is None:
            return None
        connect_leased = asking.runtime.connect_leased
        with structlog.contextvars.bound_contextvars(request_id=asking.request_id):
            answer = await connect_leased(asking.call_id, asking.context) if connect_leased is not None else None
            return self._settled(asking, answer)

    def _headers(self, scope: Any) -> dict[bytes, bytes] | None:
        """The request headers this path reads (names lower-cased, as the
        ASGI scope gives them); None when one of them is repeated or the
        request is not a plain JSON body of a declared length."""
        seen: dict[bytes, bytes] = {}
        for name, value in scope.get("headers", ()):
            name = bytes(name).lower()
            if name in _READ:
                if name in seen:
                    return None
                seen[name] = bytes(value)
        if b"transfer-encoding" in seen or b"expect" in seen:
            return None
        length = seen.get(b"content-length", b"").strip()
        if not length.isdigit() or not 0 < int(length) <= self._settings.body_limit:
            return None
        if not auth.declared_json(seen.get(b"content-type", b"").decode("latin-1")):
            return None
        return seen

    def _passes_guards(self, scope: Any, headers: dict[bytes, bytes]) -> bool:
        """Every guard Quart's hooks run would let it through (hosts.py,
        auth.py, ratelimit.py: here as questions, nothing taken)."""
        host = headers.get(b"host")
        host_text = host.decode("latin-1") if host is not None else None
        origin = headers.get(b"origin")
        if host_refusal(self._hosts, host_text, origin.decode("latin-1") if origin is not None else None,
                        scope.get("server")) is not None:
            return False
        if auth.foreign_fetch(headers.get(b"sec-fetch-site", b"").decode("latin-1")) is not None:
            return False
        if self._token_required:
            authorization = headers.get(b"authorization")
            if not auth.authorized(self._settings, authorization.decode("latin-1") if authorization else None):
                return False       # the console's cookie may stand in: Quart's hook decides
            if self._failures.locked_for(client_address(scope)) > 0:
                return False       # locked out by its refused tokens: Quart's hook answers 429
        key = bucket_key(scope)
        return key is None or self._limiter.wait_for(key) <= 0

    def _asking(self, scope: Any, headers: dict[bytes, bytes], body: bytes, started: float) -> _Asking | None:
        """The route's checks for a plain connect, in one step, and its
        rate-limit token taken; None (nothing done, nothing taken) when
        Quart must answer."""
        call_id = _plain_call_id(body) if len(body) == int(headers[b"content-length"]) else None
        runtime = self._voice.runtime
        if call_id is None or runtime is None or runtime.brain_now is None:
            return None
        try:
            if not config.openai_api_key(self._settings):
                return None
        except config.ConfigUnreadable:
            return None            # Quart's route logs it and answers 503
        key = bucket_key(scope)
        if key is not None and self._limiter.take(key) > 0:
            return None
        request_id = request_id_for(headers.get(b"x-request-id", b"").decode("latin-1"))
        brain = runtime.brain_now()
        return _Asking(runtime, call_id, LinkedContext(brain.instruction if brain.ready else None, None, False),
                       key, request_id, started)

    def _settled(self, asking: _Asking, answer: ConnectOutcome | None) -> Reply | None:
        """The reply for the supervisor's ``answer``: its status, headers and
        body; None when the supervisor declined (not serving: Quart's route
        asks its inbox), the token given back."""
        if answer is None:
            if asking.key is not None:
                self._limiter.give_back(asking.key)
            return None
        call_id, request_id, started = asking.call_id, asking.request_id, asking.started
        if answer == ConnectOutcome.CONNECTED:
            status, body = 200, _CONNECTED_BODY
        elif answer in _REFUSALS:
            status, error = _REFUSALS[answer]
            body = _json_body({"error": error})
        else:
            _log.error("http.connect_unexpected_reply", call_id=call_id, reply=str(answer)[:64])
            status, body = 500, _json_body({"error": RUNTIME_UNAVAILABLE})
        response_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if status in REFUSED_UNREAD:
            response_headers.append((b"connection", b"close"))
        response_headers += [(b"x-request-id", request_id.encode()), (b"cache-control", b"no-store")]
        metrics.http_request(CONNECT_PATH, status)
        _log.info("http.request", method="POST", path=CONNECT_PATH, status=status,
                  duration_ms=round((trio.current_time() - started) * 1000, 1), request_id=request_id)
        return status, response_headers, body


def _plain_call_id(body: bytes) -> str | None:
    """The call id of a body that is exactly ``{"call_id": "<valid id>"}``, else None."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or len(value) != 1:
        return None
    call_id = value.get("call_id")
    if not isinstance(call_id, str) or not CALL_ID_RE.fullmatch(call_id.strip()):
        return None
    return call_id.strip()


def replaying(read: list[Any], receive: Receive) -> Receive:
    """``receive`` with the messages already read given first, in order."""
    pending = list(read)

    async def replay() -> Any:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay


ServerHeaders = Callable[[], list[tuple[bytes, bytes]]]


class FirstReadConnect:
    """A plain connect answered from its connection's first read, below
    hypercorn (``serving.serve_connection``): the request parsed by h11
    (as hypercorn parses it), answered by the app's ``FastConnect`` in this
    step, and written as hypercorn would write it (its ``date``/``server``
    headers, ``Connection: close`` when the client asked for it). Anything
    it does not answer (another request, more or less than one whole
    HTTP/1.1 request in the read, a request ``FastConnect`` hands on, a
    connection from a trusted proxy, the app at its in-flight cap) goes to
    hypercorn as it came. Why: hypercorn's connection (three tasks, h11 both
    ways, its ASGI stream) was ~a third of a plain connect's CPU once Quart
    was out of it."""

    def __init__(self, app: Any, server_headers: ServerHeaders) -> None:
        self._app = app                     # its ``fast_connect`` answers (None: this is off too)
        self._server_headers = server_headers

    def watching(self, address: str) -> bool:
        """Whether a connection from ``address`` is worth reading first (per
        accept: no read for a server that cannot answer a connect, nor for a
        trusted proxy's connection)."""
        fast: FastConnect | None = getattr(self._app, "fast_connect", None)
        proxies = getattr(self._app, "trusted_proxies", None)
        return fast is not None and fast.can_answer() and not (proxies and proxies.trusts(address))

    async def answer(self, peer: Any, local: Any, data: bytes) -> tuple[bytes, bool] | None:
        """The response's bytes and whether to close after them, or None.
        Without a shared registry in this step; with one (``--redis``) the
        lease is won in this task, counted in the app's requests in flight
        meanwhile, as hypercorn's request would be."""
        if _posted_path(data) != CONNECT_PATH:
            return None
        app = self._app
        fast: FastConnect | None = getattr(app, "fast_connect", None)
        if fast is None or not fast.can_answer():
            return None
        proxies = getattr(app, "trusted_proxies", None)
        if in_flight.full(app) or (proxies and proxies.trusts(str(peer[0]))):
            return None
        parsed = _one_request(data)
        if parsed is None:
            return None
        request, body = parsed
        scope = {"type": "http", "http_version": "1.1", "method": "POST", "path": CONNECT_PATH,
                 "headers": list(request.headers), "client": tuple(peer[:2]), "server": tuple(local[:2])}
        if fast.in_step():
            # its own context: the request_id bound for its log line stays out of the connection's task
            reply = contextvars.copy_context().run(fast.answer_now, scope, body)
        else:
            with in_flight.counted(app):
                reply = await fast.answer_leased(scope, body)
        if reply is None:
            return None
        status, headers, response_body = reply
        close = any(token.strip().lower() == b"close"
                    for name, value in request.headers if name == b"connection" for token in value.split(b","))
        lines = [b"HTTP/1.1 %d " % status]
        lines += [name + b": " + value for name, value in (*headers, *self._server_headers())]
        if close:
            lines.append(b"Connection: close")       # what h11 adds for a client that asked to close
        return b"\r\n".join(lines) + b"\r\n\r\n" + response_body, close


def _posted_path(data: bytes) -> str | None:
    """The routed path (``targets.py``) of the POST whose request line
    starts ``data``; None for any other method or a line not all here."""
    if not data.startswith(b"POST "):
        return None
    end = data.find(b" ", 5)
    return target_path(data[5:end]) if end > 5 else None


def _one_request(data: bytes) -> tuple[h11.Request, bytes] | None:
    """``data`` as exactly one whole HTTP/1.1 request and its body, read by
    h11 as hypercorn reads it; None for anything else (h11's errors too)."""
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
    return request, body
