"""The Realtime session settings a journal may choose (its ``voice`` block).

``reasoning_effort`` (the session's ``reasoning.effort``),
``parallel_tool_calls`` and ``idle_timeout_ms`` (the server-VAD turn
detection's idle timeout). Each is optional: unset, the session carries no
field for it and the service's default holds, so a journal without them
mints and updates sessions exactly as before.

The allowed efforts are the SDK's own literal (``RealtimeReasoningEffort``),
read at import time: a newer SDK brings its new values along. The SDK
documents no bounds for ``idle_timeout_ms`` beyond an integer; a timeout must
be a whole number of milliseconds above 0 (a value the service does not
take, the service refuses).

Pure: no I/O; ``config.session_settings`` reads the block.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from openai.types.realtime.realtime_reasoning_effort import RealtimeReasoningEffort

#: The efforts the SDK's types allow, in the SDK's order.
REASONING_EFFORTS: tuple[str, ...] = typing.get_args(RealtimeReasoningEffort)

#: The ``voice`` block's keys read here.
KEYS = ("reasoning_effort", "parallel_tool_calls", "idle_timeout_ms")


@dataclass(frozen=True)
class SessionSettings:
    """The chosen settings; None: not set (the service's default)."""

    reasoning_effort: str | None = None
    parallel_tool_calls: bool | None = None
    idle_timeout_ms: int | None = None

    def view(self) -> dict[str, Any]:
        """The settings set, as the ``voice`` block spells them (``parse`` reads it back)."""
        return {key: getattr(self, key) for key in KEYS if getattr(self, key) is not None}

    def session_fields(self) -> dict[str, Any]:
        """The fields these settings add to a session (the mint's ``session``,
        a ``session.update``'s): only those set, so none set adds nothing."""
        fields: dict[str, Any] = {}
        if self.reasoning_effort is not None:
            fields["reasoning"] = {"effort": self.reasoning_effort}
        if self.parallel_tool_calls is not None:
            fields["parallel_tool_calls"] = self.parallel_tool_calls
        if self.idle_timeout_ms is not None:
            # the SDK places the idle timeout in server-VAD turn detection only
            fields["audio"] = {"input": {"turn_detection": {"type": "server_vad",
                                                            "idle_timeout_ms": self.idle_timeout_ms}}}
        return fields


def _reasoning_effort(value: Any) -> str:
    if not isinstance(value, str) or value.strip().lower() not in REASONING_EFFORTS:
        raise ValueError(f"voice.reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}, not {value!r}")
    return value.strip().lower()


def _parallel_tool_calls(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"voice.parallel_tool_calls must be true or false, not {value!r}")
    return value


def _idle_timeout_ms(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"voice.idle_timeout_ms must be a whole number of milliseconds above 0, not {value!r}")
    return int(value)


_PARSERS: dict[str, Callable[[Any], Any]] = {
    "reasoning_effort": _reasoning_effort,
    "parallel_tool_calls": _parallel_tool_calls,
    "idle_timeout_ms": _idle_timeout_ms,
}


def parse(block: Mapping[str, Any]) -> tuple[SessionSettings, list[str]]:
    """The settings of a ``voice`` block and the problems of its bad values,
    one message each. A bad value is left unset (the service's default), so
    a typo costs that one setting, never the call; ``null`` is unset."""
    chosen: dict[str, Any] = {}
    problems: list[str] = []
    for key in KEYS:
        value = block.get(key)
        if value is None:
            continue
        try:
            chosen[key] = _PARSERS[key](value)
        except ValueError as error:
            problems.append(str(error))
    return SessionSettings(**chosen), problems
