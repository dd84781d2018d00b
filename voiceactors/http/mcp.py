"""``/mcp``: the journal's tools over MCP Streamable HTTP, on the voice server (the
protocol server itself is ``voiceactors.mcp.server``).

The SDK's ``StreamableHTTPSessionManager`` serves the protocol, stateless
(no ``Mcp-Session-Id``: every POST stands alone, so nothing is kept per
client between requests) with JSON responses (no SSE stream). Its task
group must be running before a request arrives: ``McpEndpoint.running()``
is entered inside the app's runtime (``http/app.py``), so the serving
lifespan's bounded shutdown joins it, and it stops before the executor
does. Until then, and after, requests answer 503 ``voice runtime
unavailable``. A failure inside the SDK is kept there: logged, the manager
replaced a second later, the runtime untouched.

In front of the SDK, the guards of ``/api/voice/*``, in the app's order,
each answering ``{"error": "..."}`` with the app's strings:

1. a declared body over ``body_limit``: 413 ``request body too large``;
2. ``Host`` not one of ours: 421; an ``Origin`` not our own: 403
   (DNS rebinding, ``http/hosts.py``);
3. a browser's ``Sec-Fetch-Site: cross-site`` (or ``same-site``: another
   origin of this site): 403; any method but POST:
   405 ``method not allowed`` (a stateless server has no stream to open
   with GET and no session to end with DELETE; the SDK would hold a GET
   open until the client left); a POST not declared JSON: 415;
4. the bearer token where one is required (``http/auth.py``: off loopback,
   or whenever configured): 401 with ``WWW-Authenticate: Bearer`` and
   parameters that say which token (``TOKEN_CHALLENGE``); a wrong one
   draws from the client's token-failure bucket, the app's (shared with
   every route and the sign-in), and a client over it is answered 429
   with ``Retry-After`` before its token is compared;
5. the client's rate (``mcp_rate_limit_per_s``, one token per request, a
   bucket per client address, ``http/ratelimit.py``): 429 with
   ``Retry-After``. This stands in for the voice calls' per-turn bound;
6. a body that streams past ``body_limit``: 413.

Answers given before the body was read close the connection (the rest of
the body is still on the wire). The console's session cookie does not stand
in for the token here: MCP clients are programs, not the console's browser.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from typing import Any, AsyncIterator, Awaitable, Callable, MutableMapping

import trio
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from voiceactors import metrics, tracing
from voiceactors.http import auth
from voiceactors.http.errors import (
    NOT_JSON_CONTENT,
    RATE_LIMITED,
    RUNTIME_UNAVAILABLE,
    TOO_LARGE,
    UNAUTHORIZED,
)
from voiceactors.http.hosts import HostPolicy, host_refusal
from voiceactors.http.ratelimit import RateLimiter, TokenFailures, client_address, retry_after
from voiceactors.logs import get_logger
from voiceactors.mcp.server.tool_server import build_server
from voiceactors.mcp.server.tools import ExecutorInbox, ToolCaller
from voiceactors.settings import Settings

MCP_PATH = "/mcp"
METHOD_NOT_ALLOWED = "method not allowed"     # the app's 405 message (http/errors.py)
RESTART_AFTER_S = 1.0      # after the SDK's task group failed, until the next one starts
# This server takes a fixed API token and has no OAuth server. The realm and
# description say which token, for a person reading the response or a client
# that shows it. They do not stop a client from looking for OAuth (MCP
# Inspector 2.x does on any 401 whatever this header says): the paths it looks
# at answer 404 with ``errors.NO_OAUTH``, which names the token too.
TOKEN_CHALLENGE = ('Bearer realm="voiceactors", error_description="this server takes its API token '
                   '(VOICEACTORS_API_TOKEN) as the bearer token; it has no OAuth server"')

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_log = get_logger(actor="mcp")


def header(scope: Scope, name: bytes) -> str | None:
    """The first ``name`` header of ``scope`` (lower-case name), or None."""
    for key, value in scope.get("headers") or ():
        if key == name:
            return bytes(value).decode("latin-1")
    return None


class Refusal(Exception):
    """A guard's answer: ``status`` with ``{"error": message}``."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None, *,
                 unread: bool = True) -> None:
        super().__init__(message)
        self.status, self.message, self.headers, self.unread = status, message, headers or {}, unread


