"""The call tests' own helpers around the testing kit's rig
(``voiceactors/testing/rig.py``, ``docs/testing.md``): the rig with each
``run_call`` bounded in real time, gated tools, and protocol assertions over
what the simulator received. An actor a supervisor makes (not ``Rig.actor``)
opens the browser's sideband over loopback, whatever the rig's ``Sideband``.
Tests of timeouts use scenarios without tools, or gated tools that block on
purpose (a rig's tools run with no deadline: see the rig's docstring).
"""

from __future__ import annotations

import os
import threading
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import trio

from voiceactors.call.actor import CallActor
from voiceactors.call.websocket_transport import WebSocketTransport
from voiceactors.simulator import SimCall
from voiceactors.simulator.client_events import validate_client_event
from voiceactors.testing import rig as kit
from voiceactors.testing.rig import (  # noqa: F401 - the calls tests import them from here
    DAY, KEY, PeerSocket, Rig, Sideband, handshake_failure, start_simulator, steady,
)
from voiceactors.tools import REGISTRY, ToolSpec, make_registry

from clock_support import real_time_limit  # noqa: F401 - the calls tests import it from here

ACTIVE = "conversation_already_has_active_response"


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


def rig(tmp_path: Path, scenario: Any = None, **kw: Any) -> AbstractAsyncContextManager[Rig]:
    """The kit's rig (``voiceactors.testing.rig``), each ``run_call`` bounded in real time."""
    return kit.rig(tmp_path, scenario, guard=real_time_limit, **kw)


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
