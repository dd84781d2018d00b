"""FunctionNames: the journal's tools under names the Responses API accepts.

A Live session delegates to a Responses model, whose function names may hold
only letters, digits, ``_`` and ``-`` (at most 64 characters). Our tools are
dotted (``journal.search``) and an MCP source's may hold anything, so each is
declared under a Responses name (every other character made ``_``) and the
function calls that come back are mapped to the tool's own name. One table
holds both directions, built once per session from the tool list: a
Responses name two tools would share keeps the first, in the list's order, and
the next gets a suffix (``_2``, ``_3``, …), so no name ever stands for two
tools. Plain data; no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

__all__ = ["NAME_MAX", "RESPONSES_NAME", "FunctionNames", "responses_spelling"]

#: The longest function name the Responses API accepts.
NAME_MAX = 64
_NOT_ALLOWED = re.compile(r"[^A-Za-z0-9_-]")
#: What the Responses API accepts as a function name (whole match).
RESPONSES_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def responses_spelling(name: str) -> str:
    """``name`` with every character the Responses API refuses made ``_``,
    cut at ``NAME_MAX`` (``_`` for an empty name)."""
    return _NOT_ALLOWED.sub("_", name)[:NAME_MAX] or "_"


def _with_suffix(spelled: str, n: int) -> str:
    suffix = f"_{n}"
    return spelled[:NAME_MAX - len(suffix)] + suffix


@dataclass(frozen=True, slots=True)
class FunctionNames:
    """Tool name -> Responses name, and back (each one to one)."""

    to_responses: Mapping[str, str] = field(default_factory=dict)
    to_tool: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, tools: Iterable[str]) -> FunctionNames:
        """The table for ``tools`` (their order decides who keeps a shared
        spelling; a name listed twice is one tool)."""
        to_responses: dict[str, str] = {}
        to_tool: dict[str, str] = {}
        for tool in tools:
            if tool in to_responses:
                continue
            spelled = candidate = responses_spelling(tool)
            n = 1
            while candidate in to_tool:
                n += 1
                candidate = _with_suffix(spelled, n)
            to_responses[tool] = candidate
            to_tool[candidate] = tool
        return cls(to_responses, to_tool)

    def responses_name(self, tool: str) -> str:
        """The Responses name of ``tool`` (KeyError: not in the table)."""
        return self.to_responses[tool]

    def tool_name(self, responses_name: str) -> str:
        """The tool a Responses function name stands for; a name the table
        does not hold is given back as it came (the executor looks it up as
        any name: an unknown one is answered as such)."""
        return self.to_tool.get(responses_name, responses_name)

    def declare(self, manifest: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The delegation's function tools (``openai.types.live.FunctionTool``)
        for a Realtime ``tools`` manifest: each under its Responses name."""
        return [{"type": "function", "name": self.to_responses[tool["name"]],
                 "description": tool.get("description", ""), "parameters": tool.get("parameters", {})}
                for tool in manifest if tool.get("type") == "function" and tool.get("name") in self.to_responses]
