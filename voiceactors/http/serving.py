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

This is the only module that touches hypercorn's internals (``Lifespan``,
``TCPServer``, ``WorkerContext``); ``pyproject.toml`` pins the hypercorn
range it was written against, and ``tests/test_connection_cap.py`` tests
the seam on real sockets. Only plain HTTP (no TLS, no QUIC) is served, as
the server always has.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Awaitable, Callable

import trio
from hypercorn.config import Config
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import repr_socket_addr, wrap_app

from voiceactors.logs import get_logger

_log = get_logger(actor="server")


class SlotStream(trio.abc.HalfCloseableStream):
    """An accepted socket stream holding one connection slot until it is closed.

    It offers what hypercorn's ``TCPServer`` uses of a ``trio.SocketStream``
    (``socket``, send, receive, ``send_eof``) and, on purpose, no
    ``do_handshake``: that is how ``TCPServer`` tells a plain stream from TLS."""

    def __init__(self, stream: trio.SocketStream, slots: trio.Semaphore) -> None:
        self._stream = stream
        self._slots: trio.Semaphore | None = slots

    @property
    def socket(self) -> Any:
        return self._stream.socket

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self._stream.receive_some(max_bytes)

    async def send_eof(self) -> None:
        await self._stream.send_eof()

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()     # the descriptor is closed even if this is cancelled
        finally:
            slots, self._slots = self._slots, None
            if slots is not None:
                slots.release()


class CappedListener(trio.abc.Listener[SlotStream]):
    """``listener``'s connections, at most as many open at once as ``slots`` has."""

    def __init__(self, listener: trio.SocketListener, slots: trio.Semaphore, *, cap: int) -> None:
        self._listener = listener
        self._slots = slots
        self._cap = cap
        self._full = False

    async def accept(self) -> SlotStream:
        if self._slots.value == 0 and not self._full:
            self._full = True
            _log.warning("server.connections_at_cap", max_connections=self._cap)
        await self._slots.acquire()
        if self._full and self._slots.value > 0:
            self._full = False          # below the cap again: the next time it fills is news
        try:
            stream = await self._listener.accept()
        except BaseException:
            self._slots.release()
            raise
        return SlotStream(stream, self._slots)

    async def aclose(self) -> None:
        await self._listener.aclose()


async def serve(app: Any, config: Config, *, max_connections: int,
                shutdown_trigger: Callable[[], Awaitable[None]],
                task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve the ASGI ``app`` on ``config.bind`` as ``hypercorn.trio.serve``
    does (lifespan startup, accept, graceful shutdown when ``shutdown_trigger``
    returns: in-flight connections get ``config.graceful_timeout``, then the
    lifespan shuts down), with at most ``max_connections`` connections open
    at once (0: no cap). ``task_status.started`` gets the bound URLs."""
    if config.ssl_enabled:
        raise ValueError("TLS is not served by voiceactors: terminate it in front of the server")
    asgi = wrap_app(app, config.wsgi_max_body_size, "asgi")
    lifespan_state: dict[str, Any] = {}
    lifespan = Lifespan(asgi, config, lifespan_state)
    context = WorkerContext(None)
    slots = trio.Semaphore(max_connections) if max_connections > 0 else None

    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as connections:
            listeners: list[trio.abc.Listener[Any]] = []
            binds: list[str] = []
            for sock in config.create_sockets().insecure_sockets:
                sock.listen(config.backlog)
                listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
                listeners.append(listener if slots is None else CappedListener(listener, slots, cap=max_connections))
                binds.append(f"http://{repr_socket_addr(sock.family, sock.getsockname())}")
            task_status.started(binds)
            handler = partial(TCPServer, asgi, config, context, ConnectionState(lifespan_state.copy()))
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
