"""When a client frame was read off the socket: the simulator's one reach
into trio-websocket's internals.

Why: ``get_message`` returns a message when the simulator's reader task
gets to it, which can be several scheduler passes after trio-websocket's
reader task read its bytes (the simulator's writer and player run in
between, a frame each). A benchmark that stamps there measures the
simulator's own queue as the peer's latency. trio-websocket's reader task
hands each message to a memory channel in the step its socket read
returned (the frame parsed, nothing else between), so a stamp taken at that
hand-off is the read.

``stamp_reads(ws)`` wraps the send side of the connection's message channel
(``_send_channel``, read by trio-websocket through the attribute at every
hand-off) so every message handed over appends ``trio.current_time()`` to a
FIFO; ``read_stamp(ws)`` takes the oldest, once per message the caller got
from ``get_message``. The channel's order is the messages' order, so each
stamp belongs to the message taken with it. Nothing else changes: the
hand-off still waits (``send``) when the channel is full, exactly as before.

trio-websocket is pinned exactly in ``pyproject.toml`` (the realtime
client's ``voiceactors/realtime/ws_frames.py`` reaches into the same
attribute); ``stamp_reads`` refuses a connection without it, and
``tests/test_simulator_bench.py`` checks the stamp over real sockets.
"""

from __future__ import annotations

import collections
from typing import Any

import trio

__all__ = ["read_stamp", "stamp_reads"]


class _StampedHandOff:
    """The send side of the message channel, stamping each message as it is handed over."""

    __slots__ = ("_inner", "stamps")

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.stamps: collections.deque[float] = collections.deque()

    async def send(self, value: Any) -> None:
        self.stamps.append(trio.current_time())   # before a full channel's wait: the read was now
        try:
            await self._inner.send(value)
        except BaseException:
            self.stamps.pop()   # never queued (the connection is closing): no message to pair with
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def stamp_reads(ws: Any) -> None:
    """Stamp every message ``ws``'s reader task hands over from now on (idempotent)."""
    channel = getattr(ws, "_send_channel", None)
    if channel is None or not hasattr(channel, "send"):
        raise RuntimeError("trio-websocket internals changed (no _send_channel): "
                           "see voiceactors/simulator/read_stamps.py")
    if not isinstance(channel, _StampedHandOff):
        ws._send_channel = _StampedHandOff(channel)


def read_stamp(ws: Any) -> float:
    """The hand-off time of the oldest message not yet paired; call it once
    per message ``get_message`` returned. Without ``stamp_reads`` (or with
    no stamp left), now."""
    channel = getattr(ws, "_send_channel", None)
    if isinstance(channel, _StampedHandOff) and channel.stamps:
        return channel.stamps.popleft()
    return trio.current_time()
