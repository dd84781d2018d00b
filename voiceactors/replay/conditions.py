"""A captured call's conditions: what it had around it besides the Realtime
service, so that every replay and fuzz run of it has the same (``voiceactors
replay``, ``voiceactors fuzz``; docs/simulator.md § Replaying a capture).

They are a slow MCP tool source, the simulator's
(``simulator/tool_source.py``: its tools' pace is on the run's clock, not the
machine's), and the settings that make its slowness heard (the slow tool's
acknowledgement). A scenario carries them under ``conditions`` for
``replay --capture``; the capture's expectation keeps them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import trio

from voiceactors.simulator import Simulator
from voiceactors.simulator.tool_source import SlowTool, ToolSource

__all__ = ["CONDITION_SETTINGS", "Conditions", "TOOL_SOURCE_TOKEN_ENV", "settings_of", "start_tool_source"]

#: The settings a capture's conditions may set (those that make a slow tool heard).
CONDITION_SETTINGS = ("tool_ack_after_s", "tool_progress_after_s", "tool_slow_max")
#: Where a replay's tool source's token is found (``open_runtime``'s ``mcp_env``, never the process's).
TOOL_SOURCE_TOKEN_ENV = "VOICEACTORS_REPLAY_TOOL_SOURCE_TOKEN"


@dataclass(frozen=True)
class Conditions:
    """A capture's conditions (the module's docstring). None at all: the
    defaults, acknowledgements off."""

    tool_source: str = ""                          # the MCP source's name ("": none)
    slow_tools: tuple[SlowTool, ...] = ()
    settings: tuple[tuple[str, float], ...] = ()

    @classmethod
    def from_obj(cls, obj: Any, where: str = "conditions") -> "Conditions":
        """Raises ValueError naming what is wrong."""
        if obj is None:
            return cls()
        if not isinstance(obj, dict) or set(obj) - {"tool_source", "settings"}:
            raise ValueError(f"{where}: an object with tool_source and settings only")
        settings = obj.get("settings") or {}
        if not isinstance(settings, dict) or any(
                key not in CONDITION_SETTINGS or isinstance(value, bool) or not isinstance(value, (int, float))
                for key, value in settings.items()):
            raise ValueError(f"{where}.settings: numbers for {', '.join(CONDITION_SETTINGS)} only")
        source = obj.get("tool_source")
        if source is None:
            return cls(settings=tuple(sorted(settings.items())))
        try:
            name, tools = source["name"], tuple(SlowTool(**tool) for tool in source["tools"])
        except (KeyError, TypeError) as error:
            raise ValueError(f"{where}.tool_source: {{name, tools: [{{name, run_s, progress_every_s, text, "
                             f"read_only}}]}} ({error})") from None
        if not isinstance(name, str) or not tools or not all(map(_slow_tool_ok, tools)):
            raise ValueError(f"{where}.tool_source: a name and at least one tool, each with a name, times in "
                             "seconds (0 or more), a text and read_only true or false")
        return cls(name, tools, tuple(sorted(settings.items())))

    def to_obj(self) -> dict[str, Any] | None:
        if self == Conditions():
            return None
        obj: dict[str, Any] = {"settings": dict(self.settings)}
        if self.tool_source:
            obj["tool_source"] = {"name": self.tool_source, "tools": [vars(tool) for tool in self.slow_tools]}
        return obj


def _slow_tool_ok(tool: SlowTool) -> bool:
    times = (tool.run_s, tool.progress_every_s)
    return (isinstance(tool.name, str) and bool(tool.name) and isinstance(tool.text, str)
            and isinstance(tool.read_only, bool)
            and all(isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t < math.inf for t in times))


def settings_of(conditions: Conditions, source_url: str) -> dict[str, Any]:
    """The settings a run in ``conditions`` changes from the defaults: the
    acknowledgement off unless they set it, their tool source (at
    ``source_url``) as the one MCP source."""
    changes: dict[str, Any] = {"tool_ack_after_s": 0.0, **dict(conditions.settings)}
    if conditions.tool_source:
        changes["mcp_sources"] = json.dumps([{"name": conditions.tool_source, "url": source_url,
                                              "token_env": TOOL_SOURCE_TOKEN_ENV}])
    return changes


async def start_tool_source(nursery: trio.Nursery, conditions: Conditions,
                            sim: Simulator) -> tuple[str, dict[str, str]]:
    """The conditions' tool source serving in ``nursery`` (the simulator's
    ``slow_tool`` steps pace it): its URL and the runtime's MCP environment
    holding its token; ("", {}) without one."""
    if not conditions.tool_source:
        return "", {}
    # a fresh copy of each tool: a slow_tool step changes its pace
    source = ToolSource([SlowTool(**vars(tool)) for tool in conditions.slow_tools])
    sim.tool_source = source
    return await nursery.start(source.serve), {TOOL_SOURCE_TOKEN_ENV: source.token}
