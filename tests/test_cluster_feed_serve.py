"""The feed follows a call from any process (issue 18): two ``voiceactors
serve`` processes sharing one real ``redis-server``, against our simulator.

* an SSE client on the process that does not hold the call sees the call's
  events in order, with the ids the holder's own clients see;
* a client that drops and reconnects to the *other* process with
  ``Last-Event-ID`` resumes without loss or duplicate (both ways);
* the call's nav hint and observer action are taken once, on the process
  that does not hold the call;
* ``active_sessions`` counts both processes' calls;
* kill -9 of the holder: the other process takes the call over and its
  events follow in the same stream, with later ids; the dead holder's client
  resumes on the survivor without loss or duplicate;
* Redis down while a remote client watches: the holder's own client keeps
  its feed, the remote one gets ``feed.interrupted`` and, when Redis is back,
  ``feed.resumed`` and what it missed; neither server stops.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
import trio

from calls_support import DAY, KEY
from redis_support import REDIS_SERVER, RedisServer, redis_server  # noqa: F401  (the fixture)
from cluster_support import ClusterServer, stop_all
from voiceactors.journal.sample import write_sample_journal
from voiceactors.simulator import Simulator

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")

CALL = "rtc_feed_cluster"
Until = Callable[[dict[str, Any]], bool]


def _is(kind: str, **fields: Any) -> Until:
    return lambda e: e.get("type") == kind and all(e.get(k) == v for k, v in fields.items())


class Watcher:
    """One SSE client: its events (``data`` objects) as they arrive; the
    ``id:`` line of each is checked against the event's ``id``."""

    def __init__(self, url: str, call_id: str, last_id: str | None = None) -> None:
        self.url, self.call_id, self.last_id = url, call_id, last_id
        self.events: list[dict[str, Any]] = []
        self.connected = trio.Event()
        self.done = trio.Event()

    async def run(self, until: Until) -> None:
        headers = {"Last-Event-ID": self.last_id} if self.last_id else {}
        try:
            async with httpx.AsyncClient(base_url=self.url, timeout=httpx.Timeout(10, read=None)) as client:
                async with client.stream("GET", "/api/voice/events", params={"call_id": self.call_id},
                                         headers=headers) as response:
                    assert response.status_code == 200, await response.aread()
                    line_id = None
                    async for line in response.aiter_lines():
                        if line.startswith(": connected"):
                            self.connected.set()
                        elif line.startswith("id: "):
                            line_id = line[4:]
                        elif line.startswith("data: "):
                            event = json.loads(line[6:])
                            assert event.get("id") == line_id, (event, line_id)
                            line_id = None
                            self.events.append(event)
                            if until(event):
                                return
        finally:
            self.done.set()

    async def saw(self, until: Until, timeout_s: float = 30) -> None:
        with trio.fail_after(timeout_s):
            while not any(until(e) for e in self.events):
                await trio.sleep(0.02)

    @property
    def ids(self) -> list[str]:
        return [e["id"] for e in self.events if "id" in e]


def _scenario() -> list:
    return [
        {"sleep": 3.0},                              # the watchers connect before the first event
        {"user_turn": {"text": "what is on today"}},
        {"response": {"tool_calls": [{"name": "calendar.today", "call_id": "call_t", "arguments": {}}]}},
        {"wait_outputs": {"timeout_s": 30}},
        {"response": {"text": "A quiet day."}},
        {"sleep": 1.0},
        {"user_turn": {"text": "start listening"}},
        {"response": {"tool_calls": [{"name": "observer.start_listening", "call_id": "call_o",
                                      "arguments": {"mode": "meeting"}}]}},
        {"wait_outputs": {"timeout_s": 30}},
        {"response": {"text": "Listening."}},
        {"sleep": 1.0},
        {"close": 1000},
    ]


def _two_turns(gap_s: float) -> list:
    """"First." then, ``gap_s`` later, "Second."; then a quiet call."""
    return [
        {"sleep": 3.0},                              # the watchers connect before the first event
        {"user_turn": {"text": "one"}},
        {"response": {"text": "First."}},
        {"sleep": gap_s},
        {"user_turn": {"text": "two"}},
        {"response": {"text": "Second."}},
        {"sleep": 120},
    ]


