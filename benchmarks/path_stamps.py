"""Time stamps along one output's critical path, taken inside the benchmark's
processes (loaded by ``benchmarks.output_path``; never imported by the product).

``benchmarks.output_path`` starts ``benchmarks.burst`` with a ``sitecustomize``
that loads this file by path into every Python process of the run (the lean
peer, our server, the do-nothing server) and calls ``install()``. It wraps
``trio.run`` so that, inside the run, it patches what that process has (only
for the benchmark's processes: nothing here is in the product's code):

* every process: ``trio.SocketStream.receive_some`` (a read holding a
  function call's ``response.output_item.done`` or ``arguments.done``, by
  call id) and ``send_all`` (a write holding a ``function_call_output``), and
  a trio ``Instrument`` noting each task step (when, which task) and each
  return from the I/O wait;
* our server: ``ws_frames`` (the hand-off into the message channel,
  ``get_messages``, ``start_send``), ``events.read_server_event``,
  ``CallProtocol.handle_event``, ``CallActor._apply`` (with the effects'
  kinds), ``ToolExecutor.answer_now``;
* the lean peer: each call's ``output_item.done`` written and output read
  (its ``trio.current_time()`` stamps, turned into ``time.perf_counter``'s
  time base by the run's clock offset).

Every stamp is ``time.perf_counter_ns()`` (CLOCK_MONOTONIC: one clock for
every process of the machine). At the end of ``trio.run`` the process writes
its stamps to ``$PATH_STAMPS_DIR/<role>-<pid>.json``. The wrappers cost
~1 µs a call and the instrument ~1 µs a task step: the breakdown is for where
the time goes, not for the latency itself (``benchmarks.burst`` measures that
without them).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import Any, Awaitable, Callable, TypeVar, TypeVarTuple, Unpack

NS = time.perf_counter_ns
# trio.run's type parameters: mypy accepts a wrapper put in its place only in its generic shape
PosArgT = TypeVarTuple("PosArgT")
RetT = TypeVar("RetT")
_CALL_ID = re.compile(rb'"call_id": ?"([^"]+)"')
_CALL_ID_S = re.compile(r'"call_id": ?"([^"]+)"')
_FRAME_START = b'{"type": "'

S: dict[str, Any] = {"steps": [], "io": [], "recv": [], "send": [], "handoff": [], "batch": [], "decode": [],
                     "protocol": [], "apply": [], "fn": [], "answer": [], "start_send": [], "peer": {}}


def _role() -> str:
    argv0 = sys.argv[0] if sys.argv else ""
    if argv0.endswith(os.path.join("voiceactors", "cli.py")) or argv0.endswith("voiceactors/__main__.py"):
        return "ours"
    if argv0.endswith("nothing.py"):
        return "nothing"
    if argv0.endswith("lean_sim.py"):
        return "peer"
    return "other"


def _frames_of(data: bytes, kind: bytes) -> list[str]:
    """The call ids of the function-call frames of ``kind`` in one read."""
    out = []
    for seg in data.split(_FRAME_START)[1:]:
        if seg.startswith(kind) and (kind != b'response.output_item.done"' or b'"function_call"' in seg):
            m = _CALL_ID.search(seg)
            if m:
                out.append(m.group(1).decode())
    return out


def _instrument() -> Any:
    import trio

    class Stamps(trio.abc.Instrument):
        def before_task_step(self, task: Any) -> None:
            S["steps"].append((NS(), task.name))

        def after_io_wait(self, timeout: float) -> None:
            S["io"].append(NS())

    return Stamps()


def _patch_sockets() -> None:
    import trio

    receive_some, send_all = trio.SocketStream.receive_some, trio.SocketStream.send_all

    async def stamped_receive(self: Any, max_bytes: int | None = None) -> Any:
        data = await receive_some(self, max_bytes)
        t = NS()
        if b"output_item.done" in data or b"arguments.done" in data:
            for cid in _frames_of(data, b'response.output_item.done"'):
                S["recv"].append((t, "item_done", cid, len(data)))
            for cid in _frames_of(data, b'response.function_call_arguments.done"'):
                S["recv"].append((t, "args_done", cid, len(data)))
        return data

    # a client's frames are masked: the output is known from send_message's
    # text, its write at the send_all that follows (trio-websocket's _send)
    async def stamped_send_all(self: Any, data: Any) -> None:
        cid = S.pop("_sending", None)
        if cid is not None:
            S["send"].append((NS(), cid))
        await send_all(self, data)

    trio.SocketStream.receive_some = stamped_receive    # type: ignore[method-assign]
    trio.SocketStream.send_all = stamped_send_all       # type: ignore[method-assign]

    import trio_websocket

    send_message = trio_websocket.WebSocketConnection.send_message

    async def stamped_send_message(self: Any, message: Any) -> None:
        if isinstance(message, str) and "function_call_output" in message:
            m = _CALL_ID_S.search(message)
            S["_sending"] = m.group(1) if m else None
        await send_message(self, message)

    trio_websocket.WebSocketConnection.send_message = stamped_send_message   # type: ignore[method-assign]


def _is_item_done(raw: Any) -> str | None:
    if isinstance(raw, str) and raw.startswith('{"type": "response.output_item.done"') and '"function_call"' in raw:
        m = _CALL_ID_S.search(raw)
        return m.group(1) if m else None
    return None


def _kind(raw: Any) -> str:
    if isinstance(raw, str) and raw.startswith('{"type": "'):
        return raw[10:raw.find('"', 10)]
    return "?"


def _time_method(cls: Any, name: str) -> None:
    """Note each call's start and end under ``fn`` (the in-step answer's parts)."""
    inner = getattr(cls, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = NS()
        out = inner(*args, **kwargs)
        S["fn"].append((name, t0, NS()))
        return out

    setattr(cls, name, timed)


def _patch_ours() -> None:
    from voiceactors.actors import call as call_mod
    from voiceactors.actors import call_protocol, executor
    from voiceactors.realtime import events, ws_frames

    send = ws_frames._SendAtOnce.send

    async def stamped_handoff(self: Any, value: Any) -> None:
        cid = _is_item_done(value)
        if cid is not None:
            S["handoff"].append((NS(), cid))
        await send(self, value)

    ws_frames._SendAtOnce.send = stamped_handoff    # type: ignore[method-assign]

    get_messages = ws_frames.get_messages

    async def stamped_get_messages(ws: Any) -> Any:
        batch = await get_messages(ws)
        t = NS()
        S["batch"].append((t, [_kind(m) for m in batch], [_is_item_done(m) for m in batch]))
        return batch

    ws_frames.get_messages = stamped_get_messages

    read = events.read_server_event

    def stamped_read(raw: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = NS()
        out = read(raw, *args, **kwargs)
        S["decode"].append((t0, NS(), _kind(raw), _is_item_done(raw)))
        return out

    events.read_server_event = stamped_read

    handle_event = call_protocol.CallProtocol.handle_event

    def stamped_handle(self: Any, event: Any, now: float) -> Any:
        t0 = NS()
        out = handle_event(self, event, now)
        S["protocol"].append((t0, NS(), getattr(event, "type", None), [type(e).__name__ for e in out]))
        return out

    call_protocol.CallProtocol.handle_event = stamped_handle   # type: ignore[method-assign]

    apply = call_mod.CallActor._apply

    def stamped_apply(self: Any, effects: Any) -> None:
        t0 = NS()
        apply(self, effects)
        S["apply"].append((t0, NS(), [type(e).__name__ for e in effects]))

    call_mod.CallActor._apply = stamped_apply    # type: ignore[method-assign]

    answer_now = executor.ToolExecutor.answer_now

    def stamped_answer(self: Any, req: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = NS()
        out = answer_now(self, req, *args, **kwargs)
        S["answer"].append((t0, NS(), req.tool_call_id, out is not None))
        return out

    executor.ToolExecutor.answer_now = stamped_answer    # type: ignore[method-assign]
    for name in ("_resolve", "_admit", "_result", "_reported"):
        _time_method(executor.ToolExecutor, name)
    from voiceactors import logs, metrics
    _time_method(logs._CurrentStderr, "write")
    _time_method(logs._CurrentStderr, "flush")
    _time_method(metrics, "tool_finished")

    start_send = ws_frames.start_send

    def stamped_start_send(ws: Any, text: str) -> Any:
        t0 = NS()
        out = start_send(ws, text)
        cid = None
        if "function_call_output" in text:
            m = _CALL_ID_S.search(text)
            cid = m.group(1) if m else None
        S["start_send"].append((t0, NS(), cid, out == b""))
        return out

    ws_frames.start_send = stamped_start_send


def _patch_peer() -> None:
    calls: list[Any] = S.setdefault("_calls", [])
    seen: set[int] = set()
    for mod in list(sys.modules.values()):
        cls = getattr(mod, "LeanCall", None)
        if cls is None or id(cls) in seen or not isinstance(cls, type):
            continue
        seen.add(id(cls))
        init = cls.__init__

        def stamped_init(self: Any, *args: Any, __init: Any = init, **kwargs: Any) -> None:
            __init(self, *args, **kwargs)
            calls.append(self)

        cls.__init__ = stamped_init


def _dump_peer(offset_s: float) -> None:
    for call in S.pop("_calls", []):
        for cid, box in call.item_done_at.items():
            entry = S["peer"].setdefault(cid, {})
            if box[0] is not None:
                entry["item_done_written"] = int((box[0] - offset_s) * 1e9)
        for cid, t in call.output_at.items():
            S["peer"].setdefault(cid, {})["output_read"] = int((t - offset_s) * 1e9)


def install() -> None:
    directory = os.environ.get("PATH_STAMPS_DIR")
    if not directory:
        return
    import trio

    run = trio.run

    def stamped_run(async_fn: Callable[[Unpack[PosArgT]], Awaitable[RetT]], *args: Unpack[PosArgT],
                    **kwargs: Any) -> RetT:
        role = _role()     # sys.argv is not set yet while site imports this
        _patch_sockets()
        if role == "ours":
            _patch_ours()
        if role == "peer":
            _patch_peer()
        offset: list[float] = []

        async def main(*a: Unpack[PosArgT]) -> RetT:
            offset.append(trio.current_time() - time.perf_counter())
            return await async_fn(*a)

        instruments = list(kwargs.pop("instruments", ())) + [_instrument()]
        try:
            return run(main, *args, instruments=instruments, **kwargs)
        finally:
            if role == "peer" and offset:
                _dump_peer(offset[0])
            S.pop("_calls", None)
            S.pop("_sending", None)
            path = os.path.join(directory, f"{role}-{os.getpid()}.json")
            with open(path, "w") as f:
                json.dump(S, f)

    trio.run = stamped_run
