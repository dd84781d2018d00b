"""The shared write log (--redis) against a real redis-server: two tool
executors, each with its own state folder and registry, on one journal.
A write applied by a call's holder is answered from the shared log by the
process that takes the call over, never applied again; the old holder, its
lease gone, can apply nothing; a Redis that does not answer applies nothing.
A write whose id another run has claimed and is still applying waits for
that run's record and answers it; a write that applied nothing (its journal
lock never came) gives its claim back, so its retry elsewhere applies it."""

from __future__ import annotations

import fcntl
import json
import math

import trio

from calls_support import DAY
from redis_support import redis_server  # noqa: F401  (the fixture)
from test_cluster_registry import _two as two_registries
from test_reliability_faults import item_file, ledger_close_edits
from voiceactors.executor.actor import JOURNAL_BUSY, NOT_HOLDER, SHARED_LOG_DOWN, ToolExecutor
from voiceactors.messages import ToolRequest, ask
from voiceactors.cluster import redis_client as rc
from voiceactors.cluster.call_registry import RedisRegistry
from voiceactors.journal import ledger
from voiceactors.journal.sample import write_sample_journal
from voiceactors.settings import Settings
from voiceactors.tools.handler_context import ToolContext

CALL = "rtc_writes"


async def _executor(nursery: trio.Nursery, journal, state, registry: RedisRegistry) -> ToolExecutor:
    settings = Settings(journal=journal, state_dir=state, tool_timeout_read_s=math.inf,
                        tool_timeout_write_s=math.inf)
    executor = ToolExecutor(settings, ToolContext(journal=journal, state_dir=state, today=lambda: DAY),
                            cluster=registry)
    await nursery.start(executor.run)
    return executor


async def _complete(executor: ToolExecutor, tool_call_id: str, item_id: str):
    arguments = json.dumps({"commitment_id": item_id, "resolution": "done"})
    with trio.fail_after(20):
        return await ask(executor.inbox, lambda reply: ToolRequest(
            call_id=CALL, tool_call_id=tool_call_id, name="commitments.complete", arguments=arguments,
            epoch=0, turn=0, reply=reply), timeout=math.inf)


async def test_a_taken_over_call_replays_its_applied_write_and_the_old_holder_is_fenced(tmp_path, redis_server):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    first, second = ledger.list_items(journal, state="open", top=2)
    async with trio.open_nursery() as nursery:
        a = RedisRegistry(redis_server.url, 0.5, node="a")
        b = RedisRegistry(redis_server.url, 0.5, node="b")
        await nursery.start(a.run)
        await nursery.start(b.run)
        exec_a = await _executor(nursery, journal, tmp_path / "state_a", a)
        exec_b = await _executor(nursery, journal, tmp_path / "state_b", b)
        old = await a.acquire(CALL)
        assert old is not None and await a.confirm(old)          # an actor runs it on a
        applied = await _complete(exec_a, "call_w", first.id)
        assert applied.outcome == "ok", applied.output
        assert len(ledger_close_edits(item_file(journal, first), first.id)) == 1
        await trio.sleep(0.8)                         # a stops renewing ("dies"): the lease expires
        new = await b.acquire(CALL)
        assert new is not None and new.previous == old.token and new.fence > old.fence
        again = await _complete(exec_b, "call_w", first.id)   # the service retries on the new holder
        assert again.outcome == "replayed" and again.output == applied.output
        assert len(ledger_close_edits(item_file(journal, first), first.id)) == 1   # not twice
        # a still believes it holds the call (it was paused, not dead): its write is refused
        assert a.lease_of(CALL) == old
        stale = await _complete(exec_a, "call_w2", second.id)
        assert stale.outcome == "rejected" and json.loads(stale.output) == NOT_HOLDER
        assert ledger_close_edits(item_file(journal, second), second.id) == []
        nursery.cancel_scope.cancel()


async def test_a_write_with_redis_gone_answers_an_error_and_applies_nothing(tmp_path, redis_server):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    [item] = ledger.list_items(journal, state="open", top=1)
    before = item_file(journal, item).read_bytes()
    async with trio.open_nursery() as nursery:
        a = RedisRegistry(redis_server.url, 2.0, node="a")
        await nursery.start(a.run)
        executor = await _executor(nursery, journal, tmp_path / "state_a", a)
        assert await a.acquire(CALL) is not None
        redis_server.stop()
        answer = await _complete(executor, "call_w", item.id)
        assert answer.outcome == "busy" and json.loads(answer.output) == SHARED_LOG_DOWN
        assert item_file(journal, item).read_bytes() == before
        nursery.cancel_scope.cancel()


