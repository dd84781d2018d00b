"""CallContext: what one call is about (its original link and current
selection) and its first greeting, without I/O.

Owned by the call's ``CallProtocol`` (``protocol.py`` calls the three
hooks below and carries out what they return; the rules live here):

* the **original link** is the verified (or unverified) context the call was
  connected with; it never changes;
* the **current selection** starts as the link (when verified) and is replaced
  only by a successful ``journal.select`` whose output the model gets. Both
  are immutable values (``context.Reference``): replacing one is one
  assignment, so a barge-in or a reconnect always sees one or the other;
* after a selection changes, the session's instructions are updated
  (``session.update``: the brain's instruction plus the context section) and
  the client is told (a ``selection`` feed event; the tool's nav hint goes the
  usual way);
* the **first greeting** (``{"greeting": "first"}``) is one ``response.create``
  carrying the opening instruction, sent at the first connection only (after
  the handover), only while no response is active or requested and before
  the conversation began; otherwise it is dropped, and it is never sent again
  (not after a reconnect);
* the journal's **session settings** (``realtime/session_settings.py``:
  reasoning effort, parallel tool calls, idle timeout), when any is set, go
  out in a ``session.update`` at the first connection and in every later
  one (a browser's key was minted with them too; this makes them the
  journal's at connect). None set: no update for them, as before;
* a **continuation** (``continuation.py``: the call it continues, which the
  time limit ended, and an account of it) is a section after the context's in
  every instruction the call sends, sent in a ``session.update`` at the
  first connection as a link is, and its first greeting says it picks the
  conversation up (when it has no link of its own).

With ``--redis`` a call taken over by another process carries on with its
context (``carried_view`` on the holder, mirrored in Redis;
``taken_over_context`` on the taker): the brain's instruction it was connected
with, its link, its current selection and its session settings. The taker sends one
``session.update`` at its first connection (the holder may have died before
its own went out) and never greets: its connection is a reconnect of the
call, and the holder may have greeted already.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from voiceactors.agents import CallAgents, with_agent
from voiceactors.linked_context import references as context
from voiceactors.call.continuation import OPENING as CONTINUATION_OPENING
from voiceactors.call.continuation import Continuation, with_continuation
from voiceactors.call.phone_line import PhoneLine
from voiceactors.call.state import ToolOutcome
from voiceactors.realtime import events as rt
from voiceactors.realtime import session_settings
from voiceactors.realtime.session_settings import SessionSettings

SELECT_TOOL = "journal.select"


@dataclass(frozen=True)
class PhoneCall:
    """A call placed to the project's SIP address and accepted by the phone
    webhook (``http/phone.py``): who called, masked (the record, history and
    logs never hold the number), and the header it was read from."""

    caller: str                             # ``phone_policy.masked``
    header: str | None = None               # p-asserted-identity / from
    pin: str | None = field(default=None, repr=False)   # never in a view: a record or the mirror
    transfer_to: str | None = None
    # a PIN is asked (a carried call's says so without the PIN: the start reads it again, phone_line.py)
    pin_required: bool = False

    def view(self) -> dict[str, Any]:
        return {"caller": self.caller, "header": self.header, "pin_required": self.locked,
                "transfer_to": self.transfer_to}

    @property
    def locked(self) -> bool:
        return self.pin_required or self.pin is not None

    @classmethod
    def from_view(cls, view: object) -> PhoneCall | None:
        if not isinstance(view, dict) or not isinstance(view.get("caller"), str):
            return None
        header, target = view.get("header"), view.get("transfer_to")
        return cls(view["caller"], header if isinstance(header, str) else None,
                   transfer_to=target if isinstance(target, str) else None,
                   pin_required=view.get("pin_required") is not False)


@dataclass(frozen=True)
class LiveSession:
    """A call on OpenAI's Live API (``docs/live.md``): what its sideband's
    translation needs again at a rejoin or a takeover. ``names``: each tool's
    name and the Responses name the session declared it under;
    ``instructions``: the session's, fixed at its creation; ``writes``: the
    tools that write (their outputs are noted to the Live model); ``model``:
    the Responses model it delegates to (the call's usage is that model's
    tokens, priced by its ``prices`` entry; None: the call's default);
    ``live_model``: the session's Live model (its seconds of audio are
    priced by that model's per-minute ``prices`` entry; None: not known,
    the seconds are counted and their cost is unknown); ``audio_s``: the
    session's seconds of audio the call's earlier runs counted (a rejoin
    counts only what its reports add to them)."""

    names: dict[str, str]
    instructions: str = ""
    writes: tuple[str, ...] = ()
    model: str | None = None
    live_model: str | None = None
    audio_s: float = 0.0

    def view(self) -> dict[str, Any]:
        view: dict[str, Any] = {"names": dict(self.names), "instructions": self.instructions,
                                "writes": list(self.writes), "model": self.model}
        if self.live_model is not None:
            view["live_model"] = self.live_model
        if self.audio_s > 0:
            view["audio_s"] = self.audio_s
        return view

    @classmethod
    def from_view(cls, view: object) -> LiveSession | None:
        if not isinstance(view, dict) or not isinstance(view.get("names"), dict):
            return None
        names = {k: v for k, v in view["names"].items() if isinstance(k, str) and isinstance(v, str)}
        instructions, writes, model = view.get("instructions"), view.get("writes"), view.get("model")
        live_model, audio_s = view.get("live_model"), view.get("audio_s")
        return cls(names, instructions if isinstance(instructions, str) else "",
                   tuple(w for w in writes if isinstance(w, str)) if isinstance(writes, list) else (),
                   model if isinstance(model, str) and model else None,
                   live_model if isinstance(live_model, str) and live_model else None,
                   float(audio_s) if isinstance(audio_s, (int, float)) and not isinstance(audio_s, bool)
                   and math.isfinite(audio_s) and audio_s > 0 else 0.0)


@dataclass(frozen=True)
class LinkedContext:
    """What ``/connect`` hands a new call."""

    base_instruction: str | None            # the brain's instruction at connect (None: none yet)
    link: context.Resolution | None = None  # the original link; None when no context was given
    greeting: bool = False                  # {"greeting": "first"}
    # a taken-over call's (``taken_over_context``): its current selection
    # (None: the link's, when verified) and that it carries on elsewhere
    selection: context.Reference | None = None
    taken_over: bool = False
    # the journal's session settings at connect: every session.update of the call carries them
    session: SessionSettings = SessionSettings()
    # the call this one continues (``{"continues": ...}``), with the account of it
    continuation: Continuation | None = None
    # a phone call's caller (None: a browser's call)
    phone: PhoneCall | None = None
    # a Live session's (None: a Realtime call)
    live: LiveSession | None = None
    # the call's agents and the one in charge at the start (None: no agents, no handoffs; docs/agents.md)
    agents: CallAgents | None = None
    # a rejoined or taken-over call's agent in charge, as its record or the mirror named it (the
    # supervisor gives such a call its ``agents`` with this one in charge; None: none named)
    carried_agent: str | None = None


def first_selection(linked: LinkedContext) -> context.Reference | None:
    """The selection a call starts with: a taken-over call's, else the link when verified."""
    return linked.selection or (linked.link if isinstance(linked.link, context.Reference) else None)


