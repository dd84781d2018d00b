"""ToolExecutor: bounds, caps, idempotent writes, cancellation.

Handlers run in real worker threads. ``autojump_clock`` jumps to the next
deadline whenever every trio task is waiting, including while a thread runs,
so tests that are not about timeouts use infinite timeouts (no deadline to
jump to) and the timeout tests use handlers that block until released.
"""

from __future__ import annotations

import fcntl
import json
import math
import threading
from pathlib import Path

import pytest
import trio
from structlog.testing import capture_logs

from voiceactors import storage
from voiceactors.executor import write_log
from voiceactors.call.state import ToolOutcome
from voiceactors.messages import CancelReads, ToolRequest, ask
from voiceactors.executor.actor import ToolExecutor, cap_output
from voiceactors.journal import ledger
from voiceactors.settings import Settings
from voiceactors.tools import REGISTRY, ToolContext, ToolSpec, make_registry

NO_ARGS = {"type": "object", "properties": {}, "additionalProperties": False}
ANY_ARGS = {"type": "object"}


def settings_for(journal: Path, state: Path, **changes) -> Settings:
    base = dict(tool_timeout_read_s=math.inf, tool_timeout_write_s=math.inf)
    base.update(changes)
    return Settings(journal=journal, state_dir=state, **base)


class Gate:
    """A handler-side gate: the handler reports it started (into trio) and
    waits until the test releases it."""

    def __init__(self) -> None:
        self.started = trio.Event()
        self.release = threading.Event()
        self.calls = 0
        self._token = trio.lowlevel.current_trio_token()

    def enter(self) -> None:
        self.calls += 1
        # fire-and-forget: works even after the waiting task gave the thread up
        self._token.run_sync_soon(self.started.set)
        assert self.release.wait(10), "test never released the handler"


def spec(name, handler, effect="read", parameters=ANY_ARGS):
    return ToolSpec(name=name, description=f"test tool {name}", parameters=parameters,
                    effect=effect, handler=handler)


def echo(ctx, args):
    return {"args": args, "_nav_target": "today", "_observer_action": {"type": "start_observer", "mode": "meeting"}}


def big(ctx, args):
    return {"text": "x" * args["n"]}


def boom(ctx, args):
    raise RuntimeError("secret detail sk-do-not-leak")


@pytest.fixture
def state(tmp_path):
    return tmp_path / "state"


@pytest.fixture
def journal(tmp_path):
    root = tmp_path / "journal"
    root.mkdir()
    return root


class Client:
    """Sends requests the way a call actor does."""

    def __init__(self, executor: ToolExecutor, call_id: str = "rtc_test"):
        self.executor = executor
        self.call_id = call_id
        self.n = 0

    async def call(self, name, args=None, *, raw=None, tool_call_id=None, turn=0, epoch=0):
        self.n += 1
        arguments = raw if raw is not None else json.dumps(args or {})
        return await ask(self.executor.inbox, lambda reply: ToolRequest(
            call_id=self.call_id, tool_call_id=tool_call_id or f"call_{self.n}", name=name,
            arguments=arguments, epoch=epoch, turn=turn, reply=reply), timeout=math.inf)  # autojump: the test bounds it


async def start(nursery, settings, registry, journal, state, **kw):
    executor = ToolExecutor(settings, ToolContext(journal, state), registry=registry, **kw)
    await nursery.start(executor.run)
    return executor


async def test_nav_and_observer_keys_become_client_events(nursery, autojump_clock, journal, state):
    ex = await start(nursery, settings_for(journal, state), make_registry([spec("test.echo", echo)]),
                     journal, state)
    result = await Client(ex).call("test.echo", {"a": 1})
    assert result.outcome == "ok" and result.tool == "test.echo"
    assert json.loads(result.output) == {"args": {"a": 1}}
    assert "_nav_target" not in result.output and "_observer_action" not in result.output
    assert result.client_events == (
        {"type": "nav_hint", "target": "today"},
        {"type": "observer_action", "action": {"type": "start_observer", "mode": "meeting"}},
    )


