"""A taken-over call carries on with its linked context (issue 18): two
``voiceactors serve`` processes on one real redis-server, a call connected
on the first with a ``context`` and ``{"greeting": "first"}``, its selection
changed by ``journal.select``, then kill -9 of that holder. The other process
takes the call over: its first ``session.update`` carries the link and the
selection made before the kill (the brain's instruction it was connected
with first), ``entities.get`` without an argument reads the selected person,
and the greeting is not sent again."""

from __future__ import annotations

import json

import httpx
import pytest
import trio

from calls_support import DAY, KEY, steady
from cluster_support import TTL_S, ClusterServer, stop_all, stop_cleanly, takers
from redis_support import REDIS_SERVER, redis_server  # noqa: F401  (the fixture)
from test_call_crash import _wait_for_line
from voiceactors.call.record import read_record, record_path
from voiceactors.cluster import redis_client as rc
from voiceactors.journal.sample import write_sample_journal
from voiceactors.simulator import Simulator

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")

CALL = "rtc_linked_takeover"
# The holder is killed during the ``sleep_until`` (seconds after the call's
# first connection): the taker's connection replays it and finds it past.
SCENARIO = [
    {"sleep": 0.5},                                      # the greeting plays
    {"user_turn": {"text": "Let's talk about Sam."}},
    {"response": {"tool_calls": [{"name": "journal.select", "arguments": {"kind": "entity", "id": "sam"},
                                  "call_id": "call_select"}]}},
    {"wait_outputs": {}},
    {"response": {"text": "Sam Okafor it is."}},
    {"sleep_until": 10},
    {"user_turn": {"text": "What do we know about him?"}},
    {"response": {"tool_calls": [{"name": "entities.get", "arguments": {}, "call_id": "call_get"}]}},
    {"wait_outputs": {}},
    {"response": {"text": "He owns the data pipeline."}},
    {"close": 1000},
]


def _updates(sim_call) -> list[str]:
    return [e["session"]["instructions"] for e in sim_call.received if e["type"] == "session.update"]


def _greetings(sim_call) -> list[dict]:
    return [e for e in sim_call.received if e["type"] == "response.create"
            and "Speak first" in (e.get("response") or {}).get("instructions", "")]


async def connect_linked(url: str) -> None:
    """Connect ``CALL`` linked to Maya Chen, greeting first, once the brain
    has an instruction (the mint waits for it)."""
    async with httpx.AsyncClient(base_url=url, timeout=20) as client:
        minted = await client.post("/api/voice/session", json={})
        assert minted.status_code == 200, minted.text
        response = await client.post("/api/voice/connect", json={
            "call_id": CALL, "context": {"kind": "entity", "id": "maya_chen"}, "greeting": "first"})
        assert response.status_code == 200, response.text
        assert response.json()["context"]["name"] == "Maya Chen"


async def _mirrored_selection(url: str, entity_id: str) -> None:
    """Wait until the holder's mirror carries the selection and nothing else:
    the selection is mirrored when the select's output is made, its tool call
    leaves the mirror only once the service confirmed that output, a pass or
    more later. Killed in between, the taker would answer the select again."""
    with trio.fail_after(10):
        async with rc.client(url) as redis:
            while True:
                mirror = await redis.hgetall(rc.pending_key(CALL))
                text = mirror.get(rc.CONTEXT_FIELD)
                if text and (json.loads(text).get("selection") or {}).get("id") == entity_id \
                        and list(mirror) == [rc.CONTEXT_FIELD]:
                    return
                await trio.sleep(0.05)


async def test_kill_9_of_the_holder_the_taker_carries_the_linked_context_and_selection_on(tmp_path, redis_server):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    sim = Simulator(None, api_key=KEY)
    sc = sim.add_call(CALL, steady(SCENARIO))
    servers: list[ClusterServer] = []
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            servers = [ClusterServer(journal, tmp_path / f"state_{i}", sim, redis_server) for i in range(2)]
            a, b = servers
            url_a = await a.start(nursery)
            await b.start(nursery)
            await connect_linked(url_a)
            record_a = record_path(tmp_path / "state_0", CALL)
            await _wait_for_line(record_a, "selection", "call_select")
            await _mirrored_selection(redis_server.url, "sam_okafor")
            assert sc.step_index == 5, sc.step_index         # still in the sleep: the rest is the taker's
            a.proc.kill()                                     # SIGKILL mid-call
            with trio.fail_after(10):
                assert await a.proc.wait() == -9
            with trio.fail_after(TTL_S + 30):        # the TTL, a scan, a reconnect, the rest of the sleep
                await sc.wait_until(lambda c: c.closed)
            await stop_cleanly(b)
            nursery.cancel_scope.cancel()
    finally:
        stop_all(*servers)
    assert sc.connections == 2 and sc.violations == [] and sc.error_codes == []
    [take_over] = takers(b)
    assert take_over["call_id"] == CALL
    # the holder: the link's update, the select's; the taker: one at its connection, the same text
    link_update, select_update, taken_update = _updates(sc)
    assert '"Maya Chen"' in link_update and '"Sam Okafor"' not in link_update
    assert '"Maya Chen"' in select_update and '"Sam Okafor"' in select_update
    assert taken_update == select_update and sc.session["instructions"] == taken_update
    # "him" is the person selected before the kill
    [got] = sc.outputs["call_get"]
    assert json.loads(got)["slug"] == "sam_okafor"
    assert len(_greetings(sc)) == 1                          # the holder's only
    lines = read_record(record_path(tmp_path / "state_1", CALL))
    assert lines[0]["kind"] == "start" and lines[0]["rejoined"] is True
    assert [x["tool_call_id"] for x in lines if x["kind"] == "tool_call"] == ["call_get"]
    assert not b.events("call.greeting") and not b.events("call.greeting_dropped")
