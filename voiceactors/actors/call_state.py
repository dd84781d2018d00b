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
from enum import StrEnum
from typing import Any

#: The output a tool call gets when its result was abandoned (the rule-1 synthetic answer).
CANCELLED_OUTPUT = json.dumps({"error": "cancelled: the user interrupted"})



class ToolCallState(StrEnum):
    """Where a tool call is on its one-way walk (the module doc's diagram)."""

    SEEN = "seen"
    RUNNING = "running"
    READY = "ready"
    QUEUED = "queued"
    SENT = "sent"
    CONFIRMED = "confirmed"
    REJECTED = "rejected"


class BatchStatus(StrEnum):
    """How a response ended: the service's ``response.done`` status, or ``lost``
    (its ``response.done`` fell in a dropped socket). A status the service adds
    later is kept as the plain string it sent."""

    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"
    INCOMPLETE = "incomplete"
    LOST = "lost"


class Origin(StrEnum):
    """Who started a response: our ``response.create``, or the model itself."""

    OURS = "ours"
    MODEL = "model"


class FollowUp(StrEnum):
    """How the conversation was carried forward after a batch (module doc)."""

    OURS = "ours"
    MODEL = "model"
    SUPERSEDED = "superseded"
    FAILED = "failed"


class CreateResult(StrEnum):
    """What became of a ``response.create`` of ours (any other error: ``error:<code>``)."""

    SENT = "sent"
    REJECTED_ACTIVE = "rejected_active"
    LOST = "lost"


class ToolOutcome(StrEnum):
    """A tool call's outcome: the executor's, or one the call actor sets itself
    (``cancelled``/``failed`` for an abandoned call, ``restarted``/``replayed``
    for one taken over after a crash). Every outcome the executor answers is a
    member (``executor.py``); the strings are what records, logs, metrics
    labels and the client feed have always carried."""

    OK = "ok"
    ERROR = "error"
    INVALID = "invalid"
    REJECTED = "rejected"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    FAILED = "failed"
    REPLAYED = "replayed"
    RESTARTED = "restarted"
    AUTH_EXPIRED = "auth_expired"   # an MCP source refused the call's own token: the call ends
    BUSY = "busy"                   # a write's journal file stayed locked, or the shared write log was down
    # not the executor's: what a record or a reader says of a call without one
    UNANSWERED = "unanswered"       # the ``tool_call`` line of a call that never got an outcome
    PENDING = "pending"             # history's row for a call with only its ``tool_started`` line
    UNKNOWN = "unknown"             # the write log's intent of an MCP write sent before its answer came


UNANSWERED = frozenset({ToolCallState.SEEN, ToolCallState.RUNNING})
UNSENT = frozenset({ToolCallState.READY, ToolCallState.QUEUED})
ANSWERED = frozenset({ToolCallState.READY, ToolCallState.QUEUED, ToolCallState.SENT,
                      ToolCallState.CONFIRMED, ToolCallState.REJECTED})
ENDED_OK = frozenset({BatchStatus.COMPLETED, BatchStatus.LOST})


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
    state: ToolCallState = ToolCallState.SEEN
    output: str | None = None
    outcome: ToolOutcome | None = None
    synthetic: bool = False
    duration_ms: float | None = None
    sends: int = 0
    confirmed_seq: int | None = None  # server-event sequence number of the confirmation
    started_t: float | None = None    # trio time it went to the executor
    overhead_ms: float | None = None  # first write − start − the executor's own duration
    recovered: bool = False           # taken over from a run that crashed (recovery.py)
    recorded: bool = False            # its ``tool_call`` record line is written
    # a read run before its arguments were known complete (``Prefetch``)
    prefetch: str | None = None       # the arguments it was prefetched with
    prefetching: bool = False         # that run is still at the executor
    held: Any = None                  # its result (a ``ToolFinished``), kept until the call starts
    adopted: bool = False             # the call started on the prefetch's run
    ran_early: bool = False           # the prefetch had answered when the call started

    def abandon(self) -> None:
        """Answer with the synthetic cancelled output (only if not answered yet)."""
        if self.state in UNANSWERED:
            self.output = CANCELLED_OUTPUT
            self.outcome = self.outcome or ToolOutcome.CANCELLED
            self.synthetic = True
            self.state = ToolCallState.READY

    def record_fields(self) -> dict[str, Any]:
        return {
            "tool_call_id": self.tool_call_id, "tool": self.name, "response_id": self.response_id,
            "epoch": self.epoch, "turn": self.turn,
            "duration_ms": None if self.duration_ms is None else round(self.duration_ms, 1),
            "outcome": self.outcome or ToolOutcome.UNANSWERED,
            "output_bytes": len(self.output.encode("utf-8")) if self.output is not None else 0,
            "sends": self.sends, "delivered": self.state == ToolCallState.CONFIRMED, "synthetic": self.synthetic,
            "state": self.state, "overhead_ms": self.overhead_ms,
        }


@dataclass
class Batch:
    response_id: str
    epoch: int
    origin: Origin
    created_seq: int
    status: str | None = None         # None while active; completed|cancelled|failed|incomplete|lost
    calls: list[str] = field(default_factory=list)
    follow_up: FollowUp | None = None
    done_t: float | None = None       # trio time its response.done was read
    ordinal: int = 0                  # its place in the order batches were first seen


@dataclass
class CreateSent:
    """One ``response.create`` we sent, so an ``error`` naming its event_id finds it."""

    event_id: str
    epoch: int
    batches: list[str]
    t: float
    response_id: str | None = None
    result: str = CreateResult.SENT   # a CreateResult, or error:<code>
    turnaround_ms: float | None = None  # written − the latest response.done of its batches
