"""Messages between actors. Frozen dataclasses; a request that needs an answer
carries its own ``reply`` channel (a ``trio.MemorySendChannel`` of size 1).

``ask`` is the one way to send a request and wait for its answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, TypeAlias, TypeVar

import trio

from voiceactors.call.state import ToolOutcome

if TYPE_CHECKING:
    from voiceactors.call.call_context import LinkedContext
    from voiceactors.linked_context.references import Reference
    from voiceactors.tracing import Parent


# --- ToolExecutor ---------------------------------------------------------

#: A progress notification's receiver: ``(progress, total, message)``, never awaited.
ProgressNote: TypeAlias = Callable[[float, "float | None", "str | None"], None]


@dataclass(frozen=True)
class ToolRequest:
    """Run one tool call. The executor answers exactly once on ``reply``."""

    call_id: str          # the live call (rtc_...)
    tool_call_id: str     # the model's function-call ``call_id``
    name: str             # as the model spelled it (dotted or underscore)
    arguments: str        # raw JSON string from the model
    epoch: int            # the call's epoch when the tool call was issued
    turn: int             # the user turn it belongs to (per-turn bounds)
    reply: trio.MemorySendChannel[ToolResult] = field(repr=False, compare=False)
    # the call's current selection: fills the arguments a tool takes from it
    # when the model left them out
    selection: Reference | None = None
    # a voice call's request: with --redis its writes are fenced by the call's
    # lease. False: no call holds it (an MCP client's), claimed unfenced
    fenced_by_call: bool = True
    # called on the trio thread with each progress notification the tool's
    # source sends (MCP ``notifications/progress``: progress, total, message)
    progress: "ProgressNote | None" = field(default=None, repr=False, compare=False)
    # the span its work hangs from (tracing on; voiceactors/tracing): the executor makes it current
    trace: "Parent | None" = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class CancelReads:
    """Cancel the unfinished reads of ``call_id`` issued before ``before_epoch``
    (all of them when None), but those in ``keep`` (tool call ids: reads the
    user was told to wait for, which outlive their turn). Each answers
    ``{"error": "cancelled"}``; started writes are not cancelled."""

    call_id: str
    before_epoch: int | None = None
    keep: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ToolResult:
    call_id: str
    tool_call_id: str
    tool: str             # canonical dotted name, or the raw name when unknown
    output: str           # the JSON string sent as function_call_output
    outcome: ToolOutcome  # ok|error|invalid|rejected|timeout|busy|cancelled|failed|replayed|restarted|auth_expired
    epoch: int
    duration_ms: float = 0.0
    client_events: tuple[dict[str, Any], ...] = ()   # _nav_target / _observer_action for the client


ExecutorMessage: TypeAlias = ToolRequest | CancelReads
"""What the ToolExecutor's inbox carries."""


# --- CallSupervisor -------------------------------------------------------

class ConnectOutcome(StrEnum):
    """The supervisor's answer to ``Connect`` (the values are what logs and
    tests have always seen)."""

    CONNECTED = "connected"       # the call's actor is live (started now, or already)
    AT_CAPACITY = "at_capacity"   # ``settings.max_calls`` live calls already
    REGISTRY_DOWN = "registry_down"   # the shared registry (Redis) did not answer: nothing started


@dataclass(frozen=True)
class Connect:
    """Start (or find) the CallActor for ``call_id``. Reply: a ConnectOutcome."""

    call_id: str
    reply: trio.MemorySendChannel[ConnectOutcome] = field(repr=False, compare=False)
    # the call's linked context, used only when this Connect starts the actor
    context: LinkedContext | None = None


@dataclass(frozen=True)
class CountCalls:
    reply: trio.MemorySendChannel[int] = field(repr=False, compare=False)


class SubscribeRefusal(StrEnum):
    """The supervisor's answer to ``Subscribe`` at a subscriber cap (the
    values are the ``/events`` route's 503 error strings)."""

    TOO_MANY_FOR_CALL = "too many event streams for this call"
    TOO_MANY = "too many event streams"


@dataclass(frozen=True)
class Subscribe:
    """Open the client feed of a live call. Reply: a MemoryReceiveChannel of
    feed events (dicts), None when the call is not live, or a SubscribeRefusal."""

    call_id: str
    reply: trio.MemorySendChannel[trio.MemoryReceiveChannel[dict[str, Any]] | SubscribeRefusal | None] = field(
        repr=False, compare=False)


