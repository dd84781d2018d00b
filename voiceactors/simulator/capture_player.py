"""The simulator playing a captured call (``voiceactors replay``).

A capture (``call/event_capture.py``) holds the server events one call
actor run received. ``ReplayScript.from_block`` turns one capture block into
steps; a ``ReplayDriver`` set on a ``SimCall`` (``call.replay``) plays them
on the call's sideband instead of a scenario, and answers our client events
in its place. **Our events drive the replay**, as they drove the service:

* the service's echo of one of our tool outputs (``conversation.item.added``
  of a ``function_call_output``) is a *gate*: the replay waits there for our
  output for that tool call id and echoes **ours** (the recorded one is only
  the model of the echo); the recorded ``.done`` of that item carries ours too;
* a recorded ``response.created`` that answered a ``response.create`` of ours
  is a gate too: the replay waits for our ``response.create`` and only then
  sends it (and the response that followed). A response counts as ours when,
  since the previous ``response.created`` (or, for the first, since the
  start), the capture shows no user turn (``speech_started``, ``committed``,
  a user message item), and for the first an echo of a tool output: the
  model starts a response on its own only for a user's turn, so a second
  response with none between answered us (a slow tool's acknowledgement or
  progress line, a tool's delivery); otherwise the model started it (server
  VAD after a user turn) and it is played as recorded;
* the service's answers to our events that the capture holds (an ``error``
  naming one of our event ids, ``session.updated``) are not played: the replay
  answers our events live, as the simulator does — a ``session.update`` is
  applied and acknowledged with ``session.updated``, ``response.create`` while a
  response is active gets ``conversation_already_has_active_response``, an
  output for an unknown tool call ``invalid_tool_call_id``, a second one
  ``duplicate_tool_call_output``;
* everything else (user turns, the model's responses, transcripts) is sent as
  recorded, in order, each after its recorded gap to the previous event
  (divided by ``speed``, at most ``max_gap_s``);
* a recorded ``close`` 1000/1001 ends the call with that code; any other
  close, or a new connection without one, drops the socket (the client sees
  1006) and the replay goes on when we reconnect. What we sent on a dropped
  connection and was not echoed yet is lost with it (as ``drop_on_next_output``
  without ``applied``): the resend after the reconnect is the one that counts.

A gate waits at most ``timeout_s``; then the replay notes a *stall* and goes
on (a missing output is not echoed; a missing ``response.create`` lets the
response play as the model's). The driver's ``result()`` is what we sent,
normalised (``voiceactors/replay/`` compares it with the expectation).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Iterator

import trio

from voiceactors.simulator.call import merged_session

__all__ = ["ReplayDriver", "ReplayScript", "Step"]

ACTIVE = "conversation_already_has_active_response"
_USER_TURN = frozenset({"input_audio_buffer.speech_started", "input_audio_buffer.committed"})
_ITEM_ADDED = frozenset({"conversation.item.added", "conversation.item.created"})


@dataclass
class Step:
    kind: str                      # connect | send | await_output | await_create | close | drop | kill
    event: dict[str, Any] | None = None
    gap: float = 0.0               # recorded seconds since the previous event
    code: int | None = None        # close
    call_id: str | None = None     # await_output


@dataclass
class ReplayScript:
    call_id: str
    steps: list[Step]
    truncated: bool = False        # the capture reached its bound: the rest of the call is missing

    @classmethod
    def from_block(cls, block: list[dict[str, Any]]) -> "ReplayScript":
        head, lines = block[0], block[1:]
        steps: list[Step] = []
        truncated = False
        connected = False
        prev_t: float | None = None
        echo_since = user_since = responded = False
        for line in lines:
            kind = line.get("kind")
            t = line.get("t") if isinstance(line.get("t"), (int, float)) else prev_t
            if kind == "connect":
                if connected:
                    steps.append(Step("drop"))   # the connection ended without a close we saw
                connected = True
                steps.append(Step("connect"))
                prev_t = t
                continue
            if kind == "close":
                code = line.get("code")
                steps.append(Step("close", code=code) if code in (1000, 1001) else Step("drop"))
                connected = False
                continue
            if kind == "truncated":
                truncated = True
                break
            if kind != "event" or not isinstance(line.get("event"), dict):
                continue
            event = line["event"]
            gap = max(0.0, (t or 0.0) - (prev_t if prev_t is not None else (t or 0.0)))
            prev_t = t
            type_ = event.get("type")
            item = event.get("item") if isinstance(event.get("item"), dict) else {}
            if type_ == "error" and (event.get("error") or {}).get("event_id"):
                continue   # the service's answer to one of our events: answered live
            if type_ == "session.updated":
                continue
            if item.get("type") == "function_call_output":
                if type_ in _ITEM_ADDED:
                    steps.append(Step("await_output", event, call_id=item.get("call_id")))
                    echo_since = True
                else:
                    steps.append(Step("send", event))   # its .done: carries our output too
                continue
            if type_ in _USER_TURN or (type_ in _ITEM_ADDED and item.get("role") == "user"):
                user_since = True
            if type_ == "response.created":
                # the model starts a response on its own only for a user's turn: one after an
                # echo of our output, or after another response, with no turn between, is ours
                # (a tool's output delivered; a slow tool's acknowledgement or progress line)
                ours = (echo_since or responded) and not user_since
                echo_since = user_since = False
                responded = True
                steps.append(Step("await_create" if ours else "send", event, gap))
                continue
            steps.append(Step("send", event, gap))
        return cls(str(head.get("call_id") or "rtc_replay"), steps, truncated)


def _function_calls(items: Iterable[Any]) -> Iterator[tuple[str, str]]:
    """(call id, tool name) of each function call item among ``items``."""
    for item in items:
        if isinstance(item, dict) and item.get("type") == "function_call" and item.get("call_id"):
            yield item["call_id"], str(item.get("name") or "")


@dataclass
class _Held:
    """What we sent on the live connection that no gate has taken yet."""

    outputs: dict[str, str] = field(default_factory=dict)
    creates: list[str | None] = field(default_factory=list)


class ReplayDriver:
    """Plays a ``ReplayScript`` on one ``SimCall`` across its connections."""

    def __init__(self, script: ReplayScript, *, speed: float = 1.0, max_gap_s: float = 2.0,
                 timeout_s: float = 10.0) -> None:
        self.script = script
        self.speed = speed if speed > 0 else math.inf
        self.max_gap_s = max_gap_s
        self.timeout_s = timeout_s
        self.index = 0
        self.active: str | None = None             # the response the replay has made active
        self.active_since = 0.0                    # when its response.created went out (trio time)
        self.connected_at = 0.0                    # when the live connection began
        #: for each of our response.creates refused as active: how long we
        #: could have known that response was on when ours came (since its
        #: response.created; 0 when that came on an earlier connection: a
        #: response begun before a drop is not announced again); a fuzz run's check
        self.refused_after_s: list[float] = []
        self.known_calls: dict[str, str] = {}      # tool call id -> tool name, from the events played
        #: the tool calls of the responses played as completed (``response.done``,
        #: ``completed``): the service waits for an output to each
        self.owed_calls: dict[str, str] = {}
        self.accepted: dict[str, list[str]] = {}   # tool call id -> our outputs the replay echoed
        self.creates: list[dict[str, Any]] = []    # our response.creates and what became of them
        self.errors: list[str] = []                # error codes our events caused
        self.others: list[str] = []                # any other client event, by type
        self.stalls: list[str] = []
        self.finished = trio.Event()
        #: a ``kill`` step's hook (``replay.play_script``): our server is killed
        #: there; without one the step is a drop
        self.on_kill: Callable[[], Awaitable[None]] | None = None
        self._held = _Held()
        self._echoed: dict[str, str] = {}          # output item id -> the output we echoed in it

    # -- the player (CallSession._player hands over)

    async def play(self, session: Any) -> None:
        call = session.call
        self._held = _Held()        # a new connection: what the last one held is lost with it
        self.connected_at = trio.current_time()
        steps = self.script.steps
        while self.index < len(steps):
            step = steps[self.index]
            if step.kind == "connect":
                self.index += 1
            elif step.kind in ("drop", "kill"):
                self.index += 1
                if step.kind == "kill" and self.on_kill is not None:
                    await self.on_kill()      # our server dies here; its socket with it
                session.drop()
                return
            elif step.kind == "close":
                self.index += 1
                await session.end(step.code or 1000)
                self.finished.set()
                return
            elif step.kind == "send":
                await self._sleep_gap(step.gap)
                await self._send(session, step.event)
                self.index += 1
            elif step.kind == "await_output":
                await self._await_output(session, call, step)
                self.index += 1
            elif step.kind == "await_create":
                await self._await_create(session, call, step)
                self.index += 1
        # the capture ends without a close (truncated, or our side ended the call)
        await trio.sleep(1.0)
        self.finished.set()
        await session.end(1000)

    async def _sleep_gap(self, gap: float) -> None:
        wait = min(self.max_gap_s, gap / self.speed) if gap > 0 else 0.0
        await trio.sleep(wait) if wait > 0 else await trio.lowlevel.checkpoint()

    async def _send(self, session: Any, recorded: dict[str, Any] | None) -> None:
        assert recorded is not None
        event = copy.deepcopy(recorded)
        type_ = event.get("type")
        item = event.get("item") if isinstance(event.get("item"), dict) else None
        if item is not None and item.get("type") == "function_call_output" and item.get("id") in self._echoed:
            item["output"] = self._echoed[item["id"]]
        response = event.get("response") or {}
        for call_id, name in _function_calls((item, *(response.get("output") or ()))):
            self.known_calls.setdefault(call_id, name)
        if type_ == "response.done" and response.get("status") == "completed":
            self.owed_calls.update(_function_calls(response.get("output") or ()))
        if type_ == "response.created":
            self.active = (event.get("response") or {}).get("id")
            self.active_since = trio.current_time()
        elif type_ == "response.done" and (event.get("response") or {}).get("id") == self.active:
            self.active = None
        await session.send(event)

    async def _await_output(self, session: Any, call: Any, step: Step) -> None:
        call_id = step.call_id or ""
        with trio.move_on_after(self.timeout_s):
            await call.wait_until(lambda c: call_id in self._held.outputs)
        if call_id not in self._held.outputs:
            self.stalls.append(f"no output for tool call {call_id} ({self.known_calls.get(call_id, '?')}) "
                               f"where the recording echoed one (waited {self.timeout_s:g} s)")
            return
        output = self._held.outputs.pop(call_id)
        self.accepted.setdefault(call_id, []).append(output)
        assert step.event is not None
        item_id = (step.event.get("item") or {}).get("id")
        if item_id:
            self._echoed[item_id] = output
        await self._send(session, step.event)

    async def _await_create(self, session: Any, call: Any, step: Step) -> None:
        assert step.event is not None
        response_id = (step.event.get("response") or {}).get("id")
        with trio.move_on_after(self.timeout_s):
            await call.wait_until(lambda c: bool(self._held.creates))
        if self._held.creates:
            self._held.creates.pop(0)
            self.creates.append({"answered_by": response_id})
        else:
            self.stalls.append(f"no response.create before recorded response {response_id}, which answered one "
                               f"(waited {self.timeout_s:g} s; played as the model's)")
        await self._send(session, step.event)

    # -- our events (CallSession._handle hands over valid ones)

    async def on_client_event(self, session: Any, obj: dict[str, Any], event_id: str | None) -> None:
        type_ = obj.get("type")
        raw_item = obj.get("item")
        item: dict[str, Any] = raw_item if isinstance(raw_item, dict) else {}
        if type_ == "conversation.item.create" and item.get("type") == "function_call_output":
            await self._on_output(session, str(item.get("call_id")), str(item.get("output")), event_id)
        elif type_ == "response.create":
            if self.active is not None:
                self.creates.append({"result": "rejected_active"})
                known = self.active_since >= self.connected_at
                self.refused_after_s.append(trio.current_time() - self.active_since if known else 0.0)
                await self._error(session, ACTIVE, event_id,
                                  f"Conversation already has an active response in progress: {self.active}.")
            else:
                self._held.creates.append(event_id)
        else:
            self.others.append(str(type_))
            if type_ == "session.update" and isinstance(obj.get("session"), dict):
                # applied and acknowledged live, as the service does (a handoff waits for it: docs/agents.md)
                session.call.session = merged_session(session.call.session, obj["session"])
                await session.send({"type": "session.updated", "session": session.call.session})
        session.call.notify()

    async def _on_output(self, session: Any, call_id: str, output: str, event_id: str | None) -> None:
        if call_id not in self.known_calls:
            await self._error(session, "invalid_tool_call_id", event_id,
                              f"Tool call ID '{call_id}' not found in conversation.")
        elif call_id in self.accepted or call_id in self._held.outputs:
            await self._error(session, "duplicate_tool_call_output", event_id,
                              f"Tool call ID '{call_id}' already has an output.")
        else:
            self._held.outputs[call_id] = output

    async def _error(self, session: Any, code: str, event_id: str | None, message: str) -> None:
        self.errors.append(code)
        await session.send_error(message, code, event_id)

    # -- what we sent, normalised

    def result(self) -> dict[str, Any]:
        unechoed = sorted(self._held.outputs)
        return {
            "outputs": {call_id: {"tool": self.known_calls.get(call_id, ""), "outputs": outputs}
                        for call_id, outputs in sorted(self.accepted.items())},
            "unechoed_outputs": unechoed,
            "response_creates": self.creates + [{"result": "unanswered"}] * len(self._held.creates),
            "protocol_errors": list(self.errors),
            "other_client_events": list(self.others),
            "stalls": list(self.stalls),
            "truncated": self.script.truncated,
        }
