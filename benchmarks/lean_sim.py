"""The benchmarks' own Realtime peer: the simulator's frames for the benchmark
workloads, at a fraction of its CPU.

Why: in the burst and capacity benchmarks the simulator (the load
generator) used as much CPU per round as the server under test, and its own
write queue held frames for tens of milliseconds: on two cores the load
generator measured itself as much as the server. This peer plays
the same workloads — the same step lists (``benchmarks.burst.call_steps``,
``benchmarks.sim_host.make_scenario``), answered with the same server
events in the same order (``benchmarks/lean_frames.py``) — with one trio
task per connection, no per-event dict, and one ``send`` syscall per frame
straight from the step (TCP_NODELAY; ``--coalesce``: one write per step).

What it serves: ``GET /v1/realtime?call_id=...`` (the sideband: bearer =
the bench key, the call id registered, one sideband per call) and
``POST /v1/realtime/calls/{id}/hangup`` (ends the call); anything else is
the simulator's 404. ``voiceactors serve``'s ``/connect`` only opens the
sideband.

What it answers on the sideband: ``session.update`` (``session.updated``
with the merged session), ``conversation.item.create`` (``item.added`` +
``item.done``; a tool output is checked against the call's tool calls:
unknown and duplicate ids get the simulator's errors), ``response.create``
(``response.created``; taken by a waiting ``wait_outputs`` step, refused
while a response is active, else the default "Okay." reply),
``response.cancel`` (there is never a response mid-play to cancel here:
``response_cancel_not_active``), ``output_audio_buffer.clear``; a frame
that is not a JSON object gets ``invalid_event``. Pings get pongs, a close
gets its close back. Unlike the simulator it does **not** validate client
events against the SDK's models, does not pace deltas or hold responses
(no scenario here uses them), plays no scenario but the workloads' steps
(no barge-in, drops, faults, replays, WebRTC), and does not keep every
event as a dict: only the stamps a report needs (and, with ``--trace``,
the first call's frames).

Stamps (``trio.current_time()``, as the simulator's): a frame's
``written_at`` is taken right before its bytes go to the socket (no
schedule point between); ``read_at`` right after the socket read that
completed a client frame returned.

Roles (``benchmarks/lean_hosts.py``)::

    python -m benchmarks.lean_sim burst <burst's _sim arguments>   # benchmarks.burst --sim lean
    python -m benchmarks.lean_sim host <sim_host's arguments>      # benchmarks.roundtrip/capacity --sim lean

Each speaks its original's stdin/stdout protocol and writes the same JSON
keys (the burst's ``*_queued_ms`` and ``sim_*_wait_ms`` are left out: this
peer has no queue; its queued measure is its wire measure).
"""

from __future__ import annotations

import collections
import errno
import json
import math
import random
import socket
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator
from urllib.parse import parse_qs, urlsplit

import trio

from benchmarks import lean_frames as F
from benchmarks.common import BENCH_KEY

if TYPE_CHECKING:
    from voiceactors.simulator.scenario import Step

DEFAULT_REPLY = "Okay."
CLOSE_WAIT_S = 2.0          # how long a close waits for the client's close frame
HEAD_TIMEOUT_S = 30.0
RECV_SIZE = 256 * 1024
_DEFAULT_REPLY_JSON = json.dumps(DEFAULT_REPLY)


#: A frame's write stamp: a one-element list filled with ``trio.current_time()``
#: when the frame's first bytes go to the socket (see ``Connection.send``).
Box = list[float | None]

#: A client event as read from the socket (a JSON object).
ClientEvent = dict[str, Any]


def _audio_ms() -> int:
    return int(trio.current_time() * 1000) % 2_000_000_000


@dataclass
class Response:
    id: str
    origin: str               # scenario | client | default (the simulator's ResponseRecord.origin)
    status: str = "in_progress"


