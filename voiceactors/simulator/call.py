"""One simulated Realtime call: its records, its state, and the live connection.

``SimCall`` outlives connections (a dropped sideband may reconnect and the
conversation continues); ``CallSession`` is one accepted websocket on it. A
session runs two tasks: the *reader* answers client events the way the service
does (validation, active-response tracking, tool-output bookkeeping) and the
*player* walks the call's scenario steps.

State changes happen synchronously (between checkpoints), so the reader and
the player never disagree about whether a response is active.
"""

from __future__ import annotations

import json
import math
import secrets
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterator, Protocol

import trio
from trio_websocket import ConnectionClosed

from voiceactors.logs import get_logger
from voiceactors.realtime.events import SERVER_EVENTS, validate_server_event
from voiceactors.simulator import conformance
from voiceactors.simulator.client_events import parse_client_event
from voiceactors.simulator.conformance import Direction, Nonconforming
from voiceactors.simulator.http import ReplayStream
from voiceactors.simulator.read_stamps import read_stamp, stamp_reads
from voiceactors.simulator.refusal_errors import OUTPUT_EVENT, SESSION_EXPIRED, Refusal, error_body
from voiceactors.simulator.scenario import Scenario
from voiceactors.simulator.billing import ConversationTokens

__all__ = ["SimCall", "CallSession", "ToolCallRecord", "ResponseRecord", "DEFAULT_REPLY"]

DEFAULT_REPLY = "Okay."
IDLE_PROMPT = "Are you still there?"   # the model's reply to an idle timeout, unless the step says otherwise
SESSION_CAP_S = 3600.0   # the service caps a session at 60 minutes
PEER_OPEN_WAIT_S = 10.0   # how long a browser call's scenario waits for its data channel
DROP_FLUSH_S = 1.0   # how long a drop waits for queued events to go out
SEND_BUFFER = 64 * 1024   # unwritten characters beyond which send waits for the writer
_ITEM_EVENTS = frozenset({"conversation.item.added", "conversation.item.done"})   # they name the item before


def _id(prefix: str, nbytes: int = 10) -> str:
    return prefix + secrets.token_hex(nbytes)


def _turn_detection(session: dict) -> dict:
    """The session's ``audio.input.turn_detection`` ({} when unset)."""
    audio = session.get("audio")
    audio_in = audio.get("input") if isinstance(audio, dict) else None
    found = audio_in.get("turn_detection") if isinstance(audio_in, dict) else None
    return found if isinstance(found, dict) else {}


def idle_timeout_ms(session: dict) -> int | None:
    """The session's idle timeout: ``idle_timeout_ms`` of server VAD turn
    detection (the only mode that has one), None when not set."""
    detection = _turn_detection(session)
    value = detection.get("idle_timeout_ms")
    if detection.get("type") != "server_vad" or not isinstance(value, int) or value <= 0:
        return None
    return value


def merged_session(old: dict, update: dict) -> dict:
    """A ``session.update`` applied: nested objects merge field by field, as
    the service applies a partial update; an object with a ``type`` (turn
    detection, an audio format) replaces the old one whole."""
    merged = dict(old)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict) and "type" not in value:
            merged[key] = merged_session(merged[key], value)
        else:
            merged[key] = value
    return merged


def _output_items(spec: dict) -> list[tuple[str, Any]]:
    """A response spec's output items in order, as ``(kind, body)``:
    ``items`` as given, or the short form (``text``, then ``tool_calls``)."""
    if "items" in spec:
        return [next(iter(item.items())) for item in spec["items"]]
    items: list[tuple[str, Any]] = [("message", spec["text"])] if spec.get("text") else []
    return items + [("function_call", call) for call in spec.get("tool_calls", [])]


@dataclass
class ToolCallRecord:
    call_id: str
    name: str
    arguments: str
    response_id: str
    item_id: str
    complete: bool = False       # arguments fully sent (function_call_arguments.done, status completed)
    turn: int = 0                # the user turn (count of speech_started) it belongs to


@dataclass
class ResponseRecord:
    id: str
    origin: str                  # "scenario" | "client" | "default" | "model_first"
    status: str = "in_progress"  # then completed | cancelled | failed | incomplete | abandoned
    reason: str | None = None    # status_details.reason when cancelled
    call_ids: list[str] = field(default_factory=list)
    started_at: float = 0.0
    ended_at: float | None = None


@dataclass
class _Active:
    """A response in progress on the service side."""

    record: ResponseRecord
    scopes: list[trio.CancelScope] = field(default_factory=list)  # the tasks playing its body
    output: list[dict] = field(default_factory=list)
    open_calls: dict[str, dict] = field(default_factory=dict)  # item_id -> partial function_call item
    finishing: bool = False   # response.done is on its way: the body sends nothing more
    finished: bool = False    # response.done has been sent

    @property
    def id(self) -> str:
        return self.record.id

    @contextmanager
    def playing(self) -> Iterator[None]:
        """Run a block that finishing the response (e.g. a cancel) interrupts."""
        scope = trio.CancelScope()
        if self.finishing:
            scope.cancel()
        self.scopes.append(scope)
        try:
            with scope:
                yield
        finally:
            self.scopes.remove(scope)


