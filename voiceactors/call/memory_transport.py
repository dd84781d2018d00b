"""An in-memory call transport, for tests: the service's side is a
``MemoryPeer`` the test drives, with no socket, no simulator and no clock of
its own (``autojump_clock`` drives every wait).

A ``MemoryService`` is the opener a ``CallActor`` is given
(``open_transport=service.open``): each connect attempt takes the next
outcome the test arranged (``fail_next``), or opens a new connection whose
peer the test gets with ``await service.next_connection()``. On that peer the
test pushes server events (``push``: one call is one batch, as one socket read
brings several frames), reads what the call sent (``sent``, ``await
next_sent()``), and closes from the service's side (``close``); after the
call closed the connection, ``closed_with`` holds its code and reason.
"""

from __future__ import annotations

import json
import math
from collections import deque
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, AsyncIterator

import trio

from voiceactors.call.transport import CallTransport, FrameFilter, ServerFrame, TransportClosed, TransportError

__all__ = ["MemoryPeer", "MemoryService", "MemoryTransport"]

#: The close code of a connection that ended without a close (as a websocket reports it).
ABNORMAL_CLOSE = 1006


class MemoryTransport:
    """The call's side of one in-memory connection (a ``CallTransport``)."""

    def __init__(self) -> None:
        self._batches: deque[list[ServerFrame]] = deque()
        self._arrived = trio.Event()
        self._skip: FrameFilter | None = None
        self._skipped = 0
        self._skipped_at = -math.inf
        self.sent: list[dict[str, Any]] = []          # every client event, in order
        self._sent_more = trio.Event()
        self.peer_closed: tuple[int, str | None] | None = None   # the service's close
        self.closed_with: tuple[int, str | None] | None = None   # the call's close

    # the call's side (CallTransport)

    def screen(self, skip: FrameFilter | None) -> None:
        self._skip = skip

    async def receive_batch(self) -> list[ServerFrame]:
        while not self._batches:
            self._raise_if_closed()
            await self._arrived.wait()
            self._arrived = trio.Event()
        batch = self._batches.popleft()
        while self._batches:     # every batch already there, as a socket read takes all it finds
            batch.extend(self._batches.popleft())
        return batch

    def take_skipped(self) -> int:
        skipped, self._skipped = self._skipped, 0
        return skipped

    def last_skipped_at(self) -> float:
        return self._skipped_at

    def start_send(self, text: str) -> bytes | None:
        if self._closed():
            return None       # ``send`` raises
        self._deliver(text)
        return b""

    async def finish_send(self, rest: bytes) -> None:
        raise AssertionError("start_send always sends whole")   # pragma: no cover - never left a rest

    async def send(self, text: str) -> None:
        await trio.lowlevel.checkpoint()
        self._raise_if_closed()
        self._deliver(text)

    async def send_before(self, text: str, until: float) -> bool:
        await trio.lowlevel.checkpoint()
        self._raise_if_closed()
        if trio.current_time() >= until:
            return False
        self._deliver(text)
        return True

    async def aclose(self, code: int = 1000, reason: str | None = None) -> None:
        await trio.lowlevel.checkpoint()
        self._raise_if_closed()
        self.closed_with = (code, reason)
        self._wake()

    # the service's side (MemoryPeer)

    def _push(self, frames: list[ServerFrame]) -> None:
        if self._closed():
            return      # nobody reads a closed connection
        skip, kept = self._skip, []
        for frame in frames:
            if skip is not None and skip(frame):
                self._skipped += 1
                self._skipped_at = trio.current_time()
            else:
                kept.append(frame)
        if kept:
            self._batches.append(kept)
            self._arrived.set()

    def _close_from_peer(self, code: int, reason: str | None) -> None:
        if not self._closed():
            self.peer_closed = (code, reason)
            self._wake()

    def _deliver(self, text: str) -> None:
        self.sent.append(json.loads(text))
        self._sent_more.set()

    def _wake(self) -> None:
        self._arrived.set()
        self._sent_more.set()

    def _closed(self) -> bool:
        return self.peer_closed is not None or self.closed_with is not None

    def _raise_if_closed(self) -> None:
        closed = self.peer_closed or self.closed_with
        if closed is not None:
            raise TransportClosed(*closed)


class MemoryPeer:
    """The service's end of one in-memory connection, driven by a test."""

    def __init__(self, transport: MemoryTransport) -> None:
        self.transport = transport
        self._read = 0
        self._event_ids = 0

    def push(self, *events: dict[str, Any] | ServerFrame) -> None:
        """Server events for the call, as one read: a dict is sent as its
        JSON text, with an ``event_id`` when it has none (every server event
        carries one); a string or bytes as it is."""
        self.transport._push([self._frame(e) if isinstance(e, dict) else e for e in events])

    def _frame(self, event: dict[str, Any]) -> str:
        if "event_id" not in event:
            self._event_ids += 1
            event = {"event_id": f"event_mem_{self._event_ids}", **event}
        return json.dumps(event)

    @property
    def sent(self) -> list[dict[str, Any]]:
        """Every client event the call sent on this connection, in order."""
        return self.transport.sent

    async def next_sent(self) -> dict[str, Any]:
        """The next client event not yet read through here (waiting for it).
        Raises ``TransportClosed`` when the connection closed with none left."""
        transport = self.transport
        while self._read >= len(transport.sent):
            transport._raise_if_closed()
            await transport._sent_more.wait()
            transport._sent_more = trio.Event()
        self._read += 1
        return transport.sent[self._read - 1]

    def close(self, code: int = 1000, reason: str | None = None) -> None:
        """Close the connection from the service's side (1006: a drop)."""
        self.transport._close_from_peer(code, reason)

    @property
    def closed_with(self) -> tuple[int, str | None] | None:
        """The code and reason the call closed the connection with (None: it did not)."""
        return self.transport.closed_with


class MemoryService:
    """The opener of a call's in-memory connections, and the test's view of them."""

    def __init__(self) -> None:
        self._failures: deque[TransportError] = deque()
        self._send, self._receive = trio.open_memory_channel[MemoryPeer](math.inf)
        self.keys: list[str] = []    # the API key of every attempt, in order

    def fail_next(self, error: TransportError) -> None:
        """The next connect attempt fails with ``error`` (e.g. ``TransportGone``)."""
        self._failures.append(error)

    def open(self, api_key: str) -> AbstractAsyncContextManager[CallTransport]:
        """The ``OpenTransport`` for a ``CallActor``."""
        return self._open(api_key)

    async def next_connection(self) -> MemoryPeer:
        """The peer of the next connection the call opens (waiting for it)."""
        return await self._receive.receive()

    @asynccontextmanager
    async def _open(self, api_key: str) -> AsyncIterator[CallTransport]:
        await trio.lowlevel.checkpoint()
        self.keys.append(api_key)
        if self._failures:
            raise self._failures.popleft()
        transport = MemoryTransport()
        self._send.send_nowait(MemoryPeer(transport))
        try:
            yield transport
        finally:
            if not transport._closed():
                transport.closed_with = (ABNORMAL_CLOSE, None)   # left without a close: a drop
                transport._wake()