@dataclass
class Batch:
    """A completed ``response.done`` carrying function calls."""

    done_at: Box               # when its frame was written
    call_ids: list[str]


@dataclass
class Noise:
    """The background transcript deltas a ``transcript_deltas`` step plays."""

    item: str
    count: int
    period: float
    next_at: float
    sent: int = 0


class LeanCall:
    """One call id: its steps, its conversation state and the stamps a report needs."""

    def __init__(self, call_id: str, steps: tuple[Step, ...] | list[Step], *, trace: bool = False) -> None:
        from voiceactors.simulator.billing import ConversationTokens   # the simulator's token counts, exactly

        self.call_id = call_id
        self.steps = list(steps)
        self.step_index = 0
        self.connections = 0
        self.closed = False
        self.close_code: int | None = None
        self.connection: Connection | None = None
        self.started_at: float | None = None
        self._changed = trio.Event()
        # conversation
        self.session: dict[str, Any] = {"type": "realtime"}   # the merged session.update objects
        self.tokens = ConversationTokens()
        self._item_before: dict[str, str | None] = {}
        self._last_item: str | None = None
        self.turn = 0
        self.active: Response | None = None     # only a client's response.create waiting for its step
        self.claimed: Response | None = None
        self.waiting_create = False
        # records
        self.responses: list[Response] = []
        self.tool_calls: dict[str, int] = {}      # call id -> the turn it belongs to
        self.answered: set[str] = set()
        self.open: dict[str, None] = {}           # issued, no output yet, in issue order
        self.output_counts: collections.Counter[str] = collections.Counter()
        self.item_done_at: dict[str, Box] = {}    # call id -> its output_item.done written
        self.output_at: dict[str, float] = {}     # call id -> its first output read
        self.output_order: list[str] = []
        self.creates_at: list[float] = []         # every response.create read, in order
        self.response_creates = 0
        self.batches: list[Batch] = []
        self.errors_sent: list[str | None] = []
        self.violations: list[str] = []
        self.frames_sent = 0
        self.trace: list[str] | None = [] if trace else None

    def notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_until(self, predicate: Callable[["LeanCall"], bool]) -> None:
        while not predicate(self):
            await self._changed.wait()

    def item_before(self, item: str) -> str | None:
        if item not in self._item_before:
            self._item_before[item] = self._last_item
            self._last_item = item
        return self._item_before[item]

    def pending_call_ids(self) -> list[str]:
        return list(self.open)       # kept as calls are issued and answered: no walk of the history


