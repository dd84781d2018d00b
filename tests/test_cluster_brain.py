"""The cluster brain (issue 18): "one instruction for the cluster, refreshed
by one process at a time (single flight across processes), readable by all".

Two BrainActors, each with its own ``BrainFlight`` on one real redis-server,
stand for two processes (the serve-level test runs two ``voiceactors serve``
children); the journal is real files; time is real (a Redis TTL does not
follow trio's clock).
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import httpx
import pytest
import trio

from calls_support import DAY, KEY
from redis_support import REDIS_SERVER, redis_server  # noqa: F401  (the fixture)
from test_brain import CountingBackend
from cluster_support import ClusterServer, stop_all
from voiceactors import logs
from voiceactors.brain.actor import BrainActor
from voiceactors.messages import AwaitReady, GetBrain, RefreshBrain, ask
from voiceactors.cluster import brain_flight as bf
from voiceactors.cluster import redis_client as rc
from voiceactors.journal.sample import write_sample_journal
from voiceactors.settings import Settings
from voiceactors.simulator import Simulator

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")

UNBOUNDED = math.inf


def _journal(root: Path, agent: str = "nova") -> Path:
    (root / "config").mkdir(parents=True, exist_ok=True)
    (root / "identity").mkdir(exist_ok=True)
    _rename(root, agent)
    (root / "identity" / "self.md").write_text("# self\n\nI am the journal's companion.\n")
    return root


def _rename(root: Path, agent: str) -> None:
    (root / "config" / "journal.json").write_text(json.dumps({
        "identity": {"name": "Ada Lovelace", "preferred": "Ada"}, "agent": {"name": agent}}))


def _settings(tmp_path: Path, journal: Path, name: str, redis_url: str) -> Settings:
    return Settings(journal=journal, state_dir=tmp_path / name, redis_url=redis_url, brain_timeout_s=10)


async def _actor(nursery: trio.Nursery, settings: Settings, backend: CountingBackend,
                 flight: bf.BrainFlight | None = None) -> BrainActor:
    actor = BrainActor(settings, backend, flight=flight or bf.make_flight(settings))
    await nursery.start(actor.run)
    return actor


async def _all(*asks):
    results: list = [None] * len(asks)

    async def one(i, fn):
        results[i] = await fn()

    async with trio.open_nursery() as nursery:
        for i, fn in enumerate(asks):
            nursery.start_soon(one, i, fn)
    return results


async def test_two_processes_one_backend_run_per_change_and_the_same_instruction(tmp_path, redis_server):
    journal = _journal(tmp_path / "journal")
    a_backend, b_backend = CountingBackend(seconds=0.5), CountingBackend(seconds=0.5)
    async with trio.open_nursery() as nursery:
        a = await _actor(nursery, _settings(tmp_path, journal, "a", redis_server.url), a_backend)
        b = await _actor(nursery, _settings(tmp_path, journal, "b", redis_server.url), b_backend)
        with trio.fail_after(20):
            first_a, first_b = await _all(lambda: ask(a.inbox, AwaitReady, timeout=UNBOUNDED),
                                          lambda: ask(b.inbox, AwaitReady, timeout=UNBOUNDED))
        assert len(a_backend.calls) + len(b_backend.calls) == 1          # one flight for both
        assert first_a.instruction == first_b.instruction == "nova instruction 1"
        assert a.version == b.version is not None
        first_version = a.version
        # the journal changes; a refresh asked on both at once runs once, and both serve its result
        _rename(journal, "vega")
        with trio.fail_after(20):
            new_a, new_b = await _all(lambda: ask(a.inbox, RefreshBrain, timeout=UNBOUNDED),
                                      lambda: ask(b.inbox, RefreshBrain, timeout=UNBOUNDED))
        assert len(a_backend.calls) + len(b_backend.calls) == 2
        assert new_a.instruction == new_b.instruction and new_a.instruction.startswith("vega instruction")
        assert a.version == b.version and a.version > first_version
        # a third process starting now adopts the current one without a run of its own
        c_backend = CountingBackend(seconds=0.5)
        c = await _actor(nursery, _settings(tmp_path, journal, "c", redis_server.url), c_backend)
        with trio.fail_after(20):
            third = await ask(c.inbox, AwaitReady, timeout=UNBOUNDED)
        assert third.instruction == new_a.instruction and c_backend.calls == [] and c.version == a.version
        nursery.cancel_scope.cancel()


async def test_a_refresh_on_one_process_reaches_the_others(tmp_path, redis_server):
    journal = _journal(tmp_path / "journal")
    a_backend, b_backend = CountingBackend(seconds=0.1), CountingBackend(seconds=0.1)
    async with trio.open_nursery() as nursery:
        a = await _actor(nursery, _settings(tmp_path, journal, "a", redis_server.url), a_backend)
        b = await _actor(nursery, _settings(tmp_path, journal, "b", redis_server.url), b_backend)
        with trio.fail_after(20):
            await ask(a.inbox, AwaitReady, timeout=UNBOUNDED)
            await ask(b.inbox, AwaitReady, timeout=UNBOUNDED)
            _rename(journal, "vega")
            refreshed = await ask(a.inbox, RefreshBrain, timeout=UNBOUNDED)
            while (await ask(b.inbox, GetBrain, timeout=UNBOUNDED)).instruction != refreshed.instruction:
                await trio.sleep(0.1)                  # b follows the cluster's newer version
        assert b_backend.calls == [] and len(a_backend.calls) == 2
        assert b.version == a.version
        nursery.cancel_scope.cancel()


async def test_a_dead_refresh_holder_is_taken_over_after_its_lock_ttl(tmp_path, redis_server):
    journal = _journal(tmp_path / "journal")
    backend = CountingBackend(seconds=0.1)
    settings = _settings(tmp_path, journal, "a", redis_server.url)
    lock_ttl = 1.0
    async with rc.client(redis_server.url) as redis:        # a holder that died mid-run
        await redis.set(bf.LOCK_KEY, "dead-holder", px=round(lock_ttl * 1000))
    async with trio.open_nursery() as nursery:
        actor = await _actor(nursery, settings, backend, bf.BrainFlight(redis_server.url, lock_ttl))
        started = trio.current_time()
        with trio.fail_after(20):
            state = await ask(actor.inbox, AwaitReady, timeout=UNBOUNDED)
        waited = trio.current_time() - started
        assert state.instruction == "nova instruction 1" and len(backend.calls) == 1
        assert waited >= lock_ttl * 0.8                   # it waited for the dead holder's lock to expire
        async with rc.client(redis_server.url) as redis:
            assert not await redis.exists([bf.LOCK_KEY])   # its own lock went with its result
        nursery.cancel_scope.cancel()


async def test_redis_down_each_process_runs_its_own_brain_and_says_so(tmp_path):
    journal = _journal(tmp_path / "journal")
    backend = CountingBackend(seconds=0.1)
    settings = _settings(tmp_path, journal, "a", f"unix://{tmp_path / 'no-redis.sock'}")
    stream = io.StringIO()
    logs.configure("json", "info", stream=stream)
    try:
        async with trio.open_nursery() as nursery:
            actor = await _actor(nursery, settings, backend)
            with trio.fail_after(20):
                state = await ask(actor.inbox, AwaitReady, timeout=UNBOUNDED)
            assert state.instruction == "nova instruction 1" and len(backend.calls) == 1
            assert actor.version is None
            nursery.cancel_scope.cancel()
    finally:
        logs.configure()
    events = [json.loads(line).get("event") for line in stream.getvalue().splitlines()]
    assert events.count("brain.cluster_unreachable") == 1 and "brain.refreshed" in events


async def test_two_serve_processes_refresh_once_and_serve_the_same_instruction(tmp_path, redis_server):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    sim = Simulator(None, api_key=KEY)
    a = b = None
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            a = ClusterServer(journal, tmp_path / "state_a", sim, redis_server)
            b = ClusterServer(journal, tmp_path / "state_b", sim, redis_server)
            urls = [await a.start(nursery), await b.start(nursery)]

            def runs() -> int:
                return len(a.events("brain.refreshed")) + len(b.events("brain.refreshed"))

            async with httpx.AsyncClient(timeout=30) as client:
                async def refresh(url: str) -> dict:
                    answer = await client.post(url + "/api/voice/refresh-brain")
                    assert answer.status_code == 200, answer.text
                    return answer.json()

                async def ready(url: str) -> bool:
                    return bool((await client.get(url + "/api/voice/status")).json()["brain_ready"])

                with trio.fail_after(30):                # the first instruction: made once, adopted by the other
                    for url in urls:
                        await client.post(url + "/api/voice/session", json={})
                        while not await ready(url):
                            await trio.sleep(0.1)
                assert runs() == 1
                config_file = journal / "config" / "journal.json"
                config = json.loads(config_file.read_text())
                config.setdefault("agent", {})["name"] = "vega"
                config_file.write_text(json.dumps(config))
                results: list[dict] = []

                async def refresh_into(url: str) -> None:
                    results.append(await refresh(url))

                with trio.fail_after(30):
                    async with trio.open_nursery() as both:
                        for url in urls:
                            both.start_soon(refresh_into, url)
                assert runs() == 2                      # one run across both for the change
                previews = {r["instruction_preview"] for r in results}
                assert len(previews) == 1 and "vega" in previews.pop()
                assert len(a.events("brain.adopted")) + len(b.events("brain.adopted")) >= 2
            nursery.cancel_scope.cancel()
    finally:
        stop_all(a, b)