async def test_real_tool_through_executor(nursery, autojump_clock, fixture_journal, state):
    ex = await start(nursery, settings_for(fixture_journal, state), REGISTRY, fixture_journal, state)
    result = await Client(ex).call("journal_get_day", {"day": "2026-03-04"})   # underscore spelling
    assert result.tool == "journal.get_day" and result.outcome == "ok"
    assert json.loads(result.output)["day"] == "2026-03-04"
    assert "_nav_target" not in result.output
    assert result.client_events == ({"type": "nav_hint", "target": "today/journal/2026-03-04"},)


async def test_argument_errors(nursery, autojump_clock, journal, state):
    ex = await start(nursery, settings_for(journal, state), REGISTRY, journal, state)
    client = Client(ex)
    cases = [
        ("nope.tool", "{}", {"error": "unknown tool"}),
        ("journal.get_day", "{not json", {"error": "arguments must be valid JSON"}),
        ("journal.get_day", "[1, 2]", {"error": "arguments must be a JSON object"}),
        ("journal.get_day", '{"day": "yesterday"}', {"error": "invalid day"}),
        ("journal.search", '{"query": ""}', {"error": "query is required"}),
        ("commitments.complete", '{"commitment_id": "abc", "resolution": "maybe"}',
         {"error": "invalid resolution"}),
    ]
    for i, (name, raw, expected) in enumerate(cases):
        result = await client.call(name, raw=raw, turn=i)
        assert json.loads(result.output) == expected, name
        assert result.outcome == "invalid"
    assert not (state / "tool-writes").exists()   # an invalid write records nothing


async def test_exception_is_generic_and_detail_only_logged(nursery, autojump_clock, journal, state):
    ex = await start(nursery, settings_for(journal, state), make_registry([spec("test.boom", boom)]),
                     journal, state)
    with capture_logs() as logs:
        result = await Client(ex).call("test.boom")
    assert json.loads(result.output) == {"error": "tool failed"}
    assert result.outcome == "failed"
    assert "secret detail" not in result.output
    failed = [e for e in logs if e["event"] == "tool.failed"]
    assert failed and failed[0]["error"] == "RuntimeError" and failed[0]["tool_call_id"] == "call_1"


async def test_one_log_line_per_run_without_write_arguments(nursery, autojump_clock, journal, state):
    seen = []
    registry = make_registry([spec("test.write", lambda ctx, args: {"done": True}, effect="write")])
    ex = await start(nursery, settings_for(journal, state), registry, journal, state, on_result=seen.append)
    with capture_logs() as logs:
        result = await Client(ex).call("test.write", {"secret_note": "PRIVATE-VALUE"}, turn=3, epoch=2)
    runs = [e for e in logs if e["event"] == "tool.run"]
    assert len(runs) == 1
    line = runs[0]
    assert {k: line[k] for k in ("actor", "call_id", "tool", "tool_call_id", "epoch", "turn", "outcome",
                                  "output_chars")} == {
        "actor": "tools", "call_id": "rtc_test", "tool": "test.write", "tool_call_id": "call_1",
        "epoch": 2, "turn": 3, "outcome": "ok", "output_chars": len(result.output)}
    assert "duration_ms" in line
    assert "PRIVATE-VALUE" not in repr(logs)
    assert "PRIVATE-VALUE" not in write_log.record_path(state, "call_1").read_text()
    assert seen == [result]      # the metrics hook saw the same result once


async def test_read_timeout(nursery, autojump_clock, journal, state):
    gate = Gate()
    registry = make_registry([spec("test.block", lambda ctx, args: gate.enter() or {"late": True})])
    ex = await start(nursery, settings_for(journal, state, tool_timeout_read_s=10.0), registry, journal, state)
    t0 = trio.current_time()
    result = await Client(ex).call("test.block")
    assert json.loads(result.output) == {"error": "tool timed out"}
    assert result.outcome == "timeout"
    assert trio.current_time() - t0 == pytest.approx(10.0)
    gate.release.set()


