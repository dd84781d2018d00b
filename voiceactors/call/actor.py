"""CallActor: one live call's sideband, from connect to call record.

The actor is the async shell around its ``CallProtocol`` (``protocol.py``,
where every protocol rule lives, with no I/O): it owns the call's transport
(``call/transport.py``: the sideband websocket, or any other connection
behind the same seam), the connect loop, the tool tasks and the call record, feeds the protocol its
inputs (server events, tool results, writes done, connects and drops, the
time) and carries out the effects it returns. Nothing outside touches its
state.

Inside ``run`` it keeps a nursery for its tool tasks (they outlive a dropped
socket), and per connection a reader task and, once a send must wait
(backpressure), a writer task. The reader takes every frame of one read of the
connection at once (``CallTransport.receive_batch``) and hands each to the
protocol in that one step.
An event the protocol sends is written by the task whose step produced it
(the reader, a tool task, the watch) right after that step, when no write is
in progress and nothing is queued; otherwise it joins the writer's queue,
behind what is there. One write at a time (``_write_lock``) and one order
(``_step`` then the queue), so frames never interleave and go out in the
order the protocol produced them. Every input is handled synchronously on
the trio thread and its effects are carried out before the next await, so
each input sees and leaves a consistent state.

Cancellation (trio style): ``run`` is the only entry point; cancelling it is
a graceful stop (see ``run``). No other method of the actor is meant to be
called from outside.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import random
from collections import deque
from urllib.parse import quote
from typing import Any, Callable, Protocol, assert_never

import httpx
import trio
from structlog.typing import FilteringBoundLogger

from voiceactors import metrics, storage
from voiceactors.executor import write_log
from voiceactors.call.call_context import CallContext, LinkedContext, carried_view
from voiceactors.call.record import CallRecord
from voiceactors.call.event_capture import EventCapture
from voiceactors import tracing
from voiceactors.call.turn_latency import Turn
from voiceactors.call.protocol import (
    BLIND_RETRIES, BLIND_RETRY_S, HANDLED_EVENTS, CallInput, CallProtocol, CancelOlderReads, Connected, CountUsage,
    Disconnected, Dropped, Effect, EndCall, EndReason, Log, LogLevel, Measure, Metric, Prefetch, Publish, RateLimits,
    Refer,
    PublishKind, Recovered, RecordLine, PEER_STRING_MAX, Send, SlowTools, StartTool, Timer, ToolAbandoned, ToolFinished,
    ToolProgress,
    WakeAt, Written, WrittenAtClose,
)
from voiceactors.call.state import Batch, ToolCall, ToolOutcome
from voiceactors.call.record_kind import RecordKind
from voiceactors.call.meter import meter_for
from voiceactors.cluster.fence import SendFence
from voiceactors.call.feed import CallFeed
from voiceactors.messages import CancelReads, ExecutorMessage, ToolRequest, ToolResult
from voiceactors.call.recovery import RESTARTED_OUTPUT, PendingCall
from voiceactors.voice_config import ConfigUnreadable
from voiceactors.voice_config import DEFAULT_VOICE_MODEL
from voiceactors.logs import get_logger
from voiceactors.realtime import events as rt
from voiceactors.realtime import tls as client_tls
from voiceactors.call.transport import (
    CallTransport, OpenTransport, TransportBroken, TransportClosed, TransportGone, TransportRefused,
    TransportUnavailable,
)
from voiceactors.realtime.sideband import is_clean_close
from voiceactors.call.arrival import browser_connect
from voiceactors.settings import Settings
from voiceactors.tool_effect import READ, ToolEffect
from voiceactors.tools.registry import lookup

__all__ = ["BLIND_RETRIES", "BLIND_RETRY_S", "AnswerNow", "CallActor", "EndReason", "backoff_delay"]

#: Ends reached with the socket still up: pending tool calls are answered first.
SOCKET_UP_ENDS = frozenset({EndReason.IDLE, EndReason.MAX, EndReason.SHUTDOWN, EndReason.BUDGET,
                            EndReason.AUTH_EXPIRED, EndReason.USER_IDLE, EndReason.PIN_REFUSED})
#: Ends after which the call itself is hung up (the browser is gone, or we stop serving it).
HANGUP_ENDS = frozenset({EndReason.IDLE, EndReason.MAX, EndReason.BUDGET, EndReason.AUTH_EXPIRED,
                         EndReason.USER_IDLE, EndReason.PIN_REFUSED})
#: Close codes of a broken connection (protocol error, bad data, message too
#: big): such a drop always counts toward the reconnect limit.
BROKEN_CLOSE_CODES = frozenset({1002, 1003, 1007, 1009})
#: A connection that lasted this long counts as healthy even without events
#: (a quiet call), so its drop starts the failure count afresh.
HEALTHY_AFTER_S = 30.0
#: A write that cannot finish in this long means the socket is stuck.
SEND_TIMEOUT_S = 10.0

ApiKey = str | None | Callable[[], str | None]


class AnswerNow(Protocol):
    """The executor's in-step answer to a request: its result, or None (send
    it to the inbox). With ``later``, the answer's report (its ``tool.run``
    line) is appended there for the caller to run (``ToolExecutor.answer_now``)."""

    def __call__(self, request: ToolRequest, later: list[Callable[[], None]] | None = None, /) -> ToolResult | None: ...


#: The call's Realtime model (for its prices), or a provider read when the call starts.
ModelName = str | Callable[[], str]


def _is_cancel(exc: BaseException) -> bool:
    """True for Cancelled, or a group holding nothing but Cancelled."""
    if isinstance(exc, BaseExceptionGroup):
        rest = exc.split(trio.Cancelled)[1]
        return rest is None
    return isinstance(exc, trio.Cancelled)


def _tool_effect(name: str) -> ToolEffect | None:
    spec = lookup(name)
    return spec.effect if spec is not None else None


def _tool_may_defer(name: str) -> bool:
    # a name not in our registry is an MCP source's tool (or unknown, answered at once)
    spec = lookup(name)
    return spec is None or spec.may_defer


def backoff_delay(attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Delay before reconnect ``attempt`` (1-based): ``base * 2**(attempt-1)``
    capped at ``cap``, scaled into [50 %, 100 %] by ``rng`` when given (the
    actor seeds it with its call id, so it is deterministic)."""
    delay: float = min(cap, base * (2 ** max(0, attempt - 1)))
    if rng is not None:
        delay *= 0.5 + 0.5 * rng.random()
    return delay