async def _connect(url: str, call_id: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        response = await client.post("/api/voice/connect", json={"call_id": call_id})
        assert response.status_code == 200 and response.json()["status"] == "connected", response.text


async def _get(url: str, path: str, **params: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        return await client.get(path, params=params)


def _servers(tmp_path: Path, sim: Simulator, redis: RedisServer, ttl_s: float | None = None) -> tuple:
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    servers = ClusterServer(journal, tmp_path / "state_a", sim, redis), \
        ClusterServer(journal, tmp_path / "state_b", sim, redis)
    if ttl_s is not None:
        for server in servers:
            server.env["VOICEACTORS_REDIS_LEASE_TTL"] = str(ttl_s)
    return servers


async def test_the_feed_follows_a_call_from_either_process_and_resumes_on_the_other(tmp_path, redis_server):
    sim = Simulator(None, api_key=KEY)
    sc = sim.add_call(CALL, _scenario())
    a = b = None
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            a, b = _servers(tmp_path, sim, redis_server)
            url_a, url_b = await a.start(nursery), await b.start(nursery)
            await _connect(url_a, CALL)                          # a holds the call
            ended = _is("call.ended")
            full_here = Watcher(url_a, CALL)                     # the holder's own client, from memory
            full_there = Watcher(url_b, CALL)                    # a client of the process that does not hold it
            drops_there = Watcher(url_b, CALL)                   # drops, resumes on a
            drops_here = Watcher(url_a, CALL)                    # drops, resumes on b
            nursery.start_soon(full_here.run, ended)
            nursery.start_soon(full_there.run, ended)
            nursery.start_soon(drops_there.run, _is("tool.finished", tool_call_id="call_t"))
            nursery.start_soon(drops_here.run, _is("transcript", role="user", text="start listening"))
            with trio.fail_after(10):
                for watcher in (full_here, full_there, drops_there, drops_here):
                    await watcher.connected.wait()
            assert not sim.calls[CALL].outputs                  # no event yet: every watcher sees all of them

            await drops_there.done.wait()
            await full_here.saw(_is("transcript", role="assistant", text="A quiet day."))   # missed while away
            resumed_here = Watcher(url_a, CALL, last_id=drops_there.ids[-1])
            nursery.start_soon(resumed_here.run, ended)

            await drops_here.done.wait()
            await full_here.saw(_is("observer.action"))
            resumed_there = Watcher(url_b, CALL, last_id=drops_here.ids[-1])
            nursery.start_soon(resumed_there.run, ended)

            with trio.fail_after(60):
                for watcher in (full_here, full_there, resumed_here, resumed_there):
                    await watcher.done.wait()
            assert sc.violations == []
            expected = full_here.events
            kinds = [e["type"] for e in expected]
            for kind in ("transcript", "tool.started", "nav.hint", "tool.finished", "observer.action", "call.ended"):
                assert kind in kinds, kinds
            ids = full_here.ids
            assert len(ids) == len(expected) and len(set(ids)) == len(ids)
            assert full_there.events == expected                 # in order, the same ids, the same content
            assert drops_there.events + resumed_here.events == expected     # no loss, no duplicate
            assert drops_here.events + resumed_there.events == expected
            assert resumed_here.events and resumed_there.events

            # the call's nav hint and observer action, taken on the process that does not hold it, once
            hints = (await _get(url_b, "/api/voice/nav-hints", call_id=CALL)).json()
            assert hints == {"hints": [{"target": "today", "tool": "calendar.today", "call_id": CALL}],
                             "consumed": True}
            assert (await _get(url_a, "/api/voice/nav-hints", call_id=CALL)).json()["hints"] == []
            assert (await _get(url_b, "/api/voice/nav-hints", call_id=CALL)).json()["hints"] == []
            actions = (await _get(url_b, "/api/voice/observer-actions")).json()
            assert actions == {"actions": [{"call_id": CALL, "tool": "observer.start_listening",
                                            "action": {"type": "start_observer", "mode": "meeting"}}],
                               "consumed": True}
            assert (await _get(url_a, "/api/voice/observer-actions")).json()["actions"] == []

            # the call ended: a new stream without Last-Event-ID finds no call; a bad id is refused
            assert (await _get(url_b, "/api/voice/events", call_id=CALL)).status_code == 404
            async with httpx.AsyncClient(base_url=url_b, timeout=10) as client:
                bad = await client.get("/api/voice/events", params={"call_id": CALL},
                                       headers={"Last-Event-ID": "not-an-id"})
            assert bad.status_code == 400 and bad.json() == {"error": "Last-Event-ID is invalid"}
            nursery.cancel_scope.cancel()
    finally:
        stop_all(a, b)


async def test_active_sessions_counts_both_processes_calls(tmp_path, redis_server):
    sim = Simulator(None, api_key=KEY)
    first, second = sim.add_call("rtc_on_a", [{"sleep": 120}]), sim.add_call("rtc_on_b", [{"sleep": 120}])
    a = b = None
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            a, b = _servers(tmp_path, sim, redis_server)
            url_a, url_b = await a.start(nursery), await b.start(nursery)
            await _connect(url_a, "rtc_on_a")
            await _connect(url_b, "rtc_on_b")
            with trio.fail_after(10):
                await first.wait_until(lambda c: c.connection is not None)
                await second.wait_until(lambda c: c.connection is not None)
            for url in (url_a, url_b):
                status = (await _get(url, "/api/voice/status")).json()
                assert status["active_sessions"] == 2, status
                assert status["cluster"]["active_sessions_here"] == 1
                assert status["cluster"]["leases_held"] == 1
            nursery.cancel_scope.cancel()
    finally:
        stop_all(a, b)


async def test_redis_down_while_a_remote_client_watches(tmp_path, redis_server):
    sim = Simulator(None, api_key=KEY)
    sc = sim.add_call(CALL, _two_turns(3.0))        # Redis goes away between them
    # a long lease: the call outlives the outage on its holder (a short one would stop it, as it must)
    a = b = None
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            a, b = _servers(tmp_path, sim, redis_server, ttl_s=30.0)
            url_a, url_b = await a.start(nursery), await b.start(nursery)
            await _connect(url_a, CALL)
            here, there = Watcher(url_a, CALL), Watcher(url_b, CALL)
            second = _is("transcript", role="assistant", text="Second.")
            nursery.start_soon(here.run, second)
            nursery.start_soon(there.run, second)
            with trio.fail_after(10):
                await here.connected.wait()
                await there.connected.wait()
            await there.saw(_is("transcript", role="assistant", text="First."))
            redis_server.stop()
            await there.saw(_is("feed.interrupted"), timeout_s=10)
            unreachable = {"error": "voice unavailable — shared feed unreachable"}
            for path, params in (("/api/voice/nav-hints", {"call_id": CALL}), ("/api/voice/observer-actions", {}),
                                 ("/api/voice/events", {"call_id": CALL})):   # a new stream of a call held on a
                answer = await _get(url_b, path, **params)
                assert (answer.status_code, answer.json()) == (503, unreachable), path
            # a resume on the holder falls back to its memory (from now) rather than failing
            async with httpx.AsyncClient(base_url=url_a, timeout=httpx.Timeout(10, read=None)) as client:
                async with client.stream("GET", "/api/voice/events", params={"call_id": CALL},
                                         headers={"Last-Event-ID": here.ids[-1]}) as resumed:
                    assert resumed.status_code == 200
            assert a.events("http.feed_resume_from_memory")
            await here.saw(second)                         # the holder's own client: its feed goes on
            assert not any(e.get("text") == "Second." for e in there.events)
            redis_server.start()                           # back, without its data
            await there.saw(second, timeout_s=20)
            kinds = [e["type"] for e in there.events]
            assert kinds.count("feed.interrupted") == 1 and kinds.count("feed.resumed") == 1
            assert kinds.index("feed.interrupted") < kinds.index("feed.resumed")
            # what it missed came after the resume, nothing twice, the holder's ids
            feed_events = [e for e in there.events if "id" in e]
            assert feed_events == [e for e in here.events]
            assert a.proc.poll() is None and b.proc.poll() is None
            assert sc.violations == []
            nursery.cancel_scope.cancel()
    finally:
        stop_all(a, b)


async def test_the_feed_follows_a_call_taken_over_after_its_holder_died(tmp_path, redis_server):
    sim = Simulator(None, api_key=KEY)
    sc = sim.add_call(CALL, _two_turns(6.0))        # the holder is killed between them; the other takes over
    a = b = None
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            a, b = _servers(tmp_path, sim, redis_server, ttl_s=2.0)   # taken over in seconds, before "Second."
            url_a, url_b = await a.start(nursery), await b.start(nursery)
            await _connect(url_a, CALL)
            first, second = (_is("transcript", role="assistant", text=t) for t in ("First.", "Second."))
            on_holder, there = Watcher(url_a, CALL), Watcher(url_b, CALL)
            nursery.start_soon(on_holder.run, first)
            nursery.start_soon(there.run, second)
            with trio.fail_after(10):
                await on_holder.connected.wait()
                await there.connected.wait()
            await on_holder.done.wait()
            await there.saw(first)
            a.proc.kill()                                     # kill -9 of the holder
            with trio.fail_after(10):
                assert await a.proc.wait() == -9
            with trio.fail_after(20):
                while not b.events("supervisor.take_over"):
                    await trio.sleep(0.05)
            # the killed holder's client comes back on the process that took the call over
            moved = Watcher(url_b, CALL, last_id=on_holder.ids[-1])
            nursery.start_soon(moved.run, second)
            await there.saw(second, timeout_s=30)
            await moved.saw(second, timeout_s=10)
            assert on_holder.events + moved.events == there.events     # nothing lost, nothing twice
            epochs = [int(e["id"].split("-")[0]) for e in there.events]
            assert epochs == sorted(epochs) and epochs[-1] > epochs[0]   # the new holder's ids are later
            assert sc.violations == []
            nursery.cancel_scope.cancel()
    finally:
        stop_all(a, b)
