"""A call rejoined after a crash carries on with its linked context, as a
taken-over call does (without ``--redis``, from its own record): one
``voiceactors serve`` connects a call with a ``context`` and
``{"greeting": "first"}``, ``journal.select`` changes its selection, then
kill -9. A fresh server on the same state folder rejoins the call: its first
``session.update`` carries the link and the selection made before the kill,
``entities.get`` without an argument reads the selected person, and the
greeting is not sent again."""

from __future__ import annotations

import json

import trio

from calls_support import DAY, KEY, steady
from test_call_crash import Server, _wait_for_line, stop_all, stop_cleanly
from test_cluster_takeover_context import CALL, SCENARIO, _greetings, _updates, connect_linked
from voiceactors.call.record import read_record, record_path
from voiceactors.journal.sample import write_sample_journal
from voiceactors.simulator import Simulator


async def test_kill_9_then_a_fresh_server_rejoins_with_the_linked_context_and_selection(tmp_path):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    state = tmp_path / "state"
    sim = Simulator(None, api_key=KEY)
    sc = sim.add_call(CALL, steady(SCENARIO))
    record = record_path(state, CALL)
    first = second = None
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            first, second = Server(journal, state, sim), Server(journal, state, sim)
            await connect_linked(await first.start(nursery))
            await _wait_for_line(record, "selection", "call_select")       # on disk
            await _wait_for_line(record, "tool_call", "call_select")       # settled: not answered again
            assert sc.step_index == 5, sc.step_index         # still in the sleep: the rest is the rejoin's
            first.proc.kill()                                 # SIGKILL mid-call
            with trio.fail_after(10):
                assert await first.proc.wait() == -9
            await second.start(nursery)                       # rejoins at start-up
            with trio.fail_after(30):
                await sc.wait_until(lambda c: c.closed)
            await stop_cleanly(second)
            nursery.cancel_scope.cancel()
    finally:
        stop_all(first, second)
    assert sc.connections == 2 and sc.violations == [] and sc.error_codes == []
    assert [e["call_id"] for e in second.events("supervisor.rejoin")] == [CALL]
    # the first run: the link's update, the select's; the rejoin: one at its connection, the same text
    link_update, select_update, rejoined_update = _updates(sc)
    assert '"Maya Chen"' in link_update and '"Sam Okafor"' not in link_update
    assert '"Maya Chen"' in select_update and '"Sam Okafor"' in select_update
    assert rejoined_update == select_update and sc.session["instructions"] == rejoined_update
    [got] = sc.outputs["call_get"]                            # "him": the person selected before the kill
    assert json.loads(got)["slug"] == "sam_okafor"
    assert len(_greetings(sc)) == 1                           # the first run's only
    lines = read_record(record)
    starts = [i for i, x in enumerate(lines) if x["kind"] == "start"]
    assert len(starts) == 2
    new = lines[starts[1]:]
    assert new[0]["rejoined"] is True and new[0]["recovered"] == []
    # the rejoined run's own context line: what a second crash would carry on
    [carried] = [x["context"] for x in new if x["kind"] == "context"]
    assert carried["link"]["id"] == "maya_chen" and carried["selection"]["id"] == "sam_okafor"
    assert [x["tool_call_id"] for x in new if x["kind"] == "tool_call"] == ["call_get"]
    assert not second.events("call.greeting") and not second.events("call.greeting_dropped")
