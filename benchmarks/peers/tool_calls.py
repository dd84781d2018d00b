"""The tool work the asyncio peers do: the same voiceactors handlers over
the same journal, called the plain way (parse, validate, run, dump), with
any exception turned into ``{"error": ...}`` as the reference design does.
"""

from __future__ import annotations

import json
from pathlib import Path

from voiceactors.tools import ArgumentError, ToolContext, lookup, prepare


def context(journal: str, state_dir: str) -> ToolContext:
    return ToolContext(journal=Path(journal), state_dir=Path(state_dir))


def run_tool(ctx: ToolContext, name: str, arguments: str) -> str:
    """One tool call, synchronously; the JSON string to send as output."""
    spec = lookup(name)
    if spec is None:
        return json.dumps({"error": "unknown tool"})
    try:
        result = spec.handler(ctx, prepare(spec, arguments))
    except ArgumentError as exc:
        result = exc.error
    except Exception as exc:  # the reference: a tool exception is an inline error output
        result = {"error": str(exc)}
    return json.dumps({k: v for k, v in result.items() if not str(k).startswith("_")}, ensure_ascii=False)