class Connection:
    """One accepted sideband: the client's frames and the call's steps in one task."""

    def __init__(self, call: LeanCall, sock: socket.socket, leftover: bytes, coalesce: bool) -> None:
        self.call = call
        self.sock = sock
        self.reader = F.FrameReader()
        self.leftover = leftover
        self.coalesce = coalesce
        self._held: list[bytes] | None = None     # --coalesce: one step's frames, written together
        self._held_boxes: list[Box] = []
        self._backlog: list[tuple[memoryview, list[Box] | None]] = []   # what the socket did not take yet
        self.player: Iterator[float] | None = None
        self.player_at = math.inf
        self.waiting = False                      # the player is in wait_outputs
        self.noise: Noise | None = None
        self.closing_at = math.inf                # we sent a close: give up on its reply then
        self.end_requested = False
        self.scope: trio.CancelScope | None = None
        self.finished = False

    # -- writing
    #
    # A stamp is a one-element list (a "box") filled with the time its
    # frame's first bytes were handed to the socket: at once, or when a held
    # step (--coalesce) or a full socket's backlog goes out. Reports read
    # the boxes afterwards.

    def send(self, text: str, box: Box | None = None) -> None:
        """One event, its own frame (its own write unless the step is held)."""
        call = self.call
        call.frames_sent += 1
        if call.trace is not None:
            call.trace.append(text)
        data = F.frame(text.encode())
        if self._held is not None:
            self._held.append(data)
            if box is not None:
                self._held_boxes.append(box)
            return
        self._write(data, [box] if box is not None else None)

    def _write(self, data: bytes, boxes: list[Box] | None) -> None:
        if self._backlog:
            self._backlog.append((memoryview(data), boxes))
            return
        t = trio.current_time()
        try:
            n = self.sock.send(data)
        except BlockingIOError:
            n = 0
        except OSError:
            self.finished = True
            return
        if n == 0:
            self._backlog.append((memoryview(data), boxes))
            return
        if boxes:
            for box in boxes:
                box[0] = t
        if n < len(data):
            self._backlog.append((memoryview(data)[n:], None))

    def hold(self) -> bool:
        """With --coalesce, collect the frames until ``release`` (True: this call started holding)."""
        if self.coalesce and self._held is None:
            self._held, self._held_boxes = [], []
            return True
        return False

    def release(self) -> None:
        held, boxes = self._held, self._held_boxes
        self._held, self._held_boxes = None, []
        if held:
            self._write(b"".join(held), boxes)

    async def _flush_backlog(self) -> None:
        while self._backlog and not self.finished:
            view, boxes = self._backlog[0]
            await trio.lowlevel.wait_writable(self.sock)
            t = trio.current_time()
            try:
                n = self.sock.send(view)
            except BlockingIOError:
                continue
            except OSError:
                self.finished = True
                return
            if boxes:
                for box in boxes:
                    box[0] = t
            if n < len(view):
                self._backlog[0] = (view[n:], None)
            else:
                self._backlog.pop(0)

    # -- the loop

    async def run(self) -> None:
        call = self.call
        call.connection = self
        call.connections += 1
        if call.started_at is None:
            call.started_at = trio.current_time()
        call.notify()
        self.player = self._play()
        try:
            self._resume()
            if self.leftover:
                self._received(self.leftover, trio.current_time())
            while not self.finished:
                if self._backlog:
                    await self._flush_backlog()
                    continue
                deadline = min(self.player_at, self.closing_at,
                               self.noise.next_at if self.noise is not None else math.inf)
                readable = False
                with trio.move_on_at(deadline) as self.scope:
                    await trio.lowlevel.wait_readable(self.sock)
                    readable = True
                self.scope = None
                if readable:
                    try:
                        data = self.sock.recv(RECV_SIZE)
                    except BlockingIOError:
                        data = None
                    except OSError:
                        break
                    if data == b"":
                        break
                    if data:
                        self._received(data, trio.current_time())
                if self.finished:
                    break
                self._timers(trio.current_time())
        finally:
            self._ended()

    def _timers(self, now: float) -> None:
        if self.end_requested and self.closing_at == math.inf:
            self.start_close(1000)
        if now >= self.closing_at:
            self.finished = True
            return
        noise = self.noise
        if noise is not None and now >= noise.next_at:
            self.send(F.noise_delta(noise.item, noise.sent))
            noise.sent += 1
            noise.next_at = now + noise.period
            if noise.sent >= noise.count:
                self.noise = None
        if now >= self.player_at:
            self._resume()

    def _resume(self) -> None:
        if self.player is None:
            return
        held = self.hold()
        try:
            self.player_at = next(self.player)
        except StopIteration:
            self.player, self.player_at = None, math.inf
        finally:
            if held:
                self.release()

    def _ended(self) -> None:
        call = self.call
        for resp in (call.active, call.claimed):
            if resp is not None and resp.status == "in_progress":
                resp.status = "abandoned"
        call.active = call.claimed = None
        call.waiting_create = False
        if call.connection is self:
            call.connection = None
        try:
            self.sock.close()
        except OSError:
            pass
        call.notify()

    def start_close(self, code: int) -> None:
        """End the call as the service does: close ``code``, then wait (bounded) for the client's close."""
        call = self.call
        call.closed, call.close_code = True, code
        call.notify()
        self.release()
        self._write(F.close_frame(code), None)
        self.closing_at = trio.current_time() + CLOSE_WAIT_S
        self.player, self.player_at, self.noise = None, math.inf, None

    def request_end(self) -> None:
        """From another task: close (1000) at the loop's next turn."""
        self.end_requested = True
        if self.scope is not None:
            self.scope.cancel()

    # -- client frames

    def _received(self, data: bytes, read_at: float) -> None:
        try:
            frames = self.reader.feed(data)
        except ValueError:
            self._write(F.close_frame(1002), None)
            self.finished = True
            return
        for opcode, payload in frames:
            if opcode == F.OP_TEXT or opcode == F.OP_BINARY:
                if self.closing_at == math.inf:
                    held = self.hold()
                    self._client_event(payload, read_at, opcode == F.OP_TEXT)
                    if held:
                        self.release()
            elif opcode == F.OP_PING:
                self._write(F.frame(payload, F.OP_PONG), None)
            elif opcode == F.OP_CLOSE:
                if self.closing_at == math.inf:   # the client's close: answered with its code
                    code = payload[:2] if len(payload) >= 2 else b""
                    self._write(F.frame(code, F.OP_CLOSE), None)
                self.finished = True
                return

    def _client_event(self, payload: bytes, read_at: float, text: bool) -> None:
        obj: Any = None
        if text:
            try:
                obj = json.loads(payload)
            except ValueError:
                obj = None
        event_id = obj.get("event_id") if isinstance(obj, dict) else None
        event_id = event_id if isinstance(event_id, str) else None
        kind = obj.get("type") if isinstance(obj, dict) else None
        if not isinstance(kind, str):
            self.error("Invalid event", "invalid_event", event_id)
            return
        handler = _HANDLERS.get(kind)
        if handler is not None:
            try:
                handler(self, obj, event_id, read_at)
            except (TypeError, ValueError, AttributeError, KeyError):   # a field of the wrong shape
                self.error("Invalid event", "invalid_event", event_id)
        if self.waiting and self._outputs_ready():
            self._resume()

    def error(self, message: str, code: str | None, event_id: str | None, param: str | None = None) -> None:
        self.call.errors_sent.append(code)
        self.send(F.error_event(message, code, event_id, param))
        self.call.notify()

    def _on_session_update(self, obj: ClientEvent, event_id: str | None, read_at: float) -> None:
        session = obj.get("session")
        if isinstance(session, dict):
            self.call.session = {**self.call.session, **session}
        self.send(F.session_updated(self.call.session))

    def _on_conversation_item_create(self, obj: ClientEvent, event_id: str | None, read_at: float) -> None:
        call = self.call
        item = dict(obj.get("item") or {})
        item_id = item.get("id") or F.item_id()
        item.update(id=item_id, object="realtime.item", status="completed")
        if item.get("type") == "function_call_output":
            cid = str(item.get("call_id"))
            call.output_counts[cid] += 1
            if cid not in call.tool_calls:
                self.error(f"Tool call ID '{cid}' not found in conversation.", "invalid_tool_call_id", event_id,
                           "item.call_id")
                return
            if cid in call.answered:
                self.error(f"Tool call ID '{cid}' already has an output.", "duplicate_tool_call_output", event_id,
                           "item.call_id")
                return
            call.answered.add(cid)
            call.open.pop(cid, None)
            call.output_at[cid] = read_at
            call.output_order.append(cid)
            call.tokens.tool_output(str(item.get("output", "")))
            call.notify()
        item_json = json.dumps(item)
        previous = call.item_before(item_id)
        self.send(F.item_event("added", item_json, previous))
        self.send(F.item_event("done", item_json, previous))

    def _on_response_create(self, obj: ClientEvent, event_id: str | None, read_at: float) -> None:
        call = self.call
        call.response_creates += 1
        call.creates_at.append(read_at)
        call.notify()
        if call.active is not None:
            self.error(f"Conversation already has an active response in progress: {call.active.id}. "
                       "Wait until the response is finished before creating a new one.",
                       "conversation_already_has_active_response", event_id)
            return
        pending = call.pending_call_ids()
        resp = self._new_response("client")
        self.send(F.response_created(resp.id))
        if call.waiting_create and not pending and call.claimed is None:
            call.claimed = resp
            return
        if pending:
            call.violations.append(f"response.create ({event_id}) sent while tool calls {pending} had no output")
        resp.origin = "default"
        call.active = None
        self._play_text(resp, DEFAULT_REPLY, _DEFAULT_REPLY_JSON)
        self._finish(resp, [])

    def _on_response_cancel(self, obj: ClientEvent, event_id: str | None, read_at: float) -> None:
        self.error("Cancellation failed: no active response found.", "response_cancel_not_active", event_id)

    def _on_output_audio_buffer_clear(self, obj: ClientEvent, event_id: str | None, read_at: float) -> None:
        self.send(F.audio_buffer("cleared", self.call.active.id if self.call.active else ""))

    # -- the steps (a generator: it yields the time it wants to go on at)

    def _outputs_ready(self) -> bool:
        call = self.call
        return not call.pending_call_ids() and call.claimed is not None

    def _play(self) -> Iterator[float]:
        call = self.call
        while call.step_index < len(call.steps) and not call.closed:
            (kind, arg), = call.steps[call.step_index].items()
            if kind == "close":
                call.step_index += 1
                self.start_close(int(arg))
                return
            if kind == "sleep":
                yield trio.current_time() + float(arg)
            elif kind == "sleep_until":
                assert call.started_at is not None
                yield call.started_at + float(arg)
            elif kind == "user_turn":
                item = self._speech_started()
                duration = float(arg.get("duration_ms", 600)) / 1000
                if duration > 0:
                    yield trio.current_time() + duration
                self._user_said(item, arg.get("text", ""))
            elif kind == "response":
                self._response(arg)
            elif kind == "wait_outputs":
                yield from self._wait_outputs(arg)
            elif kind == "transcript_deltas":
                # background only (the benchmarks'): the period follows each delta, as the simulator's
                period = 1.0 / float(arg.get("rate_hz", 20))
                self.noise = Noise(F.item_id(), int(arg.get("count", 40)), period, trio.current_time())
            else:
                raise ValueError(f"the lean peer does not play {kind!r} steps")
            call.step_index += 1

    def _speech_started(self) -> str:
        item = F.item_id()
        self.call.turn += 1
        self.send(F.speech_started(item, _audio_ms()))
        return item

    def _user_said(self, item: str, text: str) -> None:
        call = self.call
        call.tokens.user_said(text)
        self.send(F.speech_stopped(item, _audio_ms()))
        self.send(F.committed(item))
        item_json = F.user_item(item)
        previous = call.item_before(item)
        self.send(F.item_event("added", item_json, previous))
        self.send(F.item_event("done", item_json, previous))
        text_json = json.dumps(text)
        if text:
            self.send(F.transcription_delta(item, text_json))
        self.send(F.transcription_completed(item, text_json, json.dumps(max(1.0, len(text) / 15))))

    def _new_response(self, origin: str) -> Response:
        resp = Response(F.response_id(), origin)
        self.call.active = resp
        self.call.responses.append(resp)
        return resp

    def _response(self, spec: dict[str, Any]) -> None:
        call = self.call
        resp = call.claimed
        if resp is not None:
            call.claimed = None
            resp.origin = "client"
        else:
            resp = self._new_response("scenario")
            self.send(F.response_created(resp.id))
        call.active = None     # from here to response.done nothing can be read: no other task
        items: list[tuple[dict[str, Any], str]] = []
        if spec.get("text"):
            text = spec["text"]
            items.append(self._play_text(resp, text, json.dumps(text)))
        call_ids = []
        for tool in spec.get("tool_calls", []):
            usage_item, item_json, cid = self._play_tool_call(resp, tool, len(items))
            items.append((usage_item, item_json))
            call_ids.append(cid)
        self._finish(resp, items, call_ids)

    def _finish(self, resp: Response, items: list[tuple[dict[str, Any], str]],
                call_ids: list[str] | None = None) -> None:
        call = self.call
        usage = call.tokens.response_usage([u for u, _ in items], call.session.get("instructions"))
        resp.status = "completed"
        text = F.response_done(resp.id, "[" + ", ".join(j for _, j in items) + "]", usage)
        if call_ids:
            batch = Batch([None], call_ids)
            call.batches.append(batch)
            self.send(text, batch.done_at)
        else:
            self.send(text)
        call.notify()

    def _play_text(self, resp: Response, text: str, text_json: str, index: int = 0) -> tuple[dict[str, Any], str]:
        call = self.call
        item = F.item_id()
        added = F.message_item(item, "in_progress", "[]")
        self.send(F.output_item("added", resp.id, index, added))
        previous = call.item_before(item)
        self.send(F.item_event("added", added, previous))
        self.send(F.content_part("added", resp.id, item, index, '""'))
        self.send(F.audio_buffer("started", resp.id))
        words = text.split(" ")
        for i, word in enumerate(words):
            self.send(F.transcript_delta(resp.id, item, index, json.dumps(word if i == len(words) - 1 else word + " ")))
        self.send(F.transcript_done(resp.id, item, index, text_json))
        self.send(F.content_part("done", resp.id, item, index, text_json))
        done = F.message_item(item, "completed", '[{"type": "output_audio", "transcript": %s}]' % text_json)
        self.send(F.output_item("done", resp.id, index, done))
        self.send(F.item_event("done", done, previous))
        self.send(F.audio_buffer("stopped", resp.id))
        return {"type": "message", "content": [{"transcript": text}]}, done

    def _play_tool_call(self, resp: Response, spec: dict[str, Any], index: int) -> tuple[dict[str, Any], str, str]:
        call = self.call
        item = F.item_id()
        cid = spec.get("call_id") or F.call_id()
        name = spec["name"]
        raw = spec.get("arguments", {})
        arguments = raw if isinstance(raw, str) else json.dumps(raw)
        name_json, args_json = json.dumps(name), json.dumps(arguments)
        added = F.function_call_item(item, "in_progress", name_json, cid, '""')
        self.send(F.output_item("added", resp.id, index, added))
        call.tool_calls[cid] = call.turn
        call.open[cid] = None
        previous = call.item_before(item)
        self.send(F.item_event("added", added, previous))
        half = len(arguments) // 2
        for chunk in (arguments[:half], arguments[half:]):
            if chunk:
                self.send(F.arguments_delta(resp.id, item, index, cid, json.dumps(chunk)))
        self.send(F.arguments_done(resp.id, item, index, cid, name_json, args_json))
        done = F.function_call_item(item, "completed", name_json, cid, args_json)
        box: Box = [None]
        call.item_done_at[cid] = box
        self.send(F.output_item("done", resp.id, index, done), box)
        self.send(F.item_event("done", done, previous))
        return {"type": "function_call", "name": name, "arguments": arguments}, done, cid

    def _wait_outputs(self, spec: dict[str, Any]) -> Iterator[float]:
        call = self.call
        need_create = spec.get("response_create", True)
        call.waiting_create = need_create
        deadline = trio.current_time() + float(spec.get("timeout_s", 30.0))
        self.waiting = True
        try:
            while not (not call.pending_call_ids() and (not need_create or call.claimed is not None)):
                if trio.current_time() >= deadline:
                    call.violations.append(
                        f"wait_outputs timed out: pending outputs {call.pending_call_ids()}, "
                        f"response.create received: {call.claimed is not None}")
                    break
                yield deadline
        finally:
            self.waiting = False
            call.waiting_create = False
        nxt = call.steps[call.step_index + 1] if call.step_index + 1 < len(call.steps) else {}
        if call.claimed is not None and "response" not in nxt:
            resp, call.claimed = call.claimed, None
            resp.origin = "default"
            call.active = None
            self._play_text(resp, DEFAULT_REPLY, _DEFAULT_REPLY_JSON)
            self._finish(resp, [])