async def test_per_turn_bound_and_duplicates(nursery, autojump_clock, journal, state):
    ex = await start(nursery, settings_for(journal, state), make_registry([spec("test.echo", echo)]),
                     journal, state)
    client = Client(ex)
    first = await client.call("test.echo", {"i": 0}, tool_call_id="call_a")
    assert first.outcome == "ok"
    # identical name + arguments (key order does not matter) under another id: rejected
    dup = await client.call("test.echo", raw='{ "i" : 0 }', tool_call_id="call_b")
    assert dup.outcome == "rejected" and "duplicate" in json.loads(dup.output)["error"]
    # the same tool call id again is a retry, not a duplicate
    retry = await client.call("test.echo", {"i": 0}, tool_call_id="call_a")
    assert retry.outcome == "ok"
    for i in range(1, 5):   # attempts 3..6 (the rejected duplicate counted too)
        assert (await client.call("test.echo", {"i": i})).outcome == "ok"
    seventh = await client.call("test.echo", {"i": 99})
    assert seventh.outcome == "rejected"
    assert json.loads(seventh.output)["error"].startswith("too many tool calls this turn")
    # a new user turn starts fresh, and the same arguments are allowed again
    assert (await client.call("test.echo", {"i": 0}, turn=1)).outcome == "ok"
    # another call's turn 0 is its own
    assert (await Client(ex, "rtc_other").call("test.echo", {"i": 0})).outcome == "ok"


async def test_calls_arriving_together_are_counted_in_arrival_order(nursery, autojump_clock, journal, state):
    """The calls of one response reach the executor in the model's order,
    often in one batch (the call actor hands a whole socket read over in one
    step): the turn's duplicate check and bound follow that order, never the
    order the executor's tasks happen to be scheduled in."""
    ex = await start(nursery, settings_for(journal, state, tool_calls_per_turn=2),
                     make_registry([spec("test.echo", echo)]), journal, state)
    for n in range(20):   # trio may run a batch of new tasks in either order
        replies = []
        for tool_call_id, args in (("call_a", {"i": 0}), ("call_b", {"i": 0}), ("call_c", {"i": 1})):
            send, receive = trio.open_memory_channel(1)
            ex.inbox.send_nowait(ToolRequest(call_id=f"rtc_{n}", tool_call_id=tool_call_id, name="test.echo",
                                             arguments=json.dumps(args), epoch=0, turn=0, reply=send))
            replies.append(receive)
        outcomes = [(await receive.receive()).outcome for receive in replies]
        assert outcomes == ["ok", "rejected", "rejected"], (n, outcomes)


def test_cap_output_is_valid_json_within_limit():
    text = json.dumps({"t": 'quote " and \\ backslash \n' * 500})
    out = cap_output(text, 1000)
    assert len(out) <= 1000
    data = json.loads(out)
    assert data["truncated"] is True and data["original_chars"] == len(text)
    assert text.startswith(data["partial"]) and len(data["partial"]) > 500
    assert cap_output("{}", 1000) == "{}"
    assert cap_output(text, 10) is None


async def test_output_cap_and_turn_cap(nursery, autojump_clock, journal, state):
    ex = await start(nursery, settings_for(journal, state), make_registry([spec("test.big", big)]),
                     journal, state)
    client = Client(ex)
    one = await client.call("test.big", {"n": 70_000})
    assert len(one.output) <= 64_000
    data = json.loads(one.output)
    assert data["truncated"] is True and data["partial"].startswith('{"text":"xxx')
    assert one.outcome == "ok"
    # turn budget 96,000: 64,000 spent, the next gets at most 32,000
    two = await client.call("test.big", {"n": 50_000})
    assert len(one.output) + len(two.output) <= 96_000
    assert json.loads(two.output)["truncated"] is True
    three = await client.call("test.big", {"n": 10})
    assert json.loads(three.output)["error"].startswith("turn output limit reached")
    assert three.outcome == "rejected"
    # the next turn has a fresh budget
    four = await client.call("test.big", {"n": 10}, turn=1)
    assert json.loads(four.output) == {"text": "x" * 10}


