"""The HTTP transport under a source's MCP sessions: every request on its own.

The SDK sends each JSON-RPC request as a POST from a task of the session's
task group. Left to itself it reads a JSON answer whole, at any size, and
an exception from one POST (a read timeout, a reset connection) ends that
task group, so every other request in flight on the shared session fails
with it; a request the SDK gave up on (its timeout, a barge-in) keeps its
POST open until httpx2's own timeout, and that late failure then tears the
session down under whichever requests are running by then.

``SourceTransport`` sits under the SDK's ``httpx2.AsyncClient`` and makes
each exchange's fate its own:

* A JSON answer is read here, into at most ``max_bytes``: past that the read
  stops, the connection is closed, and the request is answered with a
  JSON-RPC error of its own id (``ANSWER_TOO_LARGE``) in place of the body.
  An event stream's bytes count against the same cap (the stream fails past
  it; the SDK answers that request alone).
* The answer to a ``tools/call`` or ``tools/list`` is decoded here, in a
  worker thread when it is over ``inline_bytes``, and handed to the asker
  (``Answered``); the SDK gets a placeholder ``result`` (``PLACEHOLDERS``),
  so its decoding and its models never run in proportion to what the source
  sent, on the trio thread. An error answer reaches the SDK rebuilt: its code
  and the start of its message.
* An exchange that fails (refused, reset, a read timeout, its deadline) is
  answered with a JSON-RPC error of its own id (``EXCHANGE_FAILED``, or
  ``REQUEST_TIMEOUT``) instead of raising into the session's task group.
* The ``notifications/cancelled`` the SDK sends for a request it abandoned
  aborts that request's exchange here at once: its connection closed, its
  answer never read.

Messages that are not requests pass through; a notification POST that fails
is answered an empty 202, which the SDK ignores (an exception there would end
the session's writer).
"""

from __future__ import annotations

import json
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

import httpx2
import orjson
import trio
from mcp.types import REQUEST_TIMEOUT

from voiceactors import storage, tracing

#: JSON-RPC codes of our own (the implementation-defined server error range).
ANSWER_TOO_LARGE = -32090
EXCHANGE_FAILED = -32091

CLOSE_S = 1.0               # closing an abandoned answer's connection, at most

#: What the SDK gets in place of a tool answer's ``result`` that this transport
#: decoded itself (``Answered``).
PLACEHOLDERS: dict[str, dict[str, Any]] = {"tools/call": {"content": []}, "tools/list": {"tools": []}}
ERROR_TEXT_MAX = 256


@dataclass
class Answered:
    """Where the transport puts the answer to a ``tools/call`` or ``tools/list``
    it decoded itself: its ``result`` (plain JSON) and its size in bytes. Set
    in ``answered`` by the task that makes the requests (the SDK sends a
    request's POST in the context of the task that made it, so the transport
    finds it there); None there: the SDK decodes the answer as it would."""

    result: dict[str, Any] | None = None
    size: int = 0

    def take(self) -> dict[str, Any] | None:
        result, self.result = self.result, None
        return result


answered: ContextVar[Answered | None] = ContextVar("mcp_answered", default=None)


class AnswerTooLarge(httpx2.StreamError):
    """An event stream went past the answer cap (a StreamError: the SDK
    answers the stream's request with an error instead of failing the session)."""


class ExchangeAborted(httpx2.StreamError):
    """An event stream's request was abandoned or passed its deadline."""


@dataclass
class _Exchange:
    """One request's HTTP exchange: its deadline, and the scope of the step
    it is in (so that an abort reaches whichever step is waiting)."""

    deadline: float
    aborted: bool = False
    step: trio.CancelScope | None = field(default=None, repr=False)

    def abort(self) -> None:
        self.aborted = True
        if self.step is not None:
            self.step.cancel()

    def scope(self) -> trio.CancelScope:
        self.step = trio.CancelScope(deadline=self.deadline)
        if self.aborted:
            self.step.cancel()
        return self.step


