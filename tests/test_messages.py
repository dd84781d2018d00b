"""Actor messaging helpers: ``ask`` and ``drain``."""

from __future__ import annotations

import contextlib

import pytest
import trio

from voiceactors.messages import CountCalls, ask, drain


async def test_drain_takes_every_queued_message_before_yielding_to_others():
    send, receive = trio.open_memory_channel(10)
    for i in range(3):
        send.send_nowait(i)
    others: list[str] = []
    seen: list[tuple[int, list[str]]] = []

    async def other() -> None:
        others.append("ran")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)   # runs at our first checkpoint
        async with contextlib.aclosing(drain(receive)) as messages:
            async for message in messages:
                seen.append((message, list(others)))
                if message == 2:
                    break
    # a plain ``async for`` over the channel would let the other task run first
    assert seen == [(0, []), (1, []), (2, [])]


async def test_drain_ends_when_the_inbox_closes_and_waits_when_empty(autojump_clock):
    send, receive = trio.open_memory_channel(10)
    got = []

    async def producer():
        await trio.sleep(1)
        await send.send("late")
        await send.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(producer)
        async for message in drain(receive):
            got.append(message)
    assert got == ["late"]


async def test_ask_times_out_when_no_actor_answers(autojump_clock):
    inbox, _kept = trio.open_memory_channel(1)
    with pytest.raises(trio.TooSlowError):
        await ask(inbox, CountCalls, timeout=3)


async def test_ask_requires_its_timeout():
    inbox, _kept = trio.open_memory_channel(1)
    with pytest.raises(TypeError, match="timeout"):
        await ask(inbox, CountCalls)            # no default: every caller names its deadline
    assert inbox.statistics().current_buffer_used == 0   # nothing was sent
