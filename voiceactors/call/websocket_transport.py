"""The call's transport over the Realtime sideband websocket (trio-websocket).

Each method is one of ``realtime/ws_frames.py``'s fast paths on the open
``WebSocketConnection``: the reader takes every frame of a socket read in one
step (``get_messages``, with the frames it would skip dropped by the hand-off
and whole text frames cut out by ``decode_whole_frames``), and a write goes
out with no schedule point when the socket takes it whole (``start_send``),
else through ``send_now`` / ``finish_send`` / ``send_before``. Its one change
is the error: trio-websocket's ``ConnectionClosed`` becomes the seam's
``TransportClosed`` with the close code as a plain int.

``sideband_opener`` opens one for a call (``realtime/sideband.py``'s
``open_sideband``), its failures told as the seam's (``CallGone`` as
``TransportGone``, ``SidebandRefused`` as ``TransportRefused``, any other
``SidebandUnavailable`` as ``TransportUnavailable``, ``SidebandBroken`` as
``TransportBroken``; the message and status kept). The realtime package
below does not know the seam.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import AsyncIterator, Callable

from voiceactors.call.transport import (
    CallTransport, FrameFilter, OpenTransport, ServerFrame, TransportBroken, TransportClosed, TransportError,
    TransportGone, TransportRefused, TransportUnavailable,
)
from voiceactors.realtime import ws_frames
from voiceactors.realtime.sideband import (
    CallGone, ConnectionClosed, SidebandBroken, SidebandError, SidebandRefused, SidebandUnavailable,
    WebSocketConnection, close_code, open_sideband, ws_url,
)

__all__ = ["WebSocketTransport", "closed", "failure", "sideband_opener"]


def closed(exc: ConnectionClosed) -> TransportClosed:
    """The seam's error for trio-websocket's (an IntEnum code made a plain int)."""
    code = close_code(exc)
    reason = getattr(exc.reason, "reason", None)
    return TransportClosed(int(code) if code is not None else None, reason if isinstance(reason, str) else None)


class WebSocketTransport:
    """A ``CallTransport`` over one open sideband websocket."""

    __slots__ = ("ws",)

    def __init__(self, ws: WebSocketConnection) -> None:
        self.ws = ws

    def screen(self, skip: FrameFilter | None) -> None:
        # also makes the connection's reader hand every frame of a socket read over at once
        ws_frames.hand_off_at_once(self.ws, skip=skip)

    async def receive_batch(self) -> list[ServerFrame]:
        try:
            return await ws_frames.get_messages(self.ws)
        except ConnectionClosed as exc:
            raise closed(exc) from None

    def take_skipped(self) -> int:
        return ws_frames.take_skipped(self.ws)

    def last_skipped_at(self) -> float:
        return ws_frames.last_skipped_at(self.ws)

    def start_send(self, text: str) -> bytes | None:
        return ws_frames.start_send(self.ws, text)

    async def finish_send(self, rest: bytes) -> None:
        try:
            await ws_frames.finish_send(self.ws, rest)
        except ConnectionClosed as exc:
            raise closed(exc) from None

    async def send(self, text: str) -> None:
        try:
            await ws_frames.send_now(self.ws, text)
        except ConnectionClosed as exc:
            raise closed(exc) from None

    async def send_before(self, text: str, until: float) -> bool:
        try:
            return await ws_frames.send_before(self.ws, text, until)
        except ConnectionClosed as exc:
            raise closed(exc) from None

    async def aclose(self, code: int = 1000, reason: str | None = None) -> None:
        try:
            await self.ws.aclose(code, reason)
        except ConnectionClosed as exc:
            raise closed(exc) from None


def sideband_opener(base_url: str, call_id: str, *, connect_timeout: float,
                    url_of: Callable[[str, str], str] = ws_url) -> OpenTransport:
    """The opener of ``call_id``'s sideband under the REST ``base_url`` (at
    ``url_of(base_url, call_id)``: a Realtime call's by default, a Live
    session's attach for ``live/attach.py``): each attempt opens a new
    websocket with that attempt's API key."""

    def open_transport(api_key: str) -> AbstractAsyncContextManager[CallTransport]:
        return _open(base_url, api_key, call_id, connect_timeout, url_of)

    return open_transport


@asynccontextmanager
async def _open(base_url: str, api_key: str, call_id: str, connect_timeout: float,
                url_of: Callable[[str, str], str]) -> AsyncIterator[CallTransport]:
    try:
        async with open_sideband(base_url, api_key, call_id, connect_timeout=connect_timeout, url_of=url_of) as ws:
            yield WebSocketTransport(ws)
    except SidebandError as exc:     # the sideband's own failures only: the body's pass unchanged
        raise failure(exc) from None


def failure(exc: SidebandError) -> TransportError:
    """The seam's failure for the sideband's (its message and status kept)."""
    kind: type[TransportError]
    if isinstance(exc, CallGone):
        kind = TransportGone
    elif isinstance(exc, SidebandRefused):
        kind = TransportRefused
    elif isinstance(exc, SidebandUnavailable):
        kind = TransportUnavailable
    elif isinstance(exc, SidebandBroken):
        kind = TransportBroken
    else:
        kind = TransportUnavailable
    return kind(str(exc), exc.status_code)