async def test_read_cancelled_write_shielded(nursery, autojump_clock, journal, state):
    read_gate, write_gate = Gate(), Gate()
    applied = journal / "applied.txt"

    def slow_write(ctx, args):
        write_gate.enter()
        storage.append_line(applied, "applied")
        return {"ok": True}

    registry = make_registry([
        spec("test.read", lambda ctx, args: read_gate.enter() or {"read": True}),
        spec("test.write", slow_write, effect="write"),
    ])
    ex = await start(nursery, settings_for(journal, state), registry, journal, state)
    client = Client(ex)
    results = {}

    async def run(name, key, epoch):
        results[key] = await client.call(name, tool_call_id=key, epoch=epoch)

    async with trio.open_nursery() as inner:
        inner.start_soon(run, "test.read", "call_read_old", 1)
        inner.start_soon(run, "test.write", "call_write", 1)
        await read_gate.started.wait()
        await write_gate.started.wait()
        await ex.inbox.send(CancelReads("rtc_test", before_epoch=2))
        with trio.fail_after(5):
            while "call_read_old" not in results:
                await trio.sleep(0.01)
        assert json.loads(results["call_read_old"].output) == {"error": "cancelled"}
        assert results["call_read_old"].outcome == "cancelled"
        assert "call_write" not in results          # still running: not cancelled
        write_gate.release.set()
    read_gate.release.set()
    assert results["call_write"].outcome == "ok"
    assert json.loads(results["call_write"].output) == {"ok": True}
    assert applied.read_text() == "applied\n"
    assert write_log.load(state, "call_write")["output"] == '{"ok":true}'


async def test_cancel_reads_respects_epoch(nursery, autojump_clock, journal, state):
    gate = Gate()
    registry = make_registry([spec("test.read", lambda ctx, args: gate.enter() or {"read": True})])
    ex = await start(nursery, settings_for(journal, state), registry, journal, state)
    client = Client(ex)
    box = {}

    async def run():
        box["r"] = await client.call("test.read", epoch=3)

    async with trio.open_nursery() as inner:
        inner.start_soon(run)
        await gate.started.wait()
        await ex.inbox.send(CancelReads("rtc_test", before_epoch=3))   # epoch 3 is not before 3
        await ex.inbox.send(CancelReads("rtc_other", before_epoch=None))  # another call
        await trio.sleep(1)
        assert "r" not in box
        gate.release.set()
    assert box["r"].outcome == "ok"


async def test_executor_shutdown_finishes_started_write(autojump_clock, journal, state):
    gate = Gate()
    registry = make_registry([spec("test.write", lambda ctx, args: gate.enter() or {"done": 1}, effect="write")])
    box = {}
    async with trio.open_nursery() as outer:
        ex = await start(outer, settings_for(journal, state), registry, journal, state)

        async def run():
            box["w"] = await Client(ex).call("test.write", tool_call_id="call_w")

        outer.start_soon(run)
        await gate.started.wait()
        outer.cancel_scope.cancel()     # shutdown: the executor's nursery is cancelled
        gate.release.set()
    assert write_log.load(state, "call_w")["output"] == '{"done":1}'


async def test_write_timeout_records_real_outcome(nursery, autojump_clock, journal, state):
    gate = Gate()
    registry = make_registry([spec("test.write", lambda ctx, args: gate.enter() or {"done": 1}, effect="write")])
    ex = await start(nursery, settings_for(journal, state, tool_timeout_write_s=20.0), registry, journal, state)
    client = Client(ex)
    first = await client.call("test.write", tool_call_id="call_w")
    assert json.loads(first.output) == {"error": "tool timed out"} and first.outcome == "timeout"
    await gate.started.wait()   # the handler runs under the write log lock from here on
    gate.release.set()
    # the abandoned thread holds the write log lock until it has recorded
    def wait_for_record():
        with storage.file_lock(write_log.lock_path(state, "call_w")):
            pass
    await trio.to_thread.run_sync(wait_for_record)
    again = await client.call("test.write", tool_call_id="call_w")
    assert again.outcome == "replayed" and json.loads(again.output) == {"done": 1}
    assert gate.calls == 1


