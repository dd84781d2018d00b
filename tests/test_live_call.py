"""A Live call through the call's shell: ``CallActor``, the real
``ToolExecutor`` on a real journal, the connection in memory with a Live
service played on its peer (``call/memory_transport.py``) and
``LiveTransport`` between them. Every event the call sends is checked
against the SDK's Live client union; every event the peer plays against the
Live server union (``simulator/live_events.py``)."""

from __future__ import annotations

import json
from typing import Any

import trio
import trio.testing

from voiceactors.call.memory_transport import MemoryPeer, MemoryService
from voiceactors.live.names import FunctionNames
from voiceactors.live.transport import live_transport
from voiceactors.live.translate import LiveTranslator
from voiceactors.simulator import live_events as le
from voiceactors.tool_effect import WRITE
from voiceactors.tools.registry import REGISTRY, ToolSpec, make_registry

from calls_support import Gate, rig

SEARCH, WRITE_TOOL = "journal.search", "commitments.complete"


def play(peer: MemoryPeer, *events: dict[str, Any]) -> None:
    for event in events:
        assert le.live_server_error(event) is None, event
    peer.push(*events)


async def next_live(peer: MemoryPeer) -> dict[str, Any]:
    event = await peer.next_sent()
    assert le.live_client_error(event) is None, event
    return event


def live_opener(service: MemoryService, registry: dict[str, ToolSpec]) -> Any:
    names = FunctionNames.of(registry)
    return live_transport(service.open, lambda: LiveTranslator(
        names, is_write=lambda tool: tool in registry and registry[tool].effect == WRITE))


def delegation(did: str, rid: str, offset_ms: int, calls: list[tuple[str, str, str]]) -> list[dict[str, Any]]:
    names = FunctionNames.of(REGISTRY)
    events = [le.delegation_created(did, offset_ms), le.nested(did, le.response_created(rid))]
    for index, (call_id, tool, arguments) in enumerate(calls):
        events += [le.nested(did, le.item_added(call_id, names.responses_name(tool), index)),
                   le.nested(did, le.item_done(call_id, names.responses_name(tool), arguments, index))]
    return events + [le.nested(did, le.response_ended(rid))]


async def test_a_delegated_search_is_answered_from_the_journal_and_continued_once(tmp_path, autojump_clock):
    async with rig(tmp_path) as r:
        service = MemoryService()
        actor = r.actor("live_search", open_transport=live_opener(service, REGISTRY))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(actor.run)
            peer = await service.next_connection()
            play(peer, le.input_delta("what did I write about the garden", 100, 1500),
                 *delegation("del_1", "resp_1", 1600, [("call_s", SEARCH, '{"query": "garden"}')]))
            output = await next_live(peer)
            assert output["type"] == "response.item.create" and output["item"]["call_id"] == "call_s"
            assert "results" in json.loads(output["item"]["output"])       # the real search ran on the journal
            assert (await next_live(peer))["type"] == "response.create"
            play(peer, le.nested("del_1", le.response_created("resp_2")), le.nested("del_1", le.response_ended("resp_2")),
                 le.output_delta("You wrote about the garden twice.", 2500))
            await trio.testing.wait_all_tasks_blocked()
            play(peer, le.session_closed("live_search", "remote_hangup", 4.0))
            peer.close(1000)
    assert actor.end_reason == "closed_by_service"
    assert [e["type"] for e in peer.sent] == ["response.item.create", "response.create"]
    assert actor.calls["call_s"].state == "confirmed" and actor.batches["resp_2"].origin == "ours"
    assert actor.protocol.turn == 1


async def test_the_user_speaking_over_the_work_cancels_the_read_and_reports_the_write(tmp_path, autojump_clock):
    """A delegated read and write run (each held in its handler); the user
    speaks after the delegation was made: the read is cancelled, the write
    finishes and runs once; both outputs go to the delegated model, the
    write's note to the Live model, and nothing asks to speak the old work."""
    read, write = Gate({"results": []}), Gate({"ok": True, "commitment": "c_1"})
    specs = [s for s in REGISTRY.values() if s.name not in (SEARCH, WRITE_TOOL)]
    specs += [ToolSpec(name=SEARCH, description="held search", parameters={"type": "object"}, effect="read",
                       handler=read.handler),
              ToolSpec(name=WRITE_TOOL, description="held write", parameters={"type": "object"}, effect="write",
                       handler=write.handler)]
    registry = make_registry(specs)
    async with rig(tmp_path, registry=registry) as r:
        service = MemoryService()
        actor = r.actor("live_barge", open_transport=live_opener(service, registry))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(actor.run)
            peer = await service.next_connection()
            play(peer, *delegation("del_1", "resp_1", 1000, [("call_r", SEARCH, '{"query": "boat"}'),
                                                               ("call_w", WRITE_TOOL, '{"commitment_id": "c_1"}')]))
            await trio.to_thread.run_sync(read.entered.wait, 10)
            await trio.to_thread.run_sync(write.entered.wait, 10)
            play(peer, le.input_delta("no wait", 1800))
            cancelled = await next_live(peer)
            assert cancelled["item"]["call_id"] == "call_r" and "error" in json.loads(cancelled["item"]["output"])
            write.release.set()
            written = await next_live(peer)
            assert written["item"]["call_id"] == "call_w"
            assert json.loads(written["item"]["output"]) == {"ok": True, "commitment": "c_1"}
            note = await next_live(peer)
            assert note["type"] == "session.thinking.append" and WRITE_TOOL in note["content"]
            # the same function call again (a duplicated stream): not run again
            play(peer, le.nested("del_1", le.item_done("call_w", "commitments_complete", '{"commitment_id": "c_1"}')))
            await trio.testing.wait_all_tasks_blocked()
            read.release.set()
            peer.close(1000)
    assert [e["type"] for e in peer.sent] == ["response.item.create", "response.item.create",
                                              "session.thinking.append"]
    assert write.calls == 1
    assert actor.calls["call_w"].outcome == "ok" and actor.calls["call_r"].outcome == "cancelled"
