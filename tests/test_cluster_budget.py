"""The daily budget across the cluster (issue 18): two or three processes'
``DailyUsage`` with their ``DailyTotal`` on one real redis-server. Spend on
each adds up to one total, the budget is spent for all when the sum
crosses it, Redis down falls back to what this process knows, and a Redis
restart without its data is refilled by the live processes."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import trio

from redis_support import REDIS_SERVER, RedisServer, redis_server  # noqa: F401  (the fixture)
from voiceactors.usage.daily import DailyUsage
from voiceactors.cluster import redis_client as rc
from voiceactors.usage.cluster_total import DailyTotal, load_source_id, source_path

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")

DAY = dt.date(2026, 3, 27)


class Process:
    """One process's worth of the runtime piece: its state folder's own
    total and the sync task's figure (``sync`` called by hand: no timing)."""

    def __init__(self, state_dir: Path, redis: RedisServer, budget_usd: float = 1.0,
                 today: list[dt.date] | None = None) -> None:
        days = today if today is not None else [DAY]
        self.usage = DailyUsage(state_dir, budget_usd, today=lambda: days[0])
        self.usage.load()
        self.total = DailyTotal(redis.url, self.usage, every_s=3600)   # the task's first sync, then the test's

    async def start(self, nursery: trio.Nursery) -> None:
        await nursery.start(self.total.run)

    def cost(self) -> float:
        return self.usage.state().cost_usd

    def spent(self) -> bool:
        return self.usage.state().spent


async def _fields(redis: RedisServer, day: dt.date = DAY) -> dict[str, str]:
    async with rc.client(redis.url) as client:
        return dict(await client.hgetall(rc.usage_key(day.isoformat())))


async def test_spend_on_each_process_adds_up_and_the_budget_is_spent_for_both(tmp_path, redis_server):
    async with trio.open_nursery() as nursery:
        a, b = Process(tmp_path / "a", redis_server), Process(tmp_path / "b", redis_server)
        await a.start(nursery)
        await b.start(nursery)
        a.usage.add(0.4)
        b.usage.add(0.5)
        await a.total.sync()
        await b.total.sync()
        await a.total.sync()
        assert (a.cost(), b.cost()) == (0.9, 0.9)
        assert not a.spent() and not b.spent()
        # the day's hash: one field per process, its own total in micro-dollars
        assert await _fields(redis_server) == {a.total.source: "400000", b.total.source: "500000"}
        b.usage.add(0.2)
        await b.total.sync()
        assert b.spent() and b.cost() == pytest.approx(1.1)
        assert not a.spent()               # a has not heard yet: the figure lags by one sync
        await a.total.sync()
        assert a.spent() and a.cost() == pytest.approx(1.1)
        assert a.usage.own() == ("2026-03-27", 0.4)     # the own total (and its file) stays this process's
        nursery.cancel_scope.cancel()


async def test_a_sync_sent_again_counts_nothing_twice(tmp_path, redis_server):
    async with trio.open_nursery() as nursery:
        a, b = Process(tmp_path / "a", redis_server), Process(tmp_path / "b", redis_server)
        await a.start(nursery)
        await b.start(nursery)
        a.usage.add(0.25)
        for _ in range(3):                 # e.g. an answer lost and the sync repeated
            await a.total.sync()
            await b.total.sync()
        assert (a.cost(), b.cost()) == (0.25, 0.25)
        nursery.cancel_scope.cancel()


async def test_the_sync_task_sends_costs_on_its_own_and_at_stop(tmp_path, redis_server):
    a, b = Process(tmp_path / "a", redis_server), Process(tmp_path / "b", redis_server)
    a.total.every_s = b.total.every_s = 0.05
    async with trio.open_nursery() as nursery:
        await a.start(nursery)
        async with trio.open_nursery() as b_nursery:
            await b.start(b_nursery)
            b.usage.add(0.3)
            with trio.fail_after(5):
                while a.cost() != 0.3:
                    await trio.sleep(0.01)
            b.total.every_s = 3600         # from now on only the stop's last sync sends
            await trio.sleep(0.1)
            b.usage.add(0.1)
            b_nursery.cancel_scope.cancel()
        assert await _fields(redis_server) == {b.total.source: "400000"}
        nursery.cancel_scope.cancel()


