"""What every fuzz run must keep, whatever its schedule: the checks after a
run, each a line naming what broke (empty: the run kept them all)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from voiceactors.call.record_kind import RecordKind
from voiceactors.call.state import ToolOutcome
from voiceactors.tool_effect import WRITE
from voiceactors.replay import Played

__all__ = ["RACE_S", "broken"]

#: A ``response.create`` of ours refused because a response was active is a
#: race the service allows when that response had only just begun (its
#: ``response.created`` still on the way to us); after this long it was ours
#: to know. A run's clock is trio's autojump clock: a read on loopback takes
#: no time on it.
RACE_S = 0.5


def broken(played: Played) -> list[str]:
    """Every invariant ``played`` broke."""
    return [*_answered_once(played), *_no_create_while_active(played), *_applied_once(played),
            *_no_stale_follow_up(played), *_record_whole(played)]


def _answered_once(played: Played) -> list[str]:
    result = played.result
    found = [f"tool call {call_id} ({name}) of a completed response was never answered"
             for call_id, name in played.driver.owed_calls.items() if call_id not in result["outputs"]]
    found += [f"tool call {call_id} ({entry['tool']}) was answered {len(entry['outputs'])} times"
             for call_id, entry in result["outputs"].items() if len(entry["outputs"]) != 1]
    again = result["protocol_errors"].count("duplicate_tool_call_output")
    if again:
        found.append(f"{again} output(s) sent for a tool call that already had one (duplicate_tool_call_output)")
    return found


def _no_create_while_active(played: Played) -> list[str]:
    return [f"a response.create was sent {after:.2f} s after the active response began"
            for after in played.driver.refused_after_s if after > RACE_S]


def _applied_once(played: Played) -> list[str]:
    """Each server runs a tool call at most once; across a kill, a write is
    applied by one of them at most (the others answer it from the write log,
    ``replayed``, or as not done, ``restarted``)."""
    found = []
    for number, block in enumerate(_blocks(played.record), 1):
        started = Counter(line.get("tool_call_id") for line in block if line.get("kind") == RecordKind.TOOL_STARTED)
        found += [f"tool call {call_id} was run {count} times by server {number}"
                  for call_id, count in started.items() if count > 1]
    writes = {line.get("tool_call_id") for line in played.record
              if line.get("kind") == RecordKind.TOOL_STARTED and line.get("effect") == WRITE}
    applied = Counter(line.get("tool_call_id") for line in played.record
                      if line.get("kind") == RecordKind.TOOL_CALL and line.get("tool_call_id") in writes
                      and line.get("outcome") == ToolOutcome.OK)
    return found + [f"write {call_id} was applied {count} times" for call_id, count in applied.items() if count > 1]


def _no_stale_follow_up(played: Played) -> list[str]:
    """No ``response.create`` of ours asks the model to go on from a turn the
    user has since left (a batch of an older epoch than the create's), but
    the delivery of an acknowledged slow batch (its ``slow_delivery`` line
    names the create): the user was told the answer would come, and it does
    after their turn (docs/calls.md § Slow tools)."""
    epochs = {line["response_id"]: line.get("epoch") for line in played.record
              if line.get("kind") == RecordKind.RESPONSE and "response_id" in line}
    delivered = {(line.get("event_id"), line.get("response_id")) for line in played.record
                 if line.get("kind") == RecordKind.SLOW_DELIVERY}
    found = []
    for line in played.record:
        if line.get("kind") != RecordKind.RESPONSE_CREATE or line.get("result") != "sent":
            continue
        stale = [rid for rid in line.get("for") or [] if epochs.get(rid) is not None
                 and (line.get("event_id"), rid) not in delivered
                 and line.get("epoch") is not None and epochs[rid] < line["epoch"]]
        found += [f"response.create {line.get('event_id')} followed up response {rid} of an older turn"
                  for rid in stale]
    return found


def _record_whole(played: Played) -> list[str]:
    record: list[dict[str, Any]] = played.record
    if not record:
        return ["the call left no record"]
    found = []
    if record[-1].get("kind") != RecordKind.END:
        found.append("the call record does not end with its end line")
    for block in _blocks(record):
        orders = [line["order"] for line in block if line.get("kind") == RecordKind.TRANSCRIPT and "order" in line]
        if len(orders) != len(set(orders)):
            found.append("two transcripts hold the same place in the spoken order")
    return found


def _blocks(record: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The record's blocks: one per server that ran the call (each begins
    with its ``start`` line)."""
    blocks: list[list[dict[str, Any]]] = []
    for line in record:
        if line.get("kind") == RecordKind.START or not blocks:
            blocks.append([])
        blocks[-1].append(line)
    return blocks
