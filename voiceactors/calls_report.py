"""``voiceactors calls``: the recent calls from the call records, on the terminal.

The same summaries as ``GET /api/voice/calls`` (``http/history.py``), read
straight from ``<state_dir>/calls/`` (no server needed): a table of the newest
calls with their duration, end, tool calls, tokens and cost, and a total line;
``--json`` prints ``{"calls": [...]}`` as the API does.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from voiceactors.http.history import list_calls

COLUMNS = ("started", "call", "duration", "ended", "tools", "tokens", "cost")


def _money(value: Any) -> str:
    return "unknown" if value is None else f"${value:.4f}"


def _duration(value: Any) -> str:
    return "—" if value is None else f"{value:.1f} s"


def row(call: dict[str, Any]) -> tuple[str, ...]:
    started = call.get("started_at") or "—"
    tools = str(call.get("tool_calls", 0))
    if call.get("tool_failures"):
        tools += f" ({call['tool_failures']} failed)"
    ended = "unreadable" if call.get("unreadable") else (call.get("ended") or "live or crashed")
    return (started.replace("+00:00", "Z"), call["call_id"], _duration(call.get("duration_s")), ended, tools,
            str(call.get("total_tokens", 0)), _money(call.get("cost_usd")))


def render_table(calls: list[dict[str, Any]]) -> str:
    """The calls as an aligned text table, then the totals (``""`` for no calls)."""
    if not calls:
        return ""
    rows = [COLUMNS, *(row(c) for c in calls)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)).rstrip() for r in rows]
    costs = [c.get("cost_usd") for c in calls]
    total_cost = None if any(c is None for c in costs) else sum(c for c in costs if c is not None)
    tokens = sum(int(c.get("total_tokens") or 0) for c in calls)
    lines.append(f"{len(calls)} call{'s' if len(calls) != 1 else ''}, {tokens} tokens, "
                 f"{_money(total_cost)}" + (" (some calls' models have no prices)" if total_cost is None else ""))
    return "\n".join(lines) + "\n"


NO_CALLS = ("no calls recorded in {records}\n"
            "A server keeps its calls in its state folder (--state-dir, default .state); "
            "`serve --demo` and `demo` keep theirs in a temporary folder unless given --state-dir.\n")


def report(state_dir: Path, limit: int, as_json: bool, out: TextIO) -> None:
    calls = list_calls(state_dir, limit)
    if as_json:
        out.write(json.dumps({"calls": calls}, ensure_ascii=False, indent=2) + "\n")
    else:
        out.write(render_table(calls) or NO_CALLS.format(records=state_dir / "calls"))


def cli_calls(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir)
    if not state_dir.is_dir():   # a mistyped folder is not "no calls"
        print(f"voiceactors calls: no state folder at {state_dir} (--state-dir names the folder a server "
              "was started with)", file=sys.stderr)
        return 2
    report(state_dir, args.limit, args.json, sys.stdout)
    return 0
