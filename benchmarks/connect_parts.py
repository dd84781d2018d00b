"""The parts of a connect that can be timed without sockets (issue 14, "the connect").

``benchmarks.connect_cost`` gives a connect's whole CPU on a real server and
py-spy says where it goes; this times, in one process on the trio thread,
the pieces our own code adds per connect, so the accounting in
docs/benchmarks.md § 13 can say what each is worth (and what is not worth
caching):

* ``thread_hop`` — one ``storage.run_sync`` of a no-op (what the usage
  meter's model read cost per connect before it ran on the trio thread);
* ``task`` — a nursery with one task that waits once (what a task per call
  costs to start and end: the guard and writer tasks);
* ``ask`` — one ``messages.ask`` round trip to an actor task (what the
  route's ``GetBrain`` and ``Connect`` cost besides the handlers);
* ``voice_read`` — one read of the journal's voice block (a ``stat`` and a
  dict lookup; the route, the key and the model each do one);
* ``session_update`` — building a linked-context call's ``session.update``
  (``CallContext``: compose the instruction, the event) and its JSON, with a
  brain instruction of ``--instruction-chars``;
* ``manifest`` — the ``tools`` array of ``/session`` (not on the connect path);
* ``tls_context_made`` — ``ssl.create_default_context()``, what trio-websocket
  made for every ``wss`` sideband before ``realtime/tls.py``; ``tls_context_kept``
  — ``tls.SIDEBAND.get()`` once it is made (what a connect pays now);
* ``hangup_client`` / ``hangup_client_kept_tls`` — an ``httpx.AsyncClient``
  made and closed with its own TLS context (each hangup before) and with
  ``tls.REST``'s (now);
* ``tcp_open_tcp_stream`` / ``tcp_direct`` — a loopback TCP connect through
  ``trio.open_tcp_stream`` (trio-websocket's: a nursery and a task for happy
  eyeballs, even for an IP literal) and through one socket's ``connect``,
  the process's own listener accepting both (not cut: see § 24).

The TLS parts run ``--n`` ÷ 100 iterations (each is tens of ms).

Each is the best of ``--repeats`` runs of ``--n`` iterations, µs of process
CPU per iteration (``time.process_time``).

``--live-calls N`` instead connects N quiet calls through a real
``CallSupervisor`` to the in-process simulator (loopback sockets) and
reports, per live call, the trio tasks and the objects the garbage
collector tracks (what a full collection walks), measured from the same
process with and without the calls; the simulator's own tasks and objects
per call are in both numbers, so compare checkouts, not absolutes. Run it
against another checkout's package with ``PYTHONPATH=<checkout>``.

Run::

    .venv/bin/python -m benchmarks.connect_parts
    .venv/bin/python -m benchmarks.connect_parts --live-calls 200
    PYTHONPATH=/tmp/connect-before .venv/bin/python -m benchmarks.connect_parts --live-calls 200
"""

from __future__ import annotations

import argparse
import inspect
import json
import socket
import ssl
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import httpx
import trio

from benchmarks.soak import count_tasks
from voiceactors import config, context, storage
from voiceactors.realtime import tls
from voiceactors.actors.call_context import CallContext, LinkedContext
from voiceactors.actors.messages import ask
from voiceactors.settings import Settings
from voiceactors.tools.registry import manifest


async def _thread_hop() -> None:
    await storage.run_sync(lambda: None)


async def _task() -> None:
    ready = trio.Event()

    async def child() -> None:
        await ready.wait()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(child)
        await trio.sleep(0)
        ready.set()


def _settings(journal: Path) -> Settings:
    (journal / "config").mkdir(parents=True, exist_ok=True)
    (journal / "config" / "journal.json").write_text(json.dumps({"voice": {"model": "gpt-realtime"}}))
    return Settings(journal=journal, state_dir=journal.parent / "state")