class CallActor:
    """The sideband of one live call.

    ``api_key`` is the standard OpenAI key or a provider called at every
    connect attempt (the key may change in the journal). ``feed`` receives the
    client feed events (None: no feed). ``hangup`` POSTs the Realtime hangup
    at an idle timeout or the maximum duration. ``recovered`` (a rejoin after
    a crash, see ``recovery.py``): the tool calls the crashed run left
    unanswered; this run answers them once its sideband is up. ``context``:
    the call's linked context and first greeting (``call_context.py``).

    Read-only views for callers and tests: ``calls``, ``batches``, ``active``
    and ``epoch`` (the protocol's), ``transport``, ``end_reason``, ``ended_at``,
    ``reconnects``, ``record``. ``open_transport``: how each connect
    attempt opens the call's transport (``call/transport.py``; by default
    the sideband websocket of a browser's connect, ``call/arrival.py``);
    ``hangup_path``: the REST path of its hangup, the arrival's (by default
    Realtime's). ``acknowledges_slow_tools`` False: no slow-tool
    acknowledgement whatever ``tool_ack_after_s`` says (the arrival's
    service speaks its own: a Live call's).
    """

    def __init__(self, settings: Settings, call_id: str, executor_inbox: trio.MemorySendChannel[ExecutorMessage],
                 api_key: ApiKey, feed: CallFeed | None = None, *, hangup: bool = True,
                 recovered: list[PendingCall] | None = None, context: LinkedContext | None = None,
                 model: ModelName = DEFAULT_VOICE_MODEL, on_cost: Callable[[float], None] | None = None,
                 on_record: Callable[[str, dict[str, Any]], None] | None = None,
                 fence: SendFence | None = None, answer_now: AnswerNow | None = None,
                 open_transport: OpenTransport | None = None, hangup_path: str | None = None,
                 acknowledges_slow_tools: bool = True) -> None:
        self.settings = settings
        self.call_id = call_id
        self._executor = executor_inbox
        # the executor's in-step answer (ToolExecutor.answer_now; None: every request goes to its inbox)
        self._answer_now = answer_now
        self._answered: deque[ToolFinished] = deque()   # answered in-step, fed after the step's effects
        # inside the reader's handling of a socket read (None elsewhere): the
        # reports (log lines) of its steps that wait for the next write, so
        # an output's bytes do not wait for the lines of the frames before it
        self._later: list[Callable[[], None]] | None = None
        self.answered_in_step = 0                       # tool runs answered so (a view for tests)
        self._api_key = api_key
        self.feed = feed
        self._hangup_enabled = hangup
        self._hangup_path = hangup_path     # the arrival's (a Live session's); None: a Realtime call's
        # bound once: a concrete logger, not the lazy proxy that binds at every line
        self.log = get_logger(actor="call", call_id=call_id).bind()
        self._rng: random.Random | None = None     # the reconnect jitter's, seeded with the call id at first use
        self.protocol = CallProtocol(call_id, effect_of=_tool_effect, may_defer=_tool_may_defer,
                                     debug_logs=_debug_enabled(self.log),
                                     context=CallContext(context) if context is not None else None)
        self.protocol.slow_tools = SlowTools(ack_after_s=settings.tool_ack_after_s if acknowledges_slow_tools else 0.0,
                                             max_in_flight=settings.tool_slow_max,
                                             progress_after_s=settings.tool_progress_after_s)
        # a feed no one listens to: the protocol does not build its events (six a round)
        self.protocol.publishing = feed.listened if feed is not None else _never_published
        # connection state
        # how each connect attempt opens the call's transport (its arrival's: by default a browser's
        # connect, over the sideband websocket)
        self._open_transport = open_transport or browser_connect(
            settings.openai_base_url, call_id, connect_timeout=settings.connect_timeout_s).open_transport
        self._transport: CallTransport | None = None   # the open transport, while connected
        self._outbox: trio.MemorySendChannel[Send] | None = None   # the writer's queue
        self._start_writer: Callable[[], None] | None = None    # starts the writer at its first queued send
        self._queued = 0                           # sends in the writer's queue, not written yet
        self._step: deque[Send] = deque()          # sends of the step just handled, not yet written or queued
        self._write_lock = trio.Lock()             # one write at a time on this actor's socket
        self._conn_done = trio.Event()
        self._conn_reason: EndReason | None = None
        self._stop = trio.Event()                  # server shutdown requested
        self._close_code: int | None = None
        self._last_event = 0.0
        self._conn_events = 0                      # valid server events on this connection
        self._watch_scope: trio.CancelScope | None = None
        # tool tasks
        self._tools: trio.Nursery | None = None
        self._tool_scopes: dict[tuple[str, bool], trio.CancelScope] = {}   # (tool call id, prefetch)
        self._tools_idle = trio.Event()
        # lifetime
        self.started = 0.0
        self.deadline = math.inf
        self.reconnects = 0
        self.end_reason: EndReason | None = None
        self.ended_at: float | None = None     # when the end was decided (before the bounded close)
        self.record: CallRecord | None = None
        self.capture: EventCapture | None = None    # setting record_events: the raw server events
        self.recovered = recovered
        self._linked = context
        self._body = trio.CancelScope(shield=True)   # run_shielded's scope; ``stop`` gives it its deadline
        # usage: the model priced, and who adds each response's cost to the day's total
        self._model = model
        self._on_cost = on_cost
        # the cluster registry's mirror of the record's tool lines (a takeover answers from it)
        self._on_record = on_record
        # a leased call's deadline for every frame, hangup and reconnect (cluster/fence.py)
        self._fence = fence
        # traces (tracing on): the call's span, its current turn's (the protocol's turn_latency)
        self._call_span: tracing.Span | None = None
        self._turn_span: tracing.Span | None = None
        self._traced_turn: Turn | None = None
        self._turn_fields: Callable[[], dict[str, Any]] | None = None

    # views of the protocol's state
    @property
    def calls(self) -> dict[str, ToolCall]:
        return self.protocol.calls

    @property
    def batches(self) -> dict[str, Batch]:
        return self.protocol.batches

    @property
    def active(self) -> set[str]:
        return self.protocol.active

    @property
    def epoch(self) -> int:
        return self.protocol.epoch

    @property
    def transport(self) -> CallTransport | None:
        """The open transport, while connected (None between connections)."""
        return self._transport

    # ------------------------------------------------------------------ run

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> EndReason:
        """Serve the call until it ends; return the end reason.

        Reports started at once (connecting happens in the background).
        Cancellation (server shutdown) becomes a graceful stop: the call's
        work runs under a shielded scope, so the sideband's own reader stays
        alive to complete the closing handshake; on cancellation the actor
        answers pending tool calls, closes the socket with 1000 and writes its
        record as ``shutdown``, all within ``close_deadline_s`` (then the
        shield's deadline cuts it short), and Cancelled propagates.
        """
        body = trio.CancelScope(shield=True)
        finished = trio.Event()

        async def shielded() -> None:
            try:
                with body:
                    await self._serve_call()
            finally:
                finished.set()

        async with trio.open_nursery() as guard:
            guard.start_soon(shielded)
            task_status.started()
            try:
                await finished.wait()
            except trio.Cancelled:
                self._request_stop()
                body.deadline = trio.current_time() + self.settings.close_deadline_s
                raise
        return self.end_reason or EndReason.ERROR

    async def run_shielded(self) -> EndReason:
        """``run`` without its guard task, for an owner that stops its calls
        itself (the supervisor): the call runs shielded in the caller's task,
        so cancelling the caller does NOT stop it; ``stop`` does (the same
        graceful stop as a cancelled ``run``, within ``close_deadline_s``).
        One task per live call instead of two."""
        with self._body:
            await self._serve_call()
        return self.end_reason or EndReason.ERROR

    def stop(self) -> None:
        """End a ``run_shielded`` call gracefully: as ``shutdown``, the
        socket closed cleanly and the record written, within
        ``close_deadline_s`` from now (then its shield's deadline cuts it)."""
        self._request_stop()
        self._body.deadline = min(self._body.deadline, trio.current_time() + self.settings.close_deadline_s)

    def _request_stop(self) -> None:
        """Server shutdown: end the call as ``shutdown`` with the socket up."""
        self._stop.set()
        if not self._conn_done.is_set():
            self._conn_reason = EndReason.SHUTDOWN
            self._conn_done.set()

    # ----------------------------------------------------- the protocol

    def _feed(self, message: CallInput) -> None:
        """Hand one input to the protocol and carry out its effects (never
        awaits, so no other input can come between)."""
        self._apply(self.protocol.handle(message, trio.current_time()))

    def _apply(self, effects: list[Effect]) -> None:
        handlers = _EFFECT_HANDLERS
        for effect in effects:
            handlers[type(effect)](self, effect)
        if self._call_span is not None and self.protocol.latency.current is not self._traced_turn:
            self._trace_turn()
        answered = self._answered
        while answered:   # after the step's own effects, as a result from the executor would come
            self._feed(answered.popleft())

    def _do_send(self, effect: Send) -> None:
        assert self._outbox is not None, "the protocol sends only while connected"
        self._step.append(effect)   # written (or queued) by the task that fed the input, after its step

    def _do_log(self, effect: Log) -> None:
        write = _log_at(self.log, effect.level)
        later = self._later
        if later:    # behind a report that waits for the write: in the order they were made
            later.append(functools.partial(write, effect.event, **effect.fields))
            return
        write(effect.event, **effect.fields)

    def _do_record(self, effect: RecordLine) -> None:
        self._record_fields(effect.kind, effect.fields, t=effect.t)

    def _do_publish(self, effect: Publish) -> None:
        # a feed no one listens to gets no events: the protocol asks
        # ``feed.listened`` (its ``publishing``) before it builds one, in
        # the step the effect is carried out in; client events always come
        # (they are queued for polling)
        feed = self.feed
        if feed is not None:
            _PUBLISHERS[effect.kind](feed, **effect.fields)

    def _do_measure(self, effect: Measure) -> None:
        _MEASURES[effect.name](effect.seconds)

    def _do_cancel_older(self, effect: CancelOlderReads) -> None:
        if self._tools is not None:
            self._tools.start_soon(self._tell_executor, CancelReads(self.call_id, effect.before_epoch, effect.keep))

    def _do_wake(self, effect: WakeAt) -> None:
        if self._watch_scope is not None:  # the watch sleeps until its old wake time
            self._watch_scope.deadline = min(self._watch_scope.deadline, effect.at)

    def _do_end(self, effect: EndCall) -> None:
        if not self._conn_done.is_set():
            self.ended_at = trio.current_time()
            self._conn_reason = effect.reason
            self._conn_done.set()

    def _do_refer(self, effect: Refer) -> None:
        if self._tools is not None:
            self._tools.start_soon(self._refer, effect.target_uri)

    async def _refer(self, target_uri: str) -> None:
        """POST the Realtime ``refer`` of this phone call (best effort: a
        refused transfer leaves the call as it is, and is logged). The
        service moves the caller to ``target_uri`` and ends our session."""
        try:
            key = await self._key()
        except ConfigUnreadable as exc:
            self.log.warning("call.transfer_failed", error=type(exc).__name__)
            return
        if not key:
            return
        url = f"{self.settings.openai_base_url.rstrip('/')}/realtime/calls/{quote(self.call_id, safe='')}/refer"
        try:
            verify = client_tls.REST.now()
            async with httpx.AsyncClient(timeout=self.settings.connect_timeout_s, verify=verify) as client:
                response = await client.post(url, headers={"Authorization": f"Bearer {key}"},
                                             json={"target_uri": target_uri})
            self.log.info("call.transferred", status=response.status_code)
        except httpx.HTTPError as exc:
            self.log.warning("call.transfer_failed", error=type(exc).__name__)

    def _do_count_usage(self, effect: CountUsage) -> None:
        metrics.usage(effect.model, effect.tokens, effect.cost_usd)
        if self._on_cost is not None and effect.cost_usd:
            self._on_cost(effect.cost_usd)

    def _do_rate_limits(self, effect: RateLimits) -> None:
        metrics.rate_limits(effect.requests, effect.tokens)

    def _do_start(self, effect: StartTool) -> None:
        if not effect.prefetched:   # else its Prefetch's run is already at the executor
            self._start_tool(effect)

    def _do_prefetch(self, effect: Prefetch) -> None:
        self._start_tool(effect, prefetch=True)

    # ---------------------------------------------------------- writing

    async def _write_step(self) -> None:
        """Write the sends of the step just handled (``_step``) from this
        task, when no write is in progress and the writer's queue is empty;
        what cannot go out so joins the queue, behind what is there. A
        ``Written`` may produce more sends (a ``response.create`` once the
        last output is out): they go out in the same way, in this turn."""
        step, transport = self._step, self._transport
        while step and self._queued == 0 and not self._write_lock.locked() and transport is not None:
            out = step.popleft()
            self._write_lock.acquire_nowait()
            try:
                written = await self._write(transport, out)
            finally:
                self._write_lock.release()
            if not written:
                step.clear()      # the connection ended: Disconnected makes them ready again
                return
            if self._transport is transport:    # not after the protocol heard Disconnected
                self._feed(Written(out))
        self._queue_step()

    def _queue_step(self) -> None:
        """Hand what is left of ``_step`` to the writer task, in order."""
        step = self._step
        if not step:
            return
        if self._outbox is None:
            step.clear()
            return
        while step:
            self._outbox.send_nowait(step.popleft())
            self._queued += 1
        self._writer_needed()

    def _writer_needed(self) -> None:
        """Start this connection's writer task when a send is first queued:
        most connections never need one (every write goes out from its own
        step), and a task per live call costs its start, its teardown and
        the objects every full collection walks."""
        start, self._start_writer = self._start_writer, None
        if start is not None:
            start()

    async def _write(self, transport: CallTransport, out: Send) -> bool:
        """Write one frame; False when the connection ended (it is told)."""
        data = _SEND_ENCODER.encode(out.event)
        fence = self._fence
        if fence is not None and not fence.allows():
            self._fenced()
            return False
        # A frame the socket takes whole goes in this step with no schedule
        # point, so it needs no scope (the usual case on a ws:// sideband). A
        # leased call's too: its fence was read just above, in this step, and
        # the bytes leave before any schedule point (the fence's rule).
        rest = transport.start_send(data)
        if rest == b"":
            return True
        try:
            # Shielded: a frame cancelled half-way would corrupt the stream;
            # only its own deadline ends it (one scope for both: a write is hot).
            # A leased call's deadline bounds it too: no tail of a frame after it.
            with trio.CancelScope(shield=True, deadline=trio.current_time() + SEND_TIMEOUT_S) as scope:
                if fence is not None:
                    scope.deadline = min(scope.deadline, fence.until)
                if rest is not None:
                    await transport.finish_send(rest)     # what the socket did not take at once
                elif fence is None:
                    await transport.send(data)
                elif not await transport.send_before(data, fence.until):
                    self._fenced()
                    return False
        except TransportClosed as exc:
            self._end_connection(exc.code)
            return False
        if scope.cancelled_caught and fence is not None and not fence.allows():
            self._fenced()
            return False
        if scope.cancelled_caught:
            self.log.warning("call.send_stuck", epoch=self.epoch)
            self._end_connection(None)
            return False
        return True

    # ------------------------------------------------------- connection

    async def _serve_call(self) -> EndReason:
        """The call from first connect to its record, under its span (tracing
        on: every task of the call starts under it); returns the end reason.
        Runs shielded (see ``run``); only its own deadline cancels it."""
        arrival = "phone" if self._linked is not None and self._linked.phone is not None else "browser"
        with tracing.span("call", call_id=self.call_id, arrival=arrival,
                          rejoined=self.recovered is not None) as self._call_span:
            try:
                reason = await self._serve_untraced()
            finally:
                self._traced_turn = None
                self._trace_turn()      # the last turn's span ends with the call
            if self._call_span is not None:
                self._call_span.set_attribute("voiceactors.end", str(reason))
            return reason

    def _trace_turn(self) -> None:
        """The protocol's current turn changed: end the last one's span (with
        its latencies) and start the new one's, under the call's."""
        if self._turn_span is not None:
            fields = self._traced_turn_fields()
            tracing.finish(self._turn_span, **fields)
            self._turn_span = None
        turn = self._traced_turn = self.protocol.latency.current
        if turn is not None and self._call_span is not None:
            self._turn_span = tracing.start("turn", self._call_span, turn=turn.number)
            self._turn_fields = turn.fields

    def _traced_turn_fields(self) -> dict[str, Any]:
        fields = self._turn_fields() if self._turn_fields is not None else {}
        fields.pop("turn", None)
        return fields

    async def _serve_untraced(self) -> EndReason:
        self.started = trio.current_time()
        self.protocol.started = self.started
        self.deadline = self.started + self.settings.call_max_duration_s
        if self.settings.call_wrap_up_s > 0:
            self.protocol.schedule_wrap_up(at=self.deadline - self.settings.call_wrap_up_s, ends_at=self.deadline)
        self._start_meter()
        rejoin = self.recovered is not None
        fields: dict[str, Any] = {}
        if self.recovered is not None:
            fields = {"rejoined": True, "recovered": [p.tool_call_id for p in self.recovered]}
        if self._linked is not None and self._linked.phone is not None:
            # a phone call, its caller masked (call_context.PhoneCall): the history shows it as one
            fields.update(arrival="phone", caller=self._linked.phone.caller)
        elif self._linked is not None and self._linked.live is not None:
            fields.update(arrival="live")       # a Live session's (docs/live.md)
        self.record = CallRecord(self.call_id, self.settings.state_dir, started=self.started,
                                 write_now=rejoin, fsync_s=self.settings.call_record_fsync_s, **fields)
        if self._linked is not None:
            # what a rejoin after a crash carries the call on with (recovery.py),
            # as a taker does from the mirror: the instruction, link and selection
            self.record.add(RecordKind.CONTEXT, context=carried_view(self._linked))
        self.capture = EventCapture.for_settings(self.settings, self.call_id, self.started)
        if self.capture is None:
            # The record has no task of its own (the process's one RecordWriter
            # writes it): no nursery and no started-handshake per call.
            return await self._serve_recorded()
        async with trio.open_nursery() as recorder:
            await recorder.start(self.capture.run)
            try:
                return await self._serve_recorded()
            finally:
                recorder.cancel_scope.cancel()   # a close cut short by its deadline

    async def _serve_recorded(self) -> EndReason:
        reason = EndReason.ERROR
        try:
            async with trio.open_nursery() as tools:
                self._tools = tools
                try:
                    await self._seed_recovered()
                    reason = await self._connection_loop()
                except BaseException as exc:
                    if _is_cancel(exc):
                        reason = EndReason.SHUTDOWN
                        raise
                    self.log.exception("call.crashed", epoch=self.epoch)
                    reason = EndReason.ERROR
                    if not isinstance(exc, Exception):
                        raise
                finally:
                    if self.ended_at is None:
                        self.ended_at = trio.current_time()
                    self.protocol.end_decided()
                    with trio.CancelScope(shield=True) as scope:
                        scope.deadline = trio.current_time() + self.settings.close_deadline_s
                        await self._settle_tools(scope.deadline)
                    for tool_scope in list(self._tool_scopes.values()):
                        tool_scope.cancel()
        finally:
            self.end_reason = reason
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + self.settings.close_deadline_s
                await self._write_record(reason)
            if self.feed is not None:
                self.feed.close(reason)
            self.log.info("call.ended", reason=reason, epoch=self.epoch, reconnects=self.reconnects,
                          tool_calls=len(self.calls), duration_s=round(trio.current_time() - self.started, 3),
                          suppressed_logs=self.protocol.log_budget.take_suppressed() or None)
        return reason

    async def _connection_loop(self) -> EndReason:
        """Connect, serve, reconnect. A drop after a connection that carried
        at least one valid event (or lasted ``HEALTHY_AFTER_S``) starts the
        failure count afresh; a connection that broke before that (or with a
        protocol-error close)
        counts as one more failure, so a peer that accepts and then sends
        garbage exhausts the reconnect attempts instead of looping until the
        maximum duration.

        Cancellation: runs inside ``run``'s shield, so only a stop request
        (``_stop``, which also ends the backoff sleep at once) or a bug ends
        it early; a cancellation that does reach it propagates after
        ``_serve`` closed the socket."""
        failures = 0
        while True:
            if self._stop.is_set():
                return EndReason.SHUTDOWN
            if trio.current_time() >= self.deadline:
                return EndReason.MAX
            if self._fence is not None and not self._fence.allows():
                return EndReason.SHUTDOWN       # the lease may be gone: no new sideband
            self._conn_events = 0
            opened_at = math.inf
            unreadable = False
            try:
                key = await self._key()
                if not key:
                    self.log.warning("call.no_api_key")
                    return EndReason.NO_KEY
                async with self._open_transport(key) as transport:
                    opened_at = trio.current_time()
                    if self.record is not None:
                        self.record.opened()
                    self.record_line(RecordKind.CONNECT, reconnects=self.reconnects)
                    self.log.info("call.connected", epoch=self.epoch, reconnects=self.reconnects)
                    reason = await self._serve(transport)
                    if reason is not None:
                        return reason
            except TransportGone as exc:
                self.log.info("call.gone", status=exc.status_code)
                return EndReason.GONE
            except TransportRefused as exc:
                self.log.error("call.refused", status=exc.status_code)
                return EndReason.UNAUTHORIZED
            except TransportUnavailable as exc:
                self.log.warning("call.connect_failed", error=str(exc), status=exc.status_code)
                self._close_code = None
            except ConfigUnreadable as exc:     # an I/O error, not "no key": a failed attempt
                self.log.warning("call.config_unreadable", error=str(exc))
                self._close_code, unreadable = None, True
            except TransportBroken as exc:
                self.log.warning("call.connection_broken", error=str(exc), epoch=self.epoch)
                self._conn_events = 0
            self._feed(Dropped())
            healthy = self._conn_events > 0 or trio.current_time() - opened_at >= HEALTHY_AFTER_S
            if healthy and self._close_code not in BROKEN_CLOSE_CODES:
                failures = 0    # it worked for a while: a fresh drop
            failures += 1
            if failures > self.settings.reconnect_attempts:
                return EndReason.CONFIG_UNREADABLE if unreadable else EndReason.EXHAUSTED
            delay = backoff_delay(failures, self.settings.reconnect_base_s, self.settings.reconnect_max_s,
                                  self._reconnect_rng())
            self.reconnects += 1
            metrics.reconnect()
            self.record_line(RecordKind.RECONNECT, attempt=failures, delay_s=round(delay, 3), close_code=self._close_code)
            self.log.info("call.reconnecting", attempt=failures, delay_s=round(delay, 3),
                          close_code=self._close_code, epoch=self.epoch)
            with trio.move_on_at(min(self.deadline, trio.current_time() + delay)):
                await self._stop.wait()

    async def _serve(self, transport: CallTransport) -> EndReason | None:
        """One connection: reader + writer until it closes or the call ends.
        Returns the end reason, or None when the socket dropped (reconnect).

        Cancellation (or a bug) while the socket is up: pending tool calls
        are answered and the socket closed with 1000 under a shield bounded
        by ``close_deadline_s``, then the exception propagates. Either way
        the protocol is told ``Disconnected`` before this returns."""
        send, receive = trio.open_memory_channel[Send](math.inf)
        self._conn_done = trio.Event()
        self._conn_reason = None
        self._close_code = None
        self._last_event = trio.current_time()
        if self._stop.is_set():
            self._request_stop()
        # frames the reader would skip unread never wake it (all of them reach a capture)
        transport.screen(None if self.capture is not None else _SKIP_UNREAD)
        self._outbox, self._transport, self._queued = send, transport, 0
        self._step.clear()
        try:
            self._feed(Connected())
            self._queue_step()       # the outputs a reconnect writes again: the writer's
            async with trio.open_nursery() as conn:
                conn.start_soon(self._reader, transport)
                self._start_writer = lambda: conn.start_soon(self._writer, transport, receive)
                if self._queued:
                    self._writer_needed()
                reason = await self._watch()
                conn.cancel_scope.cancel()
            await self._detach()
        except BaseException:
            # cancelled (server stopping) or a bug: the socket is still up, so
            # answer what is pending and close it cleanly before unwinding
            await self._detach()
            self._feed(Disconnected())
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + self.settings.close_deadline_s
                await self._finish_on_socket(transport, EndReason.SHUTDOWN, scope.deadline)
            raise
        finally:
            self._outbox, self._transport, self._start_writer = None, None, None
            send.close()
        self._feed(Disconnected())
        if reason in SOCKET_UP_ENDS:
            with trio.move_on_after(self.settings.close_deadline_s) as scope:
                await self._finish_on_socket(transport, reason, scope.deadline)
        return reason

    async def _detach(self) -> None:
        """End this connection's writing before the protocol hears
        ``Disconnected``: wait for a write of a tool task in progress (it
        reports ``Written`` first), then stop writing on this socket."""
        self._start_writer = None    # before any checkpoint: the connection's nursery is gone
        with trio.CancelScope(shield=True):
            with trio.move_on_after(SEND_TIMEOUT_S + 1):
                await self._write_lock.acquire()
                self._write_lock.release()
        self._outbox, self._transport, self._queued = None, None, 0
        self._step.clear()

    async def _watch(self) -> EndReason | None:
        """Wait for the connection to end, the idle timeout, the maximum
        duration, or the protocol's wake-up time (``WakeAt``: a blind retry
        of ``response.create``, fed back as ``Timer``). Its sleep is a cancel
        scope (``_watch_scope``) whose deadline a ``WakeAt`` brings forward."""
        idle = self.settings.call_idle_timeout_s
        while True:
            wake = min(self._last_heard() + idle, self.deadline,
                       self.protocol.retry_at if self.protocol.retry_at is not None else math.inf,
                       self.protocol.budget_wake, self.protocol.idle_wake, self.protocol.wrap_up_wake,
                       self.protocol.phone_wake, self.protocol.slow_wake)
            with trio.move_on_at(wake) as self._watch_scope:
                await self._conn_done.wait()
                return self._conn_reason
            now = trio.current_time()
            if now >= self.deadline:
                self.ended_at = now
                return EndReason.MAX
            if now >= self._last_heard() + idle:
                self.ended_at = now
                self.log.info("call.idle", idle_s=idle, epoch=self.epoch)
                return EndReason.IDLE
            self._feed(Timer())
            await self._write_step()

    def _last_heard(self) -> float:
        """When the service last sent a frame: one the reader handled, or
        one the transport's screen dropped for it (``last_skipped_at``)."""
        transport = self._transport
        return max(self._last_event, transport.last_skipped_at()) if transport is not None else self._last_event

    async def _reader(self, transport: CallTransport) -> None:
        """Read until the socket closes: every frame of one socket read is
        handed to the protocol in turn (``receive_batch``), and what
        a frame's step sends is written (``_write_step``) before the next
        frame is handled: an output does not wait for the ``response.done``
        behind it. Its write is shielded, so a cancellation still reaches the
        reader only between reads. Cancelled by
        ``_serve`` when the connection ends (between reads: the frames of a
        read are handled in full before the next is awaited). With ``record_events``
        every frame read is captured too (``event_capture.py``). The log
        lines of a read's steps that come before a write (an in-step answer's
        ``tool.run``, and the protocol's lines behind it) are written right
        after that write, and at the latest when the read is handled, even
        when cancelled (``_later``)."""
        protocol, only, budget = self.protocol, HANDLED_EVENTS, self.protocol.log_budget
        capture = self.capture
        screened = capture is None      # the hand-off asked ``skippable`` already (``_serve``)
        if capture is not None:
            capture.connected(trio.current_time())
        try:
            while True:
                frames = await transport.receive_batch()
                now = self._last_event = trio.current_time()
                skipped = transport.take_skipped()
                if skipped:
                    protocol.skipped_frames(skipped)    # dropped unread by the hand-off, counted here
                if capture is not None:
                    for raw in frames:
                        capture.frame(raw, now)
                later: list[Callable[[], None]] = []
                try:
                    for raw in frames:
                        event = rt.read_server_event(raw, only, budget, screened=screened)
                        if event is None:
                            protocol.skipped_frame()
                            continue
                        self._conn_events += 1
                        self._later = later
                        try:
                            effects = protocol.handle_event(event, now)
                        except Exception:  # one bad event must not end the call
                            self._apply(protocol.take_effects())
                            _run_later(later)
                            self.log.exception("call.event_failed", type=getattr(event, "type", None),
                                               epoch=self.epoch)
                        else:
                            self._apply(effects)
                        finally:
                            self._later = None    # no other task's step defers into it
                        if self._conn_done.is_set():
                            break      # the call ends (a fatal error): not another frame
                        if self._step:
                            # an output (or a create) leaves before the frames behind it in this read are
                            # handled: its bytes go before the first schedule point (``_write_step``),
                            # and before the log lines of the steps since the last write (``later``)
                            await self._write_step()
                            _run_later(later)
                    if self._step:
                        await self._write_step()
                finally:
                    _run_later(later)     # before the next read's wait, or as the reader ends
        except TransportClosed as exc:
            if capture is not None:
                capture.closed(exc.code, trio.current_time())
            self._end_connection(exc.code)

    async def _writer(self, transport: CallTransport, receive: trio.MemoryReceiveChannel[Send]) -> None:
        """Write the sends that could not go out from their own step (a write
        was in progress, or others were queued), in order, reporting each as
        ``Written``. Cancellation waits for a frame being written (each write
        is shielded and bounded by ``SEND_TIMEOUT_S``); what it did not write
        stays ``queued`` until ``Disconnected`` makes it ready again."""
        async for out in receive:
            async with self._write_lock:
                written = await self._write(transport, out)
            self._queued -= 1
            if not written:
                return
            self._feed(Written(out))
            await self._write_step()

    def _fenced(self) -> None:
        """The lease may have expired: send nothing more, end as a lost
        lease does (``shutdown``, the socket closed, no hangup)."""
        if not self._stop.is_set():
            self.log.warning("call.send_fenced", epoch=self.epoch)
        self._request_stop()

    def _end_connection(self, code: int | None) -> None:
        if self._conn_done.is_set():
            return
        self._close_code = code
        self._conn_reason = EndReason.CLOSED if is_clean_close(code) else None
        self.log.debug("call.socket_closed", close_code=code, epoch=self.epoch)
        self._conn_done.set()

    async def _tell_executor(self, message: ExecutorMessage) -> None:
        try:
            await self._executor.send(message)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.log.error("tool.executor_gone")

    # -------------------------------------------------------------- tools

    def _start_tool(self, start: StartTool | Prefetch, prefetch: bool = False) -> None:
        """Hand one tool call (or a read's prefetch) to the executor and start
        the task that waits for its answer."""
        assert self._tools is not None, "tools start only inside run"
        selection = self.protocol.context.selection if self.protocol.context else None
        if self._answer_now is not None and not self._tool_scopes:
            # A fresh reusable read is answered by the executor in this step.
            # Asked only while no request of this call is on its way (every
            # run in flight has its scope): the executor counts the turn's
            # calls in the order they arrive, and this one must not overtake.
            request = ToolRequest(
                call_id=self.call_id, tool_call_id=start.tool_call_id, name=start.name,
                arguments=start.arguments, epoch=start.epoch, turn=start.turn, reply=_NO_REPLY,
                selection=selection)
            # in the reader's handling of a read, the tool.run line waits for the next write (_later)
            answered = self._answer_now(request, self._later)
            if answered is not None:
                self.answered_in_step += 1
                self._answered.append(ToolFinished(start.tool_call_id, answered.tool, answered.output,
                                                   answered.outcome, answered.duration_ms,
                                                   answered.client_events, prefetch=prefetch))
                return
        # Shielded: the actor's own cancellation (shutdown) must not cut a tool
        # call short before _settle_tools gave a started write time to report;
        # the actor cancels this scope itself when it gives up waiting.
        scope = trio.CancelScope(shield=True)
        self._tool_scopes[(start.tool_call_id, prefetch)] = scope
        self._tools_idle = trio.Event()
        send, receive = trio.open_memory_channel[ToolResult](1)
        span = tracing.start("tool", self._turn_span or self._call_span, tool=start.name,
                             tool_call_id=start.tool_call_id, epoch=start.epoch, turn=start.turn,
                             prefetch=prefetch) if self._call_span is not None else None
        request = ToolRequest(call_id=self.call_id, tool_call_id=start.tool_call_id, name=start.name,
                              arguments=start.arguments, epoch=start.epoch, turn=start.turn, reply=send,
                              selection=selection, progress=functools.partial(self._tool_progress, start.tool_call_id),
                              trace=span)
        pending: ToolRequest | None
        try:
            # handed over in this turn when the inbox has room: the executor
            # starts on it while the task that waits for the answer starts
            self._executor.send_nowait(request)
            pending = None
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            pending = request   # the task sends it (waits for room, or finds the executor gone)
        self._tools.start_soon(self._run_tool, start, scope, pending, receive, prefetch, span)

    async def _run_tool(self, start: StartTool | Prefetch, scope: trio.CancelScope, pending: ToolRequest | None,
                        receive: trio.MemoryReceiveChannel[ToolResult], prefetch: bool,
                        span: tracing.Span | None = None) -> None:
        """Wait for one tool call's answer and report it to the protocol.
        Runs in ``scope`` (shielded; only the actor cancels it): a cancelled
        or failed wait is reported as ``ToolAbandoned``."""
        result: ToolResult | None = None
        gone = False
        try:
            with scope:
                try:
                    if pending is not None:
                        await self._executor.send(pending)
                    result = await receive.receive()
                except (trio.EndOfChannel, trio.BrokenResourceError, trio.ClosedResourceError):
                    gone = True
                    self.log.error("tool.executor_gone", tool=start.name, tool_call_id=rt.clip(start.tool_call_id, PEER_STRING_MAX))
        finally:
            tracing.finish(span, outcome=str(result.outcome) if result is not None else "abandoned",
                           duration_ms=result.duration_ms if result is not None else None)
            self._tool_scopes.pop((start.tool_call_id, prefetch), None)
            if result is not None:
                self._feed(ToolFinished(start.tool_call_id, result.tool, result.output, result.outcome,
                                        result.duration_ms, result.client_events, prefetch=prefetch))
            else:
                self._feed(ToolAbandoned(start.tool_call_id, executor_gone=gone, prefetch=prefetch))
            if not self.protocol.tools_running():
                self._tools_idle.set()
            if self._step:
                await self._write_step()   # the output, from this task's own step

    def _tool_progress(self, tool_call_id: str, progress: float, total: float | None, message: str | None) -> None:
        """A progress notification of a running tool (called by its MCP
        source's connection task, on the trio thread): fed to the protocol
        at once; what it sends (a progress line) joins the writer's queue."""
        self._feed(ToolProgress(tool_call_id, progress, total, message))
        self._queue_step()

    async def _settle_tools(self, deadline: float) -> None:
        """Stop the reads of this call and give started writes until
        ``deadline`` to finish (they are reported, not lost)."""
        if not self.protocol.tools_running():
            return
        with trio.move_on_at(deadline):
            await self._executor.send(CancelReads(self.call_id, before_epoch=None))
            await self._tools_idle.wait()

    # ----------------------------------------------------------- ending

    async def _finish_on_socket(self, transport: CallTransport, reason: EndReason, deadline: float) -> None:
        """End with the socket still up: settle tools, answer every call id
        not yet written (synthetic output for abandoned ones), hang up when
        the browser is gone, close cleanly. Bounded by ``deadline`` (a
        ``move_on_at``: reaching it skips the rest; the caller shields it)."""
        self.protocol.end_decided()    # what answers from now on is recorded, not spoken
        with trio.move_on_at(deadline):
            await self._settle_tools(trio.current_time() + (deadline - trio.current_time()) / 2)
            for scope in list(self._tool_scopes.values()):
                scope.cancel()
            fence = self._fence
            for out in self.protocol.closing_outputs(trio.current_time()):
                try:
                    with trio.fail_after(SEND_TIMEOUT_S):
                        data = json.dumps(out.event, ensure_ascii=False)
                        if fence is None:
                            await transport.send(data)
                        elif not await transport.send_before(data, fence.until):
                            self._fenced()
                            break
                except (TransportClosed, trio.TooSlowError):
                    break
                assert out.tool_call_id is not None   # closing_outputs holds outputs only
                self._feed(WrittenAtClose(out.tool_call_id))
            if reason in HANGUP_ENDS and self._hangup_enabled and (self._fence is None or self._fence.allows()):
                await self._hangup()
            try:
                await transport.aclose(1000)
            except TransportClosed:
                pass

    async def _hangup(self) -> None:
        """POST the hangup for this call (best effort): Realtime's, or the
        arrival's (``hangup_path``: a Live session's ``live.sessions.hangup``). Plain httpx:
        the SDK client hops to a worker thread on its first request; with the
        process's one TLS context (``tls.REST``): a client makes its own
        otherwise, ~45 ms of CPU on the trio thread at every hangup."""
        try:
            key = await self._key()
        except ConfigUnreadable as exc:
            self.log.warning("call.hangup_failed", error=type(exc).__name__)
            return
        if not key:
            return
        path = self._hangup_path or f"/realtime/calls/{quote(self.call_id, safe='')}/hangup"
        url = f"{self.settings.openai_base_url.rstrip('/')}{path}"
        try:
            verify = client_tls.REST.now()
            async with httpx.AsyncClient(timeout=self.settings.connect_timeout_s, verify=verify) as client:
                response = await client.post(url, headers={"Authorization": f"Bearer {key}"})
            self.log.info("call.hangup", status=response.status_code)
        except httpx.HTTPError as exc:
            self.log.warning("call.hangup_failed", error=type(exc).__name__)

    def _reconnect_rng(self) -> random.Random:
        """The jitter's generator, made at the first reconnect (seeding one
        with a string hashes it: a cost at every connect for calls that
        mostly never reconnect); the same sequence as made at start."""
        if self._rng is None:
            self._rng = random.Random(self.call_id)
        return self._rng

    def _start_meter(self) -> None:
        """The call's usage meter: its model's prices and the call budget. An
        unreadable config prices the call as the default model. The provider
        runs on the trio thread: the journal's voice block is kept in memory
        (``voice_config.py``), and a worker-thread hop here was a tenth of a
        connect's CPU."""
        model = self._model
        if callable(model):
            try:
                model = model()
            except Exception as exc:  # noqa: BLE001 - the call goes on; only its prices are a guess
                self.log.warning("call.model_unreadable", error=type(exc).__name__)
                model = DEFAULT_VOICE_MODEL
        # a Live call's session audio: priced as its Live model ("unknown" for a
        # session of before the context kept it: counted, its cost unknown)
        live = self._linked.live if self._linked is not None else None
        self.protocol.meter = meter_for(model, self.settings.prices, self.settings.call_budget_usd,
                                        audio_model=(live.live_model or "unknown") if live is not None else None,
                                        audio_s=live.audio_s if live is not None else 0.0)

    async def _key(self) -> str | None:
        if callable(self._api_key):
            return self._api_key()  # the journal config is kept in memory (voice_config.py): no thread hop
        return self._api_key

    def record_line(self, kind: RecordKind, **fields: object) -> None:
        self._record_fields(kind, fields)

    def _record_fields(self, kind: RecordKind, fields: dict[str, Any], *, t: float | None = None) -> None:
        """A record line (``t``: when, if not now) and the ``on_record`` hook's
        copy; the fields as a dict, not unpacked again (nine lines a round)."""
        if self.record is not None:
            self.record.add_fields(kind, fields, t=t)
        if self._on_record is not None:
            self._on_record(self.call_id, {"kind": kind, **fields})

    async def _write_record(self, reason: str) -> None:
        record = self.record
        if record is None:
            return
        for line in self.protocol.closing_lines():
            record.add_fields(line.kind, line.fields, t=line.t)
        record.add(RecordKind.END, reason=reason, duration_s=round(trio.current_time() - self.started, 3),
                   epoch=self.epoch, reconnects=self.reconnects, tool_calls=len(self.calls),
                   responses=len(self.batches), close_code=self._close_code,
                   feed_dropped=self.feed.dropped if self.feed is not None else 0)
        written = await record.close()
        if record.failed is not None:
            self.log.error("call.record_failed", error=record.failed)
        elif written:
            self.log.debug("call.recorded", path=str(record.path), flushes=record.flushes)
        else:
            self.log.debug("call.not_recorded", why="never connected")

    async def _seed_recovered(self) -> None:
        """A rejoin: hand the protocol the tool calls the crashed run left
        pending. A write is answered from the write log (or with the restart
        error); a read with its arguments runs again; the rest get the
        restart error."""
        for pending in self.recovered or ():
            output: str | None = pending.output
            outcome: ToolOutcome | None = ToolOutcome.OK if output is not None else None
            if output is None and not (pending.effect == READ and pending.arguments is not None):
                output, outcome = RESTARTED_OUTPUT, ToolOutcome.RESTARTED
                if pending.effect != READ:   # a write, or an MCP source's tool (its effect is not ours to know)
                    recorded = await storage.run_sync(write_log.load, self.settings.state_dir, pending.tool_call_id)
                    if recorded is not None:
                        output, outcome = recorded["output"], ToolOutcome.REPLAYED
            self._feed(Recovered(pending.tool_call_id, pending.tool, pending.response_id, pending.arguments,
                                 output, outcome))


