"""CallActor: one live call's sideband, from connect to call record.

The actor owns everything about its call — the websocket, the epoch, the
responses and tool calls in flight — and nothing outside touches that state.
Inside ``run`` it keeps a nursery for its tool tasks (they outlive a dropped
socket), and per connection a reader task and ONE writer task: every event we
send goes through the writer's memory channel, so frames never interleave.
All state changes happen synchronously in event handlers on the trio thread,
so each handler sees and leaves a consistent state.

The protocol rules (``docs/calls.md`` has the long form):

* a tool call runs only on complete arguments of a response not cancelled and
  not superseded; calls of one response run concurrently;
* every tool call id is answered exactly once; an output counts as delivered
  when the service echoes it (``conversation.item.added``); unconfirmed
  outputs are written again after a reconnect, confirmed ones never;
* one ``response.create`` per batch, after that response's ``response.done``,
  once every output is written, only while no response is active and only if
  the batch's epoch is current; ``conversation_already_has_active_response``
  naming our event sends us back to waiting for the active response to end;
* ``speech_started`` and a cancelled response advance the epoch and cancel the
  older epoch's reads at the executor; older work still answers its call id
  but never asks for a response.
"""

from __future__ import annotations

import json
import math
import random
from urllib.parse import quote
from dataclasses import dataclass
from typing import Any, Callable

import httpx
import trio

from voiceactors import metrics, storage
from voiceactors.actors import write_log
from voiceactors.actors.call_record import CallRecord
from voiceactors.actors.call_state import (
    ANSWERED, ENDED_OK, UNANSWERED, UNSENT, Batch, CreateSent, ToolCall,
)
from voiceactors.actors.feed import CallFeed
from voiceactors.actors.messages import CancelReads, ToolRequest, ToolResult
from voiceactors.actors.recovery import RESTARTED_OUTPUT, PendingCall
from voiceactors.config import ConfigUnreadable
from voiceactors.logs import get_logger
from voiceactors.realtime import events as rt
from voiceactors.realtime.sideband import (
    CallGone, ConnectionClosed, SidebandBroken, SidebandRefused, SidebandUnavailable, close_code,
    is_clean_close, open_sideband,
)
from voiceactors.settings import Settings
from voiceactors.tools.registry import lookup

# End reasons (the ``end`` line of the call record, the ``call.ended`` feed event).
END_CLOSED = "closed_by_service"       # clean close 1000/1001
END_GONE = "call_gone"                 # 404/410 at the handshake
END_IDLE = "idle_timeout"
END_MAX = "max_duration"
END_EXHAUSTED = "reconnect_exhausted"
END_NO_KEY = "no_api_key"
END_CONFIG_UNREADABLE = "config_unreadable"   # the journal config could not be read at any attempt
END_UNAUTHORIZED = "unauthorized"      # 401/403 at the handshake, or an invalid_api_key error
END_QUOTA = "insufficient_quota"       # the service's insufficient_quota error
END_SHUTDOWN = "shutdown"              # the actor was cancelled (server stopping)
END_ERROR = "error"                    # a bug: logged with its traceback

#: Ends reached with the socket still up: pending tool calls are answered first.
SOCKET_UP_ENDS = frozenset({END_IDLE, END_MAX, END_SHUTDOWN})
#: Ends after which the call itself is hung up (the browser is gone, or we stop serving it).
HANGUP_ENDS = frozenset({END_IDLE, END_MAX})

#: The server events ``_handle`` acts on; the reader skips the rest (deltas,
#: audio buffer and rate-limit events) without validating them.
HANDLED_EVENTS = frozenset({
    "response.created", "response.output_item.added", "response.output_item.done",
    "response.function_call_arguments.done", "response.done", "input_audio_buffer.speech_started",
    "conversation.item.added", "conversation.item.created", "conversation.item.done", "error",
    "conversation.item.input_audio_transcription.completed",
    "response.output_audio_transcript.done", "response.output_text.done",
})

ACTIVE_RESPONSE = "conversation_already_has_active_response"
#: Service error codes after which the call cannot go on: it ends at once.
FATAL_ERRORS = {"invalid_api_key": END_UNAUTHORIZED, "insufficient_quota": END_QUOTA}
#: Close codes of a broken connection (protocol error, bad data, message too
#: big): such a drop always counts toward the reconnect limit.
BROKEN_CLOSE_CODES = frozenset({1002, 1003, 1007, 1009})
#: A connection that lasted this long counts as healthy even without events
#: (a quiet call), so its drop starts the failure count afresh.
HEALTHY_AFTER_S = 30.0
#: Longest tool name kept from the peer (ours are under 40 characters).
TOOL_NAME_MAX = 128
#: Longest peer-sent string (error code, type, event id) put in a log line.
PEER_STRING_MAX = 64
#: After ``conversation_already_has_active_response`` while we saw no active
#: response (its ``response.created`` fell in a drop), retry after this long.
BLIND_RETRY_S = 2.0
BLIND_RETRIES = 3
#: A write that cannot finish in this long means the socket is stuck.
SEND_TIMEOUT_S = 10.0