async def test_without_redis_answering_a_process_counts_its_own_and_what_it_had_seen(tmp_path, redis_server,
                                                                                    log_stream):
    async with trio.open_nursery() as nursery:
        a, b = Process(tmp_path / "a", redis_server), Process(tmp_path / "b", redis_server)
        await a.start(nursery)
        await b.start(nursery)
        a.usage.add(0.6)
        await a.total.sync()
        await b.total.sync()               # b has seen a's 0.6
        redis_server.stop()
        late = Process(tmp_path / "late", redis_server)   # started while Redis is down
        await late.start(nursery)
        late.usage.add(0.1)
        b.usage.add(0.2)
        for _ in range(3):
            await b.total.sync()           # never raises
            await late.total.sync()
        assert late.cost() == 0.1          # nothing from Redis today: its own total
        assert b.cost() == pytest.approx(0.8) and not b.spent()
        b.usage.add(0.25)
        assert b.spent()                   # the others' last known spend still counts
        lines = [line for line in log_stream.getvalue().splitlines() if "daily_total.unreachable" in line]
        assert len(lines) == 2             # once per process, not once per sync
        assert "redis.sock" not in log_stream.getvalue() and "unix://" not in log_stream.getvalue()
        stopping = Process(tmp_path / "stopping", redis_server)
        async with trio.open_nursery() as own:     # stopped during the outage: its last sync fails quietly, in time
            await stopping.start(own)
            stopping.usage.add(0.05)
            own.cancel_scope.cancel()
        assert stopping.cost() == 0.05
        redis_server.start()
        await late.total.sync()
        await b.total.sync()
        await late.total.sync()
        # b's own 0.45 and its own 0.1: a's 0.6 went with Redis's data (a has not synced since)
        assert late.cost() == pytest.approx(0.55)
        assert b.cost() == pytest.approx(1.05)      # b still counts a's 0.6 it had seen
        assert log_stream.getvalue().count("daily_total.reachable") == 2
        nursery.cancel_scope.cancel()


async def test_a_redis_restart_without_its_data_is_refilled_by_the_live_processes(tmp_path, redis_server):
    async with trio.open_nursery() as nursery:
        a, b = Process(tmp_path / "a", redis_server), Process(tmp_path / "b", redis_server)
        await a.start(nursery)
        await b.start(nursery)
        a.usage.add(0.4)
        b.usage.add(0.5)
        await a.total.sync()
        await b.total.sync()
        await a.total.sync()
        redis_server.stop()
        redis_server.start()               # empty: the day's hash is gone
        assert await _fields(redis_server) == {}
        a.usage.add(0.05)
        await a.total.sync()
        # a sent its whole day again (not only the 0.05), and keeps b's 0.5 it had seen
        assert await _fields(redis_server) == {a.total.source: "450000"}
        assert a.cost() == pytest.approx(0.95)
        await b.total.sync()
        assert await _fields(redis_server) == {a.total.source: "450000", b.total.source: "500000"}
        fresh = Process(tmp_path / "fresh", redis_server)   # started after the restart
        await fresh.start(nursery)
        await fresh.total.sync()
        assert fresh.cost() == pytest.approx(0.95)
        nursery.cancel_scope.cancel()


async def test_a_restarted_process_writes_its_own_field_again_and_never_lowers_it(tmp_path, redis_server):
    async with trio.open_nursery() as nursery:
        a = Process(tmp_path / "a", redis_server)
        await a.start(nursery)
        a.usage.add(0.3)
        await a.usage._write()             # the file has 0.3
        a.usage.add(0.1)
        await a.total.sync()               # Redis has 0.4; then a crash before the file's next write
        source = a.total.source
        assert source_path(tmp_path / "a").read_text().strip() == source
        again = Process(tmp_path / "a", redis_server)
        await again.start(nursery)
        assert again.total.source == source
        assert again.usage.own() == ("2026-03-27", 0.3)
        await again.total.sync()
        assert await _fields(redis_server) == {source: "400000"}    # one field, not lowered
        assert again.cost() == pytest.approx(0.4)
        nursery.cancel_scope.cancel()


async def test_a_new_day_starts_from_zero_in_a_key_of_its_own(tmp_path, redis_server):
    today = [DAY]
    async with trio.open_nursery() as nursery:
        a = Process(tmp_path / "a", redis_server, today=today)
        b = Process(tmp_path / "b", redis_server, today=today)
        await a.start(nursery)
        await b.start(nursery)
        a.usage.add(1.5)
        await a.total.sync()
        await b.total.sync()
        assert b.spent()
        today[0] = DAY + dt.timedelta(days=1)
        assert not b.spent() and b.cost() == 0.0
        b.usage.add(0.2)
        await b.total.sync()
        await a.total.sync()
        assert (a.cost(), b.cost()) == (0.2, 0.2)
        assert await _fields(redis_server, today[0]) == {b.total.source: "200000"}   # a spent nothing: no field
        async with rc.client(redis_server.url) as client:
            ttl = await client.ttl(rc.usage_key(DAY.isoformat()))
        assert 0 < ttl <= rc.USAGE_TTL_S
        nursery.cancel_scope.cancel()


def test_the_source_id_is_made_once_and_kept(tmp_path):
    first = load_source_id(tmp_path)
    assert load_source_id(tmp_path) == first and "/" in first
    source_path(tmp_path).write_text("\x00garbage")
    assert load_source_id(tmp_path) not in (first, "\x00garbage")
