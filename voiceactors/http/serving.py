"""Hypercorn's trio worker, with a cap on open connections at accept.

Why this module exists: ``hypercorn.trio.serve`` builds its listeners from
the bound sockets itself and hands them straight to ``trio.serve_listeners``;
no setting or argument caps the connections it accepts. A flood of fresh
connections (faster than the keep-alive timeout closes idle ones) could use
up the process's file descriptors, and then everything that opens a file
fails. So ``serve`` here drives hypercorn's own pieces (its lifespan
handler, its per-connection ``TCPServer`` and worker context) around a
listener of ours, ``CappedListener``: its ``accept`` first waits for one of
``max_connections`` slots, and a slot comes back when the accepted stream is
closed. Past the cap, new clients wait in the kernel's listen backlog (they
hold no descriptor of ours) and are served in turn once others leave.

It also refuses, below hypercorn, what can be refused from a connection's
first bytes (``AcceptRefusal``, given by the app: a rate-limited client's
POST whose bucket is empty, ``asgi.RateLimitRefusal``): a connection from
an address the refusal is ``watching`` is read once before hypercorn sees
it; a whole request that the refusal ``answer``s gets those bytes and is
closed, without h11, hypercorn's connection setup or the ASGI app (each of
those cost the trio thread about a millisecond per refused request under a
flood: live calls' round trips stretched with it). Everything else — a client not watched,
another request, a request not whole in that first read, nothing sent
within ``PEEK_S`` — goes to hypercorn as it came, the bytes read put back.

It serves, below hypercorn too, a ``POST /api/voice/connect`` whole in a
connection's first read (``FirstReadAnswer``, given by the app:
``connect.FirstReadConnect``, which hands it to the app as hypercorn
would), so every connection it is ``watching`` (all but a trusted proxy's) is read
here first (up to ``PEEK_S``); a connection kept alive after that answer
goes to hypercorn for what follows. With ``--redis`` that answer waits for
the call's lease (``FirstReadAnswer.answer`` is awaited).

The stream handed to hypercorn writes a small fixed-length response in one
send (``SlotStream.hold_heads``, the rule in ``head_hold.py``): hypercorn
writes the head and the body apart, and each send on loopback costs the
sender the receiver's TCP work too.

This is the only module that touches hypercorn's internals (``Lifespan``,
``TCPServer``, ``WorkerContext``); ``pyproject.toml`` pins the hypercorn
range it was written against, and ``tests/test_connection_cap.py`` tests
the seam on real sockets. Only plain HTTP (no TLS, no QUIC) is served, as
the server always has.
"""

from __future__ import annotations

import collections
import socket
from functools import partial
from typing import Any, Awaitable, Callable, Protocol

import trio
from hypercorn.config import Config
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import repr_socket_addr, wrap_app

from voiceactors.http.head_hold import HeadHold
from voiceactors.logs import get_logger

_log = get_logger(actor="server")

PEEK_S = 1.0          # how long a watched client's first bytes are awaited before hypercorn takes over
PEEK_BYTES = 2**16    # hypercorn's own read size
DRAIN_MAX = 64        # connections taken from the backlog in one pass (CappedListener)


class AcceptRefusal(Protocol):
    """What ``serve`` asks before hypercorn sees a connection."""

    def watching(self, address: str) -> bool:
        """Whether a connection from ``address`` is worth reading first (cheap: runs per accept)."""

    def answer(self, address: str, data: bytes) -> bytes | None:
        """The whole response for a connection whose first read was ``data``,
        or None to let hypercorn serve it."""


class SlotStream(trio.abc.HalfCloseableStream):
    """An accepted socket stream holding one connection slot (if capped)
    until it is closed, with the bytes a refusal read put back in front.

    It offers what hypercorn's ``TCPServer`` uses of a ``trio.SocketStream``
    (``socket``, send, receive, ``send_eof``) and, on purpose, no
    ``do_handshake``: that is how ``TCPServer`` tells a plain stream from TLS."""

    def __init__(self, stream: trio.SocketStream, slots: trio.Semaphore | None) -> None:
        self._stream = stream
        self._slots: trio.Semaphore | None = slots
        self._unread = b""
        self._heads: HeadHold | None = None    # hold_heads: a response's head waits for its body

    def hold_heads(self) -> None:
        """From now on a fixed-length response's head is written with the
        write after it (``head_hold.py``: one send per small response). Set
        for hypercorn's writes only: a refusal's answer is one write already."""
        self._heads = HeadHold()

    def put_back(self, data: bytes) -> None:
        """``data`` is what the next ``receive_some`` returns (before the socket's own bytes)."""
        self._unread = data + self._unread

    @property
    def socket(self) -> Any:
        return self._stream.socket

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        heads = self._heads
        if heads is None:
            await self._stream.send_all(data)
            return
        sends = heads.take(data)
        if sends is None:
            # No checkpoint here on purpose: hypercorn's next write (the body,
            # or the end's empty one) follows in the same task and is one.
            return
        for chunk in sends:
            await self._stream.send_all(chunk)

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self._unread:
            await trio.lowlevel.checkpoint()
            size = len(self._unread) if max_bytes is None else max_bytes
            data, self._unread = self._unread[:size], self._unread[size:]
            return data
        return await self._stream.receive_some(max_bytes)

    async def send_eof(self) -> None:
        held = self._heads.release() if self._heads is not None else b""
        if held:
            await self._stream.send_all(held)
        await self._stream.send_eof()

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()     # the descriptor is closed even if this is cancelled
        finally:
            slots, self._slots = self._slots, None
            if slots is not None:
                slots.release()


