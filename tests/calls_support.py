"""Shared set-up for the call tests: a sample journal, a real ToolExecutor, the
Realtime simulator, and protocol assertions over what it received.

The simulator serves REST on loopback (the hangup, client secrets). Its calls'
sidebands reach the actors one of two ways (``Sideband``): in memory (the
default: the simulator's own call session plays on a ``MemoryPeer`` of the
call's in-memory transport, so a test of the shell's behaviour crosses no
socket), or over the loopback websocket, for the tests about what crosses a
socket (the frames, TLS, the handshake, the HTTP front end, Redis, another
process). A test that plays the service itself event by event takes
``Rig.memory_actor``. An actor a supervisor makes (not ``Rig.actor``) opens
the browser's sideband, over loopback, whatever the rig's ``Sideband``.

Handlers run in real worker threads and ``autojump_clock`` jumps to the next
deadline whenever every trio task waits (a running thread included). So tests
that run tools use no deadline that could fire while a handler works: tool
timeouts, the call's idle timeout and maximum duration are infinite, a slow
tool call is never acknowledged (``tool_ack_after_s`` 0: a test of slow
tools sets it), and the
simulator's ``wait_outputs`` waits without a timeout (``steady``). Tests of
timeouts use scenarios without tools, or gated tools that block on purpose.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import threading
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import trio
from trio_websocket import CloseReason, ConnectionClosed

from voiceactors.call.actor import CallActor
from voiceactors.call.record import read_record, record_path
from voiceactors.call.feed import FeedHub
from voiceactors.executor.actor import ToolExecutor
from voiceactors.call.memory_transport import MemoryPeer, MemoryService, MemoryTransport
from voiceactors.call.transport import (
    CallTransport, OpenTransport, TransportClosed, TransportError, TransportGone, TransportRefused,
    TransportUnavailable,
)
from voiceactors.call.websocket_transport import WebSocketTransport
from voiceactors.journal.sample import write_sample_journal
from voiceactors.simulator import Scenario, SimCall, Simulator, load_scenario
from voiceactors.simulator.call import CallSession
from voiceactors.simulator.client_events import validate_client_event
from voiceactors.settings import Settings
from voiceactors.tools import REGISTRY, ToolContext, ToolSpec, make_registry

from clock_support import real_time_limit  # noqa: F401 - the calls tests import it from here

DAY = dt.date(2026, 3, 27)
KEY = "sk-test-calls-0123456789"
ACTIVE = "conversation_already_has_active_response"


def steady(name_or_steps: Any) -> Scenario:
    """A scenario whose ``wait_outputs`` and ``wait_create`` steps never time out (see module doc)."""
    scenario = load_scenario(name_or_steps) if isinstance(name_or_steps, str) else Scenario.from_obj(name_or_steps)
    steps = []
    for step in scenario.steps:
        for kind in ("wait_outputs", "wait_create"):
            if kind in step:
                step = {kind: {**step[kind], "timeout_s": math.inf}}
        steps.append(step)
    return Scenario(scenario.name, scenario.description, tuple(steps))


class Gate:
    """A handler that blocks (in its worker thread) until released."""

    def __init__(self, result: dict | None = None) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.result = result or {"ok": True}
        self.calls = 0

    def handler(self, ctx: Any, args: dict) -> dict:
        self.calls += 1
        self.entered.set()
        self.release.wait(20)
        return dict(self.result)


def gated_registry(name: str, gate: Gate, effect: str = "read") -> dict[str, ToolSpec]:
    """The real registry with ``name`` replaced by a gated handler."""
    specs = [s for s in REGISTRY.values() if s.name != name]
    specs.append(ToolSpec(name=name, description=f"gated {name}", parameters={"type": "object"},
                          effect=effect, handler=gate.handler))
    return make_registry(specs)


class Sideband(StrEnum):
    """How a rig's actors reach the simulator's calls."""

    MEMORY = "memory"       # the call's in-memory transport, the simulator's call session on its peer
    LOOPBACK = "loopback"   # the sideband websocket on a loopback socket


class PeerSocket:
    """The three websocket calls a simulator ``CallSession`` makes, on the
    service's end (a ``MemoryPeer``) of a call's in-memory transport."""

    def __init__(self, peer: MemoryPeer) -> None:
        self.peer = peer

    async def get_message(self) -> str:
        await trio.lowlevel.checkpoint()   # as a websocket's receive: a dropped session reads nothing more
        try:
            return json.dumps(await self.peer.next_sent())
        except TransportClosed as closed:
            raise ConnectionClosed(CloseReason(closed.code or 1006, closed.reason)) from None

    async def send_message(self, message: str | bytes) -> None:
        # no schedule point: the events the session writes together reach the
        # call as one read, as its one socket write of them would
        self.peer.push(message)

    async def aclose(self, code: int = 1000, reason: str | None = None) -> None:
        self.peer.close(code, reason)
        await trio.lowlevel.checkpoint()


def handshake_failure(status: int) -> TransportError:
    """What the websocket opener raises for a handshake the simulator
    answered with ``status`` (``websocket_transport.failure``)."""
    message = f"sideband handshake rejected with HTTP {status}"
    if status in (404, 410):
        return TransportGone(message, status)
    if status in (401, 403):
        return TransportRefused(message, status)
    return TransportUnavailable(message, status)


@dataclass
class Rig:
    sim: Simulator
    settings: Settings
    executor: ToolExecutor
    hub: FeedHub
    nursery: trio.Nursery
    sim_scope: trio.CancelScope
    sim_tasks: trio.Nursery          # inside ``sim_scope``: the in-memory sidebands' sessions
    sideband: Sideband = Sideband.MEMORY

    def actor(self, call_id: str, **kw: Any) -> CallActor:
        kw.setdefault("answer_now", self.executor.answer_now)   # as the runtime wires it (None: inbox only)
        if self.sideband is Sideband.MEMORY:
            kw.setdefault("open_transport", self.memory_sideband(call_id))
        return CallActor(self.settings, call_id, self.executor.inbox, kw.pop("api_key", KEY),
                         kw.pop("feed", None) or self.hub.open(call_id), **kw)

    def memory_actor(self, call_id: str, **kw: Any) -> tuple[CallActor, MemoryService]:
        """An actor whose connections are in memory (``call/memory_transport.py``):
        the test plays the service on each ``await service.next_connection()``.
        Its hangup still goes to the simulator's REST API."""
        service = MemoryService()
        return self.actor(call_id, open_transport=service.open, **kw), service

    def memory_sideband(self, call_id: str) -> OpenTransport:
        """The opener of ``call_id``'s sideband in memory: each attempt is
        answered as the simulator answers a websocket handshake (recorded in
        ``sim.handshakes``), and an accepted one is served by the simulator's
        ``CallSession`` on the new connection's peer."""

        def open_transport(api_key: str) -> AbstractAsyncContextManager[CallTransport]:
            return self._join_in_memory(call_id, api_key)

        return open_transport

    @asynccontextmanager
    async def _join_in_memory(self, call_id: str, api_key: str) -> AsyncIterator[CallTransport]:
        await trio.lowlevel.checkpoint()
        refused = self.sim.key_refusal(api_key, call_id)
        status, _, call = (*refused, None) if refused is not None else self.sim.join_answer(call_id)
        self.sim.handshakes.append({"call_id": call_id, "status": status})
        if call is None or status != 101:
            raise handshake_failure(status)
        transport = MemoryTransport()
        peer = MemoryPeer(transport)
        session = self.sim.session_for(call, PeerSocket(peer))     # duck-typed: the three websocket calls
        await self.sim_tasks.start(self._serve_session, session, peer)
        try:
            yield transport
        finally:
            if transport.peer_closed is None and transport.closed_with is None:
                with trio.CancelScope(shield=True), suppress(TransportClosed):   # the peer may close meanwhile
                    await transport.aclose(1000)    # as leaving ``open_sideband`` closes the websocket

    @staticmethod
    async def _serve_session(session: CallSession, peer: MemoryPeer,
                             task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            task_status.started()    # ``run`` takes the call before its first schedule point
            await session.run()
        finally:
            peer.close(1006)     # a drop, or the simulator stopped: no close (a no-op after one)

    async def run_call(self, call_id: str, scenario: Any = None, **kw: Any) -> tuple[CallActor, SimCall]:
        """Register ``call_id`` in the simulator and serve it until the actor ends."""
        sim_call = self.sim.calls.get(call_id) or self.sim.add_call(call_id, scenario)
        actor = self.actor(call_id, **kw)
        with real_time_limit():
            await actor.run()
        return actor, sim_call

    def record(self, call_id: str) -> list[dict]:
        return read_record(record_path(self.settings.state_dir, call_id))


async def start_simulator(nursery: trio.Nursery, sim: Simulator) -> tuple[trio.CancelScope, trio.Nursery]:
    """Serve ``sim`` on loopback in ``nursery``. Returns the scope that stops
    it (every connection dropped) and the nursery inside that scope where
    its in-memory sidebands are served."""
    sim_scope = trio.CancelScope()

    async def serve_sim(task_status: trio.TaskStatus[trio.Nursery] = trio.TASK_STATUS_IGNORED) -> None:
        with sim_scope:
            async with trio.open_nursery() as sim_tasks:
                await sim_tasks.start(sim.serve, 0)
                task_status.started(sim_tasks)

    return sim_scope, await nursery.start(serve_sim)


@asynccontextmanager
async def rig(tmp_path: Path, scenario: Any = None, *, registry: Any = None,
              sideband: Sideband = Sideband.MEMORY, **changes: Any) -> AsyncIterator[Rig]:
    journal = tmp_path / "journal"
    if not journal.exists():
        write_sample_journal(journal, days=3, today=DAY)
    base: dict[str, Any] = dict(
        journal=journal, state_dir=tmp_path / "state",
        tool_timeout_read_s=math.inf, tool_timeout_write_s=math.inf, tool_ack_after_s=0.0,
        call_idle_timeout_s=math.inf, call_max_duration_s=math.inf,
    )
    base.update(changes)
    settings = Settings(**base)
    sim = Simulator(scenario, api_key=KEY)
    async with trio.open_nursery() as nursery:
        sim_scope, sim_tasks = await start_simulator(nursery, sim)
        settings = settings.replace(openai_base_url=sim.base_url)
        ctx = ToolContext(journal=journal, state_dir=settings.state_dir, today=lambda: DAY)
        executor = ToolExecutor(settings, ctx, registry or REGISTRY)
        await nursery.start(executor.run)
        yield Rig(sim, settings, executor, FeedHub(settings.feed_retention_s, settings.feed_max_items),
                  nursery, sim_scope, sim_tasks, sideband)
        nursery.cancel_scope.cancel()


def sideband_stream(actor: CallActor) -> Any:
    """The TCP stream under an actor's open sideband websocket (None: not connected)."""
    transport = actor.transport
    if transport is None:
        return None
    assert isinstance(transport, WebSocketTransport), transport
    return transport.ws._stream


def client_events(sim_call: SimCall) -> list[dict]:
    return list(sim_call.received)


def assert_valid_client_events(sim_call: SimCall) -> None:
    """Every event we sent is a valid SDK client event and carries an event_id."""
    for event in sim_call.received:
        validate_client_event(event)
        assert isinstance(event.get("event_id"), str) and event["event_id"], event


def outputs_by_call(sim_call: SimCall) -> dict[str, list[str]]:
    return {k: list(v) for k, v in sim_call.outputs.items()}


def assert_clean_protocol(sim_call: SimCall, *, creates: int) -> None:
    """Exactly one output per issued tool call id, no unknown ids, ``creates``
    response.create events, no error the service sent us, no violation."""
    assert_valid_client_events(sim_call)
    assert set(sim_call.outputs) == set(sim_call.tool_calls), (sim_call.outputs, sim_call.tool_calls)
    for call_id, outs in sim_call.outputs.items():
        assert len(outs) == 1, (call_id, outs)
    assert sim_call.response_creates == creates
    assert sim_call.error_codes == []
    assert sim_call.violations == []


#: One round of a kept read: a briefing asked for, answered, a short reply,
#: then the close. Its second run in a rig with a long ``tool_reuse_s`` is
#: answered in the call's step (``ToolExecutor.answer_now``).
BRIEF_ME_ONCE = [
    {"user_turn": {"text": "brief me"}},
    {"response": {"tool_calls": [{"name": "briefing.get", "arguments": {}}]}},
    {"wait_outputs": {}},
    {"response": {"text": "Here it is."}},
    {"sleep": 0.5},
    {"close": 1000},
]


def watch_output_writes(monkeypatch: Any, note: Callable[[CallActor, Any], None]) -> dict[str, CallActor]:
    """Call ``note(actor, call)`` just before each socket write of one call
    actor's sideband, for each of its tool calls whose output is queued (the
    frame being written); the actor is put under ``"actor"`` of the dict
    returned (``run_in_step``). Both ways its bytes leave are wrapped (and
    still write): trio's ``SocketStream.send_all`` and ``os.write`` on the
    sideband's descriptor (``ws_frames.start_send``'s write of a frame the
    socket takes whole)."""
    watched: dict[str, CallActor] = {}
    send_all, write = trio.SocketStream.send_all, os.write

    def ours() -> CallActor | None:
        actor = watched.get("actor")
        return actor if actor is not None and actor.transport is not None else None

    def noted(actor: CallActor) -> None:
        for call in actor.calls.values():
            if call.state == "queued":
                note(actor, call)

    async def noting_send_all(self: trio.SocketStream, data: Any) -> None:
        if (actor := ours()) is not None and self is sideband_stream(actor):
            noted(actor)
        await send_all(self, data)

    def noting_write(fd: int, data: Any) -> int:
        if (actor := ours()) is not None and fd == sideband_stream(actor).socket.fileno():
            noted(actor)
        return write(fd, data)

    monkeypatch.setattr(trio.SocketStream, "send_all", noting_send_all)
    monkeypatch.setattr(os, "write", noting_write)
    return watched


async def run_in_step(r: Rig, watched: dict[str, CallActor], scenario: Scenario) -> tuple[CallActor, SimCall]:
    """Run ``scenario`` as call ``rtc_warm`` (its read runs and its answer
    is kept), then as ``rtc_step``, watched from its start: its read is
    answered in its own step (``r`` made with a long ``tool_reuse_s``)."""
    await r.run_call("rtc_warm", scenario)
    actor = watched["actor"] = r.actor("rtc_step")
    r.sim.add_call("rtc_step", scenario)
    await actor.run()
    return actor, r.sim.calls["rtc_step"]


def received_types(sim_call: SimCall) -> list[str]:
    return [e["type"] for e in sim_call.received]


def output_json(sim_call: SimCall, call_id: str) -> Any:
    return json.loads(sim_call.outputs[call_id][0])


#: The modules of the actors (a task's name starts with its function's module).
ACTOR_MODULES = ("voiceactors.call.", "voiceactors.executor.", "voiceactors.brain.actor.", "voiceactors.mcp.client.",
                 "voiceactors.usage.daily.", "voiceactors.messages.")


def our_tasks() -> list[str]:
    """Names of live tasks running our actors, calls or HTTP code, from trio's
    task tree (a shutdown must leave none behind)."""
    found: list[str] = []

    def walk(task: trio.lowlevel.Task) -> None:
        if task.name.startswith(ACTOR_MODULES + ("voiceactors.runtime", "voiceactors.http", "call:")):
            found.append(task.name)
        for nursery in task.child_nurseries:
            for child in nursery.child_tasks:
                walk(child)

    walk(trio.lowlevel.current_root_task())
    return found