#: One encoder for every frame written (``json.dumps`` with an option builds one per call).
_SEND_ENCODER = json.JSONEncoder(ensure_ascii=False)

#: The frames the reader skips unread (``rt.skippable``): the hand-off drops them for it.
_SKIP_UNREAD = functools.partial(rt.skippable, only=HANDLED_EVENTS)

#: The reply channel of a request asked in-step (``answer_now`` never replies on it).
_NO_REPLY, _no_reply_receive = trio.open_memory_channel[ToolResult](0)
_NO_REPLY.close()
_no_reply_receive.close()


def _never_published() -> bool:
    return False


def _run_later(later: list[Callable[[], None]]) -> None:
    """Run the reports a reader's steps put off until their write, in order."""
    while later:
        reports = later[:]
        later.clear()
        for report in reports:
            report()


def _debug_enabled(log: FilteringBoundLogger) -> bool:
    """Whether ``log`` writes debug lines (the protocol makes no debug ``Log``
    effects otherwise)."""
    is_enabled_for = getattr(log, "is_enabled_for", None)
    return bool(is_enabled_for(logging.DEBUG)) if callable(is_enabled_for) else True


def _log_at(log: FilteringBoundLogger, level: LogLevel) -> Callable[..., None]:
    """The logger's method for a ``Log`` effect's level."""
    write: Callable[..., None]
    match level:
        case LogLevel.DEBUG:
            write = log.debug
        case LogLevel.INFO:
            write = log.info
        case LogLevel.WARNING:
            write = log.warning
        case LogLevel.ERROR:
            write = log.error
        case _:
            assert_never(level)
    return write