class CappedListener(trio.abc.Listener[SlotStream]):
    """The connections of ``sock`` (a listening stdlib socket, now trio's), at
    most as many open at once as ``slots`` has (None: no cap, the streams
    are only wrapped).

    An accept that had to wait also takes, without waiting, every connection already in the
    kernel's backlog (up to ``DRAIN_MAX``, each with its slot), and the next
    accepts return those without a checkpoint. Why: ``trio.serve_listeners``
    accepts one connection per scheduler pass, and on a busy trio thread a
    pass takes as long as every runnable task's step, so a burst of joins
    queued behind the calls' rounds one pass each (connects' p99 of seconds
    under a burst, where a server that accepted the whole backlog took 0.1 s). The
    drained connections' handlers then all start in the same pass.

    Cancellation: an accept with connections in hand returns one even when
    cancelled (it was accepted already: at shutdown its handler gets the
    graceful timeout as every open connection does); one that has to wait
    is a checkpoint as trio's is. ``aclose`` closes the ones not handed out."""

    def __init__(self, sock: socket.socket, slots: trio.Semaphore | None, *, cap: int) -> None:
        self._sock = sock
        self._listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        self._slots = slots
        self._cap = cap
        self._full = False
        self._ready: collections.deque[SlotStream] = collections.deque()

    async def accept(self) -> SlotStream:
        if self._ready:
            return self._ready.popleft()
        if self._slots is None:
            stream = SlotStream(await self._listener.accept(), None)
        else:
            if self._slots.value == 0 and not self._full:
                self._full = True
                _log.warning("server.connections_at_cap", max_connections=self._cap)
            await self._slots.acquire()
            if self._full and self._slots.value > 0:
                self._full = False          # below the cap again: the next time it fills is news
            try:
                stream = SlotStream(await self._listener.accept(), self._slots)
            except BaseException:
                self._slots.release()
                raise
        self._drain()
        return stream

    def _drain(self) -> None:
        """Take the connections waiting in the backlog now, as far as slots allow."""
        while len(self._ready) < DRAIN_MAX:
            if self._slots is not None:
                try:
                    self._slots.acquire_nowait()
                except trio.WouldBlock:
                    return
            try:
                conn, _ = self._sock.accept()
            except OSError:
                # BlockingIOError: the backlog is empty. Any other error is
                # left to the next awaited accept, which handles it as trio does.
                if self._slots is not None:
                    self._slots.release()
                return
            stream = trio.SocketStream(trio.socket.from_stdlib_socket(conn))
            self._ready.append(SlotStream(stream, self._slots))

    async def aclose(self) -> None:
        while self._ready:
            await trio.aclose_forcefully(self._ready.popleft())
        await self._listener.aclose()


def _peer_address(stream: SlotStream) -> str | None:
    try:
        peer = stream.socket.getpeername()
    except OSError:
        return None
    return str(peer[0]) if isinstance(peer, tuple) and peer else None


def _asks(ask: Callable[..., Any], *args: Any) -> Any:
    """A refusal's answer; a bug in it (an exception) is logged and reads as
    "not refused": hypercorn serves the connection (an exception here would
    end ``trio.serve_listeners``, and the server with it)."""
    try:
        return ask(*args)
    except Exception:  # noqa: BLE001
        _log.exception("server.refusal_failed")
        return None


class FirstReadAnswer(Protocol):
    """What ``serve`` asks of a connection's first read besides a refusal
    (the app's connect, ``connect.FirstReadConnect``)."""

    def watching(self, address: str) -> bool:
        """Whether a connection from ``address`` is worth reading first (cheap: runs per accept)."""

    async def answer(self, peer: Any, local: Any, data: bytes) -> tuple[bytes, bool] | None:
        """The whole response for a connection whose first read was ``data``
        and whether to close the connection after it (else hypercorn serves
        what follows), or None to let hypercorn serve it all (awaited: a
        connect with a shared registry wins its lease in it)."""