ApiKey = str | None | Callable[[], str | None]


def _is_cancel(exc: BaseException) -> bool:
    """True for Cancelled, or a group holding nothing but Cancelled."""
    if isinstance(exc, BaseExceptionGroup):
        rest = exc.split(trio.Cancelled)[1]
        return rest is None
    return isinstance(exc, trio.Cancelled)


@dataclass(frozen=True)
class _Out:
    """One event for the writer; ``tool_call_id`` marks a function_call_output."""

    event: dict[str, Any]
    tool_call_id: str | None = None


def _log_id(tool_call_id: str) -> str:
    """A peer-sent tool call id as logged: clipped like the other peer strings."""
    return rt.clip(tool_call_id, PEER_STRING_MAX)


def backoff_delay(attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Delay before reconnect ``attempt`` (1-based): ``base * 2**(attempt-1)``
    capped at ``cap``, scaled into [50 %, 100 %] by ``rng`` when given (the
    actor seeds it with its call id, so it is deterministic)."""
    delay = min(cap, base * (2 ** max(0, attempt - 1)))
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
    unanswered; this run answers them once its sideband is up.
    """

    def __init__(self, settings: Settings, call_id: str, executor_inbox: trio.MemorySendChannel[Any],
                 api_key: ApiKey, feed: CallFeed | None = None, *, hangup: bool = True,
                 recovered: list[PendingCall] | None = None) -> None:
        self.settings = settings
        self.call_id = call_id
        self._executor = executor_inbox
        self._api_key = api_key
        self.feed = feed
        self._hangup_enabled = hangup
        self.log = get_logger(actor="call", call_id=call_id)
        self._rng = random.Random(call_id)
        # protocol state (owned by the handlers below)
        self.epoch = 0
        self.turn = 0
        self._speech_turn = False
        self.calls: dict[str, ToolCall] = {}
        self.batches: dict[str, Batch] = {}
        self.active: set[str] = set()
        self._creates: dict[str, CreateSent] = {}
        self._output_events: dict[str, str] = {}     # event_id -> tool_call_id
        self._create_inflight: str | None = None
        self._retry_at: float | None = None        # math.inf: retries used up, wait for a response event
        self._watch_scope: trio.CancelScope | None = None
        self._blind_retries = 0
        self._seq = 0
        # connection state
        self._outbox: trio.MemorySendChannel[_Out] | None = None
        self._conn_done = trio.Event()
        self._conn_reason: str | None = None
        self._stop = trio.Event()                  # server shutdown requested
        self._close_code: int | None = None
        self._last_event = 0.0
        self._conn_events = 0                      # valid server events on this connection
        self._log_budget = rt.LogBudget()          # peer-triggered log lines (skipped frames, errors)
        # tool tasks
        self._tools: trio.Nursery | None = None
        self._tool_scopes: dict[str, trio.CancelScope] = {}
        self._tools_idle = trio.Event()
        # lifetime
        self.started = 0.0
        self.deadline = math.inf
        self.reconnects = 0
        self.end_reason: str | None = None
        self.ended_at: float | None = None     # when the end was decided (before the bounded close)
        self.record: CallRecord | None = None
        self.recovered = recovered

    # ------------------------------------------------------------------ run

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> str:
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
        return self.end_reason or END_ERROR

    def _request_stop(self) -> None:
        """Server shutdown: end the call as ``shutdown`` with the socket up."""
        self._stop.set()
        if not self._conn_done.is_set():
            self._conn_reason = END_SHUTDOWN
            self._conn_done.set()

    async def _serve_call(self) -> str:
        """The call from first connect to its record; returns the end reason.
        Runs shielded (see ``run``); only its own deadline cancels it."""
        self.started = trio.current_time()
        self.deadline = self.started + self.settings.call_max_duration_s
        rejoin = self.recovered is not None
        fields = {"rejoined": True, "recovered": [p.tool_call_id for p in self.recovered]} if rejoin else {}
        self.record = CallRecord(self.call_id, self.settings.state_dir, started=self.started,
                                 write_now=rejoin, **fields)
        async with trio.open_nursery() as recorder:
            await recorder.start(self.record.run)
            try:
                return await self._serve_recorded()
            finally:
                recorder.cancel_scope.cancel()   # a close cut short by its deadline

    async def _serve_recorded(self) -> str:
        reason = END_ERROR
        try:
            async with trio.open_nursery() as tools:
                self._tools = tools
                try:
                    await self._seed_recovered()
                    reason = await self._connection_loop()
                except BaseException as exc:
                    if _is_cancel(exc):
                        reason = END_SHUTDOWN
                        raise
                    self.log.exception("call.crashed", epoch=self.epoch)
                    reason = END_ERROR
                    if not isinstance(exc, Exception):
                        raise
                finally:
                    if self.ended_at is None:
                        self.ended_at = trio.current_time()
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
                          suppressed_logs=self._log_budget.take_suppressed() or None)
        return reason

    async def _connection_loop(self) -> str:
        """Connect, serve, reconnect. A drop after a connection that carried
        at least one valid event (or lasted ``HEALTHY_AFTER_S``) starts the
        failure count afresh; a connection that broke before that (or with a
        protocol-error close)
        counts as one more failure, so a peer that accepts and then sends
        garbage exhausts the reconnect attempts instead of looping until the
        maximum duration."""
        failures = 0
        while True:
            if self._stop.is_set():
                return END_SHUTDOWN
            if trio.current_time() >= self.deadline:
                return END_MAX
            self._conn_events = 0
            opened_at = math.inf
            unreadable = False
            try:
                key = await self._key()
                if not key:
                    self.log.warning("call.no_api_key")
                    return END_NO_KEY
                async with open_sideband(self.settings.openai_base_url, key, self.call_id,
                                         connect_timeout=self.settings.connect_timeout_s) as ws:
                    opened_at = trio.current_time()
                    if self.record is not None:
                        self.record.opened()
                    self.record_line("connect", reconnects=self.reconnects)
                    self.log.info("call.connected", epoch=self.epoch, reconnects=self.reconnects)
                    reason = await self._serve(ws)
                    if reason is not None:
                        return reason
            except CallGone as exc:
                self.log.info("call.gone", status=exc.status_code)
                return END_GONE
            except SidebandRefused as exc:
                self.log.error("call.refused", status=exc.status_code)
                return END_UNAUTHORIZED
            except SidebandUnavailable as exc:
                self.log.warning("call.connect_failed", error=str(exc), status=exc.status_code)
                self._close_code = None
            except ConfigUnreadable as exc:     # an I/O error, not "no key": a failed attempt
                self.log.warning("call.config_unreadable", error=str(exc))
                self._close_code, unreadable = None, True
            except SidebandBroken as exc:
                self.log.warning("call.connection_broken", error=str(exc), epoch=self.epoch)
                self._conn_events = 0
            self._on_drop()
            healthy = self._conn_events > 0 or trio.current_time() - opened_at >= HEALTHY_AFTER_S
            if healthy and self._close_code not in BROKEN_CLOSE_CODES:
                failures = 0    # it worked for a while: a fresh drop
            failures += 1
            if failures > self.settings.reconnect_attempts:
                return END_CONFIG_UNREADABLE if unreadable else END_EXHAUSTED
            delay = backoff_delay(failures, self.settings.reconnect_base_s, self.settings.reconnect_max_s, self._rng)
            self.reconnects += 1
            metrics.reconnect()
            self.record_line("reconnect", attempt=failures, delay_s=round(delay, 3), close_code=self._close_code)
            self.log.info("call.reconnecting", attempt=failures, delay_s=round(delay, 3),
                          close_code=self._close_code, epoch=self.epoch)
            with trio.move_on_at(min(self.deadline, trio.current_time() + delay)):
                await self._stop.wait()

    async def _serve(self, ws: Any) -> str | None:
        """One connection: reader + writer until it closes or the call ends.
        Returns the end reason, or None when the socket dropped (reconnect)."""
        send, receive = trio.open_memory_channel[_Out](math.inf)
        self._conn_done = trio.Event()
        self._conn_reason = None
        self._close_code = None
        self._last_event = trio.current_time()
        if self._stop.is_set():
            self._request_stop()
        self._outbox = send
        try:
            self._on_connected()
            async with trio.open_nursery() as conn:
                conn.start_soon(self._reader, ws)
                conn.start_soon(self._writer, ws, receive)
                reason = await self._watch()
                conn.cancel_scope.cancel()
        except BaseException:
            # cancelled (server stopping) or a bug: the socket is still up, so
            # answer what is pending and close it cleanly before unwinding
            self._outbox = None
            self._unqueue()
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + self.settings.close_deadline_s
                await self._finish_on_socket(ws, END_SHUTDOWN, scope.deadline)
            raise
        finally:
            self._outbox = None
            send.close()
        self._unqueue()
        if reason in SOCKET_UP_ENDS:
            with trio.move_on_after(self.settings.close_deadline_s) as scope:
                await self._finish_on_socket(ws, reason, scope.deadline)
        return reason

    async def _watch(self) -> str | None:
        """Wait for the connection to end, the idle timeout, the maximum
        duration, or a due response.create retry."""
        idle = self.settings.call_idle_timeout_s
        while True:
            wake = min(self._last_event + idle, self.deadline,
                       self._retry_at if self._retry_at is not None else math.inf)
            with trio.move_on_at(wake) as self._watch_scope:
                await self._conn_done.wait()
                return self._conn_reason
            now = trio.current_time()
            if now >= self.deadline:
                self.ended_at = now
                return END_MAX
            if now >= self._last_event + idle:
                self.ended_at = now
                self.log.info("call.idle", idle_s=idle, epoch=self.epoch)
                return END_IDLE
            if self._retry_at is not None and now >= self._retry_at:
                self._retry_at = None
                self._maybe_follow_up()

    async def _reader(self, ws: Any) -> None:
        try:
            while True:
                raw = await ws.get_message()
                self._last_event = trio.current_time()
                self._seq += 1
                event = rt.parse_server_event(raw, only=HANDLED_EVENTS, budget=self._log_budget)
                if event is None:
                    continue
                self._conn_events += 1
                try:
                    self._handle(event)
                except Exception:  # one bad event must not end the call
                    self.log.exception("call.event_failed", type=getattr(event, "type", None), epoch=self.epoch)
        except ConnectionClosed as exc:
            self._end_connection(close_code(exc))

    async def _writer(self, ws: Any, receive: trio.MemoryReceiveChannel[_Out]) -> None:
        async for out in receive:
            data = json.dumps(out.event, ensure_ascii=False)
            try:
                # Shielded: a frame cancelled half-way would corrupt the stream.
                with trio.CancelScope(shield=True):
                    with trio.fail_after(SEND_TIMEOUT_S):
                        await ws.send_message(data)
            except ConnectionClosed as exc:
                self._end_connection(close_code(exc))
                return
            except trio.TooSlowError:
                self.log.warning("call.send_stuck", epoch=self.epoch)
                self._end_connection(None)
                return
            self._on_written(out)

    def _end_connection(self, code: int | None) -> None:
        if self._conn_done.is_set():
            return
        code = int(code) if code is not None else None  # an IntEnum from trio-websocket
        self._close_code = code
        self._conn_reason = END_CLOSED if is_clean_close(code) else None
        self.log.info("call.socket_closed", close_code=code, epoch=self.epoch)
        self._conn_done.set()

    # ------------------------------------------------------- server events

    def _handle(self, event: Any) -> None:
        """Dispatch one server event (its type is in ``HANDLED_EVENTS``)."""
        kind = event.type
        if kind == "response.created":
            self._on_response_created(event.response)
        elif kind in ("response.output_item.added", "response.output_item.done"):
            self._on_output_item(event.response_id, event.item, done=kind.endswith(".done"))
        elif kind == "response.function_call_arguments.done":
            self._on_arguments_done(event)
        elif kind == "response.done":
            self._on_response_done(event.response)
        elif kind == "input_audio_buffer.speech_started":
            self._on_speech_started()
        elif kind in ("conversation.item.added", "conversation.item.created", "conversation.item.done"):
            self._on_item_added(event.item, first=kind != "conversation.item.done")
        elif kind == "error":
            self._on_error(event.error)
        elif kind == "conversation.item.input_audio_transcription.completed":
            self._transcript("user", event.transcript, event.item_id)
        elif kind == "response.output_audio_transcript.done":
            self._transcript("assistant", event.transcript, event.item_id)
        elif kind == "response.output_text.done":
            self._transcript("assistant", event.text, event.item_id)

    def _batch(self, response_id: str) -> Batch:
        batch = self.batches.get(response_id)
        if batch is None:  # first seen without its response.created (e.g. after a reconnect)
            batch = Batch(response_id, self.epoch, "model", self._seq)
            self.batches[response_id] = batch
        return batch

    def _on_response_created(self, response: Any) -> None:
        rid = response.id or f"resp_unknown_{self._seq}"
        new = rid not in self.batches
        batch = self._batch(rid)
        self.active.add(rid)
        self._retry_at = None
        if new and self._create_inflight is not None:
            # The service answers our response.create with response.created
            # (it carries no event_id, so the first one after ours is ours).
            create = self._creates[self._create_inflight]
            create.response_id = rid
            batch.origin = "ours"
            self._create_inflight = None
        elif new:
            self._carried_forward_by(batch)
        self.log.debug("response.created", response_id=rid, origin=batch.origin, epoch=batch.epoch)

    def _carried_forward_by(self, started: Batch) -> None:
        """A response the model started after every output of a finished batch
        was confirmed has those outputs in its context: it carries the
        conversation forward, so that batch needs no response.create of ours."""
        for batch in self.batches.values():
            if batch is started or batch.follow_up is not None or not batch.calls:
                continue
            if batch.status not in ENDED_OK or batch.epoch != self.epoch or started.epoch != self.epoch:
                continue
            seqs = [self.calls[c].confirmed_seq for c in batch.calls]
            if all(s is not None and s < started.created_seq for s in seqs):
                batch.follow_up = "model"
                self.log.info("response.follow_up_by_model", response_id=batch.response_id,
                              by=started.response_id, epoch=self.epoch)

    def _tool_call(self, response_id: str, call_id: str | None, name: str | None, item_id: str | None) -> ToolCall | None:
        if not call_id:
            return None
        # a tool name is ours to know; one longer than any we have is unknown
        # either way, and clipped it cannot flood the logs and the record
        name = rt.clip(name, TOOL_NAME_MAX)
        call = self.calls.get(call_id)
        if call is None:
            batch = self._batch(response_id)
            call = ToolCall(call_id, name or "", response_id, batch.epoch, self.turn,
                            trio.current_time() - self.started, item_id=item_id)
            self.calls[call_id] = call
            batch.calls.append(call_id)
        elif name and not call.name:
            call.name = name
        return call

    def _on_output_item(self, response_id: str, item: Any, *, done: bool) -> None:
        if getattr(item, "type", None) != "function_call":
            return
        call = self._tool_call(response_id, item.call_id, item.name, item.id)
        if call is None or not done or call.state != "seen":
            return
        if item.arguments is not None:
            call.arguments = item.arguments
        if item.status in (None, "completed") and call.arguments is not None:
            call.complete = True
            self._maybe_start(call)

    def _on_arguments_done(self, event: Any) -> None:
        # Also emitted for an interrupted response, with partial arguments: not
        # a reason to run. The item's done event or the response's done decides.
        call = self._tool_call(event.response_id, event.call_id, event.name, event.item_id)
        if call is not None and call.state == "seen" and not call.complete:
            call.arguments = event.arguments

    def _on_response_done(self, response: Any) -> None:
        rid = response.id or f"resp_unknown_{self._seq}"
        batch = self._batch(rid)
        self.active.discard(rid)
        # a response ended (maybe the one the service was busy with, whose
        # response.created we never saw): decide now, not at the blind retry
        self._retry_at = None
        batch.status = response.status or "completed"
        batch.done_t = trio.current_time()
        for item in response.output or ():
            if getattr(item, "type", None) != "function_call":
                continue
            call = self._tool_call(rid, item.call_id, item.name, item.id)
            if call is not None and call.state == "seen" and not call.complete and item.arguments is not None:
                call.arguments = item.arguments
        for call_id in batch.calls:
            call = self.calls[call_id]
            if call.state != "seen":
                continue
            if batch.status == "completed" and call.arguments is not None:
                call.complete = True
                self._maybe_start(call)
            else:
                self._abandon(call)
        self.log.debug("response.done", response_id=rid, status=batch.status, origin=batch.origin,
                      epoch=batch.epoch, tool_calls=len(batch.calls))
        self.record_line("response", response_id=rid, status=batch.status, epoch=batch.epoch,
                         origin=batch.origin, tool_calls=list(batch.calls))
        if batch.status == "cancelled" and batch.epoch == self.epoch:
            self._advance_epoch("response_cancelled")
        self._maybe_follow_up()

    def _on_speech_started(self) -> None:
        self.turn += 1
        self._speech_turn = True
        self._advance_epoch("speech_started")

    def _on_item_added(self, item: Any, *, first: bool) -> None:
        kind = getattr(item, "type", None)
        if kind == "function_call_output":
            call = self.calls.get(item.call_id)
            if call is not None and call.state != "confirmed":
                call.state = "confirmed"
                call.confirmed_seq = self._seq
                self._record_settled(call)
                self.log.debug("tool.output_confirmed", tool_call_id=_log_id(call.tool_call_id), epoch=self.epoch)
        elif kind == "message" and getattr(item, "role", None) == "user" and first:
            if not self._speech_turn:  # a typed turn: no speech_started came first
                self.turn += 1
            self._speech_turn = False

    def _on_error(self, error: Any) -> None:
        event_id, code = error.event_id, error.code
        fatal = FATAL_ERRORS.get(code or "")
        if fatal is not None:
            self.log.error("realtime.fatal_error", code=code, epoch=self.epoch)
            if not self._conn_done.is_set():
                self.ended_at = trio.current_time()
                self._conn_reason = fatal
                self._conn_done.set()
            return
        if self._log_budget.allow():
            self.log.warning("realtime.error", code=rt.clip(code, PEER_STRING_MAX),
                             error_type=rt.clip(error.type, PEER_STRING_MAX),
                             event_id=rt.clip(event_id, PEER_STRING_MAX), epoch=self.epoch,
                             suppressed=self._log_budget.take_suppressed() or None)
        if event_id in self._creates:
            self._on_create_error(self._creates[event_id], code)
        elif event_id in self._output_events:
            call = self.calls[self._output_events[event_id]]
            if call.state in ("sent", "queued"):
                # The service refused this output (already answered after a
                # resend, or an id it no longer knows): never send it again.
                call.state = "rejected"
                self._record_settled(call)
            self._maybe_follow_up()

    def _on_create_error(self, create: CreateSent, code: str | None) -> None:
        if self._create_inflight == create.event_id:
            self._create_inflight = None
        if create.response_id is not None:
            # the response.created we took for ours was the model's
            self.batches[create.response_id].origin = "model"
        ours = [self.batches[r] for r in create.batches if self.batches[r].follow_up == "ours"]
        if code == ACTIVE_RESPONSE:
            create.result = "rejected_active"
            for batch in ours:
                batch.follow_up = None
            for rid in self.active:
                self._carried_forward_by(self.batches[rid])
            if not self.active and self._blind_retries < BLIND_RETRIES:
                # active on the service but not to us: retry later (a
                # response.done wakes us sooner)
                self._blind_retries += 1
                self._retry_at = trio.current_time() + BLIND_RETRY_S
                if self._watch_scope is not None:  # the watch sleeps until its old wake time
                    self._watch_scope.deadline = min(self._watch_scope.deadline, self._retry_at)
            elif not self.active:
                # retries used up: no immediate resend (that would loop while
                # the service keeps refusing); the next response.created or
                # response.done, or a reconnect, decides again
                self._retry_at = math.inf
        else:
            create.result = f"error:{code}"
            for batch in ours:
                batch.follow_up = "failed"
        self._maybe_follow_up()

    def _transcript(self, role: str, text: str | None, item_id: str | None) -> None:
        if not text:
            return
        self.record_line("transcript", role=role, item_id=item_id, text=text)
        if self.feed is not None:
            self.feed.transcript(role=role, text=text, item_id=item_id)

    # ------------------------------------------------------------- epochs

    def _advance_epoch(self, why: str) -> None:
        self.epoch += 1
        for batch in self.batches.values():
            if batch.follow_up is None and batch.calls and batch.epoch < self.epoch:
                batch.follow_up = "superseded"
        self.log.info("call.epoch", epoch=self.epoch, why=why, turn=self.turn)
        if self._tools is not None and any(c.state == "running" for c in self.calls.values()):
            self._tools.start_soon(self._tell_executor, CancelReads(self.call_id, before_epoch=self.epoch))

    async def _tell_executor(self, message: Any) -> None:
        try:
            await self._executor.send(message)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.log.error("tool.executor_gone")

    # -------------------------------------------------------------- tools

    def _maybe_start(self, call: ToolCall) -> None:
        batch = self.batches[call.response_id]
        if call.state != "seen" or not call.complete:
            return
        if batch.status not in (None, "completed") or batch.epoch < self.epoch:
            # cancelled, or the user took the floor before it ran: never start it
            self._abandon(call)
            return
        if self._tools is None:
            return
        call.state = "running"
        if not call.recovered:
            call.turn = self.turn
        call.started_t = trio.current_time()
        self._record_started(call)
        # Shielded: the actor's own cancellation (shutdown) must not cut a tool
        # call short before _settle_tools gave a started write time to report;
        # the actor cancels this scope itself when it gives up waiting.
        scope = trio.CancelScope(shield=True)
        self._tool_scopes[call.tool_call_id] = scope
        self._tools_idle = trio.Event()
        send, receive = trio.open_memory_channel[ToolResult](1)
        request = ToolRequest(call_id=self.call_id, tool_call_id=call.tool_call_id, name=call.name,
                              arguments=call.arguments or "", epoch=call.epoch, turn=call.turn, reply=send)
        try:
            # handed over in this turn when the inbox has room: the executor
            # starts on it while the task that waits for the answer starts
            self._executor.send_nowait(request)
            pending = None
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            pending = request   # the task sends it (waits for room, or finds the executor gone)
        self._tools.start_soon(self._run_tool, call, scope, pending, receive)

    async def _run_tool(self, call: ToolCall, scope: trio.CancelScope, pending: ToolRequest | None,
                        receive: trio.MemoryReceiveChannel[ToolResult]) -> None:
        self.log.debug("tool.started", tool=call.name, tool_call_id=_log_id(call.tool_call_id), epoch=call.epoch, turn=call.turn)
        if self.feed is not None:
            self.feed.tool_started(tool=call.name, tool_call_id=call.tool_call_id, epoch=call.epoch)
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
                    self.log.error("tool.executor_gone", tool=call.name, tool_call_id=_log_id(call.tool_call_id))
        finally:
            self._tool_scopes.pop(call.tool_call_id, None)
            if result is not None:
                self._on_tool_result(call, result)
            elif call.state == "running":
                call.outcome = "failed" if gone else "cancelled"
                self._abandon(call)
            if not any(c.state == "running" for c in self.calls.values()):
                self._tools_idle.set()

    def _on_tool_result(self, call: ToolCall, result: ToolResult) -> None:
        call.duration_ms = result.duration_ms
        call.outcome = result.outcome
        if result.tool and result.tool != call.name:
            call.name = result.tool  # the canonical dotted name
        if call.state == "running":
            call.output = result.output
            call.state = "ready"
            self._queue_output(call)
        self.log.debug("tool.finished", tool=call.name, tool_call_id=_log_id(call.tool_call_id), epoch=call.epoch,
                      current_epoch=self.epoch, outcome=result.outcome, duration_ms=round(result.duration_ms, 1))
        if self.feed is not None:
            self.feed.tool_done(tool=call.name, tool_call_id=call.tool_call_id, epoch=call.epoch,
                                outcome=result.outcome, duration_ms=result.duration_ms)
            if result.client_events:
                self.feed.client_events(result.client_events, tool=call.name, tool_call_id=call.tool_call_id)
        self._maybe_follow_up()

    def _abandon(self, call: ToolCall) -> None:
        if call.state not in UNANSWERED:
            return
        call.abandon()
        self.log.info("tool.abandoned", tool=call.name, tool_call_id=_log_id(call.tool_call_id), epoch=call.epoch)
        self._queue_output(call)

    async def _settle_tools(self, deadline: float) -> None:
        """Stop the reads of this call and give started writes until
        ``deadline`` to finish (they are reported, not lost)."""
        if not any(c.state == "running" for c in self.calls.values()):
            return
        with trio.move_on_at(deadline):
            await self._executor.send(CancelReads(self.call_id, before_epoch=None))
            await self._tools_idle.wait()

    # ------------------------------------------------------------ outputs

    def _queue_output(self, call: ToolCall) -> None:
        """Hand a ready output to the current connection's writer (or keep it
        ready until the next connection)."""
        if call.state != "ready" or self._outbox is None or call.output is None:
            return
        event = rt.function_call_output(call.tool_call_id, call.output)
        self._output_events[event["event_id"]] = call.tool_call_id
        call.state = "queued"
        self._outbox.send_nowait(_Out(event, call.tool_call_id))

    def _on_written(self, out: _Out) -> None:
        now = trio.current_time()
        if out.tool_call_id is None:
            self._on_create_written(out.event.get("event_id"), now)
            return
        call = self.calls[out.tool_call_id]
        call.sends += 1
        if call.sends == 1 and not call.synthetic and call.started_t is not None and call.duration_ms is not None:
            # what the actors add around the tool: the hops to the executor
            # and back and the writer's turn (the executor times the rest)
            overhead = max(0.0, (now - call.started_t) * 1000 - call.duration_ms)
            call.overhead_ms = round(overhead, 2)
            metrics.tool_overhead(overhead / 1000)
        if call.state == "queued":
            call.state = "sent"
        self._maybe_follow_up()

    def _on_create_written(self, event_id: str | None, now: float) -> None:
        """Time a response.create of ours from the latest response.done of
        the batches it carries forward (what the service waits on us)."""
        create = self._creates.get(event_id or "")
        if create is None or create.turnaround_ms is not None:
            return
        done = [self.batches[r].done_t for r in create.batches if r in self.batches]
        done = [t for t in done if t is not None]
        if done:
            create.turnaround_ms = round(max(0.0, now - max(done)) * 1000, 2)
            metrics.tool_turnaround(create.turnaround_ms / 1000)

    def _unqueue(self) -> None:
        """The writer is gone: what it did not write is ready again."""
        for call in self.calls.values():
            if call.state == "queued":
                call.state = "ready"

    def _on_connected(self) -> None:
        for call in self.calls.values():
            self._queue_output(call)
        self._maybe_follow_up()

    def _on_drop(self) -> None:
        """The socket is gone. Unconfirmed outputs will be written again; a
        response.create without its response.created is re-decided; responses
        we saw start but not end are ``lost`` (their calls with complete
        arguments run on; the others get the synthetic output)."""
        for call in self.calls.values():
            if call.state in ("queued", "sent"):
                call.state = "ready"
        if self._create_inflight is not None:
            create = self._creates[self._create_inflight]
            create.result = "lost"
            for rid in create.batches:
                if self.batches[rid].follow_up == "ours":
                    self.batches[rid].follow_up = None
            self._create_inflight = None
        for rid in list(self.active):
            batch = self.batches[rid]
            batch.status = "lost"
            for call_id in batch.calls:
                # complete calls already run (a started write must report its
                # real result); the rest will never complete
                call = self.calls[call_id]
                if not call.complete:
                    self._abandon(call)
        self.active.clear()
        self._retry_at = None

    # ---------------------------------------------------------- follow-up

    def _maybe_follow_up(self) -> None:
        """Send one response.create for the finished batches whose every
        output is written, if the epoch is theirs and no response is active."""
        if self._outbox is None or self._create_inflight is not None or self.active:
            return
        if self._retry_at is not None:
            return
        due = []
        for batch in self.batches.values():
            if batch.follow_up is not None or not batch.calls or batch.status not in ENDED_OK:
                continue
            if batch.epoch < self.epoch:
                batch.follow_up = "superseded"
                continue
            states = [self.calls[c].state for c in batch.calls]
            if all(s in ANSWERED and s not in UNSENT for s in states):
                due.append(batch)
        if not due:
            return
        event = rt.response_create()
        create = CreateSent(event["event_id"], self.epoch, [b.response_id for b in due],
                            round(trio.current_time() - self.started, 3))
        self._creates[create.event_id] = create
        self._create_inflight = create.event_id
        for batch in due:
            batch.follow_up = "ours"
        self.log.info("response.create", event_id=create.event_id, epoch=self.epoch, batches=create.batches)
        self._outbox.send_nowait(_Out(event))

    # ----------------------------------------------------------- ending

    async def _finish_on_socket(self, ws: Any, reason: str, deadline: float) -> None:
        """End with the socket still up: settle tools, answer every call id
        not yet written (synthetic output for abandoned ones), hang up when
        the browser is gone, close cleanly. Bounded by ``deadline``."""
        with trio.move_on_at(deadline):
            await self._settle_tools(trio.current_time() + (deadline - trio.current_time()) / 2)
            for scope in list(self._tool_scopes.values()):
                scope.cancel()
            for call in self.calls.values():
                if call.state in UNANSWERED:
                    call.outcome = call.outcome or "cancelled"
                    call.abandon()
                if call.state != "ready" or call.output is None:
                    continue
                event = rt.function_call_output(call.tool_call_id, call.output)
                self._output_events[event["event_id"]] = call.tool_call_id
                try:
                    with trio.fail_after(SEND_TIMEOUT_S):
                        await ws.send_message(json.dumps(event, ensure_ascii=False))
                except (ConnectionClosed, trio.TooSlowError):
                    break
                call.sends += 1
                call.state = "sent"
            if reason in HANGUP_ENDS and self._hangup_enabled:
                await self._hangup()
            try:
                await ws.aclose(1000)
            except ConnectionClosed:
                pass

    async def _hangup(self) -> None:
        """POST the Realtime hangup for this call (best effort). Plain httpx:
        the SDK client hops to a worker thread on its first request."""
        key = await self._key()
        if not key:
            return
        url = f"{self.settings.openai_base_url.rstrip('/')}/realtime/calls/{quote(self.call_id, safe='')}/hangup"
        try:
            async with httpx.AsyncClient(timeout=self.settings.connect_timeout_s) as client:
                response = await client.post(url, headers={"Authorization": f"Bearer {key}"})
            self.log.info("call.hangup", status=response.status_code)
        except httpx.HTTPError as exc:
            self.log.warning("call.hangup_failed", error=type(exc).__name__)

    async def _key(self) -> str | None:
        if callable(self._api_key):
            return await storage.run_sync(self._api_key)  # may read the journal config
        return self._api_key

    def record_line(self, kind: str, **fields: Any) -> None:
        if self.record is not None:
            self.record.add(kind, **fields)

    async def _write_record(self, reason: str) -> None:
        record = self.record
        if record is None:
            return
        for create in self._creates.values():
            record.add("response_create", t=create.t, event_id=create.event_id, epoch=create.epoch,
                       result=create.result, response_id=create.response_id,
                       turnaround_ms=create.turnaround_ms, **{"for": create.batches})
        for call in self.calls.values():
            self._record_settled(call)
        record.add("end", reason=reason, duration_s=round(trio.current_time() - self.started, 3),
                   epoch=self.epoch, reconnects=self.reconnects, tool_calls=len(self.calls),
                   responses=len(self.batches), close_code=self._close_code,
                   feed_dropped=self.feed.dropped if self.feed is not None else 0)
        written = await record.close()
        if record.failed is not None:
            self.log.error("call.record_failed", error=record.failed)
        elif written:
            self.log.info("call.recorded", path=str(record.path), flushes=record.flushes)
        else:
            self.log.info("call.not_recorded", why="never connected")

    def _record_started(self, call: ToolCall) -> None:
        """The ``tool_started`` line: what a restart needs to answer the call
        (arguments only for reads, which it may run again)."""
        spec = lookup(call.name)
        effect = spec.effect if spec is not None else None
        fields: dict[str, Any] = {"tool_call_id": call.tool_call_id, "tool": call.name,
                                  "response_id": call.response_id, "epoch": call.epoch, "turn": call.turn,
                                  "effect": effect}
        if effect == "read":
            fields["arguments"] = call.arguments
        self.record_line("tool_started", **fields)

    def _record_settled(self, call: ToolCall) -> None:
        """The one ``tool_call`` line of a call (when it settled, or at the end)."""
        if not call.recorded:
            call.recorded = True
            self.record_line("tool_call", **call.record_fields())

    async def _seed_recovered(self) -> None:
        """A rejoin: take over the tool calls the crashed run left pending.
        A write is answered from the write log (or with the restart error);
        a read with its arguments runs again; the rest get the restart error.
        They form completed batches of epoch 0, so once their outputs are
        written one ``response.create`` carries the conversation forward."""
        for pending in self.recovered or ():
            batch = self._batch(pending.response_id or f"resp_recovered_{pending.tool_call_id}")
            batch.status = "completed"
            call = ToolCall(pending.tool_call_id, pending.tool, batch.response_id, 0, 0, 0.0,
                            recovered=True, complete=True, arguments=pending.arguments)
            self.calls[call.tool_call_id] = call
            batch.calls.append(call.tool_call_id)
            if pending.effect == "read" and pending.arguments is not None:
                self._maybe_start(call)
                continue
            output, outcome = RESTARTED_OUTPUT, "restarted"
            if pending.effect == "write":
                recorded = await storage.run_sync(write_log.load, self.settings.state_dir, pending.tool_call_id)
                if recorded is not None:
                    output, outcome = recorded["output"], "replayed"
            self._record_started(call)
            call.output, call.outcome, call.state = output, outcome, "ready"
            call.synthetic = outcome == "restarted"
            self.log.info("tool.recovered", tool=call.name, tool_call_id=_log_id(call.tool_call_id), outcome=outcome)
