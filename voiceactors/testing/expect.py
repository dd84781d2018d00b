"""Assertions that read like the conversation, over a finished call
(``CallResult.expect``). Each failed one raises ``ExpectationFailed`` (an
``AssertionError``, so pytest shows it as a failed assertion) whose message
says what happened instead."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from voiceactors.call.actor import CallActor
from voiceactors.call.handoff import in_charge_after
from voiceactors.call.record_kind import RecordKind
from voiceactors.simulator import SimCall
from voiceactors.simulator.call import ToolCallRecord

__all__ = ["CallResult", "Expect", "ExpectationFailed", "ToolCallExpect"]


class ExpectationFailed(AssertionError):
    """A call did not go the way a test expected."""


@dataclass(frozen=True)
class CallResult:
    """A finished call: the actor that served it, what the service saw
    (``service``: the simulator's call) and the call record's lines."""

    call_id: str
    actor: CallActor
    service: SimCall
    record: list[dict[str, Any]]

    @property
    def expect(self) -> Expect:
        return Expect(self)

    @property
    def end_reason(self) -> str | None:
        return self.actor.end_reason

    def spoken(self) -> list[str]:
        """The assistant's words, one entry per utterance, in spoken order."""
        lines = [x for x in self.record if x["kind"] == RecordKind.TRANSCRIPT and x.get("role") == "assistant"]
        return [x["text"] for x in sorted(lines, key=lambda x: x.get("order", 0))]


class Expect:
    """What a test expects of a call (``result.expect``)."""

    def __init__(self, result: CallResult) -> None:
        self.result = result

    def tool_called(self, name: str, /, **arguments: Any) -> ToolCallExpect:
        """The model called ``name`` exactly once with these arguments (each
        one given must match; others may be there too)."""
        calls = [c for c in self.result.service.tool_calls.values() if c.name == name]
        matching = [c for c in calls if _matches(_arguments(c), arguments)]
        if not matching:
            seen = [f"{c.name}({c.arguments})" for c in self.result.service.tool_calls.values()] or ["no tool"]
            wanted = f"{name}({json.dumps(arguments, sort_keys=True)})" if arguments else name
            raise ExpectationFailed(f"expected {wanted} to be called; the model called {', '.join(seen)}")
        if len(matching) > 1:
            raise ExpectationFailed(f"expected {name} to be called once; it was called {len(matching)} times")
        return ToolCallExpect(self.result, matching[0])

    def tool_not_called(self, name: str, /) -> None:
        calls = [c for c in self.result.service.tool_calls.values() if c.name == name]
        if calls:
            raise ExpectationFailed(f"expected {name} not to be called; it was called {len(calls)} time(s)")

    def spoken(self, *, contains: str) -> None:
        """The assistant said something containing ``contains`` (case-insensitive)."""
        said = self.result.spoken()
        if not any(contains.lower() in text.lower() for text in said):
            raise ExpectationFailed(f"expected the assistant to say something containing {contains!r}; "
                                    f"it said {said!r}")

    def in_charge(self, agent: str) -> None:
        """The call ended with ``agent`` in charge (a call with agents: its
        handoffs as the record tells them, docs/agents.md)."""
        now: str | None = None
        for line in self.result.record:
            now = in_charge_after(line, now)
        if now != agent:
            handoffs = [f"{x.get('from')}→{x.get('to')} ({x.get('status')})" for x in self.result.record
                        if x.get("kind") == RecordKind.HANDOFF] or ["no handoff"]
            raise ExpectationFailed(f"expected {agent} in charge at the end; {now or 'no agent'} was "
                                    f"(handoffs: {', '.join(handoffs)})")

    def ended(self, reason: str) -> None:
        if self.result.end_reason != reason:
            raise ExpectationFailed(f"expected the call to end {reason!r}; it ended {self.result.end_reason!r}")

    def no_protocol_violation(self) -> None:
        """The call kept the Realtime protocol's rules: every tool call the
        model made got exactly one output, the service refused nothing (no
        ``response.create`` while a response was active, no unknown call
        id), the service saw no violation and every event sent either way
        conformed to the SDK's types (where the simulator checks it)."""
        service, problems = self.result.service, []
        for call_id, call in service.tool_calls.items():
            outputs = len(service.outputs.get(call_id, []))
            if call.complete and outputs != 1:
                problems.append(f"{call.name} ({call_id}) got {outputs} outputs")
        problems += [f"output for an unknown call {cid}" for cid in service.outputs if cid not in service.tool_calls]
        problems += [f"the service refused an event: {code}" for code in service.error_codes]
        problems += [f"violation: {v}" for v in service.violations]
        problems += [f"nonconforming {n.direction} event {n.type}: {n.reason}" for n in service.nonconforming]
        if problems:
            raise ExpectationFailed("the call broke the protocol:\n  " + "\n  ".join(problems))


class ToolCallExpect:
    """One tool call of a call, to say more about it."""

    def __init__(self, result: CallResult, call: ToolCallRecord) -> None:
        self.result, self.call = result, call

    @property
    def outputs(self) -> list[str]:
        return list(self.result.service.outputs.get(self.call.call_id, []))

    def answered_once(self) -> ToolCallExpect:
        """Its output reached the service exactly once."""
        if len(self.outputs) != 1:
            raise ExpectationFailed(f"expected {self.call.name} to be answered once; "
                                    f"it was answered {len(self.outputs)} times")
        return self

    @property
    def output(self) -> Any:
        """Its one output, parsed (a tool answers JSON)."""
        self.answered_once()
        text = self.outputs[0]
        try:
            return json.loads(text)
        except ValueError:
            return text


def _arguments(call: ToolCallRecord) -> dict[str, Any]:
    try:
        parsed = json.loads(call.arguments or "{}")
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _matches(actual: dict[str, Any], wanted: dict[str, Any]) -> bool:
    return all(key in actual and actual[key] == value for key, value in wanted.items())