async def serve_connection(serve_http: Callable[[SlotStream], Awaitable[None]], refusal: AcceptRefusal | None,
                           stream: SlotStream, first_read: FirstReadAnswer | None = None) -> None:
    """One accepted connection: refused from its first read when ``refusal``
    answers it, its first request answered when ``first_read`` does, else
    served by ``serve_http`` (hypercorn's ``TCPServer``)."""
    address = _peer_address(stream) if refusal is not None or first_read is not None else None
    watched = refusal is not None and address is not None and _asks(refusal.watching, address)
    if first_read is not None and (address is None or not _asks(first_read.watching, address)):
        first_read = None
    if address is not None and (watched or first_read is not None):
        data: bytes | bytearray | None = None
        with trio.move_on_after(PEEK_S):
            try:
                data = await stream.receive_some(PEEK_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
        if data is not None and not data:        # closed (or reset) before a byte: nothing to serve
            await stream.aclose()
            return
        if data:
            reply: tuple[bytes, bool] | None = None     # the response, and whether to close after it
            if watched and refusal is not None:
                refused = _asks(refusal.answer, address, bytes(data))
                reply = (refused, True) if refused is not None else None      # a refusal always closes
            if reply is None and first_read is not None:
                reply = await _answered(first_read, stream, bytes(data))   # closes when the client asked to
            if reply is None:
                stream.put_back(bytes(data))
            else:
                response, close = reply
                try:
                    await stream.send_all(response)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    close = True
                finally:
                    if close:
                        await stream.aclose()
                if close:
                    return
    stream.hold_heads()
    await serve_http(stream)


async def _answered(first_read: FirstReadAnswer, stream: SlotStream, data: bytes) -> tuple[bytes, bool] | None:
    try:
        peer, local = stream.socket.getpeername(), stream.socket.getsockname()
    except OSError:
        return None
    if not (isinstance(peer, tuple) and isinstance(local, tuple)):
        return None
    try:
        return await first_read.answer(peer, local, data)
    except Exception:  # noqa: BLE001 - as _asks: a bug in it reads as "not answered", hypercorn serves it
        _log.exception("server.refusal_failed")
        return None


async def serve(app: Any, config: Config, *, max_connections: int,
                shutdown_trigger: Callable[[], Awaitable[None]],
                task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve the ASGI ``app`` on ``config.bind`` as ``hypercorn.trio.serve``
    does (lifespan startup, accept, graceful shutdown when ``shutdown_trigger``
    returns: in-flight connections get ``config.graceful_timeout``, then the
    lifespan shuts down), with at most ``max_connections`` connections open
    at once (0: no cap). ``task_status.started`` gets the bound URLs. An app
    with an ``accept_refusal()`` method gives the ``AcceptRefusal`` asked
    before hypercorn sees a connection (None: none)."""
    if config.ssl_enabled:
        raise ValueError("TLS is not served by voiceactors: terminate it in front of the server")
    asgi = wrap_app(app, config.wsgi_max_body_size, "asgi")
    lifespan_state: dict[str, Any] = {}
    lifespan = Lifespan(asgi, config, lifespan_state)
    context = WorkerContext(None)
    slots = trio.Semaphore(max_connections) if max_connections > 0 else None
    make_refusal = getattr(app, "accept_refusal", None)
    refusal: AcceptRefusal | None = make_refusal() if callable(make_refusal) else None
    make_first_read = getattr(app, "first_read_answer", None)
    first_read: FirstReadAnswer | None = (
        make_first_read(lambda: config.response_headers("h11")) if callable(make_first_read) else None)

    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as connections:
            listeners: list[trio.abc.Listener[Any]] = []
            binds: list[str] = []
            for sock in config.create_sockets().insecure_sockets:
                sock.listen(config.backlog)
                listeners.append(CappedListener(sock, slots, cap=max_connections))
                binds.append(f"http://{repr_socket_addr(sock.family, sock.getsockname())}")
            task_status.started(binds)
            serve_http = partial(TCPServer, asgi, config, context, ConnectionState(lifespan_state.copy()))
            handler = partial(serve_connection, serve_http, refusal, first_read=first_read)
            try:
                async with trio.open_nursery() as accepting:
                    accepting.start_soon(partial(trio.serve_listeners, handler, listeners,
                                                 handler_nursery=connections))
                    await shutdown_trigger()
                    accepting.cancel_scope.cancel()       # stop accepting; the listeners close
            finally:
                await context.terminated.set()            # idle keep-alive connections close now
                connections.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()
