"""The bookkeeping of one call's tool calls and responses (plain data).

A ``ToolCall`` walks one way through its states::

    seen ──▶ running ──▶ ready ──▶ queued ──▶ sent ──▶ confirmed
      └──────────┴──────────┘ (abandoned: a synthetic output is ready)
                                      sent ──▶ rejected (the service refused it)

``ready`` means the output exists but is not in a writer's queue (no socket);
``queued`` means it is in the current connection's writer queue; ``sent`` means
the writer wrote it and the service has not confirmed it yet. After a dropped
socket, ``queued`` and ``sent`` go back to ``ready`` and are written again on
the next connection; ``confirmed`` (the service echoed the item with
``conversation.item.added``) is never written again.

A ``Batch`` is one model response and the tool calls it carried; its
``follow_up`` says how the conversation was carried forward after it:
``ours`` (we sent ``response.create``), ``model`` (a response the model
started after every output was confirmed did it), ``superseded`` (the user
took the floor: a newer epoch), ``failed`` (the service refused our
``response.create`` for another reason) or None (not yet decided).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

#: The output a tool call gets when its result was abandoned (the rule-1 synthetic answer).
CANCELLED_OUTPUT = json.dumps({"error": "cancelled: the user interrupted"})

UNANSWERED = frozenset({"seen", "running"})
UNSENT = frozenset({"ready", "queued"})
ANSWERED = frozenset({"ready", "queued", "sent", "confirmed", "rejected"})
ENDED_OK = frozenset({"completed", "lost"})  # "lost": its response.done fell in a dropped socket


@dataclass
class ToolCall:
    tool_call_id: str
    name: str
    response_id: str
    epoch: int
    turn: int
    seen_t: float
    item_id: str | None = None
    arguments: str | None = None      # never logged, never recorded
    complete: bool = False            # arguments are final (item done, or response completed)
    state: str = "seen"
    output: str | None = None
    outcome: str | None = None
    synthetic: bool = False
    duration_ms: float | None = None
    sends: int = 0
    confirmed_seq: int | None = None  # server-event sequence number of the confirmation
    started_t: float | None = None    # trio time it went to the executor
    overhead_ms: float | None = None  # first write − start − the executor's own duration
    recovered: bool = False           # taken over from a run that crashed (recovery.py)
    recorded: bool = False            # its ``tool_call`` record line is written

    def abandon(self) -> None:
        """Answer with the synthetic cancelled output (only if not answered yet)."""
        if self.state in UNANSWERED:
            self.output = CANCELLED_OUTPUT
            self.outcome = self.outcome or "cancelled"
            self.synthetic = True
            self.state = "ready"

    def record_fields(self) -> dict:
        return {
            "tool_call_id": self.tool_call_id, "tool": self.name, "response_id": self.response_id,
            "epoch": self.epoch, "turn": self.turn,
            "duration_ms": None if self.duration_ms is None else round(self.duration_ms, 1),
            "outcome": self.outcome or "unanswered",
            "output_bytes": len(self.output.encode("utf-8")) if self.output is not None else 0,
            "sends": self.sends, "delivered": self.state == "confirmed", "synthetic": self.synthetic,
            "state": self.state, "overhead_ms": self.overhead_ms,
        }


@dataclass
class Batch:
    response_id: str
    epoch: int
    origin: str                       # ours | model
    created_seq: int
    status: str | None = None         # None while active; completed|cancelled|failed|incomplete|lost
    calls: list[str] = field(default_factory=list)
    follow_up: str | None = None
    done_t: float | None = None       # trio time its response.done was read


@dataclass
class CreateSent:
    """One ``response.create`` we sent, so an ``error`` naming its event_id finds it."""

    event_id: str
    epoch: int
    batches: list[str]
    t: float
    response_id: str | None = None
    result: str = "sent"
    turnaround_ms: float | None = None  # written − the latest response.done of its batches