async def test_an_mcp_write_holds_no_lease_and_is_still_applied_once_across_processes(tmp_path, redis_server):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    [item] = ledger.list_items(journal, state="open", top=1)
    arguments = json.dumps({"commitment_id": item.id, "resolution": "done"})
    async with trio.open_nursery() as nursery:
        a = RedisRegistry(redis_server.url, 2.0, node="a")
        b = RedisRegistry(redis_server.url, 2.0, node="b")
        await nursery.start(a.run)
        await nursery.start(b.run)
        executors = [await _executor(nursery, journal, tmp_path / "state_a", a),
                     await _executor(nursery, journal, tmp_path / "state_b", b)]
        answers = []
        for executor, mcp_call in zip(executors, ("mcp-1", "mcp-2")):   # no lease: an MCP client's call ids
            with trio.fail_after(20):
                answers.append(await ask(executor.inbox, lambda reply: ToolRequest(
                    call_id=mcp_call, tool_call_id="mcp-key-1", name="commitments.complete",
                    arguments=arguments, epoch=0, turn=0, reply=reply, fenced_by_call=False), timeout=math.inf))
        assert [x.outcome for x in answers] == ["ok", "replayed"], [x.output for x in answers]
        assert answers[1].output == answers[0].output
        assert len(ledger_close_edits(item_file(journal, item), item.id)) == 1
        nursery.cancel_scope.cancel()


async def _mcp_complete(executor: ToolExecutor, mcp_call: str, tool_call_id: str, item_id: str):
    arguments = json.dumps({"commitment_id": item_id, "resolution": "done"})
    with trio.fail_after(30):
        return await ask(executor.inbox, lambda reply: ToolRequest(
            call_id=mcp_call, tool_call_id=tool_call_id, name="commitments.complete", arguments=arguments,
            epoch=0, turn=0, reply=reply, fenced_by_call=False), timeout=math.inf)


async def test_a_write_claimed_elsewhere_is_answered_from_its_record_once_it_is_there(tmp_path, redis_server):
    """The second process's request finds the key claimed by the first, whose
    write waits on the journal's lock: it waits for the record and answers it
    (``replayed``, the same output), instead of "outcome unknown"."""
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    [item] = ledger.list_items(journal, state="open", top=1)
    answers = {}
    async with trio.open_nursery() as nursery, rc.client(redis_server.url) as redis:
        a, b = await two_registries(redis_server, nursery, 2.0)
        exec_a = await _executor(nursery, journal, tmp_path / "state_a", a)
        exec_b = await _executor(nursery, journal, tmp_path / "state_b", b)

        async def complete(name: str, executor: ToolExecutor) -> None:
            answers[name] = await _mcp_complete(executor, f"mcp-{name}", "mcp:key-held", item.id)

        with open(f"{item_file(journal, item)}.lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            nursery.start_soon(complete, "a", exec_a)
            with trio.fail_after(10):                       # a claimed it and waits for the lock
                while await redis.get(rc.write_key("mcp:key-held")) != rc.APPLYING + rc.UNFENCED:
                    await trio.sleep(0.01)
            nursery.start_soon(complete, "b", exec_b)
            with trio.move_on_after(1.0):                   # b must not answer while a applies
                while "b" not in answers:
                    await trio.sleep(0.01)
            assert "b" not in answers, answers["b"].output
            fcntl.flock(lock, fcntl.LOCK_UN)
        with trio.fail_after(20):
            while len(answers) < 2:
                await trio.sleep(0.01)
        assert (answers["a"].outcome, answers["b"].outcome) == ("ok", "replayed"), answers["b"].output
        assert answers["b"].output == answers["a"].output
        assert len(ledger_close_edits(item_file(journal, item), item.id)) == 1
        nursery.cancel_scope.cancel()


async def test_a_write_whose_journal_lock_never_came_gives_its_claim_back(tmp_path, redis_server):
    """Nothing applied (``journal busy``): the shared claim is given back, so
    the retry on another process applies the write (before, the claim stayed
    for the record's week and every retry answered "outcome unknown")."""
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    [item] = ledger.list_items(journal, state="open", top=1)
    async with trio.open_nursery() as nursery, rc.client(redis_server.url) as redis:
        a, b = await two_registries(redis_server, nursery, 2.0)
        settings = Settings(journal=journal, state_dir=tmp_path / "state_a", tool_timeout_read_s=math.inf,
                            tool_timeout_write_s=math.inf)
        impatient = ToolExecutor(settings, ToolContext(journal=journal, state_dir=tmp_path / "state_a",
                                                       today=lambda: DAY, journal_lock_timeout_s=0.2), cluster=a)
        await nursery.start(impatient.run)
        exec_b = await _executor(nursery, journal, tmp_path / "state_b", b)
        with open(f"{item_file(journal, item)}.lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            busy = await _mcp_complete(impatient, "mcp-a", "mcp:key-busy", item.id)
        assert busy.outcome == "busy" and json.loads(busy.output) == JOURNAL_BUSY
        assert await redis.get(rc.write_key("mcp:key-busy")) is None
        retried = await _mcp_complete(exec_b, "mcp-b", "mcp:key-busy", item.id)
        assert retried.outcome == "ok", retried.output
        assert len(ledger_close_edits(item_file(journal, item), item.id)) == 1
        nursery.cancel_scope.cancel()