async def test_concurrent_duplicate_write_applies_once(nursery, autojump_clock, journal, state):
    gate = Gate()
    registry = make_registry([spec("test.write", lambda ctx, args: gate.enter() or {"done": 1}, effect="write")])
    ex = await start(nursery, settings_for(journal, state), registry, journal, state)
    client = Client(ex)
    results = []

    async def run():
        results.append(await client.call("test.write", tool_call_id="call_same"))

    async with trio.open_nursery() as inner:
        inner.start_soon(run)
        await gate.started.wait()
        inner.start_soon(run)
        await trio.sleep(1)
        gate.release.set()
    assert sorted(r.outcome for r in results) == ["ok", "replayed"]
    assert {r.output for r in results} == {'{"done":1}'}
    assert gate.calls == 1
    assert len(list((state / "tool-writes").glob("*.json"))) == 1


async def test_reply_channel_closed_is_dropped(nursery, autojump_clock, journal, state):
    ex = await start(nursery, settings_for(journal, state), make_registry([spec("test.echo", echo)]),
                     journal, state)
    send, receive = trio.open_memory_channel(1)
    await receive.aclose()          # the call ended before the answer
    await ex.inbox.send(ToolRequest("rtc_test", "call_x", "test.echo", "{}", 0, 0, send))
    # the executor keeps serving
    assert (await Client(ex).call("test.echo", {"after": True})).outcome == "ok"


def seed_commitment(root: Path) -> str:
    record = {
        "id": "meeting_100000_300", "activity": "meeting", "segments": ["100000_300"],
        "title": "Budget sync", "description": "Budget sync with Alice", "created_at": 1774519200000,
        "commitments": [{"owner": "Me", "owner_entity_id": None, "action": "Send the budget to Alice",
                         "counterparty": "Alice Johnson", "counterparty_entity_id": "alice_johnson",
                         "when": "Friday", "context": "budget sync"}],
    }
    path = root / "facets" / "verona" / "activities" / "20260326.jsonl"
    storage.append_line(path, json.dumps(record))
    return ledger.item_id(None, "Send the budget to Alice", "alice_johnson")


async def test_idempotent_write_across_restart(autojump_clock, fixture_copy, state):
    item = seed_commitment(fixture_copy)
    settings = settings_for(fixture_copy, state)
    args = {"commitment_id": item, "resolution": "sent"}
    ledger_file = fixture_copy / "facets" / "verona" / "activities" / "20260326.jsonl"

    async with trio.open_nursery() as nursery:
        ex = await start(nursery, settings, REGISTRY, fixture_copy, state)
        first = await Client(ex).call("commitments.complete", args, tool_call_id="call_close")
        nursery.cancel_scope.cancel()
    assert first.outcome == "ok"
    body = json.loads(first.output)
    assert body["ok"] is True and body["commitment"]["id"] == item
    assert body["commitment"]["state"] == "closed" and body["commitment"]["resolution"] == "sent"
    record = json.loads(write_log.record_path(state, "call_close").read_text())
    assert record["output"] == first.output and "arguments" not in record

    async with trio.open_nursery() as nursery:   # a restart: new executor, same state dir
        ex = await start(nursery, settings, REGISTRY, fixture_copy, state)
        again = await Client(ex, "rtc_reconnected").call("commitments.complete", args,
                                                          tool_call_id="call_close", turn=7)
        nursery.cancel_scope.cancel()
    assert again.outcome == "replayed" and again.output == first.output
    lines = [json.loads(line) for line in ledger_file.read_text().splitlines() if line.strip()]
    edits = [e for row in lines for e in row.get("edits", []) if e.get("fields") == ["ledger_close"]]
    assert len(edits) == 1
    assert edits[0]["ledger_close"] == {"item_id": item, "as_state": "closed"}
    assert edits[0]["note"] == "resolution: sent"


async def test_default_hook_counts_metrics(nursery, autojump_clock, journal, state):
    from voiceactors import metrics

    def count():
        return metrics.METRICS.registry.get_sample_value(
            "voiceactors_tool_calls_total", {"tool": "test.metered", "outcome": "ok"}) or 0.0

    before = count()
    ex = await start(nursery, settings_for(journal, state),
                     make_registry([spec("test.metered", echo)]), journal, state)
    await Client(ex).call("test.metered")
    assert count() == before + 1


