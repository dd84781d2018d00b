"""The call's transport seam: what the call's shell (``call/actor.py``)
needs of the connection that carries a call's events, and nothing more.

A transport is one open connection to one call. Its reader receives the
server's events a batch at a time (every event one read of the connection
brought, handled in one step); its writers send client events, at once when
the connection takes them (``start_send``), or awaited (``send``), or only
before a deadline (``send_before``: a leased call's fence); it closes with a
code and a reason. Opening one (``OpenTransport``) is the opener's, and so
are the failures of opening it (``TransportGone``, ``TransportRefused``,
``TransportUnavailable``) and of a connection that breaks with a protocol
error (``TransportBroken``): the shell's reconnect policy acts on these
classes, whatever the transport.

Today's transports: the websocket sideband (``websocket_transport.py``,
with the frame fast paths of ``realtime/ws_frames.py``) and an in-memory one
for tests (``memory_transport.py``). Only the standard library is imported
here, so any layer can name the seam.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Callable, Protocol

__all__ = ["CallTransport", "FrameFilter", "OpenTransport", "ServerFrame", "TransportBroken",
           "TransportClosed", "TransportError", "TransportGone", "TransportRefused", "TransportUnavailable"]

#: One server event as the connection carried it (text JSON; bytes only from a peer that breaks the protocol).
ServerFrame = str | bytes

#: Says yes to a frame the reader would skip unread (``CallTransport.screen``).
FrameFilter = Callable[[ServerFrame], bool]

class TransportClosed(Exception):
    """The connection is closed: raised by a receive or a send on it.
    ``code`` is the close code (1006 for an abnormal drop, None if none was
    given), ``reason`` the close reason."""

    def __init__(self, code: int | None, reason: str | None = None) -> None:
        super().__init__(code, reason)
        self.code = code
        self.reason = reason


class TransportError(Exception):
    """A transport could not be opened, or broke. ``status_code`` is the
    service's answer (an HTTP status) when it gave one, else None."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class TransportGone(TransportError):
    """The call is over at the service (the websocket's 404/410): never retried."""


class TransportUnavailable(TransportError):
    """Any other failure to open: refused, timed out, a 5xx, a bad address
    (retried with backoff)."""


class TransportRefused(TransportUnavailable):
    """The credentials are refused (the websocket's 401/403): never retried."""


class TransportBroken(TransportError):
    """The open connection failed with a protocol error: a drop that counts
    toward the reconnect limit. Not raised for the shell's own exceptions."""


class CallTransport(Protocol):
    """One open connection of a call, as its shell uses it.

    One reader task calls ``receive_batch``; writes are serialised by the
    shell (one at a time), and a write ``start_send`` left unfinished is
    finished with ``finish_send`` before any other."""

    def screen(self, skip: FrameFilter | None) -> None:
        """From now on, drop (and count) the frames ``skip`` says yes to
        before the reader is woken for them (None: drop none)."""

    async def receive_batch(self) -> list[ServerFrame]:
        """The next frame (waiting for it) and every frame already received
        behind it. Raises ``TransportClosed`` when the connection is closed
        and nothing is left."""

    def take_skipped(self) -> int:
        """How many frames ``screen``'s filter dropped since the last call."""

    def last_skipped_at(self) -> float:
        """``trio.current_time()`` when the filter last dropped a frame (-inf: never)."""

    def start_send(self, text: str) -> bytes | None:
        """Begin sending one client event in this step, with no schedule
        point: ``b""`` when it went whole; the bytes still to go when the
        connection took part of it (``finish_send`` must follow, before any
        other write); None when it could not start (nothing sent: use
        ``send``)."""

    async def finish_send(self, rest: bytes) -> None:
        """Send what ``start_send`` left. Raises ``TransportClosed``."""

    async def send(self, text: str) -> None:
        """Send one client event. Raises ``TransportClosed``."""

    async def send_before(self, text: str, until: float) -> bool:
        """Send one client event only if trio's clock is before ``until``
        when it goes; False (nothing sent) when it is not. Raises
        ``TransportClosed``."""

    async def aclose(self, code: int = 1000, reason: str | None = None) -> None:
        """Close the connection with ``code`` and ``reason``. Raises
        ``TransportClosed`` when it was closed already."""


#: Opens a call's transport with the API key of this attempt (the key may
#: change between attempts). Entering it raises ``TransportGone``,
#: ``TransportRefused`` or ``TransportUnavailable``; the block raises
#: ``TransportBroken`` when the open connection breaks. Leaving it closes the
#: connection.
OpenTransport = Callable[[str], AbstractAsyncContextManager[CallTransport]]