class SimCall:
    """Everything the simulator knows about one call id.

    Records (read them in assertions): ``received`` (client event dicts, in
    order, including invalid ones that were JSON objects), ``sent`` (server
    events), ``errors_sent``, ``outputs`` (tool call_id -> outputs received,
    duplicates included), ``lost_outputs`` (outputs a fault swallowed),
    ``response_creates``, ``connections``, ``drops``, ``closed``/``close_code``,
    ``responses``, ``tool_calls``, ``violations`` (protocol rules the client
    broke that the service would not report), ``refused`` (client events
    refused by an armed refusal or the expired session), ``forgotten``,
    ``idle_timeouts``, ``nonconforming`` (with conformance on).

    Times (only with ``timestamps=True``, for benchmarks; None otherwise),
    all ``trio.current_time()``:

    * ``sent_at[i]``: when ``sent[i]`` was recorded and queued for the
      writer (it may wait there behind earlier events);
    * ``written_at[i]``: right before its frame's bytes were handed to the
      socket (no schedule point between; with coalesced writes, the
      batch's one write); None until then, and for ever if it never was
      (a drop);
    * ``received_at[i]``: when the session's reader took ``received[i]``
      and decoded it (it may wait behind the session's own writes);
    * ``read_at[i]``: when trio-websocket's reader task handed the message
      over, in the step its socket read returned (``read_stamps``).

    What the peer could know is on the wire: a latency of the peer is
    ``read_at`` − ``written_at``; ``received_at`` − ``sent_at`` adds the
    simulator's own queues at both ends.

    Faults (armed by the test, used up when they fire): ``output_fault``
    (``"lost"`` or ``"applied"``: drop the socket on the next tool output, see
    ``CallSession._output_fault``), ``reject_creates`` (how many more
    ``response.create`` to refuse as if a response were active) and
    ``refusals`` (``refusals.Refusal``: the next client events one matches
    are refused with its code).
    """

    def __init__(self, call_id: str, scenario: Scenario, gone_status: int = 404, *,
                 timestamps: bool = False) -> None:
        self.call_id = call_id
        self.scenario = scenario
        self.gone_status = gone_status
        # a SIP call (``Simulator.place_phone_call``): pending until accepted or rejected
        self.sip = False
        self.accepted: dict[str, Any] | None = None     # the accept's body
        self.rejected_with: int | None = None           # the reject's SIP status
        self.referred_to: str | None = None             # the refer's target URI
        # records
        self.received: list[dict] = []
        self.sent: list[dict] = []
        self.received_at: list[float] | None = [] if timestamps else None
        self.sent_at: list[float] | None = [] if timestamps else None
        self.read_at: list[float] | None = [] if timestamps else None
        self.written_at: list[float | None] | None = [] if timestamps else None
        self.errors_sent: list[dict] = []
        self.outputs: dict[str, list[str]] = {}
        self.lost_outputs: dict[str, list[str]] = {}
        self.response_creates = 0
        self.connections = 0
        self.drops = 0
        self.closed = False
        self.close_code: int | None = None
        self.responses: list[ResponseRecord] = []
        self.tool_calls: dict[str, ToolCallRecord] = {}
        self.violations: list[str] = []
        self.nonconforming: list[Nonconforming] = []   # with conformance on: events not held to the SDK's types
        self.session: dict = {"type": "realtime"}
        # faults
        self.output_fault: str | None = None   # "lost" | "applied"
        self.reject_creates = 0
        self.refusals: list[Refusal] = []      # armed (``refuse`` steps, ``Simulator.refuse_next``), in order
        # refusals made: (code, client event), by an armed refusal or the expired session
        self.refused: list[tuple[str, dict]] = []
        self.forgotten: set[str] = set()       # tool call ids refused with invalid_tool_call_id: unknown from then on
        self.expired = False                   # past the session's cap: every client event gets session_expired
        self.idle_timeouts = 0                 # input_audio_buffer.timeout_triggered events sent
        # the model may go on while tool calls wait for their outputs (gpt-realtime's asynchronous
        # function calls; the ``async_tools`` step): a response.create then is no violation, and
        # the calls it went on over (``awaited``) may be answered and spoken in a later turn
        self.async_tools = False
        self.awaited: set[str] = set()
        # the ``hold_ack`` step: the next session.update's session.updated goes out after the next
        # response.done instead of at once (a handoff's acknowledgement after its response's completion)
        self.hold_ack = False
        self.held_ack: dict | None = None
        self.tool_source: Any = None           # the simulator's slow MCP tool source (``slow_tool`` steps), if any
        self.last_activity_at: float | None = None   # the idle timer's origin: a response.done or the user's speech
        # state
        self.step_index = 0
        self.active: _Active | None = None
        self.answered: set[str] = set()
        self._open: dict[str, None] = {}       # issued, not answered yet, in issue order
        self.claimed: _Active | None = None    # a client response.create taken by wait_outputs
        self.waiting_create = False
        self.claim_any = False                 # wait_create: claimed even while outputs are pending
        self.trigger: dict | None = None       # model_response_first waiting for outputs_answered
        self.quiet_until = 0.0
        self.turn = 0                          # speech_started events sent so far
        self.started_at: float | None = None   # trio time of the first connection (sleep_until's origin)
        self._answered_since_create: list[str] = []
        self.connection: CallSession | None = None
        # a browser call (WebRTC): its peer gets every sent event; its data
        # channel's client events are recorded here too (and in ``received``)
        self.peer: Any = None
        self.channel_received: list[dict] = []
        self.tokens = ConversationTokens()     # the context in tokens: every response.done's usage
        self._changed = trio.Event()
        self._item_before: dict[str, str | None] = {}   # the conversation's order: item id -> the one before
        self._last_item: str | None = None
        # a replay (``simulator/capture_player.py``) plays a captured call instead of the scenario
        self.replay: Any = None
        # Opt-in: a join while a sideband is open takes the call over (the
        # service's rule for two sidebands is not documented; by default the
        # second join is refused with 409). The old connection stays open but
        # silent; what arrives on it is recorded in ``stale_received`` as
        # ``(connection number, event)`` and never applied to the call.
        self.supersede_sideband = False
        self.stale_received: list[tuple[int, Any]] = []

    def item_before(self, item_id: str | None) -> str | None:
        """The ``previous_item_id`` of ``item_id``: the item before it in the
        conversation (items are appended in the order they are first sent)."""
        if not item_id:
            return self._last_item
        if item_id not in self._item_before:
            self._item_before[item_id] = self._last_item
            self._last_item = item_id
        return self._item_before[item_id]

    # -- convenience views for tests

    @property
    def error_codes(self) -> list[str | None]:
        return [e["error"].get("code") for e in self.errors_sent]

    @property
    def active_response_id(self) -> str | None:
        return self.active.id if self.active else None

    def pending_call_ids(self) -> list[str]:
        """Tool call ids issued to the client that have no output yet (kept
        as they change: the players ask at every event, and a long call's
        history must not make each ask cost more)."""
        return list(self._open)

    def add_tool_call(self, record: ToolCallRecord) -> None:
        """A tool call issued to the client (from here on it must be answered)."""
        self.tool_calls[record.call_id] = record
        if record.call_id not in self.answered:
            self._open[record.call_id] = None

    def forget_tool_call(self, call_id: str) -> None:
        """The service no longer knows this tool call (it refused an output
        for it with ``invalid_tool_call_id``): no output is awaited, and any
        later one gets ``invalid_tool_call_id`` too."""
        self.forgotten.add(call_id)
        self._open.pop(call_id, None)
        self.notify()

    def mark_answered(self, call_id: str) -> None:
        self.answered.add(call_id)
        self._open.pop(call_id, None)

    def sent_types(self) -> list[str]:
        return [e["type"] for e in self.sent]

    def notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_until(self, predicate: Callable[["SimCall"], bool]) -> None:
        """Block until ``predicate(call)`` is true (checked after every state
        change). Cancel it with an enclosing ``trio.fail_after``."""
        while not predicate(self):
            await self._changed.wait()


def _no_delay(stream: trio.abc.Stream) -> None:
    """TCP_NODELAY on a TCP stream (trio sets it by default; said here
    because one frame per segment depends on it)."""
    if isinstance(stream, trio.SocketStream):
        stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)


#: Server event types whose SDK model declares no ``event_id`` (the keypad's): sent without one.
_WITHOUT_EVENT_ID = frozenset(type_ for type_, model in SERVER_EVENTS.by_type.items()
                              if "event_id" not in model.model_fields)


class SessionSocket(Protocol):
    """What a ``CallSession`` needs of its socket: a trio-websocket
    connection, or the service's end of a call's in-memory transport
    (``voiceactors.testing.rig.PeerSocket``)."""

    async def get_message(self) -> str | bytes: ...

    async def send_message(self, message: str | bytes) -> None: ...

    async def aclose(self, code: int = 1000, reason: str | None = None) -> None: ...


