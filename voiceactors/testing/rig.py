"""The call rig: a journal, a real ToolExecutor and the Realtime simulator,
with calls served by real ``CallActor``s (``docs/testing.md``).

The simulator serves REST on loopback (the hangup, client secrets). Its calls'
sidebands reach the actors one of two ways (``Sideband``): in memory (the
default: the simulator's own call session plays on a ``MemoryPeer`` of the
call's in-memory transport, so a test of the shell's behaviour crosses no
socket), or over the loopback websocket, for the tests about what crosses a
socket. A test that plays the service itself event by event takes
``Rig.memory_actor``.

Handlers run in real worker threads and ``autojump_clock`` jumps to the next
deadline whenever every trio task waits (a running thread included). So a rig
runs tools with no deadline that could fire while a handler works: tool
timeouts, the call's idle timeout and maximum duration are infinite unless a
test sets them, a slow tool call is never acknowledged (``tool_ack_after_s``
0: a test of slow tools sets it), and ``steady`` makes the simulator's
``wait_outputs`` and ``wait_create`` wait without a timeout.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager, suppress
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Mapping

import trio
from trio_websocket import CloseReason, ConnectionClosed

from voiceactors.call.actor import CallActor
from voiceactors.call.feed import FeedHub
from voiceactors.call.memory_transport import MemoryPeer, MemoryService, MemoryTransport
from voiceactors.call.record import read_record, record_path
from voiceactors.call.transport import (
    CallTransport, OpenTransport, TransportClosed, TransportError, TransportGone, TransportRefused,
    TransportUnavailable,
)
from voiceactors.executor.actor import ToolExecutor
from voiceactors.journal.sample import write_sample_journal
from voiceactors.mcp.client.hub import McpHub
from voiceactors.mcp.client.sources import McpSource
from voiceactors.settings import Settings
from voiceactors.simulator import Scenario, SimCall, Simulator, load_scenario
from voiceactors.simulator.call import CallSession
from voiceactors.tools import REGISTRY, ToolContext

__all__ = ["DAY", "KEY", "PeerSocket", "Rig", "Sideband", "handshake_failure", "rig", "start_simulator", "steady"]

#: "Today" in a rig's journal and tools (the sample journal ends on it).
DAY = dt.date(2026, 3, 27)
#: The API key the rig's simulator accepts.
KEY = "sk-test-calls-0123456789"


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
    #: wraps each ``run_call`` (a test suite's real-time bound, say)
    guard: Callable[[], AbstractContextManager[Any]] = field(default=contextlib.nullcontext)
    #: the MCP tool sources' hub, when the rig has sources
    mcp: McpHub | None = None

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
        with self.guard():
            await actor.run()
        return actor, sim_call

    def record(self, call_id: str) -> list[dict[str, Any]]:
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
              sideband: Sideband = Sideband.MEMORY,
              guard: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
              sources: tuple[McpSource, ...] | None = None, env: Mapping[str, str] | None = None,
              **changes: Any) -> AsyncIterator[Rig]:
    """A rig under ``tmp_path``: its journal (``tmp_path/journal``, the
    sample journal unless one is there), state, simulator and executor
    (``registry``: the tools, the real ones by default); ``changes`` are
    ``Settings`` fields. MCP tool sources (``sources``, else the
    ``mcp_sources`` setting; their tokens from ``env``, else the process's
    environment) are reached through a hub whose first discovery is done
    when the rig is yielded. Everything stops when the block ends."""
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
        mcp = None
        if sources is not None or settings.mcp_sources:
            mcp = McpHub(settings, sources, env=env)
            await nursery.start(mcp.run)
            await mcp.wait_discovered()
        ctx = ToolContext(journal=journal, state_dir=settings.state_dir, today=lambda: DAY)
        executor = ToolExecutor(settings, ctx, registry or REGISTRY, remote=mcp)
        await nursery.start(executor.run)
        yield Rig(sim, settings, executor, FeedHub(settings.feed_retention_s, settings.feed_max_items),
                  nursery, sim_scope, sim_tasks, sideband, guard, mcp)
        nursery.cancel_scope.cancel()
