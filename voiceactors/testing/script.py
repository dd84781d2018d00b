"""A scripted call, built in Python: what the user says and what the model
does, in order. ``Script.scenario()`` is the simulator scenario that plays
it (``docs/simulator.md`` has every step kind; ``Script.step`` adds one as it
is for what the builder does not cover)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from voiceactors.simulator import Scenario
from voiceactors.testing.rig import steady

__all__ = ["Script", "ToolCall"]


@dataclass(frozen=True)
class ToolCall:
    """One function call the model makes: a tool's name and its arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


class Script:
    """A call in steps. Each method adds a step and returns the script, so
    a call reads as one chain::

        Script().user_says("What is on today?").model_calls("calendar.today").model_says("Two meetings.")

    The call ends as the service would close it after the last step
    (``hang_up`` says when, earlier)."""

    def __init__(self, name: str = "script") -> None:
        self.name = name
        self.steps: list[dict[str, Any]] = []
        self._closed = False

    def step(self, step: dict[str, Any]) -> Script:
        """A simulator scenario step as it is (``{"kind": body}``)."""
        if self._closed:
            raise ValueError("the call was hung up: no step can follow")
        self.steps.append(step)
        return self

    def user_says(self, text: str) -> Script:
        """The user speaks a turn (speech, then its transcript)."""
        return self.step({"user_turn": {"text": text}})

    def model_says(self, text: str) -> Script:
        """The model answers with speech."""
        return self.step({"response": {"text": text}})

    def model_calls(self, tool: str, /, **arguments: Any) -> Script:
        """The model calls one tool; the script waits for its output (and
        the server's ``response.create`` after it)."""
        return self.model_calls_in_parallel(ToolCall(tool, arguments))

    def model_calls_in_parallel(self, *calls: ToolCall) -> Script:
        """The model calls several tools in one response; the script waits
        for every output."""
        if not calls:
            raise ValueError("model_calls_in_parallel needs at least one ToolCall")
        self.step({"response": {"tool_calls": [{"name": c.name, "arguments": c.arguments} for c in calls]}})
        return self.step({"wait_outputs": {}})

    def barge_in(self, text: str | None = None, *, after_ms: int = 0) -> Script:
        """The user starts speaking over the model (an active response is
        cut); with ``text`` the interruption is a finished turn."""
        body: dict[str, Any] = {"after_ms": after_ms}
        if text is not None:
            body["text"] = text
        return self.step({"barge_in": body})

    def pause(self, seconds: float) -> Script:
        """Nothing happens for ``seconds`` (of the test's clock)."""
        return self.step({"sleep": seconds})

    def hang_up(self) -> Script:
        """The call ends here (the service closes the sideband)."""
        self.step({"sleep": 0.5})
        self.step({"close": 1000})
        self._closed = True
        return self

    def scenario(self) -> Scenario:
        """The simulator scenario of this script (closed after its last step)."""
        steps = list(self.steps)
        if not self._closed:
            steps += [{"sleep": 0.5}, {"close": 1000}]
        return steady({"name": self.name, "steps": steps})