class CallSession:
    """One accepted sideband websocket on a ``SimCall``."""

    def __init__(self, call: SimCall, ws: SessionSocket, scenario: Scenario, *,
                 validate_sent: bool = True, stream: ReplayStream | None = None,
                 coalesce_writes: bool = True, conformance: bool = False) -> None:
        self.call = call
        self.ws = ws
        self.stream = stream                   # ws's own stream: corked while a batch is written
        self.validate_sent = validate_sent
        self.conformance = conformance         # events held to the SDK's types exactly (``conformance``)
        self.coalesce_writes = coalesce_writes  # False: each event its own frame in its own socket write
        self.steps = scenario.steps
        self.log = get_logger(actor="simulator", call_id=call.call_id)
        # encoded messages the writer has not taken yet, each with its index in
        # ``call.sent`` (None: ``send_raw``) for ``call.written_at``
        self._outbox: list[tuple[str | bytes, int | None]] = []
        self._unwritten = 0                    # characters queued or being written
        self._wake = trio.Event()              # set when the outbox gets its first message
        self._writing = False
        self._drained = trio.Event()           # set whenever the writer is idle with nothing queued
        self._drained.set()
        self._dropping = False
        self._write_scope: trio.CancelScope | None = None
        self._scope = trio.CancelScope()
        self._nursery: trio.Nursery | None = None
        self.peer_close: int | None = None
        self.ended_by: str | None = None       # "peer" | "close" | "drop"
        self.number = 0                        # this call's nth connection
        self.superseded = False                # a newer sideband took the call (``supersede``)
        self._live_scope = trio.CancelScope()  # the writer and the player: what speaks on this socket

    # -- lifecycle

    async def run(self) -> None:
        """Serve the connection until the peer closes, the scenario closes or
        drops it, or ``end``/``drop`` is called. Returns without closing the
        websocket after a drop (the caller then tears the TCP stream down)."""
        call = self.call
        call.connection = self
        call.connections += 1
        self.number = call.connections
        if call.started_at is None:
            call.started_at = trio.current_time()
            call.last_activity_at = call.started_at
        call.notify()
        if not self.coalesce_writes and self.stream is not None:
            _no_delay(self.stream.inner)
        if call.read_at is not None:
            stamp_reads(self.ws)
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self._live)
                    nursery.start_soon(self._reader)
        finally:
            if not self.superseded:     # else the call is the newer connection's now
                call.connection = None
                if call.active is not None:
                    # the service would finish it; nobody hears about it on this socket
                    self._mark_finished(call.active, "abandoned", None)
                if call.claimed is not None:
                    self._mark_finished(call.claimed, "abandoned", None)
                    call.claimed = None
            call.notify()

    async def _live(self) -> None:
        with self._live_scope:
            async with trio.open_nursery() as live:
                live.start_soon(self._writer)
                live.start_soon(self._player)

    def supersede(self) -> None:
        """A newer sideband took the call: nothing more is sent here, what is
        read here is only recorded (``SimCall.stale_received``)."""
        self.superseded = True
        self._dropping = True
        self._live_scope.cancel()
        self.log.info("simulator.superseded", connection=self.number)

    async def end(self, code: int = 1000) -> None:
        """Close the websocket cleanly with ``code`` and end the call (later
        connections are refused with the call's gone status)."""
        call = self.call
        call.closed = True
        call.close_code = code
        self.ended_by = self.ended_by or "close"
        call.notify()
        with trio.move_on_after(2.0) as scope:
            scope.shield = True
            try:
                await self._wait_drained()  # what was sent before the close goes out before it
                await self.ws.aclose(code)
            except Exception:
                pass
        self._scope.cancel()

    def drop(self) -> None:
        """Abandon the connection without a close frame (the client sees 1006),
        right after the events already sent have gone out (waiting at most
        ``DROP_FLUSH_S`` for a peer that does not read); nothing sent after
        this call goes out. The call stays joinable."""
        self.ended_by = self.ended_by or "drop"
        self.call.drops += 1
        self._dropping = True
        if not self._outbox and not self._writing:
            self._scope.cancel()
            return
        # the writer cancels the session once the queue is out, or at the deadline
        if self._write_scope is not None:
            self._write_scope.deadline = trio.current_time() + DROP_FLUSH_S

    # -- sending
    #
    # Events are queued in order and written by one writer task per session,
    # which takes everything queued at once and writes it with one syscall
    # (the stream is corked meanwhile). A burst of events from one step
    # then costs one write and one wake-up of the peer instead of one each.
    # With ``coalesce_writes=False`` (the burst benchmark) every event goes
    # out in its own ``send_all`` on a TCP_NODELAY socket instead, as the
    # real service streams them: the peer pays per frame and per wake-up.

    async def send(self, event: dict, resp: _Active | None = None,
                   before: Callable[[], None] | None = None) -> None:
        """Send one server event: record it and queue it for the writer (the
        order of ``send`` calls is the order on the wire). It returns at once,
        without a checkpoint, so a burst of events is queued in one go —
        unless more than ``SEND_BUFFER`` characters are still unwritten (a
        peer that does not read): then it first waits for the queue to drain,
        and a cancellation there leaves the event unsent and unrecorded.

        The event is validated against the SDK's models first (an invalid one
        is a simulator bug), unless the simulator was made with
        ``validate_sent=False``. Events of ``resp`` are dropped once it is
        finishing, so a cancel cannot be followed by stray deltas. ``before``
        runs right before the event is recorded and queued (used for
        ``response.done`` itself: no event queued after it can see the
        response active). Nothing is queued once the session is dropping."""
        if event.get("type") not in _WITHOUT_EVENT_ID:
            event.setdefault("event_id", _id("event_", 8))
        if self.validate_sent and self.conformance:
            try:
                conformance.check_server_event(event)
            except conformance.NonconformingEvent as exc:
                self._nonconforming(Direction.SERVER, event.get("type"), str(exc))
                raise
        elif self.validate_sent:
            validate_server_event(event)
        if self._unwritten > SEND_BUFFER:
            await self._wait_drained()
        if self._dropping or (resp is not None and (resp.finished or (resp.finishing and before is None))):
            return
        if before is not None:
            before()
        if event["type"] in _ITEM_EVENTS and "previous_item_id" not in event:
            event["previous_item_id"] = self.call.item_before(event["item"].get("id"))
        index = len(self.call.sent)
        self.call.sent.append(event)
        if self.call.sent_at is not None:
            self.call.sent_at.append(trio.current_time())
        if self.call.written_at is not None:
            self.call.written_at.append(None)
        self._queue(json.dumps(event), index)
        if self.call.peer is not None:
            self.call.peer.server_event(event)   # the browser's data channel sees what the sideband sees

    async def send_raw(self, data: str | bytes) -> None:
        """Send a message as it is (no validation, no record), in turn with
        ``send``: whatever was queued before goes out first."""
        if not self._dropping:
            self._queue(data, None)
        await trio.lowlevel.checkpoint()

    def _queue(self, message: str | bytes, index: int | None) -> None:
        if not self._outbox:
            self._wake.set()
        self._outbox.append((message, index))
        self._unwritten += len(message)
        self._drained = trio.Event() if self._drained.is_set() else self._drained

    async def _wait_drained(self) -> None:
        while self._outbox or self._writing:
            await self._drained.wait()

    async def _writer(self) -> None:
        while True:
            if not self._outbox:
                self._drained.set()
                self._wake = trio.Event()
                await self._wake.wait()
                continue
            batch, self._outbox = self._outbox, []
            self._writing = True
            # shielded: a half-written frame would corrupt the stream, and a
            # drop lets the queue go out first (see ``drop``)
            deadline = trio.current_time() + DROP_FLUSH_S if self._dropping else math.inf
            with trio.CancelScope(shield=True, deadline=deadline) as self._write_scope:
                await self._write(batch)
            self._write_scope = None
            self._writing = False
            self._unwritten -= sum(len(m) for m, _ in batch)
            if self._dropping and (not self._outbox or deadline < math.inf):
                self._drained.set()
                self._scope.cancel()

    async def _write(self, batch: list[tuple[str | bytes, int | None]]) -> None:
        stream = self.stream if self.coalesce_writes else None
        if stream is not None:
            stream.cork()
        corked = 0   # messages of the batch handed to the corked stream
        try:
            for message, index in batch:
                await self.ws.send_message(message)
                if stream is None:
                    self._stamp_written(index)   # this frame's own write
                else:
                    corked += 1
        except ConnectionClosed:
            pass  # the reader notices and ends the session
        finally:
            if stream is not None:
                try:
                    await stream.uncork()
                    for _, index in batch[:corked]:
                        self._stamp_written(index)   # the batch's one write
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass

    def _stamp_written(self, index: int | None) -> None:
        """``call.written_at[index]`` = the last write's stamp: called right
        after the write of that event's frame returned (``send_message``
        releases its lock and returns with no schedule point, so no other
        write can come between). Without the replay stream (not served by
        ``http``), the time the write returned."""
        written = self.call.written_at
        if written is None or index is None:
            return
        written[index] = self.stream.last_write_at if self.stream is not None else trio.current_time()

    async def send_error(self, message: str, code: str | None, event_id: str | None = None,
                         type_: str = "invalid_request_error", param: str | None = None) -> None:
        await self.send_error_body({"type": type_, "code": code, "message": message, "param": param,
                                    "event_id": event_id})

    async def send_error_body(self, error: dict) -> None:
        """An ``error`` event carrying ``error`` (recorded in ``errors_sent``)."""
        event = {"type": "error", "event_id": _id("event_", 8), "error": error}
        self.call.errors_sent.append(event)
        await self.send(event)
        self.call.notify()  # once it is queued: a waiter's next message follows it on the wire

    # -- responses

    def _new_response(self, origin: str) -> _Active:
        """Make a response active (synchronously: no other task can slip in)."""
        assert self.call.active is None, "a response is already active"
        record = ResponseRecord(_id("resp_"), origin, started_at=trio.current_time())
        active = _Active(record)
        self.call.active = active
        self.call.responses.append(record)
        self.call.notify()
        return active

    async def _send_created(self, resp: _Active) -> None:
        body = {"id": resp.id, "object": "realtime.response", "status": "in_progress", "output": []}
        await self.send({"type": "response.created", "response": body}, resp)

    def _mark_finished(self, resp: _Active, status: str, reason: str | None) -> None:
        resp.finishing = resp.finished = True
        for scope in resp.scopes:
            scope.cancel()
        resp.record.status = status
        resp.record.reason = reason
        resp.record.ended_at = trio.current_time()
        self.call.last_activity_at = resp.record.ended_at   # the idle timer runs from here
        if self.call.active is resp:
            self.call.active = None
        self.call.notify()

    async def finish(self, resp: _Active, status: str = "completed", reason: str | None = None,
                     error: dict | None = None) -> None:
        """Send ``response.done``; the response stops being active exactly when
        its ``response.done`` goes out. ``error``: a failed response's
        ``status_details.error`` (``type``, ``code``, ``message``)."""
        if resp.finishing:
            return
        resp.finishing = True
        for scope in resp.scopes:
            scope.cancel()
        if status == "cancelled":
            await self._close_partial_calls(resp)
        details: dict[str, Any] | None = None if status == "completed" else {"type": status, "reason": reason}
        if details is not None and error is not None:
            details["error"] = dict(error)
        body = {"id": resp.id, "object": "realtime.response", "status": status,
                "status_details": details, "output": resp.output,
                "usage": self.call.tokens.response_usage(resp.output, self.call.session.get("instructions"))}
        await self.send({"type": "response.done", "response": body}, resp,
                        before=lambda: self._mark_finished(resp, status, reason))
        if self.call.held_ack is not None:
            held, self.call.held_ack = self.call.held_ack, None
            await self.send({"type": "session.updated", "session": held})

    async def _close_partial_calls(self, resp: _Active) -> None:
        """An interrupted tool call still gets ``arguments.done`` (with partial
        arguments) and an incomplete ``output_item.done``, like the service."""
        while resp.open_calls:
            item_id, item = resp.open_calls.popitem()
            index = item["_index"]
            clean = {k: v for k, v in item.items() if k != "_index"}
            clean["status"] = "incomplete"
            await self.send({"type": "response.function_call_arguments.done", "response_id": resp.id,
                             "item_id": item_id, "output_index": index, "call_id": clean["call_id"],
                             "name": clean["name"], "arguments": clean["arguments"]})
            await self.send({"type": "response.output_item.done", "response_id": resp.id,
                             "output_index": index, "item": clean})
            resp.output.append(clean)

    async def play_body(self, resp: _Active, spec: dict) -> None:
        """Emit a response's output items in order (``items``, or ``text``
        then ``tool_calls``), after its ``rate_limits.updated`` when the spec
        has one. Stops quietly when the response is cancelled meanwhile."""
        interval = float(spec.get("delta_interval_s", 0.0))
        with resp.playing():
            if "rate_limits" in spec:
                await self.send_rate_limits(spec["rate_limits"], resp)
            for kind, body in _output_items(spec):
                await self._ITEM_PLAYERS[kind](self, resp, body, interval)

    async def send_rate_limits(self, limits: list[dict], resp: _Active | None = None) -> None:
        """``rate_limits.updated`` (the service sends one as a response begins)."""
        await self.send({"type": "rate_limits.updated", "rate_limits": [dict(limit) for limit in limits]}, resp)

    async def play_response(self, resp: _Active, spec: dict) -> None:
        """Body, then ``hold_s`` with the response still active, then ``response.done``."""
        await self.play_body(resp, spec)
        with resp.playing():
            await trio.sleep(float(spec.get("hold_s", 0.0)))
        await self.finish(resp, spec.get("status", "completed"), error=spec.get("error"))

    async def _pace(self, interval: float) -> None:
        await trio.sleep(interval) if interval else await trio.lowlevel.checkpoint()

    async def _play_text(self, resp: _Active, text: str, interval: float) -> None:
        index = len(resp.output)
        item_id = _id("item_")
        item = {"id": item_id, "object": "realtime.item", "type": "message", "role": "assistant",
                "status": "in_progress", "content": []}
        common = {"response_id": resp.id, "item_id": item_id, "output_index": index, "content_index": 0}
        await self.send({"type": "response.output_item.added", "response_id": resp.id,
                         "output_index": index, "item": item}, resp)
        await self.send({"type": "conversation.item.added", "item": item}, resp)
        await self.send({"type": "response.content_part.added", **common,
                         "part": {"type": "audio", "transcript": ""}}, resp)
        await self.send({"type": "output_audio_buffer.started", "response_id": resp.id}, resp)
        words = text.split(" ")
        for i, word in enumerate(words):
            delta = word if i == len(words) - 1 else word + " "
            await self.send({"type": "response.output_audio_transcript.delta", **common, "delta": delta}, resp)
            await self._pace(interval)
        await self.send({"type": "response.output_audio_transcript.done", **common, "transcript": text}, resp)
        await self.send({"type": "response.content_part.done", **common,
                         "part": {"type": "audio", "transcript": text}}, resp)
        done = {**item, "status": "completed", "content": [{"type": "output_audio", "transcript": text}]}
        await self.send({"type": "response.output_item.done", "response_id": resp.id,
                         "output_index": index, "item": done}, resp)
        await self.send({"type": "conversation.item.done", "item": done}, resp)
        await self.send({"type": "output_audio_buffer.stopped", "response_id": resp.id}, resp)
        if not resp.finishing:
            resp.output.append(done)

    async def _play_tool_call(self, resp: _Active, spec: dict, interval: float) -> None:
        index = len(resp.output)
        item_id = _id("item_")
        call_id = spec.get("call_id") or _id("call_", 8)
        name = spec["name"]
        raw_args = spec.get("arguments", {})
        arguments = raw_args if isinstance(raw_args, str) else json.dumps(raw_args)
        item = {"id": item_id, "object": "realtime.item", "type": "function_call", "status": "in_progress",
                "name": name, "call_id": call_id, "arguments": ""}
        await self.send({"type": "response.output_item.added", "response_id": resp.id,
                         "output_index": index, "item": item}, resp)
        if resp.finishing:
            return
        # the call exists from here on: it must be answered even if the response is cancelled
        self.call.add_tool_call(ToolCallRecord(call_id, name, arguments, resp.id, item_id, turn=self.call.turn))
        resp.record.call_ids.append(call_id)
        resp.open_calls[item_id] = {**item, "_index": index}
        self.call.notify()
        await self.send({"type": "conversation.item.added", "item": item}, resp)
        half = len(arguments) // 2
        common = {"response_id": resp.id, "item_id": item_id, "output_index": index, "call_id": call_id}
        for chunk in (arguments[:half], arguments[half:]):
            if chunk:
                resp.open_calls[item_id]["arguments"] += chunk
                await self.send({"type": "response.function_call_arguments.delta", **common, "delta": chunk}, resp)
                await self._pace(interval)
        await self.send({"type": "response.function_call_arguments.done", **common, "name": name,
                         "arguments": arguments}, resp)
        if resp.finishing:
            return  # the cancel closes this item as incomplete
        done = {**item, "status": "completed", "arguments": arguments}
        resp.open_calls.pop(item_id, None)
        resp.output.append(done)
        self.call.tool_calls[call_id].complete = True
        await self.send({"type": "response.output_item.done", "response_id": resp.id,
                         "output_index": index, "item": done}, resp)
        await self.send({"type": "conversation.item.done", "item": done}, resp)

    async def _play_mcp_call(self, resp: _Active, spec: dict, interval: float) -> None:
        """A call of an OpenAI-hosted MCP tool: the service runs it and puts
        its result in the item itself; the client never answers it."""
        index = len(resp.output)
        item_id = _id("mcp_")
        raw_args = spec.get("arguments", {})
        arguments = raw_args if isinstance(raw_args, str) else json.dumps(raw_args)
        # the SDK's mcp_call item declares no status and no object
        item = {"id": item_id, "type": "mcp_call", "server_label": spec["server_label"], "name": spec["name"],
                "arguments": ""}
        where = {"item_id": item_id, "output_index": index}
        await self.send({"type": "response.output_item.added", "response_id": resp.id,
                         "output_index": index, "item": item}, resp)
        await self.send({"type": "conversation.item.added", "item": item}, resp)
        await self.send({"type": "response.mcp_call.in_progress", **where}, resp)
        half = len(arguments) // 2
        for chunk in (arguments[:half], arguments[half:]):
            if chunk:
                await self.send({"type": "response.mcp_call_arguments.delta", "response_id": resp.id, **where,
                                 "delta": chunk}, resp)
                await self._pace(interval)
        await self.send({"type": "response.mcp_call_arguments.done", "response_id": resp.id, **where,
                         "arguments": arguments}, resp)
        await trio.sleep(float(spec.get("run_s", 0.0)))   # the tool runs on the service's side
        done = {**item, "arguments": arguments}
        if "error" in spec:
            done["error"] = dict(spec["error"])
            await self.send({"type": "response.mcp_call.failed", **where}, resp)
        else:
            done["output"] = spec.get("output", "")
            await self.send({"type": "response.mcp_call.completed", **where}, resp)
        await self.send({"type": "response.output_item.done", "response_id": resp.id,
                         "output_index": index, "item": done}, resp)
        await self.send({"type": "conversation.item.done", "item": done}, resp)
        if not resp.finishing:
            resp.output.append(done)

    async def _play_pause(self, resp: _Active, seconds: float, interval: float) -> None:
        await trio.sleep(float(seconds))   # a gap between two items: the response stays active

    #: a response's output item kind -> its player (``items`` in the ``response`` step)
    _ITEM_PLAYERS: dict[str, Callable[["CallSession", _Active, Any, float], Awaitable[None]]] = {
        "message": _play_text,
        "function_call": _play_tool_call,
        "mcp_call": _play_mcp_call,
        "pause": _play_pause,
    }

    def _spawn(self, fn: Callable[..., Any], *args: Any) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(fn, *args)

    async def _play_default(self, resp: _Active) -> None:
        await self.play_response(resp, {"text": DEFAULT_REPLY})

    # -- reader: client events

    async def _reader(self) -> None:
        while True:
            try:
                raw = await self.ws.get_message()
            except ConnectionClosed as exc:
                self.peer_close = getattr(exc.reason, "code", None)
                if self.ended_by == "close":
                    # end() is closing: let its closing handshake finish (it
                    # cancels the session itself), or trio-websocket's reader
                    # could be cancelled before it marks the handshake done
                    await trio.sleep_forever()
                self.ended_by = self.ended_by or "peer"
                break
            await self._handle(raw, read_stamp(self.ws) if self.call.read_at is not None else None)
        self._scope.cancel()

    async def handle_client_message(self, raw: str | bytes) -> None:
        """A client event from elsewhere than this websocket (a browser
        call's data channel): answered exactly like one read from it."""
        await self._handle(raw)

    async def _handle(self, raw: str | bytes, read_at: float | None = None) -> None:
        obj: Any = None
        if isinstance(raw, str):
            try:
                obj = json.loads(raw)
            except ValueError:
                obj = None
        if self.superseded:
            self.call.stale_received.append((self.number, obj if obj is not None else raw))
            self.call.notify()
            return
        if isinstance(obj, dict):
            self.call.received.append(obj)
            if self.call.received_at is not None:
                self.call.received_at.append(trio.current_time())
            if self.call.read_at is not None:
                self.call.read_at.append(trio.current_time() if read_at is None else read_at)
            self.call.notify()
        event_id = obj.get("event_id") if isinstance(obj, dict) and isinstance(obj.get("event_id"), str) else None
        model, error = parse_client_event(raw)
        if self.conformance:
            self._check_client_event(obj, error)
        if model is None:
            await self.send_error(error or "Invalid event", "invalid_event", event_id)
            return
        if self.call.replay is not None:
            await self.call.replay.on_client_event(self, obj, event_id)
            return
        if await self._refused(obj, event_id):
            return
        handler = getattr(self, "_on_" + obj["type"].replace(".", "_"), None)
        if handler is not None:
            await handler(obj, event_id)

    def _check_client_event(self, obj: Any, invalid: str | None) -> None:
        """Conformance: a client event the SDK's types do not hold exactly is
        recorded (its answer does not change: an invalid one still gets
        ``invalid_event``, one with an undeclared field is still applied)."""
        reason = invalid
        if reason is None:
            reason, _ = conformance.client_error(obj)
        if reason is not None:
            type_ = obj.get("type") if isinstance(obj, dict) and isinstance(obj.get("type"), str) else None
            self._nonconforming(Direction.CLIENT, type_, reason)

    def _nonconforming(self, direction: Direction, type_: str | None, reason: str) -> None:
        entry = Nonconforming(self.call.call_id, direction, type_, reason)
        self.call.nonconforming.append(entry)
        conformance.record(entry)
        self.log.warning("simulator.nonconforming_event", direction=str(direction), type=type_, reason=reason)

    async def _refused(self, obj: dict, event_id: str | None) -> bool:
        """Refuse a client event, unapplied, when the session has expired or
        an armed refusal matches it (``refusals.py``): an ``error`` with the
        code, naming the event's ``event_id`` (unless the refusal says not).
        A refused ``response.create`` still counts in ``response_creates``, a
        refused output in ``outputs``; ``invalid_tool_call_id`` makes the
        service forget that tool call."""
        call = self.call
        refusal: Refusal | None = None
        if call.expired:
            code = SESSION_EXPIRED
        else:
            refusal = next((r for r in call.refusals if r.matches(obj)), None)
            if refusal is None:
                return False
            refusal.times -= 1
            if refusal.times <= 0:
                call.refusals.remove(refusal)
            code = refusal.code
        call.refused.append((code, obj))
        if obj["type"] == "response.create":
            call.response_creates += 1
        item = obj.get("item") if obj["type"] == "conversation.item.create" else None
        call_id: str | None = None
        if isinstance(item, dict) and item.get("type") == OUTPUT_EVENT:
            call_id = item["call_id"]
            call.outputs.setdefault(item["call_id"], []).append(item["output"])
            if code == "invalid_tool_call_id":
                call.forget_tool_call(item["call_id"])
        echo = refusal is None or refusal.echo_event_id
        await self.send_error_body(error_body(
            code, event_id=event_id if echo else None, response_id=call.active_response_id or _id("resp_"),
            call_id=call_id, type_=refusal.type if refusal else None, message=refusal.message if refusal else None))
        return True

    async def _on_session_update(self, obj: dict, event_id: str | None) -> None:
        call = self.call
        call.session = merged_session(call.session, obj["session"])
        call.notify()   # an idle timeout may have been set or changed
        if call.hold_ack:
            call.hold_ack, call.held_ack = False, call.session    # applied; acknowledged after the next response.done
            return
        await self.send({"type": "session.updated", "session": call.session})

    async def _on_conversation_item_create(self, obj: dict, event_id: str | None) -> None:
        item = dict(obj["item"])
        item_id = item.get("id") or _id("item_")
        item.update(id=item_id, object="realtime.item", status="completed")
        if item.get("type") == "function_call_output":
            call_id = item["call_id"]
            if self.call.output_fault is not None:
                self._output_fault(call_id, item["output"])
                return
            self.call.outputs.setdefault(call_id, []).append(item["output"])
            if call_id not in self.call.tool_calls or call_id in self.call.forgotten:
                await self.send_error(f"Tool call ID '{call_id}' not found in conversation.",
                                      "invalid_tool_call_id", event_id, param="item.call_id")
                return
            if call_id in self.call.answered:
                await self.send_error(f"Tool call ID '{call_id}' already has an output.",
                                      "duplicate_tool_call_output", event_id, param="item.call_id")
                return
            self.call.mark_answered(call_id)
            self.call._answered_since_create.append(call_id)
            self.call.tokens.tool_output(item["output"])
            self.call.notify()
        await self.send({"type": "conversation.item.added", "item": item})
        await self.send({"type": "conversation.item.done", "item": item})
        if item.get("type") == "function_call_output":
            await self._maybe_fire_trigger()

    def _output_fault(self, call_id: str, output: str) -> None:
        """The armed output fault fires: the socket drops (1006) before the
        output is confirmed. ``lost``: the service never applied it (recorded
        in ``lost_outputs`` only; the call id stays pending). ``applied``: it
        did (recorded in ``outputs`` and answered when the id was open), only
        the confirmation never went out. Synchronous: nothing is sent after."""
        call = self.call
        fault, call.output_fault = call.output_fault, None
        if fault == "applied":
            call.outputs.setdefault(call_id, []).append(output)
            if call_id in call.tool_calls and call_id not in call.answered:
                call.mark_answered(call_id)
                call._answered_since_create.append(call_id)
                call.tokens.tool_output(output)
        else:
            call.lost_outputs.setdefault(call_id, []).append(output)
        self.log.info("simulator.drop", fault="output_" + str(fault))
        self.drop()
        call.notify()

    async def _maybe_fire_trigger(self) -> None:
        """``model_response_first`` with ``when: outputs_answered``: the model
        starts its own response the moment the last output lands, before any
        ``response.create`` the client sends next is read."""
        spec = self.call.trigger
        if spec is None or self.call.pending_call_ids() or self.call.active is not None:
            return
        self.call.trigger = None
        resp = self._new_response("model_first")
        await self._send_created(resp)
        self._spawn(self.play_response, resp, {"text": spec.get("text", DEFAULT_REPLY),
                                                "hold_s": spec.get("hold_s", 1.0)})

    async def _on_response_create(self, obj: dict, event_id: str | None) -> None:
        call = self.call
        call.response_creates += 1
        call.notify()
        batch, call._answered_since_create = call._answered_since_create, []
        pending = call.pending_call_ids()
        # with asynchronous calls, a create that goes on over calls of this turn
        # still running (a slow tool's acknowledgement) follows those up, not
        # an older turn's results written since the last create
        going_on = call.async_tools and any(call.tool_calls[c].turn == call.turn for c in pending)
        if batch and not going_on and all(call.tool_calls[c].turn < call.turn and c not in call.awaited
                                          for c in batch):
            # rule 4: results that land after the user barged in must not take the floor
            call.violations.append(
                f"response.create ({event_id}) for tool calls {batch} of a turn the user has barged in on")
        if call.active is not None or call.reject_creates > 0:
            # a forced refusal names a response the client cannot know (as
            # when its response.created was lost in a drop)
            if call.reject_creates > 0:
                call.reject_creates -= 1
            active_id = call.active.id if call.active is not None else _id("resp_")
            await self.send_error(
                f"Conversation already has an active response in progress: {active_id}. "
                "Wait until the response is finished before creating a new one.",
                "conversation_already_has_active_response", event_id)
            return
        if pending and call.async_tools:
            call.awaited.update(pending)
        resp = self._new_response("client")
        await self._send_created(resp)
        if call.waiting_create and (not pending or call.claim_any) and call.claimed is None:
            call.claimed = resp  # the player plays the scenario's next response on it
            call.notify()
            return
        if pending and not call.async_tools:
            call.violations.append(
                f"response.create ({event_id}) sent while tool calls {pending} had no output")
        resp.record.origin = "default"
        self._spawn(self._play_default, resp)

    async def _on_response_cancel(self, obj: dict, event_id: str | None) -> None:
        active = self.call.active
        wanted = obj.get("response_id")
        if active is None or (wanted and wanted != active.id):
            await self.send_error("Cancellation failed: no active response found.",
                                  "response_cancel_not_active", event_id)
            return
        await self.finish(active, "cancelled", "client_cancelled")

    async def _on_output_audio_buffer_clear(self, obj: dict, event_id: str | None) -> None:
        await self.send({"type": "output_audio_buffer.cleared",
                         "response_id": self.call.active_response_id or ""})

    # -- player: scenario steps

    async def _player(self) -> None:
        call = self.call
        if call.replay is not None:
            await call.replay.play(self)   # a captured call instead of the scenario
            return
        if call.peer is not None and call.step_index == 0:
            # a browser call: play nothing before its data channel can carry it
            with trio.move_on_after(PEER_OPEN_WAIT_S):
                await call.peer.channel_open.wait()
        while call.step_index < len(self.steps) and not call.closed:
            step = self.steps[call.step_index]
            (kind, arg), = step.items()
            if kind == "drop":
                call.step_index += 1
                self.log.info("simulator.drop")
                self.drop()
                return
            if kind == "close":
                call.step_index += 1
                await self.end(int(arg))
                return
            await getattr(self, "_step_" + kind)(arg)
            call.step_index += 1

    async def _step_sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)

    async def _step_sleep_until(self, seconds: float) -> None:
        # a timetable, not a pause: a late step does not push the later ones back
        assert self.call.started_at is not None
        await trio.sleep_until(self.call.started_at + seconds)

    async def _step_hold_ack(self, on: bool) -> None:
        self.call.hold_ack = on

    async def _step_async_tools(self, on: bool) -> None:
        self.call.async_tools = on

    async def _step_slow_tool(self, spec: dict) -> None:
        source = self.call.tool_source
        if source is None or spec["name"] not in source.tools:
            self.call.violations.append(f"slow_tool {spec['name']!r}: the simulator has no tool source with it")
            return
        source.pace(spec["name"], float(spec.get("run_s", 0.0)), float(spec.get("progress_every_s", 0.0)))

    async def _step_refuse(self, spec: dict) -> None:
        self.call.refusals.append(Refusal.from_step(spec))

    async def _step_session_cap(self, spec: dict) -> None:
        assert self.call.started_at is not None
        await trio.sleep_until(self.call.started_at + float(spec.get("at_s", SESSION_CAP_S)))
        await self.expire(int(spec.get("close", 1001)), float(spec.get("close_after_s", 0.0)))

    async def expire(self, close: int = 1001, close_after_s: float = 0.0) -> None:
        """The session hits its cap: a response in progress stops where it is
        (no ``response.done``), an ``error`` ``session_expired`` naming no
        event goes out, every client event from then on is refused with
        ``session_expired``, and after ``close_after_s`` the socket closes
        with ``close`` and the call ends."""
        call = self.call
        call.expired = True
        if call.active is not None:
            self._mark_finished(call.active, "abandoned", None)
        await self.send_error_body(error_body(SESSION_EXPIRED, event_id=None))
        self.log.info("simulator.session_expired", close=close, close_after_s=close_after_s)
        await trio.sleep(close_after_s)
        await self.end(close)

    async def _step_idle_timeout(self, spec: dict) -> None:
        timeout_ms = await self._idle_for_timeout(float(spec.get("wait_s", SESSION_CAP_S)))
        if timeout_ms is not None:
            await self._idle_timeout_fires(timeout_ms, spec.get("text", IDLE_PROMPT))

    async def _idle_for_timeout(self, wait_s: float) -> int | None:
        """Wait until no response has been active and the user has not spoken
        for the session's ``idle_timeout_ms`` (the timer restarts at each
        response's end and each user turn; an idle time already that long
        fires at once). None when ``wait_s`` passed first (as when the
        session never sets a timeout)."""
        call = self.call
        with trio.move_on_after(wait_s):
            while True:
                await self._wait_idle()
                timeout_ms = idle_timeout_ms(call.session)
                origin = call.last_activity_at
                if timeout_ms is None or origin is None:
                    await call.wait_until(lambda c: idle_timeout_ms(c.session) is not None)
                    continue
                with trio.move_on_at(origin + timeout_ms / 1000) as timer:
                    await call.wait_until(lambda c: c.active is not None or c.last_activity_at != origin
                                          or idle_timeout_ms(c.session) != timeout_ms)
                if timer.cancelled_caught:
                    return timeout_ms
        return None

    async def _idle_timeout_fires(self, timeout_ms: int, text: str) -> None:
        """``input_audio_buffer.timeout_triggered``; the silent audio is
        committed as a user item; then (unless the session's turn detection
        says ``create_response: false``) the model answers it."""
        call = self.call
        call.idle_timeouts += 1
        item_id = _id("item_")
        end_ms = self._audio_ms()
        await self.send({"type": "input_audio_buffer.timeout_triggered", "audio_start_ms": max(0, end_ms - timeout_ms),
                         "audio_end_ms": end_ms, "item_id": item_id})
        await self.send({"type": "input_audio_buffer.committed", "item_id": item_id})
        item = {"id": item_id, "object": "realtime.item", "type": "message", "role": "user",
                "status": "completed", "content": [{"type": "input_audio", "transcript": None}]}
        await self.send({"type": "conversation.item.added", "item": item})
        await self.send({"type": "conversation.item.done", "item": item})
        call.last_activity_at = trio.current_time()
        if _turn_detection(call.session).get("create_response") is False or call.active is not None:
            return
        resp = self._new_response("idle_timeout")
        await self._send_created(resp)
        await self.play_response(resp, {"text": text})

    async def _step_rate_limits(self, limits: list[dict]) -> None:
        await self.send_rate_limits(limits)

    async def _step_dtmf(self, keys: str) -> None:
        """A phone caller presses ``keys`` on the keypad (a SIP call's
        ``input_audio_buffer.dtmf_event_received``, one per key)."""
        for key in keys:
            await self.send({"type": "input_audio_buffer.dtmf_event_received", "event": key,
                             "received_at": int(time.time())})

    async def _step_silence(self, seconds: float) -> None:
        self.call.quiet_until = trio.current_time() + seconds
        await trio.sleep(seconds)

    async def _wait_idle(self) -> None:
        await self.call.wait_until(lambda c: c.active is None)

    async def _step_user_turn(self, spec: dict) -> None:
        item_id = await self._speech_started()
        await trio.sleep(spec.get("duration_ms", 600) / 1000)
        await self._user_said(item_id, spec.get("text", ""), spec.get("transcript_delay_ms", 0))

    def _audio_ms(self) -> int:
        return int(trio.current_time() * 1000) % 2_000_000_000

    async def _speech_started(self) -> str:
        item_id = _id("item_")
        self.call.turn += 1
        await self.send({"type": "input_audio_buffer.speech_started", "audio_start_ms": self._audio_ms(),
                         "item_id": item_id})
        return item_id

    async def _user_said(self, item_id: str, text: str, transcript_delay_ms: int = 0) -> None:
        self.call.tokens.user_said(text)
        self.call.last_activity_at = trio.current_time()
        await self.send({"type": "input_audio_buffer.speech_stopped", "audio_end_ms": self._audio_ms(),
                         "item_id": item_id})
        await self.send({"type": "input_audio_buffer.committed", "item_id": item_id})
        item = {"id": item_id, "object": "realtime.item", "type": "message", "role": "user",
                "status": "completed", "content": [{"type": "input_audio", "transcript": None}]}
        await self.send({"type": "conversation.item.added", "item": item})
        await self.send({"type": "conversation.item.done", "item": item})
        if transcript_delay_ms:
            # the service transcribes on the side: the text may come after the reply it prompted
            self._spawn(self._late_transcript, item_id, text, transcript_delay_ms)
        else:
            await self._transcribed(item_id, text)

    async def _late_transcript(self, item_id: str, text: str, delay_ms: int) -> None:
        await trio.sleep(delay_ms / 1000)
        await self._transcribed(item_id, text)

    async def _transcribed(self, item_id: str, text: str) -> None:
        if text:
            await self.send({"type": "conversation.item.input_audio_transcription.delta", "item_id": item_id,
                             "content_index": 0, "delta": text})
        await self.send({"type": "conversation.item.input_audio_transcription.completed", "item_id": item_id,
                         "content_index": 0, "transcript": text,
                         "usage": {"type": "duration", "seconds": max(1.0, len(text) / 15)}})

    async def _step_response(self, spec: dict) -> None:
        """Play a model response. After ``wait_outputs`` it answers the client's
        ``response.create``; otherwise the model starts it (server VAD). The step
        ends once the items are out; ``hold_s`` keeps it active in the background."""
        resp = self.call.claimed
        if resp is not None:
            self.call.claimed = None
            resp.record.origin = "client"
        else:
            await self._wait_idle()
            resp = self._new_response("scenario")
            await self._send_created(resp)
        if spec.get("background"):
            self._spawn(self.play_response, resp, spec)   # the next steps run while it plays
            return
        await self.play_body(resp, spec)
        if float(spec.get("hold_s", 0.0)) > 0:
            self._spawn(self._hold_then_finish, resp, spec)
        else:
            await self.finish(resp, spec.get("status", "completed"), error=spec.get("error"))

    async def _hold_then_finish(self, resp: _Active, spec: dict) -> None:
        with resp.playing():
            await trio.sleep(float(spec["hold_s"]))
        await self.finish(resp, spec.get("status", "completed"), error=spec.get("error"))

    async def _step_wait_outputs(self, spec: dict) -> None:
        call = self.call
        need_create = spec.get("response_create", True)
        call.waiting_create = need_create
        try:
            with trio.move_on_after(float(spec.get("timeout_s", 30.0))) as scope:
                await call.wait_until(
                    lambda c: not c.pending_call_ids() and (not need_create or c.claimed is not None))
        finally:
            call.waiting_create = False
        if scope.cancelled_caught:
            call.violations.append(
                f"wait_outputs timed out: pending outputs {call.pending_call_ids()}, "
                f"response.create received: {call.claimed is not None}")
        nxt = self.steps[call.step_index + 1] if call.step_index + 1 < len(self.steps) else {}
        if call.claimed is not None and "response" not in nxt:
            resp, call.claimed = call.claimed, None
            resp.record.origin = "default"
            self._spawn(self._play_default, resp)

    async def _step_wait_create(self, spec: dict) -> None:
        """Wait for the client's next ``response.create``, whatever outputs
        are still pending (an acknowledgement of a slow tool call): the next
        ``response`` step plays on it (else the default reply does)."""
        call = self.call
        call.waiting_create = call.claim_any = True
        try:
            with trio.move_on_after(float(spec.get("timeout_s", 30.0))) as scope:
                await call.wait_until(lambda c: c.claimed is not None)
        finally:
            call.waiting_create = call.claim_any = False
        if scope.cancelled_caught:
            call.violations.append("wait_create timed out: no response.create received")
        nxt = self.steps[call.step_index + 1] if call.step_index + 1 < len(self.steps) else {}
        if call.claimed is not None and "response" not in nxt:
            resp, call.claimed = call.claimed, None
            resp.record.origin = "default"
            self._spawn(self._play_default, resp)

    async def _step_barge_in(self, spec: dict) -> None:
        await trio.sleep(spec.get("after_ms", 0) / 1000)
        item_id = await self._speech_started()
        resp = self.call.active
        if resp is not None:
            # turn_detection.interrupt_response: the service cancels the response itself
            await self.send({"type": "output_audio_buffer.cleared", "response_id": resp.id})
            await self.finish(resp, "cancelled", "turn_detected")
        if spec.get("text"):
            await trio.sleep(0.4)
            await self._user_said(item_id, spec["text"], spec.get("transcript_delay_ms", 0))

    async def _step_model_response_first(self, spec: dict) -> None:
        if spec.get("when", "now") == "outputs_answered":
            self.call.trigger = spec
            await self._maybe_fire_trigger()
            while self.call.trigger is not None:
                # normally the reader fires it on the last output; if a response
                # was active at that moment, fire once the floor is free
                await self.call.wait_until(
                    lambda c: c.trigger is None or (not c.pending_call_ids() and c.active is None))
                await self._maybe_fire_trigger()
            return
        await self._wait_idle()
        resp = self._new_response("model_first")
        await self._send_created(resp)
        await self.play_body(resp, {"text": spec.get("text", DEFAULT_REPLY)})
        self._spawn(self._hold_then_finish, resp, {"hold_s": spec.get("hold_s", 1.0)})

    async def _step_transcript_deltas(self, spec: dict) -> None:
        if spec.get("background", True):
            self._spawn(self._noise, spec)
        else:
            await self._noise(spec)

    async def _noise(self, spec: dict) -> None:
        item_id = _id("item_")
        period = 1.0 / float(spec.get("rate_hz", 20))
        for i in range(int(spec.get("count", 40))):
            if trio.current_time() >= self.call.quiet_until:
                await self.send({"type": "conversation.item.input_audio_transcription.delta",
                                 "item_id": item_id, "content_index": 0, "delta": f"w{i} "})
            await trio.sleep(period)
