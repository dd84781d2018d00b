"""Finding the calls that were live when the server died (kill -9, power cut).

A call record whose last block has a ``start`` and no ``end`` was live at the
crash. Its ``tool_started`` lines without a ``tool_call`` line are the tool
calls the user's turn still waits for. The CallSupervisor rejoins such calls
at start-up (``find_crashed``) and the new CallActor answers them:

* a write: from the write log (``write_log.load``) when it had been applied,
  else with ``RESTARTED_OUTPUT`` (never applied again: without a record we
  cannot know it did not half-run);
* a read: run again with the recorded arguments;
* anything else: ``RESTARTED_OUTPUT``.

Its linked context (the ``context`` line, then its ``selection`` lines)
goes on with it, as a taker's does from the Redis mirror.

Only records changed within ``max_age_s`` count (an older call cannot be
live any more), newest first, at most ``limit``. Everything here blocks
(file reads): call it through ``storage.run_sync``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any
from dataclasses import dataclass, field, replace
from pathlib import Path

from voiceactors.call.call_context import LinkedContext, taken_over_context
from voiceactors.call.handoff import in_charge_after, recorded_output
from voiceactors.call.record import last_block, read_record
from voiceactors.call.record_kind import RecordKind
from voiceactors.logs import get_logger
from voiceactors.tool_effect import ToolEffect, tool_effect

RESTARTED_OUTPUT = json.dumps({"error": "the server restarted before this tool call finished"})

_log = get_logger(actor="supervisor")


@dataclass(frozen=True)
class PendingCall:
    """A tool call started before the crash and never settled."""

    tool_call_id: str
    tool: str
    response_id: str
    effect: ToolEffect | None      # None: an MCP source's tool, or a record without the field
    arguments: str | None
    output: str | None = None      # known already: a handoff's, whose update went (``handoff.recorded_output``)


@dataclass
class CrashedCall:
    call_id: str
    pending: list[PendingCall] = field(default_factory=list)
    context: LinkedContext | None = None      # its linked context as the crash left it


def carried_context(block: list[dict[str, Any]]) -> LinkedContext | None:
    """A run's linked context as its lines left it: the ``context`` line of
    its start, the selection of its last ``selection`` line after it, a Live
    session's seconds of audio counted by its last ``audio_usage`` line (a
    rejoin carries it on as a taker does: ``taken_over_context``). None
    without a ``context`` line (a run of before they were written)."""
    view: dict[str, Any] | None = None
    agent: str | None = None
    for line in block:
        kind = line.get("kind")
        agent = in_charge_after(line, agent)
        if kind == RecordKind.CONTEXT and isinstance(line.get("context"), dict):
            view = dict(line["context"])
        elif kind == RecordKind.SELECTION and view is not None:
            view["selection"] = line.get("selection")
        elif kind == RecordKind.AUDIO_USAGE and view is not None and isinstance(view.get("live"), dict):
            view["live"] = {**view["live"], "audio_s": line.get("seconds")}
    if view is not None and agent is not None:
        view["agent"] = agent      # the agent in charge when the run was cut (docs/agents.md)
    return taken_over_context(view) if view is not None else None


def pending_calls(block: list[dict[str, Any]]) -> list[PendingCall] | None:
    """The unsettled tool calls of one run's lines; None when the run ended
    (its block has an ``end``) or is not a run at all."""
    if (not block or block[0].get("kind") != RecordKind.START
            or any(line.get("kind") == RecordKind.END for line in block)):
        return None
    settled = {line.get("tool_call_id") for line in block if line.get("kind") == RecordKind.TOOL_CALL}
    pending: dict[str, PendingCall] = {}
    for line in block:
        tool_call_id = line.get("tool_call_id")
        if line.get("kind") != RecordKind.TOOL_STARTED or not isinstance(tool_call_id, str) or tool_call_id in settled:
            continue
        arguments = line.get("arguments")
        pending[tool_call_id] = PendingCall(tool_call_id, str(line.get("tool") or ""),
                                            str(line.get("response_id") or ""), tool_effect(line.get("effect")),
                                            arguments if isinstance(arguments, str) else None)
    for line in block:
        output = recorded_output(line)
        tool_call_id = line.get("tool_call_id")
        call = pending.get(tool_call_id) if output is not None and isinstance(tool_call_id, str) else None
        if call is not None:
            pending[call.tool_call_id] = replace(call, output=output)
    return list(pending.values())


def _ends_with_end(path: Path, tail: int = 4096) -> bool:
    """True when the file's last complete line is an ``end`` line (read from
    its last ``tail`` bytes, so ended records are not read whole)."""
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - tail))
        data = handle.read()
    if not data.endswith(b"\n"):
        return False                # a torn last line: the run did not end cleanly
    last = data.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    try:
        line = json.loads(last)
    except ValueError:
        return False
    return isinstance(line, dict) and line.get("kind") == RecordKind.END


def find_crashed(state_dir: Path, *, max_age_s: float, limit: int) -> list[CrashedCall]:
    """The calls live at the crash, newest record first, at most ``limit``."""
    folder = Path(state_dir) / "calls"
    cutoff = time.time() - max_age_s
    candidates: list[tuple[float, Path]] = []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if not entry.name.endswith(".jsonl") or not entry.is_file():
                    continue
                mtime = entry.stat().st_mtime
                if mtime >= cutoff:
                    candidates.append((mtime, Path(entry.path)))
    except FileNotFoundError:
        return []
    candidates.sort(reverse=True)
    found: list[CrashedCall] = []
    for _, path in candidates:
        if len(found) >= limit:
            _log.warning("supervisor.rejoin_limit_reached", limit=limit, more=True)
            break
        try:
            if _ends_with_end(path):
                continue            # the common case, from the file's tail alone
            block = last_block(read_record(path))
        except OSError as exc:
            _log.warning("supervisor.record_unreadable", file=path.name, error=type(exc).__name__)
            continue
        pending = pending_calls(block)
        call_id = block[0].get("call_id") if block else None
        if pending is None or not isinstance(call_id, str) or not call_id:
            continue
        found.append(CrashedCall(call_id, pending, carried_context(block)))
    return found