# --- reusable reads ---------------------------------------------------------------


def reusable_registry(counter: list[str]):
    def today(ctx, args):
        counter.append(json.dumps(args, sort_keys=True))
        return {"n": len(counter), "args": args}

    def write(ctx, args):
        return {"ok": True}

    return make_registry([
        ToolSpec(name="test.today", description="reusable read", parameters=ANY_ARGS, effect="read",
                 handler=today, reusable=True),
        ToolSpec(name="test.plain", description="plain read", parameters=ANY_ARGS, effect="read", handler=today),
        spec("test.write", write, effect="write"),
    ])


async def test_reusable_read_is_answered_from_memory_while_fresh(nursery, autojump_clock, journal, state):
    runs: list[str] = []
    ex = await start(nursery, settings_for(journal, state, tool_reuse_s=2.0), reusable_registry(runs), journal, state)
    first = await Client(ex, "rtc_a").call("test.today")
    with capture_logs() as logs:
        second = await Client(ex, "rtc_b").call("test.today")     # another call, 0 s later
    assert runs == ["{}"] and second.output == first.output and second.outcome == "ok"
    assert [(x["tool_call_id"], x["reused"]) for x in logs if x["event"] == "tool.run"] == [("call_1", True)]
    other = await Client(ex, "rtc_c").call("test.today", {"x": 1})  # other arguments: a run of its own
    assert json.loads(other.output)["n"] == 2
    await trio.sleep(2.0)                                            # no longer fresh
    third = await Client(ex, "rtc_d").call("test.today")
    assert json.loads(third.output)["n"] == 3


async def test_only_reusable_reads_are_reused_and_never_when_disabled(nursery, autojump_clock, journal, state):
    runs: list[str] = []
    ex = await start(nursery, settings_for(journal, state, tool_reuse_s=0), reusable_registry(runs), journal, state)
    for call in ("rtc_a", "rtc_b"):
        await Client(ex, call).call("test.today")
        await Client(ex, call).call("test.plain")
    assert len(runs) == 4
    runs.clear()
    ex = await start(nursery, settings_for(journal, state), reusable_registry(runs), journal, state)
    for call in ("rtc_a", "rtc_b"):
        await Client(ex, call).call("test.plain")
    assert len(runs) == 2


async def test_a_write_forgets_reusable_answers(nursery, autojump_clock, journal, state):
    runs: list[str] = []
    ex = await start(nursery, settings_for(journal, state), reusable_registry(runs), journal, state)
    client = Client(ex)
    await client.call("test.today", turn=1)
    assert (await client.call("test.write", turn=1)).outcome == "ok"
    again = await Client(ex, "rtc_other").call("test.today")
    assert json.loads(again.output)["n"] == 2


async def test_reused_answer_still_counts_against_the_turn(nursery, autojump_clock, journal, state):
    runs: list[str] = []
    ex = await start(nursery, settings_for(journal, state), reusable_registry(runs), journal, state)
    client = Client(ex)
    await client.call("test.today", turn=1)
    duplicate = await client.call("test.today", turn=1)             # same turn, same arguments, new id
    assert json.loads(duplicate.output)["error"].startswith("duplicate call") and duplicate.outcome == "rejected"
    retry = await client.call("test.today", turn=1, tool_call_id="call_1")   # a retry of the same id
    assert retry.outcome == "ok" and runs == ["{}"]