def _message_of(request: httpx2.Request) -> dict[str, Any] | None:
    """The JSON-RPC message a POST carries (our own SDK's, small), or None."""
    if request.method != "POST":
        return None
    try:
        message = json.loads(request.content)
    except (ValueError, httpx2.RequestNotRead):
        return None
    return message if isinstance(message, dict) else None


def _jsonrpc(request_id: Any, **answer: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, **answer}).encode()


def _error_answer(request: httpx2.Request, request_id: Any, code: int, text: str) -> httpx2.Response:
    return httpx2.Response(200, headers={"content-type": "application/json"},
                           content=_jsonrpc(request_id, error={"code": code, "message": text}), request=request)


class SourceTransport(httpx2.AsyncBaseTransport):
    """See the module docstring. ``exchange_s``: the longest a request's
    exchange may take (its answer read included)."""

    def __init__(self, max_bytes: int, exchange_s: float, inline_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.exchange_s = exchange_s
        self.inline_bytes = inline_bytes
        self._inner = httpx2.AsyncHTTPTransport()
        self._exchanges: dict[Any, _Exchange] = {}    # JSON-RPC request id -> its exchange

    async def __aenter__(self) -> "SourceTransport":
        await self._inner.__aenter__()
        return self

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        message = _message_of(request)
        if message is None or "id" not in message or "method" not in message:
            if message is not None and message.get("method") == "notifications/cancelled":
                self._abort(message.get("params"))
            return await self._pass_through(request)
        request_id = message["id"]
        exchange = _Exchange(deadline=trio.current_time() + self.exchange_s)
        self._exchanges[request_id] = exchange
        response: httpx2.Response | None = None
        try:
            # one span per request (tracing on), under its asker's; the source gets its traceparent
            with tracing.span("mcp.request", **{"rpc.method": str(message["method"])[:64]}) as span:
                tracing.inject(request.headers)
                response = await self._exchange(request, request_id, str(message["method"]), exchange)
                if span is not None:
                    span.set_attribute("http.response.status_code", response.status_code)
            return response
        finally:
            if response is None or not isinstance(response.stream, _CappedStream):
                self._forget(request_id, exchange)    # an event stream's is forgotten when it closes

    def _forget(self, request_id: Any, exchange: _Exchange) -> None:
        if self._exchanges.get(request_id) is exchange:
            del self._exchanges[request_id]

    def _abort(self, params: Any) -> None:
        if isinstance(params, dict):
            exchange = self._exchanges.get(params.get("requestId"))
            if exchange is not None:
                exchange.abort()

    async def _pass_through(self, request: httpx2.Request) -> httpx2.Response:
        """A message that is not a request (a notification POST; the listening
        GET and the closing DELETE, whose failures the SDK handles itself)."""
        if request.method != "POST":
            return await self._inner.handle_async_request(request)
        try:
            return await self._inner.handle_async_request(request)
        except httpx2.TransportError:   # the SDK would end the session's writer on it
            return httpx2.Response(202, request=request)

    async def _exchange(self, request: httpx2.Request, request_id: Any, method: str, exchange: _Exchange
                        ) -> httpx2.Response:
        response: httpx2.Response | None = None
        try:
            with exchange.scope():
                response = await self._inner.handle_async_request(request)
            if response is None:
                return self._ended(request, request_id, exchange)
            content_type = response.headers.get("content-type", "").lower()
            if content_type.startswith("text/event-stream"):
                stream, response = response, None     # handed on: its reader closes it
                return httpx2.Response(stream.status_code, headers=stream.headers, request=request,
                                       stream=_CappedStream(stream, exchange, self.max_bytes,
                                                            lambda: self._forget(request_id, exchange)),
                                       extensions=stream.extensions)
            body = await self._read_capped(response, exchange)
            if body is None:
                if exchange.aborted or trio.current_time() >= exchange.deadline:
                    return self._ended(request, request_id, exchange)
                return _error_answer(request, request_id, ANSWER_TOO_LARGE,
                                     f"answer larger than {self.max_bytes} bytes; not read")
            target = answered.get()
            if target is not None and method in PLACEHOLDERS and content_type.startswith("application/json"):
                body = await self._decoded(body, request_id, method, target)
            # the body is decoded (no content-encoding) and may be another length now
            headers = [(k, v) for k, v in response.headers.multi_items()
                       if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
            return httpx2.Response(response.status_code, headers=headers, content=body,
                                   request=request, extensions=response.extensions)
        except httpx2.TimeoutException:
            return _error_answer(request, request_id, REQUEST_TIMEOUT, "no answer in time")
        except httpx2.TransportError as exc:
            return _error_answer(request, request_id, EXCHANGE_FAILED, type(exc).__name__)
        finally:
            if response is not None:
                await _close(response)

    async def _decoded(self, body: bytes, request_id: Any, method: str, target: Answered) -> bytes:
        """The body the SDK gets for a tool answer decoded here (see the module docstring)."""
        try:
            if len(body) <= self.inline_bytes:
                message = orjson.loads(body)
            else:
                message = await storage.run_sync(orjson.loads, body, cancellable=False)
        except orjson.JSONDecodeError:
            message = None
        if isinstance(message, dict) and isinstance(message.get("result"), dict):
            target.result, target.size = message["result"], len(body)
            return _jsonrpc(request_id, result=PLACEHOLDERS[method])
        error = message.get("error") if isinstance(message, dict) else None
        if isinstance(error, dict) and isinstance(error.get("code"), int) and not isinstance(error["code"], bool):
            text = error.get("message")
            return _jsonrpc(request_id, error={"code": error["code"],
                                               "message": text[:ERROR_TEXT_MAX] if isinstance(text, str) else ""})
        return _jsonrpc(request_id, error={"code": EXCHANGE_FAILED, "message": "not a JSON-RPC answer"})

    def _ended(self, request: httpx2.Request, request_id: Any, exchange: _Exchange) -> httpx2.Response:
        """An exchange cut short by its abort or deadline (nobody waits for the abandoned one's answer)."""
        if exchange.aborted:
            return _error_answer(request, request_id, EXCHANGE_FAILED, "abandoned")
        return _error_answer(request, request_id, REQUEST_TIMEOUT, "no answer in time")

    async def _read_capped(self, response: httpx2.Response, exchange: _Exchange) -> bytes | None:
        """The body, decoded (gzip and the like: the cap counts what it
        inflates to), or None once it passes the cap or the exchange ends: the
        rest is never read (the connection is closed instead)."""
        parts: list[bytes] = []
        size = 0
        chunks = response.aiter_bytes()
        try:
            while True:
                with exchange.scope():
                    chunk = await anext(chunks, None)
                    if chunk is None:
                        return b"".join(parts)
                    size += len(chunk)
                    if size > self.max_bytes:
                        return None
                    parts.append(chunk)
                    continue
                return None   # aborted, or past the deadline
        finally:
            with trio.CancelScope(shield=True):
                await chunks.aclose()


def _async_stream(response: httpx2.Response) -> httpx2.AsyncByteStream:
    assert isinstance(response.stream, httpx2.AsyncByteStream)   # the inner transport is async
    return response.stream


async def _close(response: httpx2.Response) -> None:
    with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_S):
        await response.aclose()


class _CappedStream(httpx2.AsyncByteStream):
    """An event stream's bytes, at most ``max_bytes``, within its exchange."""

    def __init__(self, response: httpx2.Response, exchange: _Exchange, max_bytes: int,
                 closed: Callable[[], None]) -> None:
        self._response = response
        self._exchange = exchange
        self._left = max_bytes
        self._closed = closed

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = aiter(_async_stream(self._response))
        while True:
            chunk: bytes | None = None
            with self._exchange.scope():
                chunk = await anext(chunks, None)
            if self._exchange.step is not None and self._exchange.step.cancelled_caught:
                raise ExchangeAborted("abandoned or past its deadline")
            if chunk is None:
                return
            self._left -= len(chunk)
            if self._left < 0:
                raise AnswerTooLarge("answer larger than the cap; not read")
            yield chunk

    async def aclose(self) -> None:
        self._closed()
        await _close(self._response)

