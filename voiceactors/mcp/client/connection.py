"""One MCP session (one source, one bearer token), kept in a task of its own.

``SourceConnection.run`` owns an ``httpx2.AsyncClient`` and the SDK's
Streamable HTTP session over it, opened on the first request and reused
until it fails or sits idle for ``IDLE_CLOSE_S``. Others hand it requests
(``list_tools``, ``call_tool``) and get back a value: the SDK's result, or a
``Failure`` (``denied``, ``timeout``, ``transport``, ``protocol``,
``closed``, ``too_large``). Nothing here ever raises into the asker. Under
the SDK's client sits ``SourceTransport`` (``http_transport.py``): each
request's exchange fails alone (an answer past ``ANSWER_MAX_BYTES``, a reset,
a read timeout become that request's JSON-RPC error), and a request the SDK
abandons (its timeout, the asker cancelled) has its exchange aborted at
once, so no request's failure reaches the session another request uses. A
failure of the session itself (under trio it cancels the task that holds the
session and comes out as an ``ExceptionGroup``) ends only this task's
session: the requests in flight answer ``transport`` and the next request
opens a new session. The task runs in the sources actor's nursery, never in
a call's. A tool's answer (``tools/call``, ``tools/list``) is decoded by
the transport, in a worker thread past ``INLINE_MAX_BYTES``, and reaches the
asker as the source's plain JSON (``ToolAnswer``); the SDK sees a placeholder,
and a result is never checked against the tool's ``outputSchema``.

Authentication (``docs/mcp.md``): the token goes on every request through an
``httpx2.Auth`` hook, which is also where a 401/403 is seen (the SDK reports
it as a generic error). Once refused, the connection answers ``denied`` to
everything without sending again: no anonymous retry, no other token.
Redirects are refused (``max_redirects=0``; the SDK would follow same-origin
ones itself otherwise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, TypeVar

import httpx2
import trio
import mcp.types as types
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import REQUEST_TIMEOUT, PaginatedRequestParams
from pydantic import BaseModel

from voiceactors import storage, tracing
from voiceactors.mcp.client.http_transport import ANSWER_TOO_LARGE, EXCHANGE_FAILED, Answered, SourceTransport, answered
from voiceactors.logs import get_logger
from voiceactors.mcp.client.sources import McpSource
from voiceactors.messages import ProgressNote

IDLE_CLOSE_S = 300.0        # a session unused this long is closed (the next request opens one)
HTTP_SLACK_S = 5.0          # httpx2's own timeouts sit above the MCP request timeout
MAX_PAGES = 50              # tools/list pages followed at most
LISTING_MAX_BYTES = 4 * 1024 * 1024     # and bytes of them: the pages past it are not asked for
ASK_SLACK_S = 2.0           # the asker's bound beyond the request's own timeout
#: The most of one answer read (a JSON body, an event stream): past it the read
#: stops and the request fails ``too_large`` (``http_transport``). It also bounds
#: what the SDK decodes on the trio thread: about 5 ms for a full 1 MiB.
ANSWER_MAX_BYTES = 1024 * 1024
#: An answer up to this size is decoded (and rendered) on the trio thread; a
#: bigger one in a worker thread (work in proportion to it).
INLINE_MAX_BYTES = 64 * 1024

_log = get_logger(actor="mcp")
T = TypeVar("T")


@dataclass(frozen=True)
class Failure:
    """A request that got no result: ``kind`` and a short detail for logs."""

    kind: str       # denied | timeout | transport | protocol | closed | too_large
    detail: str = ""


@dataclass(frozen=True)
class ToolAnswer:
    """A tool's result in its wire shape (``content``, ``structuredContent``,
    ``isError``) and the size of the answer it came in (0: not measured)."""

    result: dict[str, Any]
    size: int


@dataclass
class _Op:
    method: str                     # list_tools | call_tool
    args: tuple[Any, ...]
    timeout_s: float
    reply: trio.MemorySendChannel[Any] = field(repr=False)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    answered: bool = False
    progress: ProgressNote | None = field(default=None, repr=False)   # call_tool's progress receiver
    # the asker's span (tracing on): the request's POST is made under it, its traceparent sent
    trace: tracing.Parent | None = field(default=None, repr=False)

    def answer(self, value: Any) -> None:
        if self.answered:
            return
        self.answered = True
        try:
            self.reply.send_nowait(value)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            pass   # the asker gave up


class _Bearer(httpx2.Auth):
    """Puts the token on each request; notes a 401/403 answer."""

    def __init__(self, token: str, connection: "SourceConnection") -> None:
        self._token = token
        self._connection = connection

    def auth_flow(self, request: httpx2.Request) -> Generator[httpx2.Request, httpx2.Response, None]:
        request.headers["Authorization"] = f"Bearer {self._token}"
        response = yield request
        if response.status_code in (401, 403):
            self._connection.refused(response.status_code)


def _is_cancel(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(trio.Cancelled)[1] is None
    return isinstance(exc, trio.Cancelled)


def _detail(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        leaves = exc.split(trio.Cancelled)[1]
        inner = leaves.exceptions[0] if leaves is not None and leaves.exceptions else exc
        return _detail(inner) if inner is not exc else type(exc).__name__
    return type(exc).__name__


class SourceConnection:
    """See the module docstring. ``label`` names it in logs (``crm`` or
    ``crm/call``); the token never appears anywhere but the header."""

    def __init__(self, source: McpSource, token: str, timeout_s: float, label: str) -> None:
        self.source = source
        self.timeout_s = timeout_s
        self.label = label
        self._token = token
        self.denied_status: int | None = None
        self._send, self._receive = trio.open_memory_channel[_Op](math.inf)
        self.closed = False

    def refused(self, status: int) -> None:
        if self.denied_status is None:
            _log.warning("mcp.auth_refused", source=self.source.name, connection=self.label, status=status)
        self.denied_status = status

    def close(self) -> None:
        """No more requests: the task ends once the current ones are answered."""
        self.closed = True
        self._send.close()

    # --- the asker's side ---------------------------------------------------------

    async def list_tools(self) -> list[dict[str, Any]] | Failure:
        """Every tool the source lists (all pages), as wire-shaped dicts."""
        answer: list[dict[str, Any]] | Failure = await self._ask("list_tools", (), self.timeout_s * 2)
        return answer

    async def call_tool(self, tool: str, arguments: dict[str, Any], timeout_s: float,
                        progress: ProgressNote | None = None) -> ToolAnswer | Failure:
        """The tool's result, or a Failure. Cancelling the asker cancels the
        request (the SDK tells the server, and its exchange is aborted).
        ``progress`` gets each progress notification the source sends for it
        (the request then carries a progress token)."""
        answer: ToolAnswer | Failure = await self._ask("call_tool", (tool, arguments), timeout_s, progress)
        return answer

    async def _ask(self, method: str, args: tuple[Any, ...], timeout_s: float,
                   progress: ProgressNote | None = None) -> Any:
        if self.denied_status is not None:
            return Failure("denied", f"status {self.denied_status}")
        send, receive = trio.open_memory_channel[Any](1)
        op = _Op(method, args, timeout_s, send, progress=progress, trace=tracing.current())
        try:
            self._send.send_nowait(op)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return Failure("closed", "connection closed")
        try:
            with trio.move_on_after(timeout_s + ASK_SLACK_S):
                value = await receive.receive()
                return value
            op.scope.cancel()
            return Failure("timeout", "no answer in time")
        except BaseException:
            op.scope.cancel()   # the asker was cancelled (a read at barge-in): stop the request too
            raise

    # --- the connection's own task --------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve requests until closed: open a session on demand, keep it
        while it works, turn each failure into answers."""
        task_status.started()
        async with self._receive:
            while True:
                try:
                    first = await self._receive.receive()
                except trio.EndOfChannel:
                    return
                if self.denied_status is not None:
                    first.answer(Failure("denied", f"status {self.denied_status}"))
                    continue
                await self._session(first)

    async def _session(self, first: _Op) -> None:
        pending: list[_Op] = [first]
        failure = Failure("transport", "session ended")
        timeout = httpx2.Timeout(self.timeout_s + HTTP_SLACK_S)
        try:
            transport = SourceTransport(ANSWER_MAX_BYTES, self.timeout_s + HTTP_SLACK_S, INLINE_MAX_BYTES)
            async with httpx2.AsyncClient(auth=_Bearer(self._token, self), max_redirects=0, timeout=timeout,
                                          follow_redirects=False, transport=transport) as client:
                async with streamable_http_client(self.source.url, http_client=client,
                                                  max_sse_event_size=ANSWER_MAX_BYTES) as (read, write):
                    async with ClientSession(read, write, read_timeout_seconds=self.timeout_s) as session:
                        with trio.fail_after(self.timeout_s + HTTP_SLACK_S):
                            await session.initialize()
                        _log.info("mcp.session_opened", source=self.source.name, connection=self.label)
                        await self._serve(session, pending)
                        failure = Failure("closed", "connection closed")
        except BaseException as exc:
            if _is_cancel(exc):
                for op in pending:
                    op.answer(Failure("closed", "server stopping"))
                raise
            if self.denied_status is not None:
                failure = Failure("denied", f"status {self.denied_status}")
            elif isinstance(exc, trio.TooSlowError):
                failure = Failure("timeout", "initialize timed out")
            else:
                failure = Failure("transport", _detail(exc))
            _log.warning("mcp.session_failed", source=self.source.name, connection=self.label,
                         kind=failure.kind, error=failure.detail)
        finally:
            for op in pending:
                op.answer(failure)

    async def _serve(self, session: ClientSession, pending: list[_Op]) -> None:
        async with trio.open_nursery() as nursery:
            for op in pending:
                nursery.start_soon(self._run_op, session, op, pending)
            while True:
                with trio.move_on_after(IDLE_CLOSE_S):
                    try:
                        op = await self._receive.receive()
                    except trio.EndOfChannel:
                        return   # closed: the nursery waits for the requests in flight
                    if self.denied_status is not None:
                        op.answer(Failure("denied", f"status {self.denied_status}"))
                        continue
                    pending.append(op)
                    nursery.start_soon(self._run_op, session, op, pending)
                    continue
                if not pending:
                    return   # idle: close the session; the next request opens another

    async def _run_op(self, session: ClientSession, op: _Op, pending: list[_Op]) -> None:
        value: Any = Failure("closed", "cancelled")
        answered.set(Answered())    # this task's requests: the transport decodes their answers into it
        try:
            with op.scope, tracing.under(op.trace):
                value = await self._perform(session, op)
        except MCPError as exc:
            value = self._mcp_failure(exc)
        except Exception as exc:  # one request failing is its answer, never the session's end
            value = Failure("denied", f"status {self.denied_status}") if self.denied_status is not None \
                else Failure("transport", type(exc).__name__)
        finally:
            if op in pending:
                pending.remove(op)
            op.answer(value)

    def _mcp_failure(self, exc: MCPError) -> Failure:
        if self.denied_status is not None:
            return Failure("denied", f"status {self.denied_status}")
        code = getattr(getattr(exc, "error", None), "code", None)
        if code == REQUEST_TIMEOUT:
            return Failure("timeout", "request timed out")
        if code == ANSWER_TOO_LARGE:
            return Failure("too_large", f"answer larger than {ANSWER_MAX_BYTES} bytes")
        if code == EXCHANGE_FAILED:
            return Failure("transport", str(getattr(exc.error, "message", ""))[:64])
        return Failure("protocol", f"code {code}")

    async def _perform(self, session: ClientSession, op: _Op) -> Any:
        decoded = answered.get()
        assert decoded is not None      # set by _run_op for this task's requests
        if op.method == "list_tools":
            return await self._list(session, decoded)
        tool, arguments = op.args
        # send_request, not call_tool: call_tool checks a result against the tool's
        # outputSchema with stock jsonschema (Python's re), on the trio thread; the model
        # gets structuredContent as data from the source, and it is not checked
        request = types.CallToolRequest(params=types.CallToolRequestParams(name=tool, arguments=arguments))
        result = await session.send_request(request, types.CallToolResult, request_read_timeout_seconds=op.timeout_s,
                                            progress_callback=_progress_to(op.progress) if op.progress else None)
        raw = decoded.take()
        if raw is None:     # the SDK decoded it (``Answered``): its model
            return ToolAnswer(_dump(result), 0)
        return ToolAnswer(raw, decoded.size)

    async def _list(self, session: ClientSession, decoded: Answered) -> list[dict[str, Any]]:
        """Every page of ``tools/list``, each tool as the source sent it (a dict)."""
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        read = 0
        for _ in range(MAX_PAGES):
            if read > LISTING_MAX_BYTES:
                _log.warning("mcp.listing_too_large", source=self.source.name, bytes=read, tools=len(tools))
                return tools
            params = PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await session.list_tools(params=params)
            raw = decoded.take()
            if raw is None:     # the SDK decoded it: its models
                tools.extend(_dump(t) for t in page.tools)
                cursor = page.next_cursor
            else:
                read += decoded.size
                listed = raw.get("tools")
                tools.extend(t for t in (listed if isinstance(listed, list) else ()) if isinstance(t, dict))
                cursor = raw.get("nextCursor") if isinstance(raw.get("nextCursor"), str) else None
            if not cursor:
                return tools
        _log.warning("mcp.too_many_pages", source=self.source.name, pages=MAX_PAGES)
        return tools


async def in_proportion(size: int, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, work in proportion to an answer of ``size`` bytes: on the
    trio thread up to ``INLINE_MAX_BYTES``, else in a worker thread."""
    if size <= INLINE_MAX_BYTES:
        return fn(*args)
    return await storage.run_sync(fn, *args, cancellable=False)


def _progress_to(note: ProgressNote) -> Any:
    """The SDK's progress callback (awaited by its dispatcher) handing each
    notification to ``note`` (plain, never awaits)."""
    async def progressed(progress: float, total: float | None, message: str | None) -> None:
        note(progress, total, message)

    return progressed


def _dump(model: BaseModel) -> dict[str, Any]:
    """An SDK model in its wire shape."""
    dumped: dict[str, Any] = model.model_dump(by_alias=True, exclude_none=True, mode="json")
    return dumped