@dataclass(frozen=True)
class TakeNavHints:
    """Reply: the pending nav hints of ``call_id`` (list of dicts), consumed."""

    call_id: str
    reply: trio.MemorySendChannel[list[dict[str, Any]]] = field(repr=False, compare=False)


@dataclass(frozen=True)
class TakeObserverActions:
    """Reply: the pending observer actions across calls (list of dicts), consumed."""

    reply: trio.MemorySendChannel[list[dict[str, Any]]] = field(repr=False, compare=False)


@dataclass(frozen=True)
class GetDailyUsage:
    """The day's cost against the daily budget. Reply: a ``usage.daily.DailyState``."""

    reply: trio.MemorySendChannel[Any] = field(repr=False, compare=False)


SupervisorMessage: TypeAlias = Connect | CountCalls | Subscribe | TakeNavHints | TakeObserverActions | GetDailyUsage
"""What the CallSupervisor's inbox carries."""


# --- BrainActor -----------------------------------------------------------

@dataclass(frozen=True)
class BrainState:
    instruction: str | None
    refreshed_at: float | None      # trio.current_time() of the last success
    age_s: float | None             # now - refreshed_at
    refreshing: bool
    session_id: str | None = None

    @property
    def ready(self) -> bool:
        return bool(self.instruction)


@dataclass(frozen=True)
class GetBrain:
    """Reply: the current BrainState at once. With ``start=True`` a start (or
    a staleness refresh) is queued when needed, without waiting."""

    reply: trio.MemorySendChannel[BrainState] = field(repr=False, compare=False)
    start: bool = False


@dataclass(frozen=True)
class AwaitReady:
    """Start the brain if needed; reply with the BrainState once an instruction
    exists (the caller bounds the wait with its own deadline)."""

    reply: trio.MemorySendChannel[BrainState] = field(repr=False, compare=False)


@dataclass(frozen=True)
class RefreshBrain:
    """Force a refresh (single flight: joins one in progress). Reply: the new
    BrainState, or an Exception instance when the backend failed."""

    reply: trio.MemorySendChannel[Any] = field(repr=False, compare=False)


@dataclass(frozen=True)
class SummariseCall:
    """Summarise an ended call for the call that continues it (its
    ``transcript``: ``Speaker: words`` lines). Reply: the summary, or None
    when the brain has none to give (no backend that summarises, an error,
    past ``continue_summary_timeout_s``). Asked once per call id: the answer
    is kept and given again."""

    reply: trio.MemorySendChannel[str | None] = field(repr=False, compare=False)
    call_id: str
    transcript: str


BrainMessage: TypeAlias = GetBrain | AwaitReady | RefreshBrain | SummariseCall
"""What the BrainActor's inbox carries."""

Message = TypeVar("Message")


async def ask(inbox: trio.MemorySendChannel[Message], make: Callable[[trio.MemorySendChannel[Any]], Message],
              *, timeout: float) -> Any:
    """Send ``make(reply_channel)`` to ``inbox`` and wait for the one reply.

    Every caller names its deadline (``math.inf`` only where an enclosing
    cancel scope bounds the wait): a forgotten bound would hang a request
    on an actor that never answers.

    Raises ``trio.TooSlowError`` after ``timeout`` seconds and
    ``trio.BrokenResourceError``/``EndOfChannel`` if the actor is gone.
    """
    send, receive = trio.open_memory_channel[Any](1)
    with trio.fail_after(timeout):
        async with receive:
            await inbox.send(make(send))
            return await receive.receive()


async def drain(receive: trio.MemoryReceiveChannel[Message]) -> AsyncIterator[Message]:
    """The messages of an actor's inbox, until it is closed.

    Takes every message already queued before waiting again. A plain
    ``async for`` over a channel passes a scheduling point per message, and
    under load each is a full round of the scheduler: an actor with a busy
    inbox (the executor at hundreds of calls) would fall one round behind per
    message. Handlers must not block, so draining stays bounded by what is
    queued. Cancellation is delivered while waiting for the next message.
    """
    while True:
        try:
            message = receive.receive_nowait()
        except trio.WouldBlock:
            try:
                message = await receive.receive()
            except trio.EndOfChannel:
                return
        except trio.EndOfChannel:
            return
        yield message
