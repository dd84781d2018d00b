"""The handoff between a call's agents, without I/O (``docs/agents.md``).

The model calls ``handoff.<agent>``; ``CallProtocol`` (``protocol.py``)
keeps one ``Handoffs`` and asks it at each step. A handoff is a
``Transition`` that walks one way::

    called ─▶ updating ─▶ done
      │          └──────▶ failed   (the service refused its session.update)
      └─▶ refused                  (another under way, not this agent's to make, its response cut short)

The ownership rules, each a test in ``tests/test_call_handoff.py``:

* **business effects first**: a transition waits, ``called``, for its batch
  to be complete (its ``response.done``) and every other output of it to be
  written; only then its ``session.update`` goes, then its own output;
* **ownership is claimed before the first send**: the step that sends the
  ``session.update`` puts the new agent in charge (``CallContext.hand_to``);
  nothing of the transition is sent from a later step without checking it
  is still the one in flight (``owner``);
* **one at a time**: while a transition is in flight, another handoff call
  is refused (its output says so), never interleaved;
* **acknowledgement and completion in either order**: a transition is over
  when both its ``session.updated`` and the ``response.done`` of the response
  its ``response.create`` started have come, whichever first (no response of
  its own when its batch was superseded: the user's turn is answered by the
  new agent);
* **an old response completes nothing new**: the transition's response is
  the one its own ``response.create`` started (by event id, then response
  id), so a late ``response.done`` of another response never completes it;
  a handoff called by a response whose agent is no longer in charge is
  refused;
* **a refused update leaves the old agent in charge and says so**: the
  service's ``error`` naming the ``session.update`` puts the previous agent
  back, cancels the new agent's first words if they started, and the old
  agent says, at the next quiet moment, that handing over did not work;
* **interruptions keep committed effects**: a barge-in during the handoff
  cancels its words only; the outputs written before it stay written, and
  the handoff itself is carried through.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from enum import StrEnum

from typing import Any, Mapping

from voiceactors.agents import CallAgents, handoff_target
from voiceactors.call.call_context import carried_agent
from voiceactors.call.record_kind import RecordKind


class HandoffStatus(StrEnum):
    """Where a transition is (the module doc's diagram); the ``handoff`` record line's ``status``."""

    CALLED = "called"
    UPDATING = "updating"
    DONE = "done"
    FAILED = "failed"
    REFUSED = "refused"


class HandoffRefusal(StrEnum):
    """Why a handoff call was not carried out (the record line's ``why``)."""

    UNDER_WAY = "under_way"              # another transition is in flight
    NOT_IN_CHARGE = "not_in_charge"      # its response's agent is no longer in charge
    NOT_ALLOWED = "not_allowed"          # the agent in charge may not hand to that one (or it is itself)
    RESPONSE_CUT = "response_cut"        # its response did not complete (cancelled, failed, incomplete)


@dataclass
class Transition:
    """One handoff in flight: ``owner`` numbers it (the call's n-th)."""

    owner: int
    tool_call_id: str
    response_id: str                     # the batch that called it
    source: str
    target: str
    tool: str = ""                       # the handoff tool's name as the model called it
    status: HandoffStatus = HandoffStatus.CALLED
    update_event_id: str | None = None
    create_event_id: str | None = None   # the response.create of the new agent's first words
    spoken_by: str | None = None         # ... the response it started
    acked: bool = False                  # session.updated came
    completed: bool = False              # its response ended (or it has none)
    resend: bool = False                 # its update fell in a dropped socket unacknowledged

    def fields(self) -> dict[str, object]:
        """The ``handoff`` record line's fields (the status and why are added)."""
        return {"tool_call_id": self.tool_call_id, "tool": self.tool, "response_id": self.response_id,
                "from": self.source, "to": self.target, "event_id": self.update_event_id}


def refusal_output(why: HandoffRefusal, source: str, target: str, current: str | None) -> str:
    """The refused handoff call's output: what the model reads."""
    text = {
        HandoffRefusal.UNDER_WAY: (f"another handoff is under way; {current or source} will be in charge, "
                                   "do not call it again now"),
        HandoffRefusal.NOT_IN_CHARGE: f"the {source} agent is no longer in charge: {current} is",
        HandoffRefusal.NOT_ALLOWED: f"the {current} agent cannot hand the call to {target}",
        HandoffRefusal.RESPONSE_CUT: "cancelled: the user interrupted",
    }[why]
    return json.dumps({"error": text})


def handed_output(source: str, target: str) -> str:
    """A carried-out handoff call's output."""
    return json.dumps({"handed_to": target, "from": source})


def recorded_output(line: Mapping[str, Any]) -> str | None:
    """The output a ``handoff`` record line says its call was answered with
    once its update went (a rejoin or a taker answers the call so, never
    with the restart error: the handoff happened); None for any other line."""
    source, target = line.get("from"), line.get("to")
    if (line.get("kind") != RecordKind.HANDOFF or not isinstance(source, str) or not isinstance(target, str)
            or line.get("status") not in (HandoffStatus.UPDATING, HandoffStatus.DONE, HandoffStatus.FAILED)):
        return None
    return handed_output(source, target)


def in_charge_after(line: Mapping[str, Any], agent: str | None) -> str | None:
    """The agent in charge after a call record line, ``agent`` before it:
    a ``context`` line's (a run starts with it), a ``handoff`` line's
    target once its update went (``updating``, ``done``), its source again
    when it failed; every other line changes nothing. Recovery, the cluster's
    mirror, the history and the timeline read the record so."""
    kind = line.get("kind")
    if kind == RecordKind.CONTEXT:
        return carried_agent(line.get("context")) or agent
    if kind != RecordKind.HANDOFF:
        return agent
    status = line.get("status")
    named = line.get("to") if status in (HandoffStatus.UPDATING, HandoffStatus.DONE) else (
        line.get("from") if status == HandoffStatus.FAILED else None)
    return named if isinstance(named, str) else agent


class Handoffs:
    """A call's transitions: the one in flight, the ``session.update``s of
    ours not acknowledged yet (the service answers them in order, and a
    ``session.updated`` carries no event id), and a failure the old agent
    has still to speak of."""

    def __init__(self, agents: CallAgents) -> None:
        self.agents = agents
        self.current: Transition | None = None
        self.count = 0
        self.updates: deque[str] = deque()       # session.update event ids sent, not yet acknowledged
        self.failure_due: Transition | None = None
        self.announced = False                   # the feed heard who is in charge (at the first response)

    def target_of(self, tool: str) -> str | None:
        return handoff_target(tool, self.agents.agents)

    def refusal(self, target: str, caller: str | None, in_charge: str) -> HandoffRefusal | None:
        """Why a handoff to ``target`` called by a response of ``caller``
        cannot start now (None: it may)."""
        if caller is not None and caller != in_charge:
            return HandoffRefusal.NOT_IN_CHARGE
        if self.current is not None:
            return HandoffRefusal.UNDER_WAY
        if target not in self.agents.agent(in_charge).handoffs:
            return HandoffRefusal.NOT_ALLOWED
        return None

    def claim(self, tool_call_id: str, tool: str, response_id: str, source: str, target: str) -> Transition:
        self.count += 1
        self.current = Transition(self.count, tool_call_id, response_id, source, target, tool)
        return self.current

    def sent_update(self, event_id: str) -> None:
        """A ``session.update`` of ours went (the context's or a transition's)."""
        self.updates.append(event_id)

    def acknowledged(self) -> str | None:
        """A ``session.updated``: the oldest update of ours it answers (None: none was waiting)."""
        return self.updates.popleft() if self.updates else None

    def refused(self, event_id: str) -> bool:
        """An ``error`` naming ``event_id``: whether it was one of our updates (then never acknowledged)."""
        if event_id in self.updates:
            self.updates.remove(event_id)
            return True
        return False

    def dropped(self) -> None:
        """The socket is gone: updates unacknowledged are not answered on the next one."""
        self.updates.clear()
        if self.current is not None and self.current.status is HandoffStatus.UPDATING and not self.current.acked:
            self.current.resend = True