async def test_a_read_that_a_write_overtook_is_not_kept(nursery, autojump_clock, journal, state):
    """A reusable read started before a write and finishing after it may hold
    the old state: it answers its own call but is not handed to others."""
    gate = Gate()
    runs: list[str] = []

    def slow_today(ctx, args):
        gate.enter()
        runs.append("slow")
        return {"n": len(runs)}

    registry = make_registry([
        ToolSpec(name="test.today", description="reusable read", parameters=ANY_ARGS, effect="read",
                 handler=slow_today, reusable=True),
        spec("test.write", lambda ctx, args: {"ok": True}, effect="write"),
    ])
    ex = await start(nursery, settings_for(journal, state), registry, journal, state)
    async with trio.open_nursery() as inner:
        inner.start_soon(Client(ex, "rtc_a").call, "test.today")
        await gate.started.wait()
        assert (await Client(ex, "rtc_w").call("test.write")).outcome == "ok"
        gate.release.set()
    after = await Client(ex, "rtc_b").call("test.today")
    assert json.loads(after.output) == {"n": 2} and runs == ["slow", "slow"]


def gated_reusable(gate: Gate, runs: list[str]):
    def today(ctx, args):
        runs.append("run")
        gate.enter()
        return {"n": len(runs)}

    return make_registry([ToolSpec(name="test.today", description="reusable read", parameters=ANY_ARGS,
                                   effect="read", handler=today, reusable=True)])


async def test_requests_for_a_reusable_read_in_flight_wait_for_it(nursery, autojump_clock, journal, state):
    """The bug behind a collapse at 750 calls: when a kept answer expired,
    every request arriving while the next run was in flight started a
    worker thread of its own. Now they wait for that run."""
    gate, runs = Gate(), []
    ex = await start(nursery, settings_for(journal, state), gated_reusable(gate, runs), journal, state)
    results = {}

    async def call(call_id):
        results[call_id] = await Client(ex, call_id).call("test.today")

    with capture_logs() as logs:
        async with trio.open_nursery() as calls:
            calls.start_soon(call, "rtc_lead")
            await gate.started.wait()
            for call_id in ("rtc_w1", "rtc_w2"):
                calls.start_soon(call, call_id)
            await trio.sleep(0.5)
            assert set(results) == set()                  # all three wait for the one run
            gate.release.set()
    assert runs == ["run"]
    assert [json.loads(r.output) for r in results.values()] == [{"n": 1}] * 3
    reused = sorted(x["call_id"] for x in logs if x["event"] == "tool.run" and x["reused"])
    assert reused == ["rtc_w1", "rtc_w2"]


async def test_waiters_run_their_own_read_when_the_one_they_waited_for_was_cancelled(
        nursery, autojump_clock, journal, state):
    gate, runs = Gate(), []
    ex = await start(nursery, settings_for(journal, state), gated_reusable(gate, runs), journal, state)
    results = {}

    async def call(call_id):
        results[call_id] = await Client(ex, call_id).call("test.today")

    async with trio.open_nursery() as calls:
        calls.start_soon(call, "rtc_lead")
        await gate.started.wait()
        calls.start_soon(call, "rtc_waiter")
        await trio.sleep(0.5)
        await ex.inbox.send(CancelReads("rtc_lead", before_epoch=None))   # the leader's user barged in
        while "rtc_lead" not in results:
            await trio.sleep(0.01)
        gate.release.set()
    assert json.loads(results["rtc_lead"].output) == {"error": "cancelled"}
    assert results["rtc_waiter"].outcome == "ok" and runs == ["run", "run"]


async def test_executor_shutdown_answers_waiters_once(autojump_clock, journal, state):
    gate, runs = Gate(), []
    results: dict[str, list] = {"rtc_lead": [], "rtc_waiter": []}
    async with trio.open_nursery() as outer:
        ex = await start(outer, settings_for(journal, state), gated_reusable(gate, runs), journal, state)
        replies = {}
        for call_id in results:
            send, receive = trio.open_memory_channel(2)
            replies[call_id] = receive
            await ex.inbox.send(ToolRequest(call_id=call_id, tool_call_id=f"call_{call_id}", name="test.today",
                                            arguments="{}", epoch=0, turn=0, reply=send))
            if call_id == "rtc_lead":
                await gate.started.wait()
        await trio.sleep(0.5)
        outer.cancel_scope.cancel()                       # the executor stops with both in flight
        gate.release.set()
    for call_id, receive in replies.items():
        while True:
            try:
                results[call_id].append(receive.receive_nowait().outcome)
            except trio.WouldBlock:
                break
    assert results == {"rtc_lead": ["cancelled"], "rtc_waiter": ["cancelled"]}


