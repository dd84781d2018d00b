"""Requests of one kind that wait together go to Redis as one.

A ``Batched`` has one sender task (``run``, in its owner's nursery). A
caller's ``ask`` queues its item and waits; the sender takes every item
queued and sends them in one request (``send``, one script). Nothing waits
on a timer: a lone item goes at once, and the items that arrive while a
request is out go together in the next one. So a quiet process pays what it
paid before, and a burst (a join, the ends of many calls) pays one round trip
per batch instead of one per item: a request costs our process about the
same however few it carries (its connection's tasks wake for each).

The sender, not the caller, runs the request, so a caller that gives up
(its bound passed, or it was cancelled) never cancels a request carrying
other callers' items, and an item already sent is settled by ``abandoned``
(the owner undoes what nobody will use).
"""

from __future__ import annotations

from typing import Awaitable, Callable, Generic, TypeVar

import trio

from voiceactors.cluster.redis_client import RegistryDown

I = TypeVar("I")
R = TypeVar("R")

MAX_ITEMS = 256          # per request: one script holds Redis while it runs


class _Slot(Generic[I, R]):
    __slots__ = ("item", "done", "answer", "error", "gone")

    answer: R          # set with ``done`` when the batch was answered (unset before, and on an error)

    def __init__(self, item: I) -> None:
        self.item = item
        self.done = trio.Event()
        self.error: RegistryDown | None = None
        self.gone = False            # its caller stopped waiting before the answer


class Batched(Generic[I, R]):
    """``send(items) -> answers`` (one answer per item, in order; raises
    ``RegistryDown``) for every batch; ``abandoned(item, answer)`` for an
    answered item whose caller was gone. An item whose caller was gone before
    it was sent is dropped, unless ``send_when_gone`` (a release: it must
    reach Redis whether anyone waits for it or not)."""

    def __init__(self, send: Callable[[list[I]], Awaitable[list[R]]],
                 abandoned: Callable[[I, R], None] | None = None, *, send_when_gone: bool = False) -> None:
        self._send = send
        self._abandoned = abandoned
        self._send_when_gone = send_when_gone
        self._queued: list[_Slot[I, R]] = []
        self._wake = trio.Event()

    async def ask(self, item: I, bound_s: float) -> R:
        """``item``'s answer; ``RegistryDown`` when its request failed or no
        answer came within ``bound_s`` (``timed_out``)."""
        slot: _Slot[I, R] = _Slot(item)
        self._queued.append(slot)
        self._wake.set()
        try:
            with trio.move_on_after(bound_s):
                await slot.done.wait()
        finally:
            if not slot.done.is_set():
                slot.gone = True
        if not slot.done.is_set():
            raise RegistryDown("TooSlowError", timed_out=True)
        if slot.error is not None:
            raise RegistryDown(str(slot.error), timed_out=slot.error.timed_out)
        return slot.answer

    def submit(self, item: I) -> None:
        """Queue ``item`` with nobody waiting for its answer (only for a
        ``send_when_gone`` batch: otherwise it would be dropped)."""
        slot: _Slot[I, R] = _Slot(item)
        slot.gone = True
        self._queued.append(slot)
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            while self._queued:
                batch = [slot for slot in self._queued[:MAX_ITEMS] if self._send_when_gone or not slot.gone]
                del self._queued[:MAX_ITEMS]
                if batch:
                    await self._send_batch(batch)

    async def _send_batch(self, batch: list[_Slot[I, R]]) -> None:
        try:
            answers = await self._send([slot.item for slot in batch])
        except RegistryDown as exc:
            for slot in batch:
                slot.error = exc
                slot.done.set()
            return
        for slot, answer in zip(batch, answers, strict=True):
            slot.answer = answer
            slot.done.set()
            if slot.gone and self._abandoned is not None:
                self._abandoned(slot.item, answer)