def carried_view(linked: LinkedContext) -> dict[str, Any]:
    """What a taker needs of a call's context, as JSON: the brain's
    instruction at connect, the link and the selection it starts with (a
    ``selection`` record line's ``selection`` replaces it). Not the greeting:
    a taker never greets."""
    selection = first_selection(linked)
    view = {"base": linked.base_instruction, "link": linked.link.view() if linked.link is not None else None,
            "selection": selection.view() if selection is not None else None}
    if linked.session.view():
        view["session"] = linked.session.view()
    if linked.continuation is not None:
        view["continuation"] = linked.continuation.view()
    if linked.phone is not None:
        view["phone"] = linked.phone.view()
    if linked.live is not None:
        view["live"] = linked.live.view()
    if linked.agents is not None:
        view["agent"] = linked.agents.in_charge
    elif linked.carried_agent is not None:
        view["agent"] = linked.carried_agent
    return view


def carried_agent(view: object) -> str | None:
    """The agent in charge a ``carried_view`` names (a ``handoff`` record line's replaces it)."""
    agent = view.get("agent") if isinstance(view, dict) else None
    return agent if isinstance(agent, str) else None


def _resolution(view: object) -> context.Resolution | None:
    if isinstance(view, dict) and view.get("verified") is False:
        kind, reason = view.get("kind"), view.get("reason")
        if kind in context.KINDS and isinstance(reason, str):
            return context.Unverified(str(kind), reason)
        return None
    return context.Reference.from_view(view)