class McpEndpoint:
    """The ``/mcp`` ASGI app (see the module docstring). ``inbox`` answers
    the live ToolExecutor's inbox, or None while no runtime is up."""

    def __init__(self, settings: Settings, inbox: Callable[[], ExecutorInbox | None],
                 failures: TokenFailures) -> None:
        self.settings = settings
        self.failures = failures
        self.hosts = HostPolicy.from_settings(settings)
        self.token_required = auth.token_required(settings)
        self.limiter = RateLimiter(settings.mcp_rate_limit_burst, settings.mcp_rate_limit_per_s,
                                   settings.rate_limit_clients)
        self.server = build_server(ToolCaller(settings, inbox))
        self._manager: StreamableHTTPSessionManager | None = None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Serve requests for the block. The SDK's task group runs in a task
        of the block's own nursery whose boundary turns a failure into a log
        line: the block is the runtime's (``http/app.py``), and an error
        escaping the SDK must not cancel the actors and their live calls."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self._serve)
            try:
                yield
            finally:
                nursery.cancel_scope.cancel()

    async def _serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run session managers until cancelled: one after another, since a
        manager runs once; after a failure (logged ``mcp.failed``) requests
        answer 503 until the next one is up, ``RESTART_AFTER_S`` later."""
        started = False
        try:
            while True:
                manager = StreamableHTTPSessionManager(self.server, json_response=True, stateless=True,
                                                       max_request_body_size=self.settings.body_limit)
                try:
                    async with manager.run():
                        self._manager = manager
                        _log.info("mcp.serving", path=MCP_PATH, token_required=self.token_required)
                        if not started:
                            started = True
                            task_status.started()
                        await trio.sleep_forever()
                except Exception as error:  # noqa: BLE001 - logged; /mcp answers 503 meanwhile
                    _log.error("mcp.failed", error_type=type(error).__name__, exc_info=error)
                finally:
                    self._manager = None
                if not started:
                    started = True
                    task_status.started()
                await trio.sleep(RESTART_AFTER_S)
        finally:
            self._manager = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_id = uuid.uuid4().hex
        started = trio.current_time()
        status = 0
        span = tracing.start("http.request", **{"http.request.method": str(scope.get("method"))[:16],
                                                "http.route": MCP_PATH})

        async def send_with_headers(message: Message) -> None:
            nonlocal status
            if message.get("type") == "http.response.start":
                status = int(message["status"])
                message["headers"] = [*message.get("headers", ()), (b"cache-control", b"no-store"),
                                      (b"x-request-id", request_id.encode("ascii"))]
            await send(message)

        try:
            self._guard(scope)
            body = await self._read_body(receive)
            manager = self._manager
            if manager is None:
                raise Refusal(503, RUNTIME_UNAVAILABLE, {"Retry-After": "1"}, unread=False)
            await manager.handle_request(scope, _replay(body, receive), send_with_headers)
        except Refusal as refusal:
            await _answer(send_with_headers, refusal)
        finally:
            # status None: no answer was sent (the request was cancelled, e.g. at shutdown)
            if status:
                metrics.http_request(MCP_PATH, status)
            tracing.finish(span, outcome=str(status or "cancelled"), **{"http.response.status_code": status or None})
            _log.info("mcp.request", method=scope.get("method"), status=status or None, request_id=request_id,
                      duration_ms=round((trio.current_time() - started) * 1000, 1))

    def _guard(self, scope: Scope) -> None:
        """The guards before the body (1-5 of the module docstring)."""
        declared = header(scope, b"content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > self.settings.body_limit:
            raise Refusal(413, TOO_LARGE)
        refused = host_refusal(self.hosts, header(scope, b"host"), header(scope, b"origin"), scope.get("server"))
        if refused is not None:
            raise Refusal(*refused)
        foreign = auth.foreign_fetch(header(scope, b"sec-fetch-site"))
        if foreign is not None:
            raise Refusal(403, foreign)
        if scope.get("method") != "POST":
            raise Refusal(405, METHOD_NOT_ALLOWED, {"Allow": "POST"})
        if not auth.declared_json(header(scope, b"content-type")):
            raise Refusal(415, NOT_JSON_CONTENT)
        client = client_address(scope)
        if self.token_required:
            self._check_token(client, header(scope, b"authorization"))
        wait = self.limiter.take((MCP_PATH, client))
        if wait > 0:
            raise Refusal(429, RATE_LIMITED, {"Retry-After": retry_after(wait)})

    def _check_token(self, client: str, authorization: str | None) -> None:
        """Guard 4: the bearer token, by the app's one rule (``auth.check_credential``)."""
        check = auth.check_credential(self.failures, client, authorization is not None,
                                      lambda: auth.authorized(self.settings, authorization))
        if check.locked_s > 0:
            raise Refusal(429, RATE_LIMITED, {"Retry-After": retry_after(check.locked_s)})
        if not check.accepted:
            raise Refusal(401, UNAUTHORIZED, {"WWW-Authenticate": TOKEN_CHALLENGE})

    async def _read_body(self, receive: Receive) -> bytes:
        """The whole request body, at most ``body_limit`` bytes (guard 6)."""
        body = bytearray()
        while True:
            message = await receive()
            if message.get("type") != "http.request":
                return bytes(body)            # the client left; the SDK sees an empty body
            body.extend(message.get("body", b""))
            if len(body) > self.settings.body_limit:
                raise Refusal(413, TOO_LARGE)
            if not message.get("more_body", False):
                return bytes(body)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the body already read over once, then the
    connection's own messages (its disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Message:
        return pending.pop() if pending else await receive()

    return replayed


async def _answer(send: Send, refusal: Refusal) -> None:
    body = json.dumps({"error": refusal.message}, ensure_ascii=False).encode("utf-8")
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode("ascii"))]
    headers += [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in refusal.headers.items()]
    if refusal.unread:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
