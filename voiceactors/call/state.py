"""The bookkeeping of one call's tool calls and responses (plain data).

A ``ToolCall`` walks one way through its states. ``TRANSITIONS`` below is
every step it may take (state × event → next state, in the manner of h11's
connection states) and ``advance`` the one way a state changes; any other
step raises ``ToolCallLifecycleError``::

    seen ─▶ prefetching ─▶ prefetched      (a read run early on done arguments)
      │  ◀─────┘ (no answer) │
      └───────┴──────────────┴─▶ running ─▶ ready ─▶ queued ─▶ sent ─▶ confirmed
      └─────────────────────────────┴──────▶ ready (abandoned: a synthetic output)
                                                   queued, sent ─▶ rejected (the service refused it)

``seen``, ``prefetching`` and ``prefetched`` are the states before the
arguments are known final; the record calls all three ``seen``. A call
starts (``running``) on its own run, or on its prefetch's run when that ran
on the same arguments (``ToolCall.run`` says which). ``ready`` means the
output exists but is not in a writer's queue (no socket); ``queued`` means
it is in the current connection's writer queue; ``sent`` means the writer
wrote it and the service has not confirmed it yet. After a dropped socket,
``queued`` and ``sent`` go back to ``ready`` and are written again on the
next connection; ``confirmed`` (the service echoed the item with
``conversation.item.added``, which it may do in any state) is never written
again.

A ``Batch`` is one model response and the tool calls it carried; its
``follow_up`` says how the conversation was carried forward after it:
``ours`` (we sent ``response.create``), ``model`` (a response the model
started after every output was confirmed did it), ``superseded`` (the user
took the floor: a newer epoch), ``failed`` (the service refused our
``response.create`` and we gave up, ``refusals.py``), ``refused`` (the
service refused every output of the batch) or None (not yet decided).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

#: The output a tool call gets when its result was abandoned (the rule-1 synthetic answer).
CANCELLED_OUTPUT = json.dumps({"error": "cancelled: the user interrupted"})



class ToolCallState(StrEnum):
    """Where a tool call is on its one-way walk (the module doc's diagram)."""

    SEEN = "seen"                  # named by the service; its arguments are not final
    PREFETCHING = "prefetching"    # ... and a read runs early on its done arguments (``Prefetch``)
    PREFETCHED = "prefetched"      # ... and that read answered: the answer waits for the start
    RUNNING = "running"            # arguments final: its run is at the executor
    READY = "ready"                # answered (or abandoned); not in a writer's queue
    QUEUED = "queued"              # in the current connection's writer queue
    SENT = "sent"                  # written, not confirmed yet
    CONFIRMED = "confirmed"        # the service echoed the output
    REJECTED = "rejected"          # the service refused the output


class ToolCallEvent(StrEnum):
    """What moves a tool call from one state to the next (``TRANSITIONS``)."""

    PREFETCH = "prefetch"                    # a read started on its done arguments
    PREFETCH_ANSWERED = "prefetch_answered"  # that read answered before the call started
    PREFETCH_ENDED = "prefetch_ended"        # that read ended without an answer
    START = "start"                          # arguments final, its response alive: it runs
    ANSWER = "answer"                        # its run answered
    ABANDON = "abandon"                      # answered with the synthetic output instead
    RECOVER = "recover"                      # taken over from a crashed run with its output
    QUEUE = "queue"                          # handed to the connection's writer
    WRITE = "write"                          # the writer wrote it
    WRITE_AT_CLOSE = "write_at_close"        # the bounded close wrote it itself
    CONFIRM = "confirm"                      # the service echoed it
    REJECT = "reject"                        # the service refused it
    DISCONNECT = "disconnect"                # the writer is gone
    DROP = "drop"                            # the socket is gone (a reconnect follows)


class ToolRun(StrEnum):
    """Which run answers a started tool call."""

    OWN = "own"                              # a run of its own, started with it
    PREFETCH = "prefetch"                    # its prefetch's run, still at the executor then
    PREFETCH_ANSWERED = "prefetch_answered"  # its prefetch's answer, there before it started


class ToolCallLifecycleError(RuntimeError):
    """A step ``TRANSITIONS`` does not allow: a bug of the protocol, never the peer's doing."""

    def __init__(self, tool_call_id: str, state: ToolCallState, event: ToolCallEvent) -> None:
        super().__init__(f"tool call {tool_call_id}: no transition on {event.value!r} "
                         f"in state {state.value!r}")
        self.tool_call_id, self.state, self.event = tool_call_id, state, event


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
    REFUSED = "refused"        # the service refused every output of it: it awaits no response for them


class SlowCourse(StrEnum):
    """Where a batch stands with its slow tool calls (docs/calls.md § Slow tools)."""

    ACK_DUE = "ack_due"   # its response ended with calls unanswered: acknowledged at ``ack_at`` if still so
    KEPT = "kept"         # acknowledged: its calls outlive later turns, its outputs are spoken at a quiet moment


class CreateResult(StrEnum):
    """What became of a ``response.create`` of ours (any other error: ``error:<code>``)."""

    SENT = "sent"
    REJECTED_ACTIVE = "rejected_active"
    LOST = "lost"


class HostedToolStatus(StrEnum):
    """How a call of an OpenAI-hosted MCP tool (an ``mcp_call`` item, run by
    the service itself) ended, as its ``hosted_tool`` record line says."""

    COMPLETED = "completed"
    FAILED = "failed"          # the item carries an ``error``


class ToolOutcome(StrEnum):
    """A tool call's outcome: the executor's, or one the call actor sets itself
    (``cancelled``/``failed`` for an abandoned call, ``restarted``/``replayed``
    for one taken over after a crash). Every outcome the executor answers is a
    member (``executor/actor.py``); the strings are what records, logs, metrics
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


_S, _E = ToolCallState, ToolCallEvent
#: Not started: the arguments are not known final yet.
UNSTARTED = frozenset({_S.SEEN, _S.PREFETCHING, _S.PREFETCHED})
UNANSWERED = UNSTARTED | {_S.RUNNING}
UNSENT = frozenset({_S.READY, _S.QUEUED})
ANSWERED = frozenset({_S.READY, _S.QUEUED, _S.SENT, _S.CONFIRMED, _S.REJECTED})
ENDED_OK = frozenset({BatchStatus.COMPLETED, BatchStatus.LOST})

#: Every step a tool call may take: state -> {event: next state}. The
#: protocol asks before it steps where an event applies to some states only
#: (a late answer of an abandoned call changes nothing); a step not here is a
#: bug. The service may echo an output in any state (one a crashed run sent,
#: or a peer's mistake), so every state but ``confirmed`` takes ``confirm``.
TRANSITIONS: dict[ToolCallState, dict[ToolCallEvent, ToolCallState]] = {
    _S.SEEN: {_E.PREFETCH: _S.PREFETCHING, _E.START: _S.RUNNING, _E.ABANDON: _S.READY,
              _E.RECOVER: _S.READY, _E.CONFIRM: _S.CONFIRMED},
    _S.PREFETCHING: {_E.PREFETCH_ANSWERED: _S.PREFETCHED,
                     _E.PREFETCH_ENDED: _S.SEEN,      # never prefetched again: it runs when it starts
                     _E.START: _S.RUNNING, _E.ABANDON: _S.READY, _E.CONFIRM: _S.CONFIRMED},
    _S.PREFETCHED: {_E.START: _S.RUNNING, _E.ABANDON: _S.READY, _E.CONFIRM: _S.CONFIRMED},
    _S.RUNNING: {_E.ANSWER: _S.READY, _E.ABANDON: _S.READY, _E.CONFIRM: _S.CONFIRMED},
    _S.READY: {_E.QUEUE: _S.QUEUED, _E.WRITE_AT_CLOSE: _S.SENT, _E.CONFIRM: _S.CONFIRMED},
    _S.QUEUED: {_E.WRITE: _S.SENT, _E.DISCONNECT: _S.READY, _E.DROP: _S.READY, _E.REJECT: _S.REJECTED,
                _E.CONFIRM: _S.CONFIRMED},
    _S.SENT: {_E.DROP: _S.READY, _E.REJECT: _S.REJECTED, _E.CONFIRM: _S.CONFIRMED},
    _S.CONFIRMED: {},
    _S.REJECTED: {_E.CONFIRM: _S.CONFIRMED},
}

#: The state a call's record line names (the record keeps the public walk).
RECORDED_STATE = {state: _S.SEEN if state in UNSTARTED else state for state in ToolCallState}


def advance(call: ToolCall, event: ToolCallEvent) -> ToolCallState:
    """Step ``call`` on ``event`` by ``TRANSITIONS``; return its new state."""
    state = TRANSITIONS[call.state].get(event)
    if state is None:
        raise ToolCallLifecycleError(call.tool_call_id, call.state, event)
    call.state = state
    return state


@dataclass(frozen=True, slots=True)
class ToolFinished:
    """The executor answered a tool call (a ``ToolResult``'s fields): the
    protocol's input, defined here since a tool call holds a prefetch's."""

    tool_call_id: str
    tool: str
    output: str
    outcome: ToolOutcome
    duration_ms: float = 0.0
    client_events: tuple[dict[str, Any], ...] = ()
    prefetch: bool = False     # the answer of a ``Prefetch`` run (not of a ``StartTool``)


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
    held: ToolFinished | None = None  # that read's answer (state ``prefetched``), kept for the start
    run: ToolRun | None = None        # which run answers it (set when it starts)
    # the latest progress its source reported: (progress, total) (MCP notifications/progress)
    progress: tuple[float, float | None] | None = None

    @property
    def adopted(self) -> bool:
        """It started on its prefetch's run."""
        return self.run is not None and self.run is not ToolRun.OWN

    def abandon(self) -> None:
        """Answer with the synthetic cancelled output (only if not answered yet)."""
        if self.state in UNANSWERED:
            self.output = CANCELLED_OUTPUT
            self.outcome = self.outcome or ToolOutcome.CANCELLED
            self.synthetic = True
            advance(self, ToolCallEvent.ABANDON)

    def record_fields(self) -> dict[str, Any]:
        return {
            "tool_call_id": self.tool_call_id, "tool": self.name, "response_id": self.response_id,
            "epoch": self.epoch, "turn": self.turn,
            "duration_ms": None if self.duration_ms is None else round(self.duration_ms, 1),
            "outcome": self.outcome or ToolOutcome.UNANSWERED,
            "output_bytes": len(self.output.encode("utf-8")) if self.output is not None else 0,
            "sends": self.sends, "delivered": self.state == ToolCallState.CONFIRMED, "synthetic": self.synthetic,
            "state": RECORDED_STATE[self.state], "overhead_ms": self.overhead_ms,
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
    slow: SlowCourse | None = None    # its slow calls' course (None: none of them was slow)
    ack_at: float = math.inf          # when its acknowledgement is due (``slow`` ack_due)
    ack_t: float | None = None        # trio time its acknowledgement was asked for
    bounded: bool = False             # its acknowledgement was held back by the bound on slow calls (logged once)
    reports: list[str] = field(default_factory=list)   # ours: the batches whose follow-up it is (its create's)
    progress_at: float = math.inf     # when a progress line may be spoken (a call of it reported progress)
    progress_spoken: bool = False     # its one progress line was asked for
    agent: str | None = None          # the agent in charge when it was first seen (None: a call without agents)

    @property
    def kept(self) -> bool:
        """Acknowledged: later turns do not supersede it (its calls answer and are spoken)."""
        return self.slow is SlowCourse.KEPT


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
