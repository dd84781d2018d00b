"""The in-memory call transport (``voiceactors/call/memory_transport.py``):
the seam's contract as the call's shell relies on it, with the service's
side driven by the test."""

from __future__ import annotations

import json
import math

import pytest
import trio

from voiceactors.call.memory_transport import MemoryPeer, MemoryService, MemoryTransport
from voiceactors.call.transport import CallTransport, TransportClosed, TransportGone, TransportRefused


def _pair() -> tuple[MemoryTransport, MemoryPeer]:
    transport = MemoryTransport()
    return transport, MemoryPeer(transport)


def test_it_is_a_call_transport():
    transport: CallTransport = MemoryTransport()    # mypy checks the structure; this, that it builds
    assert transport.take_skipped() == 0 and transport.last_skipped_at() == -math.inf


async def test_a_push_is_one_batch_and_batches_waiting_come_together():
    transport, peer = _pair()
    peer.push({"type": "a"}, '{"type": "b"}')
    peer.push({"type": "c"})
    assert [json.loads(f)["type"] for f in await transport.receive_batch()] == ["a", "b", "c"]
    async with trio.open_nursery() as nursery:
        got = []

        async def read() -> None:
            got.extend(await transport.receive_batch())

        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []                  # it waits for the next push
        peer.push({"type": "d"})
    assert [json.loads(f)["type"] for f in got] == ["d"]


async def test_screened_frames_are_dropped_counted_and_stamped(autojump_clock):
    transport, peer = _pair()
    transport.screen(lambda frame: "delta" in frame)
    await trio.sleep(5)
    peer.push({"type": "x.delta"}, {"type": "kept"}, {"type": "y.delta"})
    assert transport.take_skipped() == 2 and transport.take_skipped() == 0
    assert transport.last_skipped_at() == trio.current_time()
    assert [json.loads(f)["type"] for f in await transport.receive_batch()] == ["kept"]
    peer.push({"type": "z.delta"})                 # nothing kept: the reader is not woken
    with trio.move_on_after(1):
        await transport.receive_batch()
        pytest.fail("woken for a skipped frame")


async def test_what_the_call_sends_the_peer_reads_in_order():
    transport, peer = _pair()
    assert transport.start_send(json.dumps({"type": "one"})) == b""     # whole, in this step
    await transport.send(json.dumps({"type": "two"}))
    assert [e["type"] for e in peer.sent] == ["one", "two"]
    assert (await peer.next_sent())["type"] == "one"
    assert (await peer.next_sent())["type"] == "two"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(transport.send, json.dumps({"type": "three"}))
        assert (await peer.next_sent())["type"] == "three"     # waited for


async def test_send_before_sends_nothing_at_or_after_its_deadline(autojump_clock):
    transport, peer = _pair()
    assert await transport.send_before(json.dumps({"type": "in_time"}), trio.current_time() + 1)
    assert not await transport.send_before(json.dumps({"type": "late"}), trio.current_time())
    assert [e["type"] for e in peer.sent] == ["in_time"]


async def test_a_close_from_the_service_ends_reads_and_sends():
    transport, peer = _pair()
    peer.push({"type": "last"})
    peer.close(1001, "limit")
    peer.push({"type": "after the close"})          # never read
    assert len(await transport.receive_batch()) == 1   # what came before the close is still read
    with pytest.raises(TransportClosed) as closed:
        await transport.receive_batch()
    assert (closed.value.code, closed.value.reason) == (1001, "limit")
    assert transport.start_send("{}") is None
    with pytest.raises(TransportClosed):
        await transport.send("{}")
    with pytest.raises(TransportClosed):
        await peer.next_sent()
    assert peer.closed_with is None


async def test_a_close_from_the_call_wakes_the_reader_and_the_peer_sees_its_code():
    transport, peer = _pair()
    async with trio.open_nursery() as nursery:
        failures = []

        async def read() -> None:
            try:
                await transport.receive_batch()
            except TransportClosed as exc:
                failures.append(exc.code)

        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        await transport.aclose(1000, "bye")
    assert failures == [1000] and peer.closed_with == (1000, "bye")
    with pytest.raises(TransportClosed):
        await transport.aclose()


async def test_the_service_opens_connections_in_order_and_fails_the_attempts_asked():
    service = MemoryService()
    service.fail_next(TransportGone("gone", 404))
    service.fail_next(TransportRefused("refused", 401))
    with pytest.raises(TransportGone):
        async with service.open("sk-1"):
            pass
    with pytest.raises(TransportRefused):
        async with service.open("sk-2"):
            pass
    async with service.open("sk-3") as transport:
        peer = await service.next_connection()
        await transport.send(json.dumps({"type": "hello"}))
    assert service.keys == ["sk-1", "sk-2", "sk-3"]
    assert peer.sent == [{"type": "hello"}]
    assert peer.closed_with == (1006, None)      # left without a close: a drop, as a socket's


# ------------------------------------------------ the calls rig's sideband in memory

@pytest.mark.parametrize("scenario", ["parallel_tools", "drop_and_resume"])
async def test_the_calls_rig_plays_a_scenario_in_memory_as_over_loopback(tmp_path, autojump_clock, scenario):
    """``calls_support``'s rig serves the simulator's calls in memory by
    default: the same scenario gives the same exchange, the same records and
    the same end as over the loopback websocket, and the memory run's
    connection is a ``MemoryTransport``."""
    from calls_support import Sideband, real_time_limit, rig, steady

    seen = {}
    for sideband in Sideband:
        async with rig(tmp_path / sideband.value, sideband=sideband) as r:
            sc = r.sim.add_call("rtc_same", steady(scenario))
            actor = r.actor("rtc_same")
            with real_time_limit():
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(actor.run)
                    while actor.transport is None:
                        await trio.sleep(0.01)
                    transport = type(actor.transport).__name__
        seen[sideband] = (transport, actor.end_reason, actor.reconnects, [e["type"] for e in sc.received],
                          sc.sent_types(), [(x.origin, x.status) for x in sc.responses], sc.connections,
                          sorted(len(o) for o in sc.outputs.values()), [h["status"] for h in r.sim.handshakes],
                          # the kinds, not their count: whether a drop finds a response.create on
                          # its way (one more ``response_create`` line, ``lost``) is a race either way
                          sorted({line["kind"] for line in r.record("rtc_same")}))
    memory, loopback = seen[Sideband.MEMORY], seen[Sideband.LOOPBACK]
    assert memory[0] == "MemoryTransport" and loopback[0] == "WebSocketTransport"
    assert memory[1:] == loopback[1:]
    assert memory[1] == "closed_by_service"