class CountingRegistry(dict):
    """A test registry that counts the executor's lookups."""

    gets = 0

    def get(self, key, default=None):
        self.gets += 1
        return super().get(key, default)


async def test_each_request_is_looked_up_once(nursery, autojump_clock, journal, state):
    registry = CountingRegistry(make_registry([spec("test.echo", echo), spec("test.write", echo, effect="write")]))
    ex = await start(nursery, settings_for(journal, state), registry, journal, state)
    client = Client(ex)
    for name, args in (("test.echo", {"a": 1}), ("test.write", {"b": 2}), ("test.echo", "not json")):
        before = registry.gets
        result = await client.call(name, raw=args if isinstance(args, str) else json.dumps(args))
        assert registry.gets - before == 1, (name, result.outcome)
    assert result.outcome == "invalid"


async def test_every_outcome_the_executor_answers_is_a_tool_outcome(nursery, autojump_clock, journal, state):
    """Each outcome the executor can answer here is a ``ToolOutcome`` member,
    not a bare string that only looks like one: ``busy`` (a write whose
    journal file another holder keeps locked, a real ``flock``) was a string
    the enum did not have. ``restarted`` and ``auth_expired`` need a second
    server or an MCP source (tests/test_cluster_no_retry.py, test_mcp_sources.py)."""
    held = journal / "held.jsonl"
    gate, cancelled_gate = Gate(), Gate()

    def locked_write(ctx, args):
        storage.update_jsonl(held, lambda rows: rows.append({"n": 1}) or True, lock_timeout_s=1.0)
        return {"done": True}

    registry = make_registry([
        spec("test.echo", echo), spec("test.boom", boom),
        spec("test.refuse", lambda ctx, args: {"error": "no such item"}),
        spec("test.block", lambda ctx, args: gate.enter() or {"late": True}),
        spec("test.slow", lambda ctx, args: cancelled_gate.enter() or {"late": True}),
        spec("test.write", lambda ctx, args: {"done": True}, effect="write"),
        spec("test.locked", locked_write, effect="write"),
    ])
    # reads without a deadline (autojump would jump past one while a handler's
    # thread runs); the timeout from an executor of its own
    ex = await start(nursery, settings_for(journal, state), registry, journal, state)
    client = Client(ex)
    timing_out = await start(nursery, settings_for(journal, state, tool_timeout_read_s=10.0), registry,
                             journal, state)
    seen = {
        "ok": await client.call("test.echo", {"i": 0}, turn=0),
        "rejected": await client.call("test.echo", {"i": 0}, turn=0),          # a duplicate
        "error": await client.call("test.refuse", turn=1),
        "invalid": await client.call("nope.tool", turn=1),
        "failed": await client.call("test.boom", turn=1),
        "timeout": await Client(timing_out).call("test.block"),
    }
    gate.release.set()
    seen["ok_write"] = await client.call("test.write", tool_call_id="call_w", turn=3)
    seen["replayed"] = await client.call("test.write", tool_call_id="call_w", turn=3)
    lock = open(f"{held}.lock", "a+b")     # another holder of the journal file's lock
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        seen["busy"] = await client.call("test.locked", turn=4)
    finally:
        lock.close()
    async with trio.open_nursery() as inner:
        async def read() -> None:
            seen["cancelled"] = await client.call("test.slow", turn=5, epoch=1)
        inner.start_soon(read)
        await cancelled_gate.started.wait()
        await ex.inbox.send(CancelReads("rtc_test", before_epoch=2))
    cancelled_gate.release.set()

    for name, result in seen.items():
        assert type(result.outcome) is ToolOutcome, (name, result.outcome)
        assert result.outcome == name.removesuffix("_write"), name
    assert json.loads(seen["busy"].output)["error"].startswith("journal busy")
    assert not held.exists()                       # nothing applied
    assert {o.value for o in ToolOutcome} >= {"ok", "error", "invalid", "rejected", "timeout", "busy",
                                               "cancelled", "failed", "replayed", "restarted", "auth_expired"}