def _session_update(chars: int) -> Callable[[], None]:
    base = ("You are the journal's voice. " * (chars // 29 + 1))[:chars]
    link = context.Reference(kind="day", id="2026-03-27", name="Friday 27 March", date="2026-03-27")

    def build() -> None:
        ctx = CallContext(LinkedContext(base, link, greeting=False))
        events, _ = ctx.on_connected(quiet=True)
        for event in events:
            json.dumps(event, ensure_ascii=False)
    return build


async def _best(fn: Callable[[], Awaitable[None]] | Callable[[], None], n: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        for _ in range(n):
            result: Any = fn()
            if inspect.isawaitable(result):
                await result
        best = min(best, (time.process_time() - t0) / n)
    return round(best * 1e6, 2)


async def main_async(args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        settings = _settings(Path(tmp) / "journal")
        inbox, receive = trio.open_memory_channel[Any](16)

        async def actor() -> None:
            async for message in receive:
                message.send_nowait(None)

        results: dict[str, float] = {}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(actor)
            parts: dict[str, Callable[[], Any]] = {
                "thread_hop": _thread_hop,
                "task": _task,
                "ask": lambda: ask(inbox, lambda reply: reply, timeout=5),
                "voice_read": lambda: config.voice_model(settings),
                "session_update": _session_update(args.instruction_chars),
                "manifest": lambda: manifest("dotted"),
            }
            for name, fn in parts.items():
                results[name] = await _best(fn, args.n, args.repeats)
            slow: dict[str, Callable[[], Any]] = {
                "tls_context_made": ssl.create_default_context,
                "tls_context_kept": tls.SIDEBAND.get,
                "hangup_client": _hangup_client(None),
                "hangup_client_kept_tls": _hangup_client(tls.REST),
            }
            for name, fn in slow.items():
                results[name] = await _best(fn, max(1, args.n // 100), args.repeats)
            port = await nursery.start(_listener)
            for name, fn in (("tcp_open_tcp_stream", _open_tcp_stream(port)), ("tcp_direct", _direct_tcp(port))):
                results[name] = await _best(fn, max(1, args.n // 10), args.repeats)
            nursery.cancel_scope.cancel()
    return results


def _hangup_client(kept: Any) -> Callable[[], Awaitable[None]]:
    async def make() -> None:
        verify = kept.now() if kept is not None else True
        async with httpx.AsyncClient(timeout=5, verify=verify):
            pass
    return make


async def _listener(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """A loopback listener that accepts and closes every connection."""
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    task_status.started(listener.socket.getsockname()[1])
    async with listener:
        while True:
            stream = await listener.accept()
            await stream.aclose()


def _open_tcp_stream(port: int) -> Callable[[], Awaitable[None]]:
    async def connect() -> None:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.aclose()
    return connect


def _direct_tcp(port: int) -> Callable[[], Awaitable[None]]:
    async def connect() -> None:
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        await sock.connect(("127.0.0.1", port))
        await trio.SocketStream(sock).aclose()
    return connect


async def live_calls(n: int) -> dict[str, float]:
    import gc

    from voiceactors.actors.messages import Connect, CountCalls
    from voiceactors.actors.supervisor import CallSupervisor
    from voiceactors.simulator import Simulator

    key = "sk-bench-connect-parts-0123"
    with tempfile.TemporaryDirectory() as tmp:
        sim = Simulator(None, api_key=key)
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            settings = Settings(journal=Path(tmp) / "journal", state_dir=Path(tmp) / "state",
                                openai_base_url=sim.base_url, call_idle_timeout_s=3600.0)
            executor, _unused = trio.open_memory_channel[Any](1)
            sup = CallSupervisor(settings, executor, key)
            await nursery.start(sup.run)
            silence = [{"silence": 3600}]
            for i in range(n):
                sim.add_call(f"rtc_parts_{i}", silence)
            await trio.sleep(0.2)
            gc.collect()
            tasks0, objects0 = count_tasks(), len(gc.get_objects())
            for i in range(n):
                assert await ask(sup.inbox, lambda reply: Connect(f"rtc_parts_{i}", reply), timeout=10) == "connected"
            with trio.fail_after(60):
                while sum(1 for actor in sup.calls.values() if actor._ws is not None) < n:
                    await trio.sleep(0.05)
            await trio.sleep(0.5)
            gc.collect()
            tasks1, objects1 = count_tasks(), len(gc.get_objects())
            assert await ask(sup.inbox, CountCalls, timeout=5) == n
            nursery.cancel_scope.cancel()
    return {"tasks_per_live_call": round((tasks1 - tasks0) / n, 2),
            "gc_objects_per_live_call": round((objects1 - objects0) / n, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="CPU of the parts of a connect, without sockets")
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--instruction-chars", type=int, default=6000)
    p.add_argument("--live-calls", type=int, default=0, help="count tasks and objects per live quiet call instead")
    args = p.parse_args(argv)
    if args.live_calls:
        for name, value in trio.run(live_calls, args.live_calls).items():
            print(f"{name:26s} {value}", flush=True)
        return 0
    results = trio.run(main_async, args)
    for name, us in results.items():
        print(f"{name:16s} {us:8.2f} µs", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
