"""LiveTransport: a call's transport over a Live session's attach sideband.

The connection under it (any ``CallTransport``: the websocket to
``/v1/live/sessions/{id}/attach``, or the in-memory one in tests) carries
Live's frames; the call's shell above it reads and writes the Realtime
events its protocol speaks. Between them sits the call's ``LiveTranslator``
(``translate.py``): each frame read is translated before the shell gets it,
each client event the shell writes is translated before it is sent.

What the translation adds to a plain transport:

* events for the protocol that no frame brought (the echo of an output once
  it is written: Live confirms no item) wake the reader, which returns them
  with its next batch (its wait on the connection is cancelled for them;
  the connection's receive keeps what it had not handed over);
* client events a frame asks for at once (a failed delegation's commentary)
  are sent by the reader, one write at a time with the shell's (``_writing``:
  a write the shell began and did not finish holds it until it does);
* the shell's screen (the frames it would skip unread) applies to the
  translated events, and the connection's screen is off (Live's frames are
  not the Realtime events the screen knows).
"""

from __future__ import annotations

import math
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import AsyncIterator, Callable

import trio

from voiceactors.call.transport import CallTransport, FrameFilter, OpenTransport, ServerFrame
from voiceactors.live.translate import LiveTranslator, Translated

__all__ = ["LiveTransport", "live_transport"]

#: What ``start_send`` answers for a write begun and not finished (the shell hands it back to ``finish_send``).
_BEGUN = b"begun"


class LiveTransport:
    """A ``CallTransport`` that speaks Realtime above and Live below."""

    def __init__(self, inner: CallTransport, translator: LiveTranslator) -> None:
        self.inner = inner
        self.translator = translator
        inner.screen(None)
        self._ready: list[str] = []              # translated events for the shell, not read yet
        self._waiting: trio.CancelScope | None = None
        self._skip: FrameFilter | None = None
        self._skipped = 0
        self._skipped_at = -math.inf
        self._writing = trio.Lock()             # the connection's writes, the shell's and the reader's
        self._started: tuple[str, Translated] | None = None   # a write begun: its translation, done once
        self._inner_rest: bytes | None = None   # what the connection did not take of a begun write
        self._rest: list[str] = []              # ... and the frames behind it

    # ------------------------------------------------------------ reading

    def screen(self, skip: FrameFilter | None) -> None:
        self._skip = skip

    async def receive_batch(self) -> list[ServerFrame]:
        while True:
            if self._ready:
                batch = self._screened()
                if batch:
                    return batch
                continue
            with trio.CancelScope() as waiting:
                self._waiting = waiting
                try:
                    frames = await self.inner.receive_batch()
                finally:
                    self._waiting = None
            if waiting.cancelled_caught:
                continue                         # events of ours are ready
            due: list[str] = []
            for frame in frames:
                translated = self.translator.from_service(frame)
                self._ready.extend(translated.to_call)
                due.extend(translated.to_service)
            if due:
                async with self._writing:
                    for text in due:
                        await self.inner.send(text)

    def _screened(self) -> list[ServerFrame]:
        ready, self._ready = self._ready, []
        skip = self._skip
        if skip is None:
            return list(ready)
        kept: list[ServerFrame] = []
        for frame in ready:
            if skip(frame):
                self._skipped += 1
                self._skipped_at = trio.current_time()
            else:
                kept.append(frame)
        return kept

    def _deliver(self, frames: list[str]) -> None:
        """Events for the shell that no frame brought: the reader returns them next."""
        if frames:
            self._ready.extend(frames)
            if self._waiting is not None:
                self._waiting.cancel()

    def take_skipped(self) -> int:
        skipped, self._skipped = self._skipped, 0
        return skipped + self.inner.take_skipped()

    def last_skipped_at(self) -> float:
        return max(self._skipped_at, self.inner.last_skipped_at())

    # ------------------------------------------------------------ writing

    def _translate(self, text: str) -> Translated:
        started = self._started
        if started is not None and started[0] == text:
            return started[1]                    # begun and not sent: translated already
        translated = self.translator.from_call(text)
        self._started = (text, translated)
        return translated

    def _done(self, translated: Translated) -> None:
        self._started = None
        self._deliver(translated.to_call)

    def start_send(self, text: str) -> bytes | None:
        if self._writing.locked():
            return None                          # the reader is writing: ``send`` waits for it
        translated = self._translate(text)
        frames = translated.to_service
        for index, frame in enumerate(frames):
            rest = self.inner.start_send(frame)
            if rest == b"":
                continue
            if rest is None and index == 0:
                return None                      # nothing went: ``send`` follows with the same text
            # part of the write went: the rest goes in ``finish_send``, before any other write
            self._writing.acquire_nowait()
            self._inner_rest = rest
            self._rest = frames[index if rest is None else index + 1:]
            return _BEGUN
        self._done(translated)
        return b""

    async def finish_send(self, rest: bytes) -> None:
        try:
            if self._inner_rest is not None:
                await self.inner.finish_send(self._inner_rest)
            for frame in self._rest:
                await self.inner.send(frame)
        finally:
            self._inner_rest, self._rest = None, []
            self._writing.release()
        assert self._started is not None
        self._done(self._started[1])

    async def send(self, text: str) -> None:
        async with self._writing:
            translated = self._translate(text)
            for frame in translated.to_service:
                await self.inner.send(frame)
        self._done(translated)

    async def send_before(self, text: str, until: float) -> bool:
        async with self._writing:
            if trio.current_time() >= until:
                return False
            translated = self._translate(text)
            for frame in translated.to_service:
                if not await self.inner.send_before(frame, until):
                    return False
        self._done(translated)
        return True

    async def aclose(self, code: int = 1000, reason: str | None = None) -> None:
        await self.inner.aclose(code, reason)




def live_transport(inner: OpenTransport, translator: Callable[[], LiveTranslator]) -> OpenTransport:
    """The opener of a Live call's transports over ``inner``'s connections:
    the call's one translator (``translator()`` makes it at the first
    attempt; a reconnect keeps what it knows of the session)."""
    kept: list[LiveTranslator] = []

    def open_transport(api_key: str) -> AbstractAsyncContextManager[CallTransport]:
        if not kept:
            kept.append(translator())
        return _open(inner, api_key, kept[0])

    return open_transport


@asynccontextmanager
async def _open(inner: OpenTransport, api_key: str, translator: LiveTranslator) -> AsyncIterator[CallTransport]:
    async with inner(api_key) as connection:
        yield LiveTransport(connection, translator)