_HANDLERS: dict[str, Callable[[Connection, ClientEvent, str | None, float], None]] = {
    "session.update": Connection._on_session_update,
    "conversation.item.create": Connection._on_conversation_item_create,
    "response.create": Connection._on_response_create,
    "response.cancel": Connection._on_response_cancel,
    "output_audio_buffer.clear": Connection._on_output_audio_buffer_clear,
}


# --- the listener ------------------------------------------------------------------------------

class LeanPeer:
    """The HTTP + sideband listener over ``calls`` (the call ids that may join)."""

    def __init__(self, *, coalesce: bool = False, api_key: str = BENCH_KEY) -> None:
        self.calls: dict[str, LeanCall] = {}
        self.coalesce = coalesce
        self.api_key = api_key
        self.handshakes: list[dict[str, Any]] = []

    async def serve(self, port: int = 0, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(4096)
        listener.setblocking(False)
        async with trio.open_nursery() as nursery:
            task_status.started(listener.getsockname()[1])
            try:
                while True:
                    await trio.lowlevel.wait_readable(listener)
                    while True:
                        try:
                            sock, _ = listener.accept()
                        except BlockingIOError:
                            break
                        except OSError as exc:
                            if exc.errno in (errno.EMFILE, errno.ENFILE):
                                await trio.sleep(0.05)
                                break
                            raise
                        sock.setblocking(False)
                        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        nursery.start_soon(self._connection, sock)
            finally:
                listener.close()

    async def _connection(self, sock: socket.socket) -> None:
        try:
            with trio.move_on_after(HEAD_TIMEOUT_S):
                head, rest = await _read_head(sock)
            if head is None:
                sock.close()
                return
            method, target, headers = _parse_head(head)
            parts = urlsplit(target)
            if "websocket" in headers.get("upgrade", "").lower():
                await self._websocket(sock, parts.path, parts.query, headers, rest)
                return
            body = rest
            length = int(headers.get("content-length", "0") or 0)
            with trio.move_on_after(HEAD_TIMEOUT_S):
                while len(body) < length:
                    await trio.lowlevel.wait_readable(sock)
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    body += chunk
            await _send_all(sock, self._rest(method, parts.path, headers, body))
        except OSError:
            pass
        finally:
            sock.close()

    def _rest(self, method: str, path: str, headers: dict[str, str], body: bytes) -> bytes:
        path = path.rstrip("/")
        if method != "POST":
            return F.http_response(404, F.error_body(f"Invalid URL ({method} {path})"))
        if _bearer(headers) != self.api_key:
            return F.http_response(401, F.error_body("Incorrect API key provided.", "invalid_api_key"))
        parts = path.split("/")
        if path == "/v1/realtime/client_secrets":
            return self._client_secret(body)
        if len(parts) == 6 and parts[:4] == ["", "v1", "realtime", "calls"] and parts[5] == "hangup":
            call = self.calls.get(parts[4])
            if call is None or call.closed:
                return F.http_response(404, F.error_body(f"Call '{parts[4]}' not found.", "call_id_not_found"))
            self.end_call(call)
            return F.http_response(200)
        return F.http_response(404, F.error_body(f"Invalid URL (POST {path})"))

    def _client_secret(self, body: bytes) -> bytes:
        """A minted ephemeral key (the server's ``/api/voice/session``, which the
        drivers' readiness check calls): the asked session echoed back, not
        validated against the SDK's models as the simulator does."""
        try:
            asked = json.loads(body or b"{}")
        except ValueError:
            asked = None
        if not isinstance(asked, dict):
            return F.http_response(400, F.error_body("We could not parse the JSON body of your request."))
        expires = asked.get("expires_after")
        seconds = expires.get("seconds", 600) if isinstance(expires, dict) else 600
        asked_session = asked.get("session")
        session: dict[str, Any] = asked_session if isinstance(asked_session, dict) else {"type": "realtime"}
        minted = {"value": "ek_%032x" % random.getrandbits(128), "expires_at": int(time.time()) + int(seconds),
                  "session": {**session, "id": "sess_%016x" % random.getrandbits(64),
                              "object": "realtime.session" if session.get("type", "realtime") == "realtime"
                              else "realtime.transcription_session", "expires_at": 0}}
        return F.http_response(200, json.dumps(minted).encode())

    def _check(self, path: str, query: str, headers: dict[str, str]) -> tuple[int, bytes, LeanCall | None]:
        call_id = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}.get("call_id", "")
        if path.rstrip("/") != "/v1/realtime":
            return 404, F.error_body(f"Invalid URL (GET {path})"), None
        key = _bearer(headers)
        if key is None:
            return 401, F.error_body("Missing bearer authentication.", "invalid_api_key"), None
        if key != self.api_key:
            return 401, F.error_body("Incorrect API key provided.", "invalid_api_key"), None
        if not call_id:
            return 400, F.error_body("Missing call_id.", "missing_required_parameter", param="call_id"), None
        call = self.calls.get(call_id)
        if call is None:
            return 404, F.error_body(f"Call '{call_id}' not found.", "call_id_not_found"), None
        if call.closed:
            return 404, F.error_body(f"Call '{call_id}' has ended.", "call_id_not_found"), call
        if call.connection is not None:
            return 409, F.error_body("This call already has a sideband connection.", "conflict"), call
        return 101, b"", call

    async def _websocket(self, sock: socket.socket, path: str, query: str, headers: dict[str, str],
                         rest: bytes) -> None:
        status, body, call = self._check(path, query, headers)
        self.handshakes.append({"call_id": call.call_id if call else "", "status": status})
        key = headers.get("sec-websocket-key", "")
        if status == 101 and not key:
            status, body = 400, F.error_body("Missing Sec-WebSocket-Key.")
        if status != 101:
            await _send_all(sock, F.http_response(status, body))
            return
        assert call is not None
        await _send_all(sock, F.switching_protocols(key))
        await Connection(call, sock, rest, self.coalesce).run()

    def end_call(self, call: LeanCall) -> None:
        """End ``call`` as the service does: later joins are refused; a live sideband closes (1000)."""
        if call.connection is not None:
            call.connection.request_end()
        else:
            call.closed, call.close_code = True, 1000
            call.notify()


async def _read_head(sock: socket.socket) -> tuple[bytes | None, bytes]:
    buf = b""
    while b"\r\n\r\n" not in buf:
        await trio.lowlevel.wait_readable(sock)
        try:
            chunk = sock.recv(65536)
        except BlockingIOError:
            continue
        if not chunk or len(buf) > 65536:
            return None, b""
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    return head, rest


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = (lines[0].split(" ", 2) + ["", ""])[:3]
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return method, target, headers


def _bearer(headers: dict[str, str]) -> str | None:
    value = headers.get("authorization", "")
    if value[:7].lower() != "bearer ":
        return None
    return value[7:].strip() or None


async def _send_all(sock: socket.socket, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = sock.send(view)
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)
            continue
        view = view[n:]
    await trio.lowlevel.checkpoint()


def main(argv: list[str] | None = None) -> int:
    from benchmarks.lean_hosts import burst_main, host_main

    argv = sys.argv[1:] if argv is None else argv
    roles = {"burst": burst_main, "host": host_main}
    if not argv or argv[0] not in roles:
        raise SystemExit("usage: python -m benchmarks.lean_sim {burst|host} ...")
    return roles[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