def _publisher(kind: PublishKind) -> Callable[..., None]:
    """The feed's method for a kind of ``Publish`` effect. A kind without its
    case here is a mypy error (``assert_never``)."""
    match kind:
        case PublishKind.TOOL_STARTED:
            return CallFeed.tool_started
        case PublishKind.TOOL_DONE:
            return CallFeed.tool_done
        case PublishKind.TOOL_PROGRESS:
            return CallFeed.tool_progress
        case PublishKind.CLIENT_EVENTS:
            return CallFeed.client_events
        case PublishKind.TRANSCRIPT:
            return CallFeed.transcript
        case PublishKind.USAGE:
            return CallFeed.usage
        case PublishKind.SELECTION:
            return CallFeed.selection
        case PublishKind.AGENT:
            return CallFeed.agent
        case _:
            assert_never(kind)


def _metric(name: Metric) -> Callable[[float], None]:
    """The metric a ``Measure`` effect observes (every one: ``assert_never``)."""
    match name:
        case Metric.TOOL_OVERHEAD:
            return metrics.tool_overhead
        case Metric.TOOL_TURNAROUND:
            return metrics.tool_turnaround
        case Metric.TURN_FIRST_AUDIO:
            return metrics.turn_first_audio
        case Metric.TURN_ANSWER:
            return metrics.turn_answer
        case Metric.TURN_TOOLS:
            return metrics.turn_tools
        case Metric.TURN_OVERHEAD:
            return metrics.turn_overhead
        case Metric.TURN_SERVICE:
            return metrics.turn_service
        case _:
            assert_never(name)


# The effects look their handler up in a table made from the matches above
# (one dict lookup per effect, where a match over enum members tests them one
# by one, each a class attribute read).
_PUBLISHERS: dict[PublishKind, Callable[..., None]] = {kind: _publisher(kind) for kind in PublishKind}
_MEASURES: dict[Metric, Callable[[float], None]] = {name: _metric(name) for name in Metric}

_EFFECT_HANDLERS: dict[type, Callable[[CallActor, Any], None]] = {
    Send: CallActor._do_send,
    Log: CallActor._do_log,
    RecordLine: CallActor._do_record,
    Publish: CallActor._do_publish,
    StartTool: CallActor._do_start,
    Prefetch: CallActor._do_prefetch,
    Measure: CallActor._do_measure,
    CancelOlderReads: CallActor._do_cancel_older,
    WakeAt: CallActor._do_wake,
    EndCall: CallActor._do_end,
    Refer: CallActor._do_refer,
    CountUsage: CallActor._do_count_usage,
    RateLimits: CallActor._do_rate_limits,
}