def taken_over_context(view: object) -> LinkedContext | None:
    """The context a taker carries a call on with, from ``carried_view``'s
    JSON (None: not one)."""
    if not isinstance(view, dict):
        return None
    base = view.get("base")
    session = view.get("session")
    return LinkedContext(base if isinstance(base, str) and base else None, _resolution(view.get("link")),
                         selection=context.Reference.from_view(view.get("selection")), taken_over=True,
                         session=session_settings.parse(session)[0] if isinstance(session, dict) else SessionSettings(),
                         continuation=Continuation.from_view(view.get("continuation")),
                         phone=PhoneCall.from_view(view.get("phone")), live=LiveSession.from_view(view.get("live")),
                         carried_agent=carried_agent(view))


def selected_reference(output: str) -> context.Reference | None:
    """The reference a successful ``journal.select`` output carries, else None."""
    try:
        body = json.loads(output)
    except ValueError:
        return None
    return context.Reference.from_view(body.get("selected") if isinstance(body, dict) else None)


class Greeting(StrEnum):
    NONE = "none"          # not asked for
    PENDING = "pending"    # asked for, the first connection has not come yet
    SENT = "sent"
    DROPPED = "dropped"    # the conversation had begun, or there is no instruction to greet with


class CallContext:
    """The call's link, selection and greeting (see the module doc)."""

    def __init__(self, linked: LinkedContext) -> None:
        self.base = linked.base_instruction
        self.link: context.Resolution | None = linked.link
        self.selection: context.Reference | None = first_selection(linked)
        self.greeting = Greeting.PENDING if linked.greeting and not linked.taken_over else Greeting.NONE
        self.greeting_event_id: str | None = None
        self._connected_before = False
        # taken over: the selection is sent at the first connection, also
        # without a link (a select on the holder made it)
        self._update_due = linked.taken_over and self.selection is not None
        self.session_fields = linked.session.session_fields()
        self._settings_due = False
        self.continuation = linked.continuation
        phone = linked.phone
        self.phone = PhoneLine(phone.pin, phone.transfer_to, locked=phone.locked) if phone is not None else None
        self.agents = linked.agents
        self.agent = linked.agents.in_charge if linked.agents is not None else None   # the agent in charge
        # a rejoined or taken-over call whose agent is not the first: its tools and words at the first connection
        self._agent_due = linked.agents is not None and linked.agents.in_charge != linked.agents.agents.first.name

    def _call_instructions(self) -> str | None:
        if not self.base:
            return None
        return with_continuation(context.compose(self.base, self.link, self.selection), self.continuation)

    def instructions(self) -> str | None:
        """The session's instructions for the current selection and the agent
        in charge (None without the brain's instruction: an update would erase it)."""
        text = self._call_instructions()
        if text is None or self.agents is None:
            return text
        return with_agent(text, self.agents.agent(self.agent), self.agents.agents)

    def hand_to(self, agent: str) -> dict[str, Any]:
        """The ``session.update`` that puts ``agent`` in charge (its
        instructions and tools, and the session settings as every update
        carries them), which is in charge from now on (``handoff.py`` puts
        the previous one back when the service refuses it)."""
        assert self.agents is not None
        self.agent = agent
        body = self.agents.session(agent, self._call_instructions())
        body.update(self.session_fields)
        return rt.session_update(body)

    def _session_update(self, *, instructions: bool, settings: bool) -> dict[str, Any] | None:
        """A ``session.update`` with the instructions (when due and known)
        and the session settings (when due, and in every update: a
        ``session.update`` changes only the fields it carries); None when
        it would carry nothing."""
        body: dict[str, Any] = {"type": "realtime"}
        text = self.instructions() if instructions else None
        if text is not None:
            body["instructions"] = text
        if self._agent_due and self.agents is not None and self.agent is not None:
            self._agent_due = False
            body.update(self.agents.session(self.agent, self._call_instructions()))
        if len(body) > 1 or settings:
            body.update(self.session_fields)
        return rt.session_update(body) if len(body) > 1 else None

    # ------------------------------------------------------------ hooks

    def on_connected(self, *, quiet: bool) -> tuple[list[dict[str, Any]], str | None]:
        """Events to send once a socket is up, and why a pending greeting was
        dropped (None when it was not). ``quiet``: no response is active or
        requested, and no response or user turn has been seen yet."""
        first = not self._connected_before
        self._connected_before = True
        if first and (self.link is not None or self.continuation is not None):
            self._update_due = True    # the call's own link replaces what the session was minted with
        if first and self.session_fields:
            self._settings_due = True  # the journal's settings now, whatever the browser's key was minted with
        events: list[dict[str, Any]] = []
        update = self.take_update()
        if update is not None:
            events.append(update)
        dropped: str | None = None
        if self.greeting == Greeting.PENDING:
            if not first:
                dropped = "reconnect"
            elif not quiet:
                dropped = "conversation_started"
            elif not self.base:
                dropped = "no_instruction"
            else:
                asked = self.phone.opening if self.phone is not None else None
                opening = f"{self.instructions()}\n\n{asked or self._opening()}"
                create = rt.response_create({"instructions": opening})
                self.greeting_event_id = create["event_id"]
                self.greeting = Greeting.SENT
                events.append(create)
            if dropped is not None:
                self.greeting = Greeting.DROPPED
        return events, dropped

    def _opening(self) -> str:
        """The first greeting's instruction: about the link, else about the call continued."""
        if self.link is None and self.continuation is not None:
            return CONTINUATION_OPENING
        return context.opening_instruction(self.link)

    def on_tool_finished(self, tool: str, output: str, outcome: ToolOutcome) -> context.Reference | None:
        """A tool output the model is about to get: for a successful
        ``journal.select``, the new selection, applied now (a ``session.update``
        becomes due: ``take_update``). None for everything else, which
        changes nothing."""
        if tool != SELECT_TOOL or outcome != ToolOutcome.OK:
            return None
        chosen = selected_reference(output)
        if chosen is None:
            return None
        self.selection = chosen
        self._update_due = True
        return chosen

    def take_update(self) -> dict[str, Any] | None:
        """The due ``session.update`` (once), or None. Without the brain's
        instruction none is sent: an update would erase the session's."""
        if not (self._update_due or self._settings_due or self._agent_due):
            return None
        update = self._session_update(instructions=self._update_due, settings=self._settings_due)
        self._update_due = self._settings_due = False
        return update

    def views(self) -> dict[str, Any]:
        """The link and selection as JSON (feed event, record line)."""
        return {"selection": self.selection.view() if self.selection is not None else None,
                "link": self.link.view() if self.link is not None else None}
