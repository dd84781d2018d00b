"""CallProtocol: the rules of one call's sideband, with no I/O (sans-IO).

``CallProtocol.handle(input, now)`` takes one ``CallInput`` (a parsed server
event, a tool result, an event written, the socket connected or dropped, a
timer) and the current time, updates the call's bookkeeping
(``state.py``) and returns the effects to carry out, in order: events to
send, tools to start, reads to cancel, a wake-up time, record lines, feed
events, metrics, log lines, the end of the call. It never blocks, sleeps,
reads a clock or imports trio: ``CallActor`` (``actor.py``) is the async shell
that feeds it and carries its effects out. The protocol tests drive it
directly (``tests/test_call_protocol.py``).

The rules (``docs/calls.md`` has the long form):

* a tool call runs only on complete arguments of a response not cancelled and
  not superseded; calls of one response run concurrently;
* every tool call id is answered exactly once; an output counts as delivered
  when the service echoes it (``conversation.item.added``); unconfirmed
  outputs are written again after a reconnect, confirmed ones never;
* one ``response.create`` per batch, after that response's ``response.done``,
  once every output is written, only while no response is active and only if
  the batch's epoch is current; ``conversation_already_has_active_response``
  naming our event sends us back to waiting for the active response to end
  (or, when we know of none, a blind retry after ``BLIND_RETRY_S``); every
  other ``error`` does what its row in ``refusals.REFUSALS`` says (back off
  and retry, forget the tool call, end the call);
* ``speech_started`` and a cancelled response advance the epoch and cancel the
  older epoch's reads at the executor; older work still answers its tool call
  id but never asks for a response.

Names: ``call_id`` is the live call (``rtc_...``); ``tool_call_id`` is the
model's function-call id (the ``call_id`` field of the Realtime events).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Callable

from voiceactors.call.meter import FAREWELL, FAREWELL_MAX_S, GRACE_S, BudgetState, CallMeter
from voiceactors.call.state import (
    ANSWERED, ENDED_OK, UNANSWERED, UNSENT, UNSTARTED, Batch, BatchStatus, CreateResult, CreateSent, FollowUp,
    HostedToolStatus, Origin, SlowCourse, ToolCall, ToolCallEvent, ToolCallState, ToolOutcome, ToolRun, advance,
)
# an input of the protocol's, defined beside the ToolCall that may hold one (a prefetch's answer)
from voiceactors.call.state import ToolFinished as ToolFinished
from voiceactors.call.call_context import CallContext
from voiceactors.agents import handoff_failed, taking_over
from voiceactors.call.handoff import (HandoffRefusal, Handoffs, HandoffStatus, Transition, handed_output,
                                      refusal_output)
from voiceactors.call.phone_line import (PIN_ACCEPTED, REFUSED_PARTING_S, REFUSED_WORDS, TRANSFER_SPEAK_S,
                                         TRANSFER_WORDS, Keyed, PhoneLine, ToolAnswer, wrong_pin_words)
# re-exported: the actor, the supervisor and the tests name it from here
from voiceactors.call.end_reason import EndReason as EndReason
from voiceactors.call.refusals import ACTIVE_RESPONSE as ACTIVE_RESPONSE, RefusalAction, backoff_s, refusal_of
from voiceactors.call.record_kind import RecordKind
from voiceactors.call.transcript_order import ITEM_EVENTS, OUTPUT_ITEM_EVENTS, TranscriptOrder
from voiceactors.call.turn_latency import Heard, Turn, TurnLatency
from voiceactors.realtime import events as rt
from voiceactors.realtime.event_view import EventView
from voiceactors.tool_effect import READ, WRITE, ToolEffect
from voiceactors.settings import default


#: The server events the protocol acts on; the reader skips the rest (deltas,
#: audio buffer events) without validating them.
HANDLED_EVENTS = frozenset({
    "response.created", "response.output_item.added", "response.output_item.done",
    "response.function_call_arguments.done", "response.done", "input_audio_buffer.speech_started",
    "conversation.item.added", "conversation.item.created", "conversation.item.done", "error",
    "conversation.item.input_audio_transcription.completed",
    "response.output_audio_transcript.done", "response.output_text.done", "rate_limits.updated",
    "input_audio_buffer.timeout_triggered", "input_audio_buffer.dtmf_event_received",
    "conversation.item.truncated", "session.updated",
    # one per turn and one per response: the latency a person feels (turn_latency.py)
    "input_audio_buffer.speech_stopped", "output_audio_buffer.started",
    # a Live call's audio usage, as its translator hands it on (live/translate.py)
    "session.usage.updated",
})

#: Longest tool name kept from the peer (ours are under 40 characters).
TOOL_NAME_MAX = 128
#: Longest peer-sent string (error code, type, event id) put in a log line.
PEER_STRING_MAX = 64
#: After ``conversation_already_has_active_response`` while we saw no active
#: response (its ``response.created`` fell in a drop), retry after this long.
BLIND_RETRY_S = 2.0
BLIND_RETRIES = 3
#: The goodbye's response parameters, when the user stayed silent through a
#: check-in (overriding the session's for that response only).
IDLE_GOODBYE: dict[str, Any] = {
    "instructions": ("The user has said nothing for a long time, even after you checked in. Say a short, friendly "
                     "goodbye in one sentence, and say nothing else."),
    "tool_choice": "none",
}
#: The latest end after the second idle timeout (a service that never answers the goodbye).
IDLE_GOODBYE_MAX_S = FAREWELL_MAX_S
#: The service answers an idle timeout with a response of its own: the goodbye
#: waits for it to end, or this long for it to start (a session with
#: ``create_response: false`` starts none), rather than be refused while it is active.
SERVICE_ANSWER_WAIT_S = 2.0


#: The acknowledgement's response parameters: a tool call the user waits for
#: is slow (overriding the session's for that response only).
TOOL_ACK: dict[str, Any] = {
    "instructions": ("A tool you called is still working. Tell the user, in one short and natural sentence, that "
                     "you are on it and will tell them as soon as you have it. Do not guess its answer, do not say "
                     "that anything is done, and say nothing else."),
    "tool_choice": "none",
}
#: How many assistant items' transcripts and truncations are kept for the
#: ``heard`` line of a reply cut short (the latest ones: a cut reply is recent).
HEARD_ITEMS_KEPT = 32
#: Longest arguments of a write named in the truthful report.
REPORT_ARGUMENTS_MAX = 300


def truthful_report(done: list[ToolCall], not_done: list[ToolCall]) -> str:
    """The system item after a barge-in cut short the assistant's report of
    writes: which were done and which were not, so the model neither denies
    nor repeats one."""
    def named(calls: list[ToolCall]) -> str:
        return "; ".join(f"{c.name} {rt.clip(c.arguments or '{}', REPORT_ARGUMENTS_MAX)}" for c in calls) or "none"

    return ("The user interrupted your reply while it reported changes to the journal. Done: "
            f"{named(done)}. Not done: {named(not_done)}. Do not say that a done change failed and do not make "
            "it again; do not say that a change not done was made.")


#: After speech with no user item (a turn the service dropped), the floor is
#: taken free again after this long: a kept answer is not held back for ever.
USER_TURN_MAX_S = 15.0


@dataclass(frozen=True, slots=True)
class SlowTools:
    """The shell's settings for slow tool calls (docs/calls.md § Slow tools).
    ``ack_after_s`` 0: no acknowledgement (the protocol's default; the call
    actor sets ``tool_ack_after_s``)."""

    ack_after_s: float = 0.0
    # acknowledged calls unanswered at once; a batch past it is not acknowledged
    max_in_flight: int = default("tool_slow_max")
    # a progress line may be spoken once a call has run this long (0: never)
    progress_after_s: float = default("tool_progress_after_s")


#: Longest progress message of a source's passed to the client feed (never to the model).
PROGRESS_MESSAGE_MAX = 200


def progress_response(progress: float, total: float | None) -> dict[str, Any]:
    """The progress line's response parameters (overriding the session's for
    that response only). Only the numbers: the source's message is its own
    text, data for the feed, never an instruction to the model."""
    if total:
        how_far = f"about {max(0, min(100, round(100 * progress / total)))} percent of it is done"
    else:
        how_far = "it has made some progress"
    return {
        "instructions": (f"A tool you called is still working; {how_far}. Tell the user so in one short, natural "
                         "sentence, and that you will tell them the answer when it comes. Say nothing else."),
        "tool_choice": "none",
    }

def wrap_up_response(minutes_left: int) -> dict[str, Any]:
    """The wrap-up's response parameters, a few minutes before the call's
    time limit (overriding the session's for that response only)."""
    minutes = "a minute" if minutes_left <= 1 else f"{minutes_left} minutes"
    return {
        "instructions": (f"This call reaches its time limit in about {minutes}. First answer anything still "
                         "pending. Then tell the user, in one short sentence, that the call ends soon and that "
                         "they can continue in a new call with Continue."),
        "tool_choice": "none",
    }


class WrapUp(StrEnum):
    """Where a call stands with its time limit's wrap-up."""

    PENDING = "pending"      # not due yet (or the call has no wrap-up)
    DUE = "due"              # due: sent at the next quiet moment
    SENT = "sent"            # its response.create is sent (asked again if refused or lost)


class IdleCourse(StrEnum):
    """Where a silent call stands (``input_audio_buffer.timeout_triggered``
    since the user last spoke)."""

    TALKING = "talking"      # no timeout, or one (the service's own response checked in)
    GOODBYE_DUE = "goodbye_due"   # a second timeout: our goodbye is due
    GOODBYE = "goodbye"      # the goodbye is sent
    ENDING = "ending"        # the goodbye is done: the call ends at ``idle_wake``
    ENDED = "ended"          # EndCall(user_idle) emitted


# ------------------------------------------------------------------ inputs

@dataclass(frozen=True, slots=True)
class Connected:
    """A socket is up and its writer takes events: pending outputs go out."""


@dataclass(frozen=True, slots=True)
class Received:
    """One frame from the service: its parsed event, or None for a frame the
    reader skipped (it still counts in the event sequence)."""

    event: Any


@dataclass(frozen=True, slots=True)
class Written:
    """The writer wrote this ``Send`` on the socket."""

    send: "Send"


@dataclass(frozen=True, slots=True)
class ToolProgress:
    """A running tool call's source reported progress (MCP
    ``notifications/progress``): its numbers and message, as sent."""

    tool_call_id: str
    progress: float
    total: float | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class ToolAbandoned:
    """A tool task ended without a result: cancelled by the actor, or the
    executor was gone (``executor_gone``)."""

    tool_call_id: str
    executor_gone: bool = False
    prefetch: bool = False     # a ``Prefetch`` run ended without a result


@dataclass(frozen=True, slots=True)
class Disconnected:
    """The connection's writer is gone: what it did not write is ready again."""


@dataclass(frozen=True, slots=True)
class Dropped:
    """The socket is gone and a reconnect follows (see ``CallProtocol._on_drop``)."""


@dataclass(frozen=True, slots=True)
class Timer:
    """The wake-up time the protocol asked for (``WakeAt``) may have come."""


@dataclass(frozen=True, slots=True)
class Recovered:
    """A tool call a crashed run left pending (a rejoin, ``recovery.py``).
    ``output`` None: run it again (a read with its arguments); else answer it
    with ``output`` and ``outcome``."""

    tool_call_id: str
    tool: str
    response_id: str | None
    arguments: str | None
    output: str | None = None
    outcome: ToolOutcome | None = None


@dataclass(frozen=True, slots=True)
class WrittenAtClose:
    """The bounded close wrote this tool call's output itself (``closing_outputs``)."""

    tool_call_id: str


#: Everything the call actor feeds its protocol.
CallInput = (Connected | Received | Written | ToolFinished | ToolAbandoned | Disconnected | Dropped | Timer
             | Recovered | WrittenAtClose | ToolProgress)


# ----------------------------------------------------------------- effects

@dataclass(frozen=True, slots=True)
class Send:
    """One event for the connection's writer; ``tool_call_id`` marks a
    function_call_output (the writer reports it back with ``Written``)."""

    event: dict[str, Any]
    tool_call_id: str | None = None


@dataclass(frozen=True, slots=True)
class StartTool:
    """Run one tool call at the executor; report back with ``ToolFinished``
    or ``ToolAbandoned``. ``prefetched``: the call starts on the run its
    ``Prefetch`` began (same arguments): the shell starts nothing."""

    tool_call_id: str
    name: str
    arguments: str
    epoch: int
    turn: int
    prefetched: bool = False


@dataclass(frozen=True, slots=True)
class Prefetch:
    """Run a read whose arguments are done but not yet known complete
    (``response.function_call_arguments.done``): report back with
    ``ToolFinished``/``ToolAbandoned`` carrying ``prefetch=True``. Its answer
    is used only if the call then starts with the same arguments (rule 2);
    otherwise it is dropped."""

    tool_call_id: str
    name: str
    arguments: str
    epoch: int
    turn: int


@dataclass(frozen=True, slots=True)
class CancelOlderReads:
    """Tell the executor to cancel this call's reads issued before
    ``before_epoch``, but those in ``keep`` (acknowledged slow calls)."""

    before_epoch: int
    keep: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class WakeAt:
    """Feed ``Timer`` at ``at`` (or sooner; the protocol checks the time itself)."""

    at: float


@dataclass(frozen=True, slots=True)
class RecordLine:
    """A line for the call record (``t``: when it happened, seconds since
    the start, for a line written later; None: when it is added)."""

    kind: RecordKind
    fields: dict[str, Any]
    t: float | None = None


class PublishKind(StrEnum):
    """What a ``Publish`` effect tells the client feed: each member names the
    ``CallFeed`` method the shell hands its fields to (``call.py``'s
    ``_publisher``, a match mypy checks is exhaustive)."""

    TOOL_STARTED = "tool_started"
    TOOL_DONE = "tool_done"
    TOOL_PROGRESS = "tool_progress"
    CLIENT_EVENTS = "client_events"
    TRANSCRIPT = "transcript"
    USAGE = "usage"
    SELECTION = "selection"
    AGENT = "agent"


class Metric(StrEnum):
    """The metric a ``Measure`` effect observes (``metrics.py``'s function of
    the member's name; ``call.py``'s ``_metric``)."""

    TOOL_OVERHEAD = "tool_overhead"
    TOOL_TURNAROUND = "tool_turnaround"
    # a turn's latency as a person feels it (turn_latency.py)
    TURN_FIRST_AUDIO = "turn_first_audio"
    TURN_ANSWER = "turn_answer"
    TURN_TOOLS = "turn_tools"
    TURN_OVERHEAD = "turn_overhead"
    TURN_SERVICE = "turn_service"


class LogLevel(StrEnum):
    """A ``Log`` effect's level: the call actor's logger method of that name."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class Publish:
    """A client feed event: the ``CallFeed`` method ``kind`` names, called with ``**fields``."""

    kind: PublishKind
    fields: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Measure:
    """A metric observation: ``name``'s metric observes ``seconds``."""

    name: Metric
    seconds: float


@dataclass(frozen=True, slots=True)
class Log:
    """A structured log line of the call actor."""

    level: LogLevel
    event: str
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EndCall:
    """The call cannot go on (a fatal service error)."""

    reason: EndReason


@dataclass(frozen=True)
class CountUsage:
    """One response's tokens and cost: the metrics and the day's total."""

    model: str
    tokens: dict[str, int]
    cost_usd: float | None


@dataclass(frozen=True, slots=True)
class RateLimits:
    """A ``rate_limits.updated``: what the service says is left (None: not
    reported), for the metrics' gauges."""

    requests: int | None
    tokens: int | None


@dataclass(frozen=True, slots=True)
class Refer:
    """A phone call is to be transferred to ``target_uri`` (the service's
    ``refer``: the caller's SIP session goes there and ours ends)."""

    target_uri: str


Effect = (Send | StartTool | Prefetch | CancelOlderReads | WakeAt | RecordLine | Publish | Measure | Log | EndCall
          | CountUsage | RateLimits | Refer)


def _always() -> bool:
    return True


class CallProtocol:
    """The sideband protocol of one call: state and rules, no I/O.

    ``effect_of(name)`` says whether a tool is a ``read`` or a ``write`` (None
    when unknown): the ``tool_started`` record line keeps a read's arguments.
    ``started`` is the time the call started (record times are relative to it).
    ``debug_logs`` False: no ``Log`` effects at debug level are made (the
    shell's logger would drop them). Not thread-safe; one owner feeds it.

    Per-event work does not grow with the call's history: the checks that
    look for batches to decide walk only the batches still undecided
    (``_undecided``), and the tool runs in flight are a set (``_running``).
    """

    def __init__(self, call_id: str, *, effect_of: Callable[[str], ToolEffect | None] = lambda name: None,
                 may_defer: Callable[[str], bool] = lambda name: False,
                 started: float = 0.0, context: CallContext | None = None, debug_logs: bool = True) -> None:
        self.call_id = call_id
        self.context = context                      # linked context, selection, greeting (call_context.py)
        self.started = started
        self._effect_of = effect_of
        self._may_defer = may_defer                 # whether a tool's slow call may be acknowledged (ToolSpec)
        self.debug_logs = debug_logs
        # Whether a feed event would reach anyone now (the shell's
        # ``CallFeed.listened``): when not, the feed's events (all but
        # ``client_events``, which are more than a publish) are not built.
        # Asked at the step it is emitted in, as the shell would ask it when
        # carrying the effect out; by default every event is emitted.
        self.publishing: Callable[[], bool] = _always
        self.epoch = 0
        self.turn = 0
        self._speech_turn = False
        self.calls: dict[str, ToolCall] = {}
        self.batches: dict[str, Batch] = {}
        self.active: set[str] = set()
        self.creates: dict[str, CreateSent] = {}
        self._output_events: dict[str, str] = {}     # event_id -> tool_call_id
        self.create_inflight: str | None = None
        self.retry_at: float | None = None          # math.inf: retries used up, wait for a response event
        self._blind_retries = 0
        self._backoff_retries = 0                   # retries of refused creates since one was accepted
        self._refused_outright: set[str] = set()    # tool call ids whose only write the service refused
        self.seq = 0                                # server frames received
        self.connected = False                      # a writer takes Send effects
        self.log_budget = rt.LogBudget()            # peer-triggered log lines (skipped frames, errors)
        self.spoken = TranscriptOrder()             # the transcripts' spoken order, cut-short replies
        self._now = started
        self._effects: list[Effect] = []
        self.meter = CallMeter()                    # usage, cost, budget (the shell sets model and prices)
        self._budget_ended = False
        self._running: set[str] = set()             # tool call ids with a StartTool run in flight
        self._prefetching: set[str] = set()         # ... with a Prefetch run in flight
        # batches with tool calls whose follow_up may still be None (pruned
        # lazily once decided; re-added when a follow_up goes back to None)
        self._undecided: dict[str, Batch] = {}
        self.idle_timeouts = 0                      # timeout_triggered since the user last spoke
        self.idle = IdleCourse.TALKING
        self._idle_goodbye: str | None = None       # the goodbye's event id
        # the goodbye goes out no sooner (the service's answer first); -inf: no wait left
        self._goodbye_after = math.inf
        self._idle_end_at = math.inf                # when a silent call ends (math.inf: not ending)
        self.wrap_up = WrapUp.PENDING
        self.wrap_up_at = math.inf                  # when the wrap-up is due (math.inf: never)
        self.ends_at = math.inf                     # the call's time limit (the shell ends it there)
        self._wrap_up_event: str | None = None      # the wrap-up's event id
        # a phone call's transfer and PIN refusal (phone_line.py): when each is due at the latest
        self._transfer_at = math.inf                # the refer goes out (math.inf: none asked)
        self._transfer_next = False                 # the next response created says "transferring"
        self._transfer_response: str | None = None  # ... that response: the refer follows its end
        self._transferred = False
        self._refused_end_at = math.inf             # the call hangs up after the last wrong PIN
        self._refused_parting: str | None = None    # the goodbye's event id
        self._refused_ended = False
        self.slow_tools = SlowTools()               # the shell sets the settings'
        self._ack_due: dict[str, Batch] = {}        # batches whose acknowledgement may come (slow ack_due)
        self._kept: dict[str, Batch] = {}           # acknowledged batches not spoken yet (slow kept)
        self._kept_calls: set[str] = set()          # their tool calls not answered yet
        # the user's turn holds the floor until the service's answer to it
        # starts (or this time passes: no answer comes); -inf: the floor is free
        self._floor_held_until = -math.inf
        # the latest assistant items' transcripts and truncation points (the service's
        # conversation.item.truncated), for the heard line of a reply cut short
        self._said: dict[str, str] = {}
        self._truncated_at: dict[str, int] = {}
        # cut replies whose report waits for a write still running: response id -> (line fields, write ids)
        self._reports_due: dict[str, tuple[dict[str, Any], list[str]]] = {}
        self.over = False       # the call's end is decided (``end_decided``): nothing more is spoken
        self._progress_due: dict[str, Batch] = {}   # batches a call of which reported progress (no line yet)
        self.latency = TurnLatency()                # each turn's felt latency (turn_latency.py)
        # the handoffs between the call's agents (handoff.py; None: a call without agents)
        agents = context.agents if context is not None else None
        self.handoffs = Handoffs(agents) if agents is not None else None

    # ----------------------------------------------------------- the API

    def handle(self, message: CallInput, now: float) -> list[Effect]:
        """Apply one input at time ``now``; return the effects, in order."""
        self._now = now
        handler = _INPUT_HANDLERS.get(type(message))
        if handler is None:
            raise TypeError(f"not a CallInput: {message!r}")
        handler(self, message)
        return self.take_effects()

    def handle_event(self, event: Any, now: float) -> list[Effect]:
        """The same as ``handle(Received(event), now)`` without building the
        input: the reader's path for every frame it acts on."""
        self._now = now
        self.seq += 1
        if event is not None:
            self._on_event(event)
        effects, self._effects = self._effects, []
        return effects

    def _in_received(self, message: Received) -> None:
        self.seq += 1
        if message.event is not None:
            self._on_event(message.event)

    def _in_written(self, message: Written) -> None:
        self._on_written(message.send)

    def _in_connected(self, _message: Connected) -> None:
        self._on_connected()

    def _in_disconnected(self, _message: Disconnected) -> None:
        self._on_disconnected()

    def _in_dropped(self, _message: Dropped) -> None:
        self._on_drop()

    def _in_timer(self, _message: Timer) -> None:
        if self.retry_at is not None and self._now >= self.retry_at:
            self.retry_at = None
            self._maybe_follow_up()
        self._budget_timer(self._now)
        if self.idle is not IdleCourse.TALKING:
            self._idle_timer()
        if self.wrap_up is WrapUp.PENDING and self._now >= self.wrap_up_at:
            self._wrap_up_due()
        self._phone_timer()
        if self._ack_due or self._kept or self._progress_due:
            if self._now >= self._floor_held_until:
                self._floor_held_until = -math.inf
            self._maybe_follow_up()

    def _in_written_at_close(self, message: WrittenAtClose) -> None:
        call = self.calls[message.tool_call_id]
        call.sends += 1
        advance(call, ToolCallEvent.WRITE_AT_CLOSE)

    def skipped_frame(self) -> None:
        """The same as ``handle(Received(None), now)``, which has no effects:
        the reader's path for the frames it skips (most of a busy call's
        traffic is deltas)."""
        self.seq += 1

    def skipped_frames(self, count: int) -> None:
        """``count`` skipped frames at once (the sideband's hand-off drops
        them before the reader sees them, ``ws_frames.take_skipped``); like
        ``skipped_frame``, only the event sequence moves."""
        self.seq += count

    def take_effects(self) -> list[Effect]:
        """The effects not yet returned (after ``handle`` raised half-way)."""
        effects, self._effects = self._effects, []
        return effects

    def tools_running(self) -> bool:
        """Whether a tool run (started or prefetched) has not reported back."""
        return bool(self._running or self._prefetching)

    def end_decided(self) -> None:
        """The shell decided the call ends (its bounded close follows): a
        result that comes from now on is recorded, never spoken (its output
        may still be written by the close; no response is asked for)."""
        self.over = True

    def closing_outputs(self, now: float) -> list[Send]:
        """The end of a call with its socket up: answer every unanswered tool
        call with the synthetic output, and return the outputs never written
        on this socket for the shell to write (report each with
        ``WrittenAtClose``; outputs written and not confirmed are not written
        twice)."""
        self._now = now
        sends = []
        for call in self.calls.values():
            if call.state in UNANSWERED:
                call.outcome = call.outcome or ToolOutcome.CANCELLED
                call.abandon()
            if call.state != ToolCallState.READY or call.output is None:
                continue
            event = rt.function_call_output(call.tool_call_id, call.output)
            self._output_events[event["event_id"]] = call.tool_call_id
            sends.append(Send(event, call.tool_call_id))
        return sends

    def closing_lines(self) -> list[RecordLine]:
        """The record lines written at the end: every ``response.create`` and
        the ``tool_call`` line of each call not settled yet."""
        lines = [RecordLine(RecordKind.RESPONSE_CREATE, {
            "event_id": create.event_id, "epoch": create.epoch, "result": create.result,
            "response_id": create.response_id, "turnaround_ms": create.turnaround_ms, "for": create.batches,
        }, t=create.t) for create in self.creates.values()]
        for call in self.calls.values():
            self._record_settled(call)
        self._turn_line(self.latency.settle())
        lines.extend(e for e in self.take_effects() if isinstance(e, RecordLine))
        if self.meter.counted:    # the call's usage totals (meter.py)
            lines.append(RecordLine(RecordKind.USAGE_TOTAL, self.meter.totals()))
        return lines

    # ------------------------------------------------------------ helpers

    def _undecided_batches(self) -> list[Batch]:
        """The batches with tool calls and no follow_up yet, in the order
        they were created (drops the decided ones from ``_undecided``)."""
        undecided = self._undecided
        decided = [rid for rid, batch in undecided.items() if batch.follow_up is not None]
        for rid in decided:
            del undecided[rid]
        if len(undecided) < 2:
            return list(undecided.values())
        return sorted(undecided.values(), key=lambda b: b.ordinal)

    def _emit(self, effect: Effect) -> None:
        self._effects.append(effect)

    def _log(self, level: LogLevel, event: str, **fields: object) -> None:
        # the per-event debug lines are asked for under ``if self.debug_logs:``
        # at their call sites: with debug off not even their fields are packed
        if level is LogLevel.DEBUG and not self.debug_logs:
            return
        # a tool call id is the peer's string: clipped in logs like the others
        # (outputs and records keep it whole)
        if isinstance(fields.get("tool_call_id"), str):
            fields["tool_call_id"] = rt.clip(fields["tool_call_id"], PEER_STRING_MAX)
        self._effects.append(Log(level, event, fields))

    def _record(self, kind: RecordKind, **fields: object) -> None:
        self._effects.append(RecordLine(kind, fields))

    # ------------------------------------------------------- server events

    def _on_event(self, event: Any) -> None:
        """Dispatch one server event (its type is in ``HANDLED_EVENTS``)."""
        # Each field is read once and handed on (a view builds a new view at
        # every read of a nested object); the conversation's order
        # (``spoken``) sees an event's fields before its handler, the most
        # frequent kinds first.
        kind = event.type
        if kind in ITEM_EVENTS:
            item = event.item
            self.spoken.item_seen(item, getattr(event, "previous_item_id", None))
            self._on_item_added(item, first=kind != "conversation.item.done")
        elif kind in OUTPUT_ITEM_EVENTS:
            response_id, item = event.response_id, event.item
            self.spoken.output_item_seen(response_id, item)
            self._on_output_item(response_id, item, done=kind == "response.output_item.done")
        elif kind == "response.done":
            response = event.response
            if response.status == BatchStatus.CANCELLED:
                self._cut_short(response)
            for item_id in self.spoken.response_done(response):
                self._record(RecordKind.TRANSCRIPT_CUT, item_id=item_id)
            self._on_response_done(response)
        elif kind == "response.created":
            self._on_response_created(event.response)
        elif kind == "response.function_call_arguments.done":
            self._on_arguments_done(event)
        elif kind == "input_audio_buffer.speech_started":
            self._on_speech_started()
        elif kind == "session.usage.updated":
            self._count_audio(event.usage)
        elif kind == "error":
            self._on_error(event.error)
        elif kind == "conversation.item.input_audio_transcription.completed":
            self._transcript("user", event.transcript, event.item_id)
        elif kind == "response.output_audio_transcript.done":
            self._transcript("assistant", event.transcript, event.item_id)
        elif kind == "response.output_text.done":
            self._transcript("assistant", event.text, event.item_id)
        elif kind == "rate_limits.updated":
            self._on_rate_limits(event.rate_limits)
        elif kind == "input_audio_buffer.timeout_triggered":
            self._on_idle_timeout()
        elif kind == "input_audio_buffer.dtmf_event_received":
            self._on_keypad(event.event)
        elif kind == "conversation.item.truncated":
            self._keep_recent(self._truncated_at, event.item_id, event.audio_end_ms)
        elif kind == "output_audio_buffer.started":
            self._heard(self.latency.audio_started(self._now))
        elif kind == "input_audio_buffer.speech_stopped":
            self._turn_line(self.latency.speech_stopped(self.turn, self._now))
        elif kind == "session.updated":
            self._on_session_updated()

    def _batch(self, response_id: str) -> Batch:
        batch = self.batches.get(response_id)
        if batch is None:  # first seen without its response.created (e.g. after a reconnect)
            batch = Batch(response_id, self.epoch, Origin.MODEL, self.seq, ordinal=len(self.batches),
                          agent=self.context.agent if self.context is not None else None)
            self.batches[response_id] = batch
        return batch

    def _on_response_created(self, response: Any) -> None:
        rid = response.id or f"resp_unknown_{self.seq}"
        new = rid not in self.batches
        batch = self._batch(rid)
        self.active.add(rid)
        self.retry_at = None
        self._floor_held_until = -math.inf     # the answer to the user's turn (if one was held) started
        if self.idle is IdleCourse.GOODBYE_DUE:
            self._goodbye_after = -math.inf     # the service's answer started: the goodbye follows its end
        if new and self._transfer_next:
            self._transfer_next, self._transfer_response = False, rid
        if new and self.create_inflight is not None:
            # The service answers our response.create with response.created
            # (it carries no event_id, so the first one after ours is ours).
            create = self.creates[self.create_inflight]
            create.response_id = rid
            batch.origin = Origin.OURS
            self._handoff_response_created(create.event_id, rid)
            batch.reports = create.batches
            self.create_inflight = None
            self._backoff_retries = 0
        elif new:
            self._carried_forward_by(batch)
            if self.idle is IdleCourse.GOODBYE_DUE:
                self._cancel_second_check_in(rid)
        if self.handoffs is not None and not self.handoffs.announced:
            # the first response of the call: the feed hears who speaks (then at each change)
            self.handoffs.announced = True
            self._publish_agent(self.context.agent if self.context is not None else None, None, "start")
        if self.debug_logs:
            self._log(LogLevel.DEBUG, "response.created", response_id=rid, origin=batch.origin, epoch=batch.epoch)

    def _carried_forward_by(self, started: Batch) -> None:
        """A response the model started after every output of a finished batch
        was confirmed has those outputs in its context: it carries the
        conversation forward, so that batch needs no response.create of ours."""
        for batch in self._undecided_batches():
            if batch is started:
                continue
            if batch.status not in ENDED_OK or started.epoch != self.epoch:
                continue
            if batch.epoch != self.epoch and not batch.kept:
                continue
            seqs = [self.calls[c].confirmed_seq for c in batch.calls]
            if all(s is not None and s < started.created_seq for s in seqs):
                batch.follow_up = FollowUp.MODEL
                self._kept.pop(batch.response_id, None)    # a kept answer: that response speaks it
                if self.handoffs is not None:
                    self._handoff_carried_by(batch, started)
                if self.debug_logs:
                    self._log(LogLevel.DEBUG, "response.follow_up_by_model", response_id=batch.response_id,
                              by=started.response_id, epoch=self.epoch)

    def _tool_call(self, response_id: str, tool_call_id: str | None, name: str | None,
                   item_id: str | None) -> ToolCall | None:
        if not tool_call_id:
            return None
        # a tool name is ours to know; one longer than any we have is unknown
        # either way, and clipped it cannot flood the logs and the record
        name = rt.clip(name, TOOL_NAME_MAX)
        call = self.calls.get(tool_call_id)
        if call is None:
            batch = self._batch(response_id)
            call = ToolCall(tool_call_id, name or "", response_id, batch.epoch, self.turn,
                            self._now - self.started, item_id=item_id)
            self.calls[tool_call_id] = call
            batch.calls.append(tool_call_id)
            self._undecided[response_id] = batch
        elif name and not call.name:
            call.name = name
        return call

    def _on_output_item(self, response_id: str, item: Any, *, done: bool) -> None:
        kind = getattr(item, "type", None)
        if kind != "function_call":
            if kind == "mcp_call" and done:
                self._record_hosted_tool(response_id, item)
            return
        call = self._tool_call(response_id, item.call_id, item.name, item.id)
        if call is None or not done or call.state not in UNSTARTED:
            return
        if item.arguments is not None:
            call.arguments = item.arguments
        if item.status in (None, "completed") and call.arguments is not None:
            self._maybe_start(call)     # the arguments are final

    def _record_hosted_tool(self, response_id: str, item: Any) -> None:
        """An OpenAI-hosted MCP tool's call, done: the service ran it and put
        its result in the item, so nothing is ours to answer; it is only shown
        (the record, the timeline, the history)."""
        def text(value: Any, limit: int) -> str | None:   # the peer's strings only, clipped
            return rt.clip(value, limit) if isinstance(value, str) else None

        error = getattr(item, "error", None)
        self._record(RecordKind.HOSTED_TOOL, item_id=text(getattr(item, "id", None), PEER_STRING_MAX),
                     response_id=response_id, server=text(getattr(item, "server_label", None), TOOL_NAME_MAX),
                     tool=text(getattr(item, "name", None), TOOL_NAME_MAX),
                     status=HostedToolStatus.FAILED if error is not None else HostedToolStatus.COMPLETED,
                     error=text(getattr(error, "type", None), PEER_STRING_MAX))

    def _on_arguments_done(self, event: Any) -> None:
        # Also emitted for an interrupted response, with partial arguments: not
        # a reason to run. The item's done event or the response's done decides.
        call = self._tool_call(event.response_id, event.call_id, event.name, event.item_id)
        if call is not None and call.state in UNSTARTED:
            call.arguments = event.arguments
            self._maybe_prefetch(call)

    def _maybe_prefetch(self, call: ToolCall) -> None:
        """Run a read on arguments that are done but not yet known complete,
        so its answer may be there when the call starts. Only a read (no
        effect to undo), once per call, while its response is active and its
        epoch current; the answer is used only if the call then starts with
        these very arguments (``_maybe_start``), else it is dropped."""
        if call.prefetch is not None or call.recovered or not call.name or call.arguments is None:
            return
        if self.handoffs is not None and self.handoffs.target_of(call.name) is not None:
            return          # a handoff is never the executor's (handoff.py)
        if self._phone is not None and not self._phone.open:
            return          # nothing reads the journal before the PIN (phone_line.py)
        batch = self.batches[call.response_id]
        if batch.status is not None or batch.epoch < self.epoch or self._effect_of(call.name) != READ:
            return
        call.prefetch = call.arguments
        advance(call, ToolCallEvent.PREFETCH)
        call.started_t = self._now
        self._prefetching.add(call.tool_call_id)
        # logged first: the actor may have the executor answer it (and log tool.run) while carrying it out
        if self.debug_logs:
            self._log(LogLevel.DEBUG, "tool.prefetched", tool=call.name, tool_call_id=call.tool_call_id,
                      epoch=call.epoch)
        self._emit(Prefetch(call.tool_call_id, call.name, call.arguments, call.epoch, self.turn))

    def _on_response_done(self, response: Any) -> None:
        rid = response.id or f"resp_unknown_{self.seq}"
        batch = self._batch(rid)
        self.active.discard(rid)
        # a response ended (maybe the one the service was busy with, whose
        # response.created we never saw): decide now, not at the blind retry
        self.retry_at = None
        batch.status = response.status or BatchStatus.COMPLETED
        batch.done_t = self._now
        for item in response.output or ():
            if getattr(item, "type", None) != "function_call":
                continue
            call = self._tool_call(rid, item.call_id, item.name, item.id)
            if call is not None and call.state in UNSTARTED and item.arguments is not None:
                call.arguments = item.arguments
        for tool_call_id in batch.calls:
            call = self.calls[tool_call_id]
            if call.state not in UNSTARTED:
                continue
            if batch.status == BatchStatus.COMPLETED and call.arguments is not None:
                self._maybe_start(call)     # the arguments are final
            else:
                self._abandon(call)
        if self.debug_logs:
            self._log(LogLevel.DEBUG, "response.done", response_id=rid, status=batch.status, origin=batch.origin,
                      epoch=batch.epoch, tool_calls=len(batch.calls))
        self._record(RecordKind.RESPONSE, response_id=rid, status=batch.status, epoch=batch.epoch,
                     origin=batch.origin, tool_calls=list(batch.calls),
                     **({"agent": batch.agent} if batch.agent is not None else {}))
        usage = getattr(response, "usage", None)
        # a view's plain JSON (usage.read_usage walks it with isinstance checks, which
        # a view answers only through a dunder lookup); an SDK model as it is
        self._count_usage(rid, usage.to_dict() if type(usage) is EventView else usage)
        if self.idle is IdleCourse.GOODBYE:
            self._idle_goodbye_done(rid)
        self._phone_response_done(rid)
        if self.handoffs is not None:
            self._handoff_response_done(rid)
        if batch.status == BatchStatus.CANCELLED and batch.epoch == self.epoch:
            self._advance_epoch("response_cancelled")
        elif batch.status == BatchStatus.COMPLETED and batch.calls:
            self._slow_watch(batch)
        self._maybe_follow_up()

    def _on_speech_started(self) -> None:
        self._turn_line(self.latency.settle())
        self.turn += 1
        self._speech_turn = True
        self._floor_held_until = self._now + USER_TURN_MAX_S
        if self.idle_timeouts:
            self._user_back()
        self._advance_epoch("speech_started")

    def _on_item_added(self, item: Any, *, first: bool) -> None:
        kind = getattr(item, "type", None)
        if kind == "function_call_output":
            call = self.calls.get(item.call_id)
            if call is not None and call.state != ToolCallState.CONFIRMED:
                advance(call, ToolCallEvent.CONFIRM)
                call.confirmed_seq = self.seq
                self._record_settled(call)
                if self.debug_logs:
                    self._log(LogLevel.DEBUG, "tool.output_confirmed", tool_call_id=call.tool_call_id, epoch=self.epoch)
        elif kind == "message" and getattr(item, "role", None) == "user" and first:
            if not self._speech_turn:  # a typed turn: no speech_started came first
                self.turn += 1
            self._speech_turn = False
            waiting = bool(self._kept or self._ack_due)
            if self._floor_held_until > self._now:
                # the turn is in: the service's answer starts soon, or none comes
                self._floor_held_until = min(self._floor_held_until, self._now + SERVICE_ANSWER_WAIT_S)
            elif waiting:
                # a typed turn: its answer (asked for by the client) may start soon too
                self._floor_held_until = self._now + SERVICE_ANSWER_WAIT_S
            if waiting:
                self._emit(WakeAt(self._floor_held_until))

    def _on_error(self, error: Any) -> None:
        """An ``error``: what it does is ``refusals.REFUSALS``' row for its
        code; the event it names (``event_id``) was not applied."""
        event_id, code = error.event_id, error.code
        refusal = refusal_of(code)
        if refusal.end is not None:
            self._log(LogLevel.ERROR, "realtime.fatal_error", code=code, epoch=self.epoch, end=refusal.end)
            self._emit(EndCall(refusal.end))
            return
        if self.log_budget.allow():
            self._log(LogLevel.WARNING, "realtime.error", code=rt.clip(code, PEER_STRING_MAX),
                      error_type=rt.clip(error.type, PEER_STRING_MAX),
                      event_id=rt.clip(event_id, PEER_STRING_MAX), epoch=self.epoch, action=refusal.action,
                      suppressed=self.log_budget.take_suppressed() or None)
        if self.handoffs is not None and event_id and self.handoffs.refused(event_id):
            self._handoff_update_refused(event_id, code)
        elif event_id in self.creates:
            self._on_create_error(self.creates[event_id], code, refusal.action)
        elif event_id in self._output_events:
            self._on_output_refused(self.calls[self._output_events[event_id]])

    def _on_output_refused(self, call: ToolCall) -> None:
        """The service refused this output (already answered after a resend,
        or an id it no longer knows): never sent again, not answered. A
        batch whose every output was refused outright (never written before)
        asks for no response: the service awaits none of them."""
        if call.state in (ToolCallState.SENT, ToolCallState.QUEUED):
            if call.sends - (call.state == ToolCallState.SENT) == 0:
                # the refused write was its only one; an output written on an
                # earlier socket may be in the conversation (a resend refused)
                self._refused_outright.add(call.tool_call_id)
            advance(call, ToolCallEvent.REJECT)
            self._record_settled(call)
            batch = self.batches[call.response_id]
            if batch.follow_up is None and all(c in self._refused_outright for c in batch.calls):
                batch.follow_up = FollowUp.REFUSED
        self._maybe_follow_up()

    def _on_create_error(self, create: CreateSent, code: str | None, action: RefusalAction) -> None:
        if self.create_inflight == create.event_id:
            self.create_inflight = None
        if create.response_id is not None:
            # the response.created we took for ours was the model's
            self.batches[create.response_id].origin = Origin.MODEL
        current = self.handoffs.current if self.handoffs is not None else None
        if current is not None and current.create_event_id == create.event_id:
            # not the transition's words: the response taken for them cannot complete it
            current.create_event_id = current.spoken_by = None
        ours = [self.batches[r] for r in create.batches if self.batches[r].follow_up == FollowUp.OURS]
        if action == RefusalAction.WAIT_FOR_RESPONSE:
            create.result = CreateResult.REJECTED_ACTIVE
            self._undecide(ours)
            for rid in self.active:
                self._carried_forward_by(self.batches[rid])
            if not self.active and self._blind_retries < BLIND_RETRIES:
                # active on the service but not to us: retry later (a
                # response.done wakes us sooner)
                self._blind_retries += 1
                self._retry_after(BLIND_RETRY_S)
            elif not self.active:
                # retries used up: no immediate resend (that would loop while
                # the service keeps refusing); the next response.created or
                # response.done, or a reconnect, decides again
                self.retry_at = math.inf
        else:
            create.result = f"error:{code}"
            delay = backoff_s(self._backoff_retries) if action == RefusalAction.BACKOFF else None
            parting = not create.batches     # words of ours (a wrap-up, farewell, goodbye): asked again
            if delay is not None and (ours or parting):
                # not applied: the same batches (or words) are asked for again after the wait
                self._backoff_retries += 1
                self._undecide(ours)
                self._retry_after(delay)
            else:
                for batch in ours:
                    batch.follow_up = FollowUp.FAILED
                if parting and action == RefusalAction.BACKOFF:
                    self.retry_at = math.inf   # retries spent: the next response event decides again
                if ours:
                    self._log(LogLevel.WARNING, "response.create_given_up", code=rt.clip(code, PEER_STRING_MAX),
                              batches=[b.response_id for b in ours], retries=self._backoff_retries)
        self._maybe_follow_up()

    def _undecide(self, batches: list[Batch]) -> None:
        for batch in batches:
            batch.follow_up = None
            self._undecided[batch.response_id] = batch

    def _retry_after(self, delay: float) -> None:
        self.retry_at = self._now + delay
        self._emit(WakeAt(self.retry_at))

    def _on_rate_limits(self, limits: Any) -> None:
        remaining: dict[str, int] = {}
        for limit in limits or ():
            name, left = getattr(limit, "name", None), getattr(limit, "remaining", None)
            if name in ("requests", "tokens") and isinstance(left, (int, float)) and not isinstance(left, bool):
                remaining[name] = int(left)
        if remaining:
            self._emit(RateLimits(remaining.get("requests"), remaining.get("tokens")))

    def _transcript(self, role: str, text: str | None, item_id: str | None) -> None:
        if not text or (item_id and self.spoken.transcribed(item_id)):
            return      # nothing said, or said already (the service delivered its transcript again)
        if role == "assistant" and item_id:
            self._keep_recent(self._said, item_id, text)
        self._record(RecordKind.TRANSCRIPT, role=role, item_id=item_id, text=text,
                     **self.spoken.place_transcript(item_id))
        if self.publishing():
            self._emit(Publish(PublishKind.TRANSCRIPT, {"role": role, "text": text, "item_id": item_id}))

    # ------------------------------------------------------------- epochs

    def _advance_epoch(self, why: str) -> None:
        self.epoch += 1
        for batch in self._undecided_batches():
            if batch.epoch < self.epoch and not batch.kept:
                batch.follow_up = FollowUp.SUPERSEDED
        if self.debug_logs:
            self._log(LogLevel.DEBUG, "call.epoch", epoch=self.epoch, why=why, turn=self.turn)
        if self.tools_running():
            # the acknowledged reads run on: the user was told to wait for them
            self._emit(CancelOlderReads(self.epoch, keep=frozenset(self._kept_calls)))

    # -------------------------------------------------------------- tools

    def _maybe_start(self, call: ToolCall) -> None:
        """Start a call whose arguments are final (or abandon it)."""
        batch = self.batches[call.response_id]
        if call.state not in UNSTARTED:
            return
        if batch.status not in (None, BatchStatus.COMPLETED) or batch.epoch < self.epoch:
            # cancelled, or the user took the floor before it ran: never start it
            self._abandon(call)
            return
        # the prefetch's run is this call's run when it ran on these arguments
        # and has not ended without an answer (so it is prefetching or prefetched)
        answer = self._phone.answer_for(call.name) if self._phone is not None else None
        if answer is not None:
            self._answer_on_the_line(call, answer)
            return
        target = self.handoffs.target_of(call.name) if self.handoffs is not None else None
        if target is not None:
            self._handoff_called(call, batch, target)
            return
        prefetched = call.state != ToolCallState.SEEN and call.prefetch == call.arguments
        held = call.held
        call.held = None
        advance(call, ToolCallEvent.START)
        if not call.recovered:
            call.turn = self.turn
        if prefetched:
            # started_t stays the prefetch's start: the run began then
            call.run = ToolRun.PREFETCH if held is None else ToolRun.PREFETCH_ANSWERED
        else:
            held = None
            call.run = ToolRun.OWN
            call.started_t = self._now
            self._running.add(call.tool_call_id)
        self._record_started(call)
        if self.debug_logs:
            self._log(LogLevel.DEBUG, "tool.started", tool=call.name, tool_call_id=call.tool_call_id, epoch=call.epoch,
                      turn=call.turn)      # before the StartTool, for the same reason as tool.prefetched
        self._emit(StartTool(call.tool_call_id, call.name, call.arguments or "", call.epoch, call.turn,
                             prefetched=prefetched))
        if self.publishing():
            self._emit(Publish(PublishKind.TOOL_STARTED, {"tool": call.name, "tool_call_id": call.tool_call_id,
                                                "epoch": call.epoch}))
        if held is not None:
            call.started_t = self._now     # the answer was there: the overhead counts from here
            self._finish(call, held)

    def _on_tool_finished(self, result: ToolFinished) -> None:
        call = self.calls[result.tool_call_id]
        if result.prefetch and not call.adopted:
            self._prefetching.discard(call.tool_call_id)
            if call.state == ToolCallState.PREFETCHING:
                advance(call, ToolCallEvent.PREFETCH_ANSWERED)
                call.held = result     # kept for the call's start (used if its arguments match)
            return                     # else dropped: abandoned, or started on other arguments
        if call.adopted:
            self._prefetching.discard(call.tool_call_id)
        self._running.discard(call.tool_call_id)
        self._finish(call, result)

    def _finish(self, call: ToolCall, result: ToolFinished) -> None:
        self._slow_answered(call)
        self.latency.tool_answered(self._now)
        call.duration_ms = result.duration_ms
        call.outcome = result.outcome
        if result.tool and result.tool != call.name:
            call.name = result.tool  # the canonical dotted name
        if call.state == ToolCallState.RUNNING:
            call.output = result.output
            advance(call, ToolCallEvent.ANSWER)
            self._context_tool_finished(call, result)
            self._queue_output(call)
        if self._reports_due:
            self._reports_waiting_on(call)
        if self.debug_logs:
            self._log(LogLevel.DEBUG, "tool.finished", tool=call.name, tool_call_id=call.tool_call_id, epoch=call.epoch,
                      current_epoch=self.epoch, outcome=result.outcome, duration_ms=round(result.duration_ms, 1))
        if self.publishing():
            self._emit(Publish(PublishKind.TOOL_DONE, {"tool": call.name, "tool_call_id": call.tool_call_id,
                                             "epoch": call.epoch, "outcome": result.outcome,
                                             "duration_ms": result.duration_ms}))
        if result.client_events:
            self._emit(Publish(PublishKind.CLIENT_EVENTS, {"events": result.client_events, "tool": call.name,
                                                 "tool_call_id": call.tool_call_id}))
        self._maybe_follow_up()
        self._end_if_auth_expired(result)

    def _end_if_auth_expired(self, result: ToolFinished) -> None:
        """The call's own credentials for an MCP source were refused: the
        user's authentication expired, so the call ends (its output, already
        queued, tells the model why)."""
        if result.outcome == ToolOutcome.AUTH_EXPIRED:
            self._log(LogLevel.WARNING, "call.auth_expired", tool=result.tool, tool_call_id=result.tool_call_id)
            self._emit(EndCall(EndReason.AUTH_EXPIRED))

    def _on_tool_abandoned(self, message: ToolAbandoned) -> None:
        call = self.calls[message.tool_call_id]
        if message.prefetch and not call.adopted:
            # a prefetch that ended without an answer: the call starts (or
            # not) by the rules, on a run of its own
            self._prefetching.discard(call.tool_call_id)
            if call.state == ToolCallState.PREFETCHING:
                advance(call, ToolCallEvent.PREFETCH_ENDED)
            return
        if call.adopted:
            self._prefetching.discard(call.tool_call_id)
        self._running.discard(call.tool_call_id)
        if call.state == ToolCallState.RUNNING:
            call.outcome = ToolOutcome.FAILED if message.executor_gone else ToolOutcome.CANCELLED
            self._slow_answered(call)
            self._abandon(call)

    def _abandon(self, call: ToolCall) -> None:
        if call.state not in UNANSWERED:
            return
        if call.state in UNSTARTED and not call.recovered:
            # answered without a run: still in the record before its output
            # goes, so a restart that finds the output unconfirmed answers it
            # (as it does a started call) instead of never hearing of it
            self._record_started(call)
        call.abandon()
        self._log(LogLevel.INFO, "tool.abandoned", tool=call.name, tool_call_id=call.tool_call_id, epoch=call.epoch)
        self._queue_output(call)
        if self._reports_due:
            self._reports_waiting_on(call)

    def _on_recovered(self, pending: Recovered) -> None:
        """A rejoin: take over a tool call the crashed run left pending. They
        form completed batches of epoch 0, so once their outputs are written
        one ``response.create`` carries the conversation forward."""
        batch = self._batch(pending.response_id or f"resp_recovered_{pending.tool_call_id}")
        batch.status = BatchStatus.COMPLETED
        call = ToolCall(pending.tool_call_id, pending.tool, batch.response_id, 0, 0, 0.0,
                        recovered=True, arguments=pending.arguments)
        self.calls[call.tool_call_id] = call
        batch.calls.append(call.tool_call_id)
        self._undecided[batch.response_id] = batch
        if pending.output is None:
            self._maybe_start(call)
            return
        self._record_started(call)
        call.output, call.outcome = pending.output, pending.outcome
        advance(call, ToolCallEvent.RECOVER)
        call.synthetic = pending.outcome is ToolOutcome.RESTARTED
        self._log(LogLevel.INFO, "tool.recovered", tool=call.name, tool_call_id=call.tool_call_id,
                  outcome=pending.outcome)

    # ------------------------------------------------------------ outputs

    def _queue_output(self, call: ToolCall) -> None:
        """Hand a ready output to the current connection's writer (or keep it
        ready until the next connection)."""
        if call.state != ToolCallState.READY or not self.connected or call.output is None:
            return
        event = rt.function_call_output(call.tool_call_id, call.output)
        self._output_events[event["event_id"]] = call.tool_call_id
        advance(call, ToolCallEvent.QUEUE)
        self._emit(Send(event, call.tool_call_id))

    def _on_written(self, send: Send) -> None:
        if send.tool_call_id is None:
            self._on_create_written(send.event.get("event_id"))
            return
        call = self.calls[send.tool_call_id]
        call.sends += 1
        if call.sends == 1 and not call.synthetic and call.started_t is not None and call.duration_ms is not None:
            # what the actors add around the tool: the hops to the executor
            # and back and the writer's turn (the executor times the rest)
            spent = 0.0 if call.run == ToolRun.PREFETCH_ANSWERED else call.duration_ms
            overhead = max(0.0, (self._now - call.started_t) * 1000 - spent)
            call.overhead_ms = round(overhead, 2)
            self._emit(Measure(Metric.TOOL_OVERHEAD, overhead / 1000))
        if call.state == ToolCallState.QUEUED:
            advance(call, ToolCallEvent.WRITE)
        self._maybe_follow_up()

    def _on_create_written(self, event_id: str | None) -> None:
        """Time a response.create of ours from the latest response.done of
        the batches it carries forward (what the service waits on us)."""
        create = self.creates.get(event_id or "")
        if create is None or create.turnaround_ms is not None:
            return
        done = [t for r in create.batches if r in self.batches and (t := self.batches[r].done_t) is not None]
        if done:
            create.turnaround_ms = round(max(0.0, self._now - max(done)) * 1000, 2)
            self._emit(Measure(Metric.TOOL_TURNAROUND, create.turnaround_ms / 1000))
            self.latency.follow_up_written(self._now, max(done))

    def _heard(self, heard: Heard | None) -> None:
        """The sound of a reply started: the turn's latencies it closes."""
        if heard is None:
            return
        turn = heard.turn
        if heard.first_audio and turn.first_audio_s is not None:
            self._emit(Measure(Metric.TURN_FIRST_AUDIO, turn.first_audio_s))
        if heard.answer and turn.answer_s is not None:
            self._emit(Measure(Metric.TURN_ANSWER, turn.answer_s))
            self._emit(Measure(Metric.TURN_TOOLS, turn.tools_s))
            self._emit(Measure(Metric.TURN_OVERHEAD, turn.overhead_s))
            self._emit(Measure(Metric.TURN_SERVICE, turn.service_s or 0.0))

    def _turn_line(self, turn: Turn | None) -> None:
        """A settled turn's ``turn`` line, at the time its speech ended."""
        if turn is not None:
            self._emit(RecordLine(RecordKind.TURN, turn.fields(), t=round(turn.stopped_at - self.started, 3)))

    def _on_disconnected(self) -> None:
        self.connected = False
        for call in self.calls.values():
            if call.state == ToolCallState.QUEUED:
                advance(call, ToolCallEvent.DISCONNECT)

    def _on_connected(self) -> None:
        self.connected = True
        self._context_connected()   # first: a due session.update precedes the outputs
        if self.handoffs is not None:
            self._handoff_connected()
        for call in self.calls.values():
            self._queue_output(call)
        self._maybe_follow_up()

    def _on_drop(self) -> None:
        """The socket is gone. Unconfirmed outputs will be written again; a
        response.create without its response.created is re-decided; responses
        we saw start but not end are ``lost`` (their calls with complete
        arguments run on; the others get the synthetic output)."""
        self.connected = False
        for call in self.calls.values():
            if call.state in (ToolCallState.QUEUED, ToolCallState.SENT):
                advance(call, ToolCallEvent.DROP)
        if self.create_inflight is not None:
            create = self.creates[self.create_inflight]
            create.result = CreateResult.LOST
            for rid in create.batches:
                if self.batches[rid].follow_up == FollowUp.OURS:
                    self.batches[rid].follow_up = None
                    self._undecided[rid] = self.batches[rid]
            self.create_inflight = None
        for rid in list(self.active):
            batch = self.batches[rid]
            batch.status = BatchStatus.LOST
            for tool_call_id in batch.calls:
                # started calls run on (a started write must report its real
                # result); the rest will never have final arguments
                call = self.calls[tool_call_id]
                if call.state in UNSTARTED:
                    self._abandon(call)
        self.active.clear()
        self.retry_at = None
        if self.handoffs is not None:
            self.handoffs.dropped()

    # ---------------------------------------------------------- follow-up

    def _maybe_follow_up(self) -> None:
        """Send one response.create for the finished batches whose every
        output is written, if the epoch is theirs and no response is active."""
        if self.handoffs is not None:
            self._maybe_hand_off()
        if not self.connected or self.create_inflight is not None or self.active or self.over:
            return
        if self.retry_at is not None:
            return
        if self.meter.state != BudgetState.UNDER:
            self._farewell()    # past the budget: the farewell is the only create left
            return
        if self.idle is not IdleCourse.TALKING:
            self._say_idle_goodbye()    # a silent call: the goodbye is the only create left
            return
        if self.wrap_up is not WrapUp.PENDING and not self._wrap_up_said():
            return                      # the wrap-up is due: it carries the finished batches
        if self.handoffs is not None and self.handoffs.failure_due is not None:
            self._say_handoff_failed()  # a refused handoff: the agent still in charge says so first
            return
        # an acknowledged batch is spoken at a quiet moment: not in the user's turn
        floor_free = self._now >= self._floor_held_until
        due = [batch for batch in self._finished_batches()
               if self._outputs_written(batch) and (floor_free or not batch.kept)]
        if not due:
            if self._ack_due and floor_free:
                self._acknowledge_slow()
            if self._progress_due and floor_free and self.create_inflight is None:
                self._speak_progress()
            return
        event = rt.response_create(self._taking_over_words(due) if self.handoffs is not None else None)
        create = self._create_for(event, due)
        if self.debug_logs:
            self._log(LogLevel.DEBUG, "response.create", event_id=create.event_id, epoch=self.epoch,
                      batches=create.batches)
        self._emit(Send(event))

    def _finished_batches(self) -> list[Batch]:
        """The ended batches of the current epoch (or kept: acknowledged)
        still waiting for a follow-up, in the order they were created; an
        older epoch's are marked superseded on the way."""
        finished = []
        for batch in self._undecided_batches():
            if batch.status not in ENDED_OK:
                continue
            if batch.epoch < self.epoch and not batch.kept:
                batch.follow_up = FollowUp.SUPERSEDED
                continue
            finished.append(batch)
        return finished

    def _outputs_written(self, batch: Batch) -> bool:
        calls = self.calls
        for tool_call_id in batch.calls:     # a loop, not all(genexpr): asked several times a round
            state = calls[tool_call_id].state
            if state not in ANSWERED or state in UNSENT:
                return False
        return True

    def _create_for(self, event: dict[str, Any], due: list[Batch]) -> CreateSent:
        """Register ``event`` (a response.create about to be sent) as ours,
        carrying ``due`` forward."""
        create = CreateSent(event["event_id"], self.epoch, [b.response_id for b in due],
                            round(self._now - self.started, 3))
        self.creates[create.event_id] = create
        self.create_inflight = create.event_id
        for batch in due:
            batch.follow_up = FollowUp.OURS
            if batch.kept:
                self._slow_delivered(batch, create.event_id)
        current = self.handoffs.current if self.handoffs is not None else None
        if current is not None and current.status is HandoffStatus.UPDATING and any(
                batch.response_id == current.response_id for batch in due):
            current.create_event_id = create.event_id     # the transition's response: the new agent's first words
        return create

    # ---------------------------------------------------- usage and budget

    @property
    def budget_wake(self) -> float:
        """When the budget's course wants a ``Timer`` (math.inf: never)."""
        end = self.meter.end_at
        return end if end is not None and not self._budget_ended else math.inf

    def _count_usage(self, rid: str, usage: object) -> None:
        """A response.done's usage: record, feed, metrics; then the budget."""
        meter = self.meter
        if usage is None:     # nothing reported (the service always reports; an old peer may not; Live's words)
            self._farewell_heard(rid)
            return
        entry, malformed = meter.count(rid, usage)
        if malformed and self.log_budget.allow():
            self._log(LogLevel.WARNING, "usage.malformed", response_id=rt.clip(rid, PEER_STRING_MAX),
                      fields=[rt.clip(f, PEER_STRING_MAX) for f in malformed[:8]])
        line = meter.line(entry)
        self._record(RecordKind.USAGE, **line)
        if self.publishing():
            self._emit(Publish(PublishKind.USAGE, {**line, "call": meter.totals()}))
        self._emit(CountUsage(meter.model, line["tokens"], entry.cost_usd))
        if meter.prices is None:
            self._warn_unpriced(meter.model)
        self._farewell_heard(rid)
        self._check_budget()

    def _warn_unpriced(self, model: str) -> None:
        """Once a call: a budget is set but ``model``'s use has no price, so
        no budget can stop the call (its cost is unknown)."""
        meter = self.meter
        if meter.budgeted and not meter.unpriced_logged:
            meter.unpriced_logged = True
            self._log(LogLevel.WARNING, "usage.unpriced", model=rt.clip(model, PEER_STRING_MAX),
                      budget_usd=meter.budget_usd)

    def _farewell_heard(self, rid: str) -> None:
        """The farewell's response ended: the call ends after the grace."""
        farewell = self.creates.get(self.meter.farewell_event_id or "")
        if (farewell is not None and farewell.response_id == rid and farewell.result == CreateResult.SENT
                and self.meter.farewell_done(self._now)):
            self._emit(WakeAt(self.budget_wake))

    def _count_audio(self, usage: Any) -> None:
        """A Live session's cumulative seconds of audio: what they add is
        recorded, priced, added to the day's total; then the budget."""
        meter = self.meter
        added = meter.count_audio(getattr(usage, "seconds", None))
        if added <= 0:
            return
        line = meter.audio_line(added)
        self._record(RecordKind.AUDIO_USAGE, **line)
        self._emit(CountUsage(line["model"], {}, meter.audio.cost_of(added) if meter.audio else None))
        if line["cost_usd"] is None:       # the Live model has no per-minute price
            self._warn_unpriced(line["model"])
        self._check_budget()
        if meter.state == BudgetState.REACHED:
            self._maybe_follow_up()     # no response.done brings the farewell's chance: this is one

    def _check_budget(self) -> None:
        meter = self.meter
        if meter.budget_reached_now(self._now):
            cost = meter.usage.cost_usd
            self._log(LogLevel.INFO, "call.budget_spent", budget_usd=meter.budget_usd, cost_usd=round(cost or 0.0, 6))
            self._record(RecordKind.BUDGET, budget_usd=meter.budget_usd, cost_usd=round(cost or 0.0, 6))
            self._emit(WakeAt(self.budget_wake))

    def _farewell(self) -> None:
        """Past the budget: ask the model, once, to say goodbye (after every
        finished batch's outputs are written; a refused or lost farewell is
        asked again)."""
        meter = self.meter
        if meter.state == BudgetState.FAREWELL:
            if not self._parting_refused(meter.farewell_event_id):
                return
            meter.state = BudgetState.REACHED
        if meter.state != BudgetState.REACHED:
            return
        event_id = self._ask_parting_words(FAREWELL, why="budget_spent")
        if event_id is not None:
            meter.state = BudgetState.FAREWELL
            meter.farewell_event_id = event_id

    def _parting_refused(self, event_id: str | None) -> bool:
        """Whether the parting words' ``response.create`` (the budget's
        farewell, the idle goodbye) came back unsent: refused or lost, so
        they are asked again."""
        sent = self.creates.get(event_id or "")
        return sent is not None and sent.result != CreateResult.SENT

    def _ask_parting_words(self, response: dict[str, Any], *, why: str) -> str | None:
        """Send the ``response.create`` of parting words (or an
        acknowledgement) once every finished batch's outputs are written
        (outputs first: the conversation stays consistent); its event id, or
        None while outputs are still due. An acknowledged batch still waiting
        for its slow calls does not hold them up (it is spoken later)."""
        due = []
        for batch in self._finished_batches():
            if self._outputs_written(batch):
                due.append(batch)
            elif not batch.kept:
                return None
        event = rt.response_create(response)
        create = self._create_for(event, due)
        self._log(LogLevel.INFO, "response.create", event_id=create.event_id, epoch=self.epoch, batches=create.batches,
                  why=why)
        self._emit(Send(event))
        return create.event_id

    def _budget_timer(self, now: float) -> None:
        if not self._budget_ended and self.meter.due(now):
            self._budget_ended = True
            self._emit(EndCall(EndReason.BUDGET))

    # ---------------------------------------------------------- idle calls

    def _on_idle_timeout(self) -> None:
        """The service's idle timeout fired (``idle_timeout_ms`` of silence).
        The service answers it with a response of its own (the SDK's
        ``idle_timeout_ms``: "a model response will be triggered
        automatically"): the first is the check-in, we send nothing. A second
        with no user speech in between: our goodbye, then the call ends."""
        if self.idle is not IdleCourse.TALKING:
            return          # already saying goodbye
        self.idle_timeouts += 1
        then = "check_in" if self.idle_timeouts == 1 else "goodbye"
        self._record(RecordKind.IDLE, timeouts=self.idle_timeouts, then=then)
        self._log(LogLevel.INFO, "call.idle_timeout", timeouts=self.idle_timeouts, then=then, epoch=self.epoch)
        if self.idle_timeouts < 2:
            return
        self.idle = IdleCourse.GOODBYE_DUE
        self._goodbye_after = self._now + SERVICE_ANSWER_WAIT_S
        self._idle_end_at = self._now + IDLE_GOODBYE_MAX_S
        self._emit(WakeAt(self._goodbye_after))

    def _cancel_second_check_in(self, rid: str) -> None:
        """The service's own answer to the second timeout would ask whether
        the user is still there once more, right before our goodbye: it is
        cancelled (the user hears one check-in, then the goodbye, which
        follows this response's end as before)."""
        self._log(LogLevel.INFO, "call.idle_check_in_cancelled", response_id=rt.clip(rid, PEER_STRING_MAX),
                  epoch=self.epoch)
        self._emit(Send(rt.response_cancel(rid)))

    @property
    def idle_wake(self) -> float:
        """When a silent call wants a ``Timer`` (math.inf: never): the
        goodbye's wait for the service's answer, then the call's end."""
        # a wait already over asks for no wake-up (the shell would wake at once, again and again)
        if self.idle is IdleCourse.GOODBYE_DUE and self._goodbye_after > -math.inf:
            return min(self._goodbye_after, self._idle_end_at)
        return self._idle_end_at if self.idle is not IdleCourse.ENDED else math.inf

    def _idle_timer(self) -> None:
        if self.idle is IdleCourse.ENDED:
            return
        if self._now >= self._idle_end_at:
            self.idle = IdleCourse.ENDED
            self._emit(EndCall(EndReason.USER_IDLE))
        elif self.idle is IdleCourse.GOODBYE_DUE and self._now >= self._goodbye_after > -math.inf:
            self._goodbye_after = -math.inf
            self._maybe_follow_up()

    def _say_idle_goodbye(self) -> None:
        """Ask the model, once, to say goodbye (after every finished batch's
        outputs are written; a refused or lost goodbye is asked again)."""
        if self.idle is IdleCourse.GOODBYE:
            if not self._parting_refused(self._idle_goodbye):
                return
            self.idle = IdleCourse.GOODBYE_DUE
        if self.idle is not IdleCourse.GOODBYE_DUE or self._now < self._goodbye_after:
            return
        event_id = self._ask_parting_words(IDLE_GOODBYE, why="user_idle")
        if event_id is not None:
            self.idle = IdleCourse.GOODBYE
            self._idle_goodbye = event_id

    def _idle_goodbye_done(self, rid: str) -> None:
        """The goodbye's response ended: the call ends once its audio played out."""
        sent = self.creates.get(self._idle_goodbye or "")
        if sent is None or sent.response_id != rid or sent.result != CreateResult.SENT:
            return
        self.idle = IdleCourse.ENDING
        self._idle_end_at = min(self._idle_end_at, self._now + GRACE_S)
        self._emit(WakeAt(self._idle_end_at))

    def _user_back(self) -> None:
        """The user spoke: the silence is over (a goodbye in progress is
        dropped, the call goes on)."""
        self.idle_timeouts = 0
        if self.idle is not IdleCourse.ENDED:
            self.idle = IdleCourse.TALKING
            self._goodbye_after = self._idle_end_at = math.inf

    # --------------------------------------------------------- slow tools

    @property
    def slow_wake(self) -> float:
        """When the slow calls want a ``Timer`` (math.inf: never): the next
        acknowledgement due, or the end of the wait for the service's answer
        to the user's turn while a kept answer waits to be spoken."""
        # a time already past asks for no wake-up (the shell would wake at once, again and again)
        now = self._now
        wake = min((batch.ack_at for batch in self._ack_due.values() if batch.ack_at > now), default=math.inf)
        if (self._kept or self._ack_due) and self._floor_held_until > now:
            wake = min(wake, self._floor_held_until)
        for batch in self._progress_due.values():
            if now < batch.progress_at < wake:
                wake = batch.progress_at
        return wake

    def _slow_watch(self, batch: Batch) -> None:
        """A completed response with tool calls: if its calls have not all
        answered ``ack_after_s`` from now, they may be acknowledged."""
        after = self.slow_tools.ack_after_s
        if after <= 0 or batch.slow is not None or batch.epoch < self.epoch or self._outputs_written(batch):
            return
        batch.slow = SlowCourse.ACK_DUE
        batch.ack_at = self._now + after
        self._ack_due[batch.response_id] = batch
        self._emit(WakeAt(batch.ack_at))

    def _acknowledge_slow(self) -> None:
        """At a quiet moment (the caller checked: connected, no response
        active or asked for, the floor free, nothing else due), ask for the
        acknowledgement of one batch whose calls are still unanswered
        ``ack_after_s`` after its response ended: only when every one of them
        may defer (a write answers before anything is said about it). Once
        asked for, the batch is kept: a later turn does not supersede it, its
        reads are not cancelled, and its outputs are spoken at the next quiet
        moment after they are written (``_maybe_follow_up``)."""
        for rid, batch in list(self._ack_due.items()):
            if batch.follow_up is not None or batch.epoch < self.epoch or self._outputs_written(batch):
                del self._ack_due[rid]          # decided, superseded, or answered in time
                batch.slow = None
                continue
            if self._now < batch.ack_at:
                continue
            waiting = [c for c in batch.calls if self.calls[c].state in UNANSWERED]
            if not waiting or not all(self._may_defer(self.calls[c].name) for c in waiting):
                continue    # answered (its outputs go out now), or a write still runs: asked again later
            if len(self._kept_calls) + len(waiting) > self.slow_tools.max_in_flight:
                if not batch.bounded:
                    batch.bounded = True
                    self._log(LogLevel.INFO, "tool.ack_bounded", response_id=rt.clip(rid, PEER_STRING_MAX),
                              tool_calls=len(waiting), in_flight=len(self._kept_calls),
                              max_in_flight=self.slow_tools.max_in_flight)
                continue    # too many slow calls already: it waits as any batch (asked again when fewer)
            batch.slow = SlowCourse.KEPT        # first: the acknowledgement does not wait for its outputs
            event_id = self._ask_parting_words(TOOL_ACK, why="tool_ack")
            if event_id is None:
                batch.slow = SlowCourse.ACK_DUE
                return
            del self._ack_due[rid]
            self._kept[rid] = batch
            self._kept_calls.update(waiting)
            batch.ack_t = self._now
            waited_ms = round((self._now - batch.done_t) * 1000, 1) if batch.done_t is not None else None
            self._record(RecordKind.SLOW_ACK, response_id=rid, tool_call_ids=waiting, event_id=event_id,
                         waited_ms=waited_ms)
            self._log(LogLevel.INFO, "tool.acknowledged", response_id=rt.clip(rid, PEER_STRING_MAX),
                      tool_calls=len(waiting), epoch=self.epoch)
            return

    # ------------------------------------------------- interrupted, truthful

    @staticmethod
    def _keep_recent(kept: dict[str, Any], key: str | None, value: Any) -> None:
        if key:
            kept[key] = value
            if len(kept) > HEARD_ITEMS_KEPT:
                del kept[next(iter(kept))]

    def _cut_short(self, response: Any) -> None:
        """A response ended ``cancelled`` (the user barged in, or our
        cancel): a ``heard`` line says what the user heard of it (its
        messages' transcripts as far as they came, cut where the service
        says it truncated the audio) and which writes it reported on or made
        were done and which not; when there are such writes, one system item
        tells the model the same (once they have all answered)."""
        rid = response.id or ""
        heard = [{"item_id": item_id, "text": self._said.get(item_id),
                  "audio_end_ms": self._truncated_at.get(item_id)} for item_id in self.spoken.messages_of(rid)]
        batch = self.batches.get(rid)
        reported = batch.reports if batch is not None and batch.origin == Origin.OURS else []
        writes = [c for r in [rid, *reported] if r in self.batches for c in self.batches[r].calls
                  if self._effect_of(self.calls[c].name) == WRITE]
        fields: dict[str, Any] = {"response_id": rid, "turn": self.turn, "heard": heard}
        self._reports_due[rid] = (fields, writes)
        self._report_if_settled(rid)

    def _report_if_settled(self, rid: str) -> None:
        fields, writes = self._reports_due[rid]
        calls = [self.calls[c] for c in writes]
        if any(call.state == ToolCallState.RUNNING for call in calls):
            return      # a write still running: it finishes, then the report says how
        del self._reports_due[rid]
        done = [c for c in calls if c.outcome in (ToolOutcome.OK, ToolOutcome.REPLAYED) and not c.synthetic]
        not_done = [c for c in calls if c not in done]
        self._record(RecordKind.HEARD, **fields, done=[c.tool_call_id for c in done],
                     not_done=[c.tool_call_id for c in not_done])
        if calls and self.connected:
            self._log(LogLevel.INFO, "call.truthful_report", response_id=rt.clip(rid, PEER_STRING_MAX),
                      done=len(done), not_done=len(not_done), epoch=self.epoch)
            self._emit(Send(rt.system_message(truthful_report(done, not_done))))

    def _reports_waiting_on(self, call: ToolCall) -> None:
        """A write answered: the reports of cut replies that waited for it go out."""
        for rid in [r for r, (_, writes) in self._reports_due.items() if call.tool_call_id in writes]:
            self._report_if_settled(rid)

    def _on_tool_progress(self, note: ToolProgress) -> None:
        """A running call's source reported progress: the client feed shows
        it; past ``progress_after_s`` of the call's run, an acknowledged
        batch gets one progress line (at a quiet moment, as the
        acknowledgement)."""
        call = self.calls.get(note.tool_call_id)
        if call is None or call.state != ToolCallState.RUNNING:
            return
        total = note.total if note.total is not None and note.total > 0 else None
        call.progress = (note.progress, total)
        if self.publishing():
            message = rt.clip(note.message, PROGRESS_MESSAGE_MAX) if isinstance(note.message, str) else None
            self._emit(Publish(PublishKind.TOOL_PROGRESS, {"tool": call.name, "tool_call_id": call.tool_call_id,
                                                           "epoch": call.epoch, "progress": note.progress,
                                                           "total": total, "message": message}))
        after = self.slow_tools.progress_after_s
        batch = self.batches[call.response_id]
        if after <= 0 or batch.progress_spoken or batch.follow_up is not None:
            return
        if batch.response_id not in self._progress_due:
            batch.progress_at = (call.started_t if call.started_t is not None else self._now) + after
            self._progress_due[batch.response_id] = batch
            if batch.progress_at > self._now:
                self._emit(WakeAt(batch.progress_at))
        self._maybe_follow_up()

    def _speak_progress(self) -> None:
        """At a quiet moment (the caller checked, as for an acknowledgement),
        ask for one progress line of a kept batch whose call has run past
        ``progress_after_s`` and reported progress, once per batch."""
        for rid, batch in list(self._progress_due.items()):
            running = [self.calls[c] for c in batch.calls if self.calls[c].state == ToolCallState.RUNNING]
            if batch.follow_up is not None or batch.progress_spoken or not running:
                del self._progress_due[rid]        # answered, decided or superseded: nothing to say
                continue
            if not batch.kept or self._now < batch.progress_at:
                continue        # only after the acknowledgement (the user was told to wait)
            reported = [c for c in running if c.progress is not None]
            if not reported:
                continue
            call = reported[-1]
            assert call.progress is not None
            progress, total = call.progress
            event_id = self._ask_parting_words(progress_response(progress, total), why="tool_progress")
            if event_id is None:
                return
            del self._progress_due[rid]
            batch.progress_spoken = True
            self._record(RecordKind.SLOW_PROGRESS, response_id=rid, tool_call_id=call.tool_call_id,
                         progress=progress, total=total, event_id=event_id)
            return

    def _slow_answered(self, call: ToolCall) -> None:
        """An acknowledged call answered (or was abandoned): the wait is over."""
        if call.tool_call_id not in self._kept_calls:
            return
        self._kept_calls.discard(call.tool_call_id)
        batch = self.batches[call.response_id]
        waited_ms = round((self._now - batch.ack_t) * 1000, 1) if batch.ack_t is not None else None
        self._record(RecordKind.SLOW_OUTPUT, tool_call_id=call.tool_call_id, response_id=call.response_id,
                     waited_ms=waited_ms, after_end=self.over)

    def _slow_delivered(self, batch: Batch, event_id: str) -> None:
        """A kept batch's follow-up is asked for: its answers are spoken."""
        if self._kept.pop(batch.response_id, None) is None:
            return
        since_ms = round((self._now - batch.ack_t) * 1000, 1) if batch.ack_t is not None else None
        self._record(RecordKind.SLOW_DELIVERY, response_id=batch.response_id, event_id=event_id,
                     since_ack_ms=since_ms, epoch=self.epoch)

    # ----------------------------------------------------- the time limit

    def schedule_wrap_up(self, *, at: float, ends_at: float) -> None:
        """The shell's time limit: the call ends at ``ends_at``; at ``at``
        the assistant is asked to say so (``wrap_up_wake``)."""
        self.wrap_up_at, self.ends_at = at, ends_at

    @property
    def wrap_up_wake(self) -> float:
        """When the wrap-up wants a ``Timer`` (math.inf: never)."""
        return self.wrap_up_at if self.wrap_up is WrapUp.PENDING else math.inf

    def _wrap_up_due(self) -> None:
        self.wrap_up = WrapUp.DUE
        left_s = round(self.ends_at - self._now, 3)
        self._record(RecordKind.WRAP_UP, left_s=left_s)
        self._log(LogLevel.INFO, "call.wrap_up", left_s=left_s, epoch=self.epoch)
        self._maybe_follow_up()

    def _wrap_up_said(self) -> bool:
        """Whether the wrap-up is sent (True), or asked for now: at a quiet
        moment (no response active, no tool run in flight: a write under way
        is finished and answered first, every finished batch's outputs
        written), carrying the finished batches' follow-up. A refused or lost
        wrap-up is asked again."""
        if self.wrap_up is WrapUp.SENT:
            if not self._parting_refused(self._wrap_up_event):
                return True
            self.wrap_up = WrapUp.DUE
        if self._running:
            return False
        minutes_left = max(1, round((self.ends_at - self._now) / 60))
        event_id = self._ask_parting_words(wrap_up_response(minutes_left), why="wrap_up")
        if event_id is not None:
            self.wrap_up = WrapUp.SENT
            self._wrap_up_event = event_id
        return False

    # ------------------------------------------------------------- record

    # ---------------------------------------------------------- phone calls

    @property
    def _phone(self) -> PhoneLine | None:
        return self.context.phone if self.context is not None else None

    @property
    def phone_wake(self) -> float:
        """When a phone call's transfer or PIN refusal wants a ``Timer`` (math.inf: never)."""
        return min(math.inf if self._transferred else self._transfer_at,
                   math.inf if self._refused_ended else self._refused_end_at)

    def _start_our_own(self, call: ToolCall) -> None:
        """Start a call this protocol answers itself, never the executor (the
        phone line's, a handoff): started in this step, in the record."""
        advance(call, ToolCallEvent.START)
        if not call.recovered:
            call.turn = self.turn
        call.run = ToolRun.OWN
        call.started_t = self._now
        self._record_started(call)

    def _answer_on_the_line(self, call: ToolCall, answer: ToolAnswer) -> None:
        """A tool call the phone line answers itself (the PIN is due, or the
        transfer): started and finished in this step, never at the executor."""
        call.held = None
        self._start_our_own(call)
        self._log(LogLevel.INFO, "call.tool_on_the_line", tool=call.name, tool_call_id=call.tool_call_id,
                  outcome=answer.outcome, epoch=call.epoch)
        self._finish(call, ToolFinished(call.tool_call_id, call.name, answer.output, answer.outcome))
        if answer.transfer:
            self._ask_transfer("tool")

    def _on_keypad(self, key: Any) -> None:
        phone = self._phone
        if phone is None or not isinstance(key, str):
            return
        keyed = phone.key(key[:1])
        if keyed == Keyed.NOTHING:
            return
        self._log(LogLevel.INFO, "call.keypad", keyed=keyed, tries_left=phone.left, epoch=self.epoch)
        if keyed == Keyed.TRANSFER:
            self._ask_transfer("keypad")
            return
        self._record(RecordKind.PHONE, event=f"pin_{keyed}", tries_left=phone.left)
        if keyed == Keyed.ACCEPTED:
            self._ask_parting_words(PIN_ACCEPTED, why="pin_accepted")
        elif keyed == Keyed.WRONG:
            self._ask_parting_words(wrong_pin_words(phone.left), why="pin_wrong")
        else:
            self._refused_parting = self._ask_parting_words(REFUSED_WORDS, why="pin_refused")
            self._refused_end_at = self._now + REFUSED_PARTING_S
            self._emit(WakeAt(self._refused_end_at))

    def _ask_transfer(self, why: str) -> None:
        """The caller asked for a person: the model says it is transferring
        (the tool's output asks it to; for the keypad, a ``response.create``),
        then the call is referred (``_phone_response_done``), at the latest
        after ``TRANSFER_SPEAK_S``."""
        phone = self._phone
        if phone is None or phone.transfer_to is None or self._transfer_at < math.inf:
            return
        self._record(RecordKind.PHONE, event="transfer", target=phone.transfer_to, why=why)
        self._log(LogLevel.INFO, "call.transfer_asked", why=why, epoch=self.epoch)
        self._transfer_at = self._now + TRANSFER_SPEAK_S
        self._transfer_next = True
        if why == "keypad":
            self._ask_parting_words(TRANSFER_WORDS, why="transfer")
        self._emit(WakeAt(self._transfer_at))

    def _phone_response_done(self, rid: str) -> None:
        if rid == self._transfer_response:
            self._transfer_now()
        parting = self.creates.get(self._refused_parting or "")
        if parting is not None and parting.response_id == rid and not self._refused_ended:
            self._refused_end_at = min(self._refused_end_at, self._now + GRACE_S)
            self._emit(WakeAt(self._refused_end_at))

    def _transfer_now(self) -> None:
        phone = self._phone
        if self._transferred or phone is None or phone.transfer_to is None:
            return
        self._transferred = True
        self._log(LogLevel.INFO, "call.transfer", epoch=self.epoch)
        self._emit(Refer(phone.transfer_to))

    def _phone_timer(self) -> None:
        if self._now >= self._transfer_at:
            self._transfer_now()
        if self._now >= self._refused_end_at and not self._refused_ended:
            self._refused_ended = True
            self._emit(EndCall(EndReason.PIN_REFUSED))

    def _record_started(self, call: ToolCall) -> None:
        """The ``tool_started`` line: what a restart needs to answer the call
        (arguments only for reads, which it may run again)."""
        effect = self._effect_of(call.name)
        fields: dict[str, Any] = {"tool_call_id": call.tool_call_id, "tool": call.name,
                                  "response_id": call.response_id, "epoch": call.epoch, "turn": call.turn,
                                  "effect": effect}
        if effect == READ:
            fields["arguments"] = call.arguments
        self._record(RecordKind.TOOL_STARTED, **fields)

    def _record_settled(self, call: ToolCall) -> None:
        """The one ``tool_call`` line of a call (when it settled, or at the end)."""
        if not call.recorded:
            call.recorded = True
            self._record(RecordKind.TOOL_CALL, **call.record_fields())

    # ------------------------------------------------------------ handoffs
    # The rules are handoff.py's (its module doc); these hooks keep them in
    # the call's steps and turn them into effects.

    def _handoff_called(self, call: ToolCall, batch: Batch, target: str) -> None:
        """The model called ``handoff.<target>`` with final arguments: it is
        not the executor's; it waits for its batch (``_maybe_hand_off``), or
        is refused at once when it cannot be carried out."""
        assert self.handoffs is not None and self.context is not None and self.context.agent is not None
        self._start_our_own(call)
        in_charge = self.context.agent
        why = self.handoffs.refusal(target, batch.agent, in_charge)
        if why is not None:
            self._handoff_refused(call, batch.agent or in_charge, target, why)
            return
        transition = self.handoffs.claim(call.tool_call_id, call.name, call.response_id, in_charge, target)
        self._log(LogLevel.INFO, "call.handoff_called", source=transition.source, target=target,
                  tool_call_id=call.tool_call_id, epoch=self.epoch)

    def _handoff_refused(self, call: ToolCall, source: str, target: str, why: HandoffRefusal) -> None:
        """A handoff call not carried out: its output says why (a refused
        one never touches the transition in flight)."""
        assert self.context is not None
        self._record(RecordKind.HANDOFF, tool_call_id=call.tool_call_id, tool=call.name, response_id=call.response_id,
                     status=HandoffStatus.REFUSED, why=why, **{"from": source, "to": target})
        self._log(LogLevel.INFO, "call.handoff_refused", source=source, target=target, why=why, epoch=self.epoch)
        if why is HandoffRefusal.RESPONSE_CUT:
            call.outcome = ToolOutcome.CANCELLED
            self._abandon(call)
            return
        self._finish(call, ToolFinished(call.tool_call_id, call.name,
                                        refusal_output(why, source, target, self.context.agent),
                                        ToolOutcome.REJECTED))

    def _maybe_hand_off(self) -> None:
        """Start the transition in flight once its batch is complete and
        every other output of it is written (business effects first); note
        a transition with no words of its own (its batch superseded)."""
        assert self.handoffs is not None
        current = self.handoffs.current
        if current is None:
            return
        batch = self.batches[current.response_id]
        if current.status is HandoffStatus.CALLED:
            self._start_transition(current, batch)
        elif (current.status is HandoffStatus.UPDATING and current.create_event_id is None
              and current.spoken_by is None and not current.completed
              and batch.follow_up not in (None, FollowUp.OURS)):
            current.completed = True    # superseded: the user's turn is answered by the new agent
            self._settle_handoff(current)

    def _start_transition(self, transition: Transition, batch: Batch) -> None:
        assert self.handoffs is not None and self.context is not None
        if not self.connected or self.over or batch.status is None:
            return      # its response is still on: more calls of the batch may come
        call = self.calls[transition.tool_call_id]
        if batch.status not in ENDED_OK:
            self.handoffs.current = None
            self._handoff_refused(call, transition.source, transition.target, HandoffRefusal.RESPONSE_CUT)
            return
        for tool_call_id in batch.calls:
            state = self.calls[tool_call_id].state
            if tool_call_id != transition.tool_call_id and (state not in ANSWERED or state in UNSENT):
                return  # a business output of the batch is not written yet: it goes first
        # ownership is claimed in this step, before the first send: the new agent is in charge
        update = self.context.hand_to(transition.target)
        transition.status = HandoffStatus.UPDATING
        transition.update_event_id = update["event_id"]
        self.handoffs.sent_update(update["event_id"])
        self._emit(Send(update))
        self._record(RecordKind.HANDOFF, **transition.fields(), status=HandoffStatus.UPDATING)
        self._log(LogLevel.INFO, "call.handoff", source=transition.source, target=transition.target,
                  event_id=transition.update_event_id, epoch=self.epoch)
        self._publish_agent(transition.target, transition.source, HandoffStatus.UPDATING)
        self._finish(call, ToolFinished(call.tool_call_id, call.name,
                                        handed_output(transition.source, transition.target), ToolOutcome.OK))

    def _taking_over_words(self, due: list[Batch]) -> dict[str, Any] | None:
        """The response parameters of the transition's own response (the new
        agent speaks first, briefly), when ``due`` carries its batch."""
        assert self.handoffs is not None and self.context is not None and self.context.agents is not None
        current = self.handoffs.current
        if current is None or current.status is not HandoffStatus.UPDATING:
            return None
        if not any(batch.response_id == current.response_id for batch in due):
            return None
        instructions = self.context.instructions()
        words = taking_over(self.context.agents.agent(current.target), current.source)
        return {"instructions": f"{instructions}\n\n{words}" if instructions is not None else words}

    def _handoff_response_created(self, event_id: str, rid: str) -> None:
        """Our ``response.create`` started ``rid``: the transition's own
        response is known by it from now on; the words of a transition that
        failed meanwhile are cancelled (they speak as the agent refused)."""
        if self.handoffs is None:
            return
        current, failed = self.handoffs.current, self.handoffs.failure_due
        if current is not None and current.create_event_id == event_id:
            current.spoken_by = rid
        elif failed is not None and failed.create_event_id == event_id:
            failed.spoken_by = rid
            self._emit(Send(rt.response_cancel(rid)))

    def _handoff_carried_by(self, batch: Batch, started: Batch) -> None:
        """A response the model started after the handoff's output was
        confirmed (so after its update: the service applies our events in
        order) carries its batch forward: it is the new agent's first words,
        and its end completes the transition."""
        current = self.handoffs.current if self.handoffs is not None else None
        if (current is not None and current.status is HandoffStatus.UPDATING
                and current.response_id == batch.response_id and current.spoken_by is None):
            current.spoken_by = started.response_id

    def _handoff_response_done(self, rid: str) -> None:
        """A response ended: the transition's completion only when it is its own."""
        assert self.handoffs is not None
        current = self.handoffs.current
        if current is not None and current.spoken_by == rid:
            current.completed = True
            self._settle_handoff(current)

    def _on_session_updated(self) -> None:
        if self.handoffs is None:
            return
        event_id = self.handoffs.acknowledged()
        current = self.handoffs.current
        if current is not None and event_id is not None and event_id == current.update_event_id:
            current.acked = True
            self._settle_handoff(current)

    def _settle_handoff(self, transition: Transition) -> None:
        """Acknowledged and completed, in either order: the transition is over."""
        assert self.handoffs is not None
        if not (transition.acked and transition.completed) or self.handoffs.current is not transition:
            return
        transition.status = HandoffStatus.DONE
        self.handoffs.current = None
        self._record(RecordKind.HANDOFF, **transition.fields(), status=HandoffStatus.DONE)
        self._log(LogLevel.INFO, "call.handoff_done", source=transition.source, target=transition.target,
                  epoch=self.epoch)

    def _handoff_update_refused(self, event_id: str, code: str | None) -> None:
        """The service refused a ``session.update`` of ours: a transition's
        puts the previous agent back in charge (the service never applied
        it), cancels the new agent's words if they began, and the agent
        still in charge says so at the next quiet moment."""
        assert self.handoffs is not None and self.context is not None
        current = self.handoffs.current
        if current is None or current.update_event_id != event_id:
            return          # a selection's or the settings' update: logged, as before
        self.context.agent = current.source
        current.status = HandoffStatus.FAILED
        self.handoffs.current = None
        self.handoffs.failure_due = current
        self._record(RecordKind.HANDOFF, **current.fields(), status=HandoffStatus.FAILED,
                     why=rt.clip(code, PEER_STRING_MAX))
        self._log(LogLevel.WARNING, "call.handoff_failed", source=current.source, target=current.target,
                  code=rt.clip(code, PEER_STRING_MAX), epoch=self.epoch)
        self._publish_agent(current.source, current.target, HandoffStatus.FAILED)
        if current.spoken_by is not None and current.spoken_by in self.active:
            self._emit(Send(rt.response_cancel(current.spoken_by)))
        self._maybe_follow_up()

    def _say_handoff_failed(self) -> None:
        """The agent still in charge says that handing over did not work (once)."""
        assert self.handoffs is not None and self.context is not None and self.context.agents is not None
        failed = self.handoffs.failure_due
        assert failed is not None
        instructions = self.context.instructions()
        words = handoff_failed(self.context.agents.agent(failed.source), failed.target)
        text = f"{instructions}\n\n{words}" if instructions is not None else words
        if self._ask_parting_words({"instructions": text}, why="handoff_failed") is not None:
            self.handoffs.failure_due = None

    def _publish_agent(self, agent: str | None, previous: str | None, status: str) -> None:
        """The agent in charge, for the client feed (the console shows its
        name). Published whether or not anyone listens yet: the feed keeps
        it for a subscriber that comes later (once per call and handoff)."""
        self._emit(Publish(PublishKind.AGENT, {"agent": agent, "previous": previous, "status": status}))

    def _handoff_connected(self) -> None:
        """A socket is up: a transition's update that fell in a drop
        unacknowledged goes again (the same agent: sending it twice is harmless)."""
        assert self.handoffs is not None and self.context is not None
        current = self.handoffs.current
        if current is None or not current.resend:
            return
        current.resend = False
        update = self.context.hand_to(current.target)
        current.update_event_id = update["event_id"]
        self.handoffs.sent_update(update["event_id"])
        self._emit(Send(update))

    # ----------------------------------------------------- linked context
    # The rules are CallContext's (call_context.py); these hooks only turn
    # its answers into effects.

    def _context_connected(self) -> None:
        if self.context is None:
            return
        quiet = not self.active and self.create_inflight is None and not self.batches and self.turn == 0
        events, dropped = self.context.on_connected(quiet=quiet)
        for event in events:
            if event["event_id"] == self.context.greeting_event_id:
                # ours like any response.create: its response.created is ours,
                # and no other create of ours goes out before it
                create = self._create_for(event, [])
                self._log(LogLevel.INFO, "call.greeting", event_id=create.event_id, epoch=self.epoch)
            elif self.handoffs is not None and event["type"] == "session.update":
                self.handoffs.sent_update(event["event_id"])
            self._emit(Send(event))
        if dropped is not None:
            self._log(LogLevel.INFO, "call.greeting_dropped", why=dropped, epoch=self.epoch)

    def _context_tool_finished(self, call: ToolCall, result: ToolFinished) -> None:
        """A ``journal.select`` output the model gets: apply the selection,
        send the new instructions before the output, tell the client."""
        if self.context is None:
            return
        chosen = self.context.on_tool_finished(call.name, result.output, result.outcome)
        if chosen is None:
            return
        views = self.context.views()
        self._record(RecordKind.SELECTION, tool_call_id=call.tool_call_id, **views)
        self._log(LogLevel.INFO, "call.selection", kind=chosen.kind, epoch=self.epoch)
        if self.publishing():
            self._emit(Publish(PublishKind.SELECTION, {"tool_call_id": call.tool_call_id, **views}))
        update = self.context.take_update() if self.connected else None
        if update is not None:
            if self.handoffs is not None:
                self.handoffs.sent_update(update["event_id"])
            self._emit(Send(update))


_INPUT_HANDLERS: dict[type, Callable[[CallProtocol, Any], None]] = {
    Received: CallProtocol._in_received,
    Written: CallProtocol._in_written,
    ToolFinished: CallProtocol._on_tool_finished,
    ToolAbandoned: CallProtocol._on_tool_abandoned,
    Connected: CallProtocol._in_connected,
    Disconnected: CallProtocol._in_disconnected,
    Dropped: CallProtocol._in_dropped,
    Timer: CallProtocol._in_timer,
    Recovered: CallProtocol._on_recovered,
    WrittenAtClose: CallProtocol._in_written_at_close,
    ToolProgress: CallProtocol._on_tool_progress,
}
