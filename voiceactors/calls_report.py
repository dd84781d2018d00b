"""``voiceactors calls``: the recent calls from the call records, on the terminal.

The same summaries as ``GET /api/voice/calls`` (``http/history.py``), read
straight from ``<state_dir>/calls/`` (no server needed): a table of the newest
calls with their duration, end, tool calls, tokens and cost, the latency of
their turns (the end of the user's speech to the first sound of the reply,
from the record's ``turn`` lines: the median and the worst turn), and a total
line; ``--json`` prints ``{"calls": [...]}`` as the API does, each call with
its ``turns`` (``count``, ``median_ms``, ``worst_ms``) besides.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, TextIO

from voiceactors.call.record_kind import RecordKind
from voiceactors.http.history import list_calls, summarize

COLUMNS = ("started", "call", "duration", "ended", "tools", "tokens", "cost", "turn median", "worst turn")


def turn_latency(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """A call's turns, from its ``turn`` lines: how many had a reply heard,
    the median and the worst time to its first sound (None: no turn)."""
    felt = [float(ms) for line in lines if line.get("kind") == RecordKind.TURN
            and isinstance(ms := line.get("first_audio_ms"), (int, float)) and not isinstance(ms, bool)]
    return {"count": len(felt), "median_ms": round(statistics.median(felt), 1) if felt else None,
            "worst_ms": max(felt) if felt else None}


def with_turns(call_id: str, lines: list[dict[str, Any]]) -> dict[str, Any]:
    """The API's summary of a call, and its turns' latency."""
    return {**summarize(call_id, lines), "turns": turn_latency(lines)}


def _money(value: Any) -> str:
    return "unknown" if value is None else f"${value:.4f}"


def _duration(value: Any) -> str:
    return "—" if value is None else f"{value:.1f} s"


def _felt(turns: Any, key: str) -> str:
    value = turns.get(key) if isinstance(turns, dict) else None
    return "—" if value is None else f"{value / 1000:.2f} s"


def row(call: dict[str, Any]) -> tuple[str, ...]:
    started = call.get("started_at") or "—"
    tools = str(call.get("tool_calls", 0))
    if call.get("tool_failures"):
        tools += f" ({call['tool_failures']} failed)"
    ended = "unreadable" if call.get("unreadable") else (call.get("ended") or "live or crashed")
    return (started.replace("+00:00", "Z"), call["call_id"], _duration(call.get("duration_s")), ended, tools,
            str(call.get("total_tokens", 0)), _money(call.get("cost_usd")),
            _felt(call.get("turns"), "median_ms"), _felt(call.get("turns"), "worst_ms"))


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
    calls = list_calls(state_dir, limit, with_turns)
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
