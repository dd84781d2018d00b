"""Live calls' tool round trip while the HTTP API is flooded.

What it measures: a real ``voiceactors serve`` process (the generated 14-day
sample journal; the Realtime simulator standing in for OpenAI, over loopback)
carries ``--calls`` live calls, each doing one ``briefing.get`` tool round
every ``--gap`` seconds on a timetable (and, unless ``--no-live-sse``, one
``/api/voice/events`` subscriber per call reading every feed event as it
arrives, as a browser does). Their round trip is measured at the simulator
exactly as ``benchmarks.roundtrip`` does (``output`` = the server's
``function_call_output`` read − the ``response.done`` queued; ``create`` =
its ``response.create`` read − the same), together with the server's own
``overhead_ms`` from its call records (joined by tool call id), in phases of
``--phase-s`` seconds each:

* ``idle`` — no flood: the reference;
* ``mint`` — ``--mint-rate`` ``POST /api/voice/session`` per second (each one
  mints a client secret at the simulator);
* ``sse`` — ``--sse-subscribers`` ``GET /api/voice/events?call_id=<live call
  0>`` streams opened (at ``--sse-rate`` per second; the phase starts once
  they are all open) and held, never read;
* ``connect`` — ``--connect-rate`` ``POST /api/voice/connect`` per second with
  call ids the simulator does not know; after it (and ``--settle-s``) the
  files in ``<state_dir>/calls/`` are counted.

Per phase: round-trip p50 / p99 / max and the ratio to the same repeat's
idle phase (the target: within 2x), rounds that got no output, the flood's
requests by answer status (a rate limit's 429s, a cap's 503s) and by client
error (timeouts, refused, EMFILE), requests not sent because
``--max-in-flight`` were already waiting (``skipped``) or still waiting
when the phase ended (``cancelled``), and CPU seconds per second of the
server, the simulator and the flood process (psutil, user+system). Between
phases the driver waits ``--settle-s`` and then until the server's CPU is
below ``--quiet-core-pct`` of a core (at most ``--settle-max-s``), so one
phase's backlog does not land in the next. Each repeat is a fresh server,
simulator and state directory.

Processes: this driver (starts everything, samples CPU, makes the live
calls' ``/connect`` requests), the simulator (``_sim`` role of this module:
the measuring side), the server, and one flood process per phase (``_flood``
role), so the flood's own CPU is not the measuring side's. On 2 cores they
still share the machine: a flood process busy on one core leaves the server
and the simulator the other; its CPU is in the report.

Every request carries ``Host: 127.0.0.1:<port>`` (``--host-header``) and no
``Origin``; an answer 421 (or 403) means the server refused the request
itself, not the flood's load: the phase is marked ``refused`` and is
meaningless. The benchmark raises its ``RLIMIT_NOFILE`` soft limit to the
hard one (the children inherit it) and bounds ``--sse-subscribers`` by it.

Run::

    .venv/bin/python -m benchmarks.floods --repeats 3 --json F-floods.json --markdown F-floods.md
    .venv/bin/python -m benchmarks.floods --phases idle mint --mint-rate 50 --phase-s 5 --repeats 1
    .venv/bin/python -m benchmarks.floods --server-env VOICEACTORS_SOME_LIMIT=100000   # limits raised
    .venv/bin/python -m benchmarks.floods --flood-sources 127.0.0.2 127.0.0.3   # several clients
    git worktree add /tmp/before 3c99a01 && \
    .venv/bin/python -m benchmarks.floods --server-repo /tmp/before            # that commit's server

Bounded: every phase ends after its seconds, every wait has a timeout, and
every process is a child on loopback.
"""

from __future__ import annotations

import argparse
import collections
import gc
import http.client
import itertools
import json
import os
import random
import select
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import (
    BENCH_KEY, BENCH_TODAY, CpuWindow, Proc, free_loopback_port, machine_facts, raise_nofile_limit,
    sample_journal, spawn, summary, work_dir, write_json,
)

PHASES = ("idle", "mint", "sse", "connect")
PREFIX = "rtc_flood"
BOGUS_PREFIX = "bogus_flood"
REFUSED_STATUSES = ("421", "403")   # the server refusing the request itself (Host / Origin checks)
FD_MARGIN = 256                     # descriptors left for everything but the SSE flood's sockets


# --- a minimal HTTP/1.1 client on trio (the flood and the live subscribers) -----------------

class HttpEof(Exception):
    """The server closed the connection before a whole answer."""


def request_bytes(method: str, path: str, host_header: str, body: bytes = b"", *,
                  close: bool = True, accept: str | None = None) -> bytes:
    """One request: a loopback ``Host``, never an ``Origin``."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host_header}"]
    if accept:
        lines.append(f"Accept: {accept}")
    if method == "POST":
        lines.append(f"Content-Length: {len(body)}")
        if body:
            lines.append("Content-Type: application/json")
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + body


async def http_exchange(host: str, port: int, raw: bytes, *, source: str | None = None,
                        keep_open: bool = False) -> tuple[int, Any]:
    """Send ``raw`` on a new connection and read the answer's head (and its
    body, by ``Content-Length``). Returns ``(status, stream)``: the stream
    is still open with ``keep_open`` (an event stream), else closed.
    Reads by length because the server may not close after an answer."""
    import trio

    stream = await trio.open_tcp_stream(host, port, local_address=source)
    try:
        await stream.send_all(raw)
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = await stream.receive_some(65536)
            if not chunk:
                raise HttpEof("closed before the answer's head")
            buf += chunk
            if len(buf) > 65536:
                raise HttpEof("answer head over 64 KiB")
        head, _, rest = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        if keep_open:
            return status, stream
        length = None
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        while length is None or len(rest) < length:
            chunk = await stream.receive_some(65536)
            if not chunk:
                break                        # no length: the body ends at EOF
            rest += chunk
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    await trio.aclose_forcefully(stream)
    return status, None


def error_name(error: BaseException) -> str:
    """A short bucket for a client-side failure: ``timeout``, ``eof``, an errno name."""
    import errno
    import trio

    if isinstance(error, trio.TooSlowError):
        return "timeout"
    if isinstance(error, HttpEof):
        return "eof"
    if isinstance(error, OSError):
        code = error.errno
        cause = error.__cause__
        if code is None and isinstance(cause, BaseExceptionGroup):   # trio: every connect attempt failed
            code = next((e.errno for e in cause.exceptions if isinstance(e, OSError)), None)
        elif code is None and isinstance(cause, OSError):
            code = cause.errno
        return errno.errorcode.get(code, type(error).__name__) if code else type(error).__name__
    if isinstance(error, ValueError):
        return "bad_answer"
    return type(error).__name__


# --- role: the simulator (the measuring side) -----------------------------------------------

def rounds_of(call: Any, to_monotonic: float) -> list[list[Any]]:
    """One row per tool call of a completed ``response.done``:
    ``[t0 (time.monotonic), tool call id, output_ms | None, create_ms | None]``
    (the same definitions as ``sim_host.analyse``, with the start time kept,
    so the driver can tell which phase a round belongs to)."""
    from benchmarks.sim_host import batch_times

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value, 3)

    rows: list[list[Any]] = []
    for batch in batch_times(call):
        for i, out in batch.outputs:
            rows.append([batch.t0 + to_monotonic, i, ms(out), ms(batch.create_ms)])
    return rows


@dataclass
class LiveFeed:
    """What the live calls' own event-stream subscribers saw."""

    statuses: collections.Counter[str] = field(default_factory=collections.Counter)
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    events: list[list[float]] = field(default_factory=list)   # [time.monotonic(), data lines]


async def _live_subscriber(host: str, port: int, host_header: str, call_id: str, feed: LiveFeed) -> None:
    """One browser-like subscriber: every event read as it arrives."""
    import trio

    raw = request_bytes("GET", f"/api/voice/events?call_id={call_id}", host_header, close=False,
                        accept="text/event-stream")
    try:
        with trio.fail_after(15):
            status, stream = await http_exchange(host, port, raw, keep_open=True)
    except Exception as error:  # noqa: BLE001 - counted
        feed.errors[error_name(error)] += 1
        return
    feed.statuses[str(status)] += 1
    async with stream:
        while True:
            try:
                chunk = await stream.receive_some(65536)
            except (OSError, trio.BrokenResourceError) as error:
                feed.errors[error_name(error)] += 1
                return
            if not chunk:
                return
            n = chunk.count(b"data: ")
            if n:
                feed.events.append([time.monotonic(), n])


async def sim_run(args: argparse.Namespace) -> dict[str, Any]:
    import trio

    from voiceactors.simulator import Simulator
    from voiceactors.simulator.scenario import Scenario

    from benchmarks.sim_host import stdin_lines, aggregate, analyse, end_open_calls, roundtrip_steps

    rng = random.Random(args.seed)
    to_monotonic = time.monotonic() - trio.current_time()   # both clocks are CLOCK_MONOTONIC
    sim = Simulator(None, api_key=BENCH_KEY, validate_sent=False, timestamps=True)
    ids = [f"{args.prefix}-{n}" for n in range(args.calls)]
    feed = LiveFeed()
    timed_out = False
    async with trio.open_nursery() as nursery:
        port = await nursery.start(sim.serve, 0)
        for cid in ids:
            offset = args.warmup + rng.uniform(0, args.gap)
            steps = roundtrip_steps(args.rounds, args.gap, args.rate_hz, offset, args.wait)
            sim.add_call(cid, Scenario("bench_floods", "floods benchmark workload", tuple(steps)))
        print(f"PORT {port}", flush=True)
        commands_send, commands = trio.open_memory_channel[str](8)
        nursery.start_soon(stdin_lines, commands_send)
        with trio.move_on_after(args.timeout) as bound:
            async with trio.open_nursery() as live:
                async for line in commands:
                    if line.startswith("SSE "):   # SSE <server port> <host header>
                        _, server_port, host_header = line.split(" ", 2)
                        for cid in ids if int(server_port) else []:   # port 0: no live subscribers
                            live.start_soon(_live_subscriber, "127.0.0.1", int(server_port), host_header,
                                            cid, feed)
                        for call in (sim.calls[c] for c in ids):
                            await call.wait_until(lambda c: c.connections > 0 or c.closed)
                        print(f"CONNECTED {len(ids)}", flush=True)
                    elif line in ("STOP", "EOF"):
                        break
                live.cancel_scope.cancel()
        timed_out = bound.cancelled_caught
        await end_open_calls(sim, ids)
        await trio.sleep(0.2)
        nursery.cancel_scope.cancel()
    per_call = {cid: analyse(sim.calls[cid]) for cid in ids}
    totals = aggregate(per_call, sim.handshakes)
    totals.pop("outputs", None)
    return {
        "rounds": [row for cid in ids for row in rounds_of(sim.calls[cid], to_monotonic)],
        "totals": totals,
        "handshakes_by_status": dict(collections.Counter(str(h["status"]) for h in sim.handshakes)),
        "client_secret_requests": len(sim.client_secret_requests),
        "live_feed": {"statuses": dict(feed.statuses), "errors": dict(feed.errors), "events": feed.events},
        "timed_out": timed_out,
    }


def sim_main(argv: list[str]) -> int:
    from voiceactors import logs

    import trio

    p = argparse.ArgumentParser(description="floods benchmark: the simulator side")
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--prefix", default=PREFIX)
    p.add_argument("--gap", type=float, default=0.25)
    p.add_argument("--rounds", type=int, default=1000)
    p.add_argument("--rate-hz", type=float, default=0.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--wait", type=float, default=10.0)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    logs.configure("json", "warning")
    gc.freeze()      # as sim_host: the records only grow, full collections would stall every call
    gc.disable()
    result = trio.run(sim_run, args)
    Path(args.out).write_text(json.dumps(result, default=str))
    print(f"DONE {args.out}", flush=True)
    return 0


# --- role: one flood ------------------------------------------------------------------------

@dataclass
class Tally:
    """What one flood's requests got."""

    statuses: collections.Counter[str] = field(default_factory=collections.Counter)
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    sent: int = 0
    skipped: int = 0          # not sent: --max-in-flight requests were already waiting
    in_flight: int = 0
    cancelled: int = 0        # still waiting when the phase ended
    latency_ms: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"sent": self.sent, "statuses": dict(self.statuses), "errors": dict(self.errors),
                "skipped": self.skipped, "cancelled": self.cancelled,
                "answer_ms": summary(self.latency_ms)}


async def _one_request(args: argparse.Namespace, raw: bytes, source: str | None, tally: Tally) -> None:
    import trio

    tally.sent += 1
    tally.in_flight += 1
    started = trio.current_time()
    try:
        with trio.fail_after(args.request_timeout):
            status, _ = await http_exchange(args.host, args.port, raw, source=source)
        tally.statuses[str(status)] += 1
        tally.latency_ms.append((trio.current_time() - started) * 1000)
    except Exception as error:  # noqa: BLE001 - counted by kind
        tally.errors[error_name(error)] += 1
    finally:
        tally.in_flight -= 1


async def _rate_flood(args: argparse.Namespace, tally: Tally) -> dict[str, Any]:
    """``--rate`` requests per second for ``--duration`` seconds, open loop."""
    import trio

    sources = itertools.cycle(args.sources or [None])
    path = "/api/voice/session" if args.kind == "mint" else "/api/voice/connect"
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        print(f"READY {time.monotonic():.6f}", flush=True)
        end = start + args.duration
        for i in itertools.count():
            at = start + i / args.rate
            if at >= end:
                break
            await trio.sleep_until(at)
            if tally.in_flight >= args.max_in_flight:
                tally.skipped += 1
                continue
            body = b"" if args.kind == "mint" else json.dumps({"call_id": f"{args.bogus_prefix}_{i}"}).encode()
            nursery.start_soon(_one_request, args, request_bytes("POST", path, args.host_header, body),
                               next(sources), tally)
        await trio.sleep_until(end)
        print(f"END {time.monotonic():.6f}", flush=True)
        tally.cancelled = tally.in_flight
        nursery.cancel_scope.cancel()
    return {}


def _closed_by_peer(streams: list[Any]) -> int:
    """How many held streams the server has closed or reset (one poll, no read)."""
    poller = select.poll()
    mask = select.POLLRDHUP | select.POLLHUP | select.POLLERR
    for s in streams:
        poller.register(s.socket.fileno(), mask)
    return sum(1 for _, revents in poller.poll(0) if revents & mask)


async def _sse_flood(args: argparse.Namespace, tally: Tally) -> dict[str, Any]:
    """Open ``--count`` event streams on one call at ``--rate`` per second
    (``--max-in-flight`` opening at once), hold them ``--duration`` seconds
    without reading, then close them all."""
    import trio

    sources = itertools.cycle(args.sources or [None])
    raw = request_bytes("GET", f"/api/voice/events?call_id={args.call_id}", args.host_header, close=False,
                        accept="text/event-stream")
    held: list[Any] = []
    opening = trio.CapacityLimiter(args.max_in_flight)

    async def open_one(source: str | None) -> None:
        async with opening:
            tally.sent += 1
            started = trio.current_time()
            try:
                with trio.fail_after(args.request_timeout):
                    status, stream = await http_exchange(args.host, args.port, raw, source=source, keep_open=True)
            except Exception as error:  # noqa: BLE001 - counted by kind
                tally.errors[error_name(error)] += 1
                return
            tally.statuses[str(status)] += 1
            tally.latency_ms.append((trio.current_time() - started) * 1000)
            if status == 200:
                held.append(stream)
            else:
                await trio.aclose_forcefully(stream)

    ramp_started = trio.current_time()
    print(f"RAMP {time.monotonic():.6f}", flush=True)
    with trio.move_on_after(args.ramp_timeout) as ramp:
        async with trio.open_nursery() as nursery:
            for i in range(args.count):
                await trio.sleep_until(ramp_started + i / args.rate)
                nursery.start_soon(open_one, next(sources))
    ramp_s = trio.current_time() - ramp_started
    pending = tally.sent - sum(tally.statuses.values()) - sum(tally.errors.values())
    print(f"READY {time.monotonic():.6f}", flush=True)
    await trio.sleep(args.duration)
    print(f"END {time.monotonic():.6f}", flush=True)
    closed = _closed_by_peer(held)
    for stream in held:
        await trio.aclose_forcefully(stream)
    return {"requested": args.count, "held": len(held), "closed_by_server_at_end": closed,
            "ramp_s": round(ramp_s, 3), "ramp_timed_out": ramp.cancelled_caught,
            "unanswered_at_ramp_end": pending + (args.count - tally.sent)}


async def _flood_run(args: argparse.Namespace) -> dict[str, Any]:
    tally = Tally()
    extra = await (_sse_flood(args, tally) if args.kind == "sse" else _rate_flood(args, tally))
    return {"kind": args.kind, "rate": args.rate, "duration_s": args.duration, "sources": args.sources,
            **tally.as_dict(), **extra}


def flood_main(argv: list[str]) -> int:
    import trio

    p = argparse.ArgumentParser(description="floods benchmark: one flood client process")
    p.add_argument("kind", choices=["mint", "sse", "connect"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host-header", required=True)
    p.add_argument("--rate", type=float, default=200.0, help="requests (sse: opens) per second")
    p.add_argument("--count", type=int, default=0, help="sse: streams to hold")
    p.add_argument("--call-id", default=f"{PREFIX}-0", help="sse: the live call subscribed to")
    p.add_argument("--bogus-prefix", default=BOGUS_PREFIX)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--max-in-flight", type=int, default=256)
    p.add_argument("--request-timeout", type=float, default=10.0)
    p.add_argument("--ramp-timeout", type=float, default=60.0)
    p.add_argument("--sources", nargs="*", default=[], help="local addresses to connect from, in turn")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    result = trio.run(_flood_run, args)
    Path(args.out).write_text(json.dumps(result, default=str))
    print(f"DONE {args.out}", flush=True)
    return 0


# --- the driver -----------------------------------------------------------------------------

def http_call(port: int, method: str, path: str, host_header: str, body: dict[str, str] | None = None,
              timeout: float = 10.0) -> tuple[int, Any]:
    """One blocking request from the driver (loopback ``Host``, no ``Origin``)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Host": host_header, "Connection": "close"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        raw = response.read()
        try:
            return response.status, json.loads(raw)
        except ValueError:
            return response.status, raw[:200].decode("utf-8", "replace")
    finally:
        conn.close()


class Refused(RuntimeError):
    """The server refused the benchmark's own requests (Host/Origin checks)."""


def wait_ready(server: Proc, port: int, host_header: str, timeout: float = 60.0) -> dict[str, Any]:
    """Poll until one mint succeeds (bounded): ``/session`` also starts the
    brain, which ``/status`` only reports on. Returns the last ``/status``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        if server.popen.poll() is not None:
            raise RuntimeError(f"server exited ({server.popen.returncode}): {server.tail()}")
        try:
            status, body = http_call(port, "POST", "/api/voice/session", host_header, timeout=15)
            if str(status) in REFUSED_STATUSES:
                raise Refused(f"/api/voice/session answered {status} to Host {host_header!r}: {body}")
            if status == 200:
                answer = http_call(port, "GET", "/api/voice/status", host_header)[1]
                assert isinstance(answer, dict), answer     # /status answers a JSON object
                return answer
            last = (status, body)
        except OSError as error:
            last = error
        time.sleep(0.2)
    raise RuntimeError(f"server not ready within {timeout:.0f}s (last: {last}); stderr: {server.tail()}")


def serve_against_sim(sim_port: int, port: int, journal: Path, run_dir: Path, *, host_header: str | None = None,
                      env: dict[str, str] | None = None, repo: Path | None = None) -> Proc:
    """A ``voiceactors serve`` on 127.0.0.1:``port`` whose OpenAI is the
    simulator on ``sim_port`` (no API token; ``env`` adds to that), started
    from ``repo`` (None: this checkout) and ready (``wait_ready``)."""
    server = spawn("server", "voiceactors.cli", [
        "serve", "--journal", str(journal), "--state-dir", str(run_dir / "state"), "--host", "127.0.0.1",
        "--port", str(port), "--today", BENCH_TODAY.isoformat()], workdir=run_dir,
        env={"OPENAI_BASE_URL": f"http://127.0.0.1:{sim_port}/v1", "OPENAI_API_KEY": BENCH_KEY,
             "VOICEACTORS_API_TOKEN": "", **(env or {})}, repo=repo)
    wait_ready(server, port, host_header or f"127.0.0.1:{port}")
    return server


def connect_live(port: int, host_header: str, call_id: str, bound_s: float = 30.0) -> tuple[int, Any]:
    """``/connect`` for a live call; a 429 (a per-client rate limit) is
    retried after a second, within ``bound_s``."""
    deadline = time.monotonic() + bound_s
    while True:
        status, body = http_call(port, "POST", "/api/voice/connect", host_header, {"call_id": call_id})
        if status != 429 or time.monotonic() > deadline:
            return status, body
        time.sleep(1.0)


def server_overheads(state_dir: Path) -> dict[str, float]:
    """Each tool call's ``overhead_ms`` by tool call id, from the call records."""
    out: dict[str, float] = {}
    for path in (state_dir / "calls").glob(f"{PREFIX}-*.jsonl"):
        for line in path.read_text(encoding="utf-8", errors="replace").split("\n"):
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("kind") == "tool_call" and rec.get("overhead_ms") is not None:
                out[str(rec["tool_call_id"])] = float(rec["overhead_ms"])
    return out


def count_call_files(state_dir: Path) -> dict[str, int]:
    calls = state_dir / "calls"
    names = [p.name for p in calls.iterdir()] if calls.is_dir() else []
    return {"all": len(names), "bogus": sum(1 for n in names if n.startswith(BOGUS_PREFIX))}


def settle(server: Proc, args: argparse.Namespace) -> float:
    """``--settle-s``, then until the server's CPU over 0.5 s is below
    ``--quiet-core-pct`` of a core (at most ``--settle-max-s`` in all)."""
    started = time.monotonic()
    time.sleep(args.settle_s)
    while time.monotonic() - started < args.settle_max_s:
        c0 = server.cpu_s()
        time.sleep(0.5)
        if (server.cpu_s() - c0) / 0.5 * 100 < args.quiet_core_pct:
            break
    return round(time.monotonic() - started, 2)


def flood_args(kind: str, args: argparse.Namespace, port: int, out: Path, repeat: int) -> list[str]:
    common = ["--port", str(port), "--host-header", args.host_header.format(port=port),
              "--duration", str(args.phase_s), "--max-in-flight", str(args.max_in_flight),
              "--request-timeout", str(args.request_timeout), "--out", str(out)]
    if args.flood_sources:
        common += ["--sources", *args.flood_sources]
    if kind == "mint":
        return ["_flood", "mint", "--rate", str(args.mint_rate), *common]
    if kind == "connect":
        return ["_flood", "connect", "--rate", str(args.connect_rate),
                "--bogus-prefix", f"{BOGUS_PREFIX}_{repeat}", *common]
    common[common.index("--request-timeout") + 1] = str(args.sse_open_timeout)
    return ["_flood", "sse", "--rate", str(args.sse_rate), "--count", str(args.sse_subscribers),
            "--call-id", f"{PREFIX}-0", "--ramp-timeout", str(args.ramp_timeout), *common]


def run_phase(kind: str, args: argparse.Namespace, server: Proc, sim: Proc, port: int, run_dir: Path,
              repeat: int) -> dict[str, Any]:
    """One phase: its window in ``time.monotonic()``, CPU over it, the flood's tallies."""
    phase: dict[str, Any] = {"phase": kind}
    if kind == "connect":
        phase["call_files_before"] = count_call_files(run_dir / "state")
    if kind == "idle":
        window = CpuWindow({"server": server, "sim": sim})
        t0 = time.monotonic()
        window.start()
        time.sleep(args.phase_s)
        phase["cpu"] = window.stop()
        phase["window"] = [t0, time.monotonic()]
        return phase
    out = run_dir / f"flood-{kind}.json"
    flood = spawn(f"flood-{kind}", "benchmarks.floods", flood_args(kind, args, port, out, repeat), workdir=run_dir)
    try:
        window = CpuWindow({"server": server, "sim": sim, "flood": flood})
        if kind == "sse":   # the opening of the streams: reported beside the phase, not in it
            phase["ramp_window"] = [float(flood.expect("RAMP", 30)), None]
        t0 = float(flood.expect("READY", args.ramp_timeout + 30))
        if kind == "sse":
            phase["ramp_window"][1] = t0
        window.start()
        t1 = float(flood.expect("END", args.phase_s + 30))
        phase["cpu"] = window.stop()
        phase["window"] = [t0, t1]
        flood.expect("DONE", 120)
        phase["flood"] = json.loads(out.read_text())
    finally:
        flood.close_stdin()
        flood.wait(30)
    phase["settle_s"] = settle(server, args)
    if kind == "connect":
        phase["call_files_after"] = count_call_files(run_dir / "state")
    statuses = phase["flood"]["statuses"]
    refused = {s: statuses[s] for s in REFUSED_STATUSES if s in statuses}
    if refused:
        phase["refused"] = refused
    return phase


def phase_numbers(phase: dict[str, Any], rounds: list[list[Any]], overheads: dict[str, float],
                  feed_events: list[list[float]]) -> None:
    """Fill a phase with the round trips whose round started in its window."""
    t0, t1 = phase["window"]
    mine = [r for r in rounds if t0 <= r[0] < t1]
    phase["output_ms"] = summary(r[2] for r in mine if r[2] is not None)
    phase["create_ms"] = summary(r[3] for r in mine if r[3] is not None)
    phase["rounds"] = len(mine)
    phase["no_output"] = sum(1 for r in mine if r[2] is None)
    phase["server_overhead_ms"] = summary(overheads[r[1]] for r in mine if r[1] in overheads)
    phase["live_feed_events"] = sum(n for t, n in feed_events if t0 <= t < t1)
    if "ramp_window" in phase:
        r0, r1 = phase["ramp_window"]
        phase["ramp_output_ms"] = summary(r[2] for r in rounds if r0 <= r[0] < r1 and r[2] is not None)


class LoadWatch:
    """Every ``period`` seconds, in a thread: the 1-minute load and how many
    other ``pytest`` processes run (other sessions share the machine)."""

    def __init__(self, period: float = 2.0) -> None:
        import threading

        self.samples: list[tuple[float, float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period,), daemon=True)

    def _run(self, period: float) -> None:
        import psutil

        while not self._stop.is_set():
            busy = 0
            for proc in psutil.process_iter(["cmdline"]):
                cmd = proc.info.get("cmdline") or []
                is_python = bool(cmd) and "python" in os.path.basename(cmd[0])   # not `timeout ... pytest`
                if is_python and any("pytest" in part for part in cmd) and proc.pid != os.getpid():
                    busy += 1
            self.samples.append((time.monotonic(), os.getloadavg()[0], busy))
            self._stop.wait(period)

    def __enter__(self) -> "LoadWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(5)

    def during(self, t0: float, t1: float) -> dict[str, Any]:
        mine = [s for s in self.samples if t0 <= s[0] <= t1]
        if not mine:
            return {}
        return {"load_1m": [round(min(s[1] for s in mine), 2), round(max(s[1] for s in mine), 2)],
                "other_pytest_max": max(s[2] for s in mine)}


def run_repeat(repeat: int, args: argparse.Namespace, journal: Path, watch: LoadWatch) -> dict[str, Any]:
    """A fresh simulator, server and state directory; every phase in order."""
    run_dir = work_dir() / "runs" / f"floods-{repeat}-{int(time.time() * 1000)}"
    run_dir.mkdir(parents=True, exist_ok=True)
    budget = 60 + len(args.phases) * (args.phase_s + args.settle_max_s + 15) + args.ramp_timeout
    sim_out = run_dir / "sim.json"
    sim = spawn("sim", "benchmarks.floods", [
        "_sim", "--calls", str(args.calls), "--gap", str(args.gap), "--rate-hz", str(args.rate_hz),
        "--rounds", str(int(budget / args.gap) + 10), "--warmup", str(args.warmup), "--timeout", str(budget), "--seed", str(repeat),
        "--out", str(sim_out)], workdir=run_dir)
    server = None
    started = time.monotonic()
    result: dict[str, Any] = {"repeat": repeat, "run_dir": str(run_dir)}
    try:
        sim_port = int(sim.expect("PORT", 60))
        port = free_loopback_port()
        host_header = args.host_header.format(port=port)
        server = serve_against_sim(sim_port, port, journal, run_dir, host_header=host_header,
                                   env=dict(kv.split("=", 1) for kv in args.server_env),
                                   repo=Path(args.server_repo) if args.server_repo else None)
        connects: collections.Counter[str] = collections.Counter()
        for n in range(args.calls):
            status, body = connect_live(port, host_header, f"{PREFIX}-{n}")
            connects[str(status)] += 1
        result["live_connects"] = dict(connects)
        if connects.get("200") != args.calls:
            raise Refused(f"live calls' /connect answered {dict(connects)}: last {body}")
        sim.send(f"SSE {port if not args.no_live_sse else 0} {host_header}")
        sim.expect("CONNECTED", 30)
        time.sleep(args.warmup + args.gap)     # the calls' first rounds have started
        result["phases"] = [run_phase(kind, args, server, sim, port, run_dir, repeat) for kind in args.phases]
        sim.send("STOP")
        sim.expect("DONE", 60)
        sim_result = json.loads(sim_out.read_text())
        server.popen.send_signal(signal.SIGTERM)   # the live calls' records are flushed by now or at shutdown
        result["server_rc"] = server.wait(30)
    finally:
        for proc in (server, sim):
            if proc is not None and proc.popen.poll() is None:
                proc.popen.terminate()
                proc.wait(10)
    overheads = server_overheads(run_dir / "state")
    for phase in result["phases"]:
        phase_numbers(phase, sim_result["rounds"], overheads, sim_result["live_feed"]["events"])
        phase["machine"] = watch.during(*phase["window"])
    idle = next((p for p in result["phases"] if p["phase"] == "idle"), None)
    for phase in result["phases"]:
        if idle and idle["output_ms"]["n"] and phase["output_ms"]["n"]:
            phase["ratio_p50"] = round(phase["output_ms"]["p50"] / idle["output_ms"]["p50"], 2)
            phase["ratio_p99"] = round(phase["output_ms"]["p99"] / idle["output_ms"]["p99"], 2)
    result["sim"] = {k: v for k, v in sim_result.items() if k not in ("rounds", "live_feed")}
    result["live_feed"] = {k: v for k, v in sim_result["live_feed"].items() if k != "events"}
    result["server_stderr_tail"] = server.tail(600) if server else ""
    result["wall_s"] = round(time.monotonic() - started, 1)
    if not args.keep:
        shutil.rmtree(run_dir / "state", ignore_errors=True)
    return result


# --- reporting ------------------------------------------------------------------------------

def _ms(s: dict[str, Any]) -> str:
    if not s or not s.get("n"):
        return "n/a"
    return f"{s['p50']:.1f} / {s['p99']:.1f}"


def _counts(d: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(d.items())) or "–"


def phase_row(repeat: int, p: dict[str, Any]) -> str:
    cpu = p.get("cpu", {})
    def core(k: str) -> str:
        return f"{cpu[k]['core_pct']:.0f} %" if k in cpu else "–"

    ratio = f"{p['ratio_p50']:.2f} / {p['ratio_p99']:.2f}" if "ratio_p99" in p else "–"
    flood = p.get("flood", {})
    answered = _counts(flood.get("statuses", {})) if flood else "–"
    other = []
    if flood:
        if flood.get("errors"):
            other.append("errors " + _counts(flood["errors"]))
        if flood.get("skipped"):
            other.append(f"skipped {flood['skipped']}")
        if flood.get("cancelled"):
            other.append(f"cancelled {flood['cancelled']}")
        other.append(f"sent {flood['sent']}")
        if flood.get("answer_ms", {}).get("n"):
            other.append(f"answered in p50 {flood['answer_ms']['p50'] / 1000:.1f} s")
    if "held" in flood:
        other.append(f"held {flood['held']}/{flood['requested']} (ramp {flood['ramp_s']:.1f} s"
                     f"{', timed out' if flood['ramp_timed_out'] else ''}, unanswered then "
                     f"{flood['unanswered_at_ramp_end']}, closed by server at end {flood['closed_by_server_at_end']}"
                     f"; output p50 / p99 during the ramp {_ms(p.get('ramp_output_ms', {}))})")
    if "call_files_after" in p:
        other.append(f"call files {p['call_files_before']['all']} → **{p['call_files_after']['all']}**")
    if p.get("no_output"):
        other.append(f"no output {p['no_output']}")
    if p.get("refused"):
        other.append(f"**REFUSED {_counts(p['refused'])}: phase meaningless**")
    if "settle_s" in p:
        other.append(f"settle {p['settle_s']:.1f} s")
    machine = p.get("machine") or {}
    if machine:
        other.append(f"load {machine['load_1m'][0]:.1f}–{machine['load_1m'][1]:.1f}, "
                     f"other pytest {machine['other_pytest_max']}")
    return (f"| {repeat} | {p['phase']} | {p['rounds']} | {_ms(p['output_ms'])} | {ratio} | "
            f"{_ms(p['create_ms'])} | {_ms(p['server_overhead_ms'])} | {core('server')} | {core('sim')} | "
            f"{core('flood')} | {p['live_feed_events']} | {answered} | {'; '.join(other)} |")


TABLE_HEAD = ("| repeat | phase | rounds | output p50 / p99 (ms) | × idle p50 / p99 | create p50 / p99 | "
              "server overhead p50 / p99 | server CPU | sim CPU | flood CPU | live feed events | "
              "answered by status | other |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def markdown(report: dict[str, Any]) -> str:
    rows = [phase_row(r["repeat"], p) for r in report["repeats"] for p in r.get("phases", [])]
    return TABLE_HEAD + "\n" + "\n".join(rows) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--calls", type=int, default=10, help="live calls")
    p.add_argument("--gap", type=float, default=0.25, help="seconds between a live call's tool rounds")
    p.add_argument("--rate-hz", type=float, default=0.0, help="background transcript deltas per live call")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds from the joins to the first rounds")
    p.add_argument("--phase-s", type=float, default=10.0, help="measured seconds per phase")
    p.add_argument("--settle-s", type=float, default=3.0, help="pause after a flood before the next phase")
    p.add_argument("--settle-max-s", type=float, default=30.0)
    p.add_argument("--quiet-core-pct", type=float, default=50.0,
                   help="the server counts as settled below this CPU (%% of a core)")
    p.add_argument("--mint-rate", type=float, default=200.0, help="POST /session per second")
    p.add_argument("--connect-rate", type=float, default=200.0, help="bogus POST /connect per second")
    p.add_argument("--sse-subscribers", type=int, default=6000,
                   help="event streams held on one live call (bounded by RLIMIT_NOFILE)")
    p.add_argument("--sse-rate", type=float, default=1000.0, help="event streams opened per second")
    p.add_argument("--ramp-timeout", type=float, default=60.0, help="bound on opening the event streams")
    p.add_argument("--sse-open-timeout", type=float, default=30.0, help="bound on one event stream's answer")
    p.add_argument("--max-in-flight", type=int, default=2000,
                   help="a flood's requests waiting at once (more are counted as skipped, not sent)")
    p.add_argument("--request-timeout", type=float, default=10.0)
    p.add_argument("--flood-sources", nargs="*", default=[],
                   help="local addresses the floods connect from, in turn (e.g. 127.0.0.2 127.0.0.3)")
    p.add_argument("--host-header", default="127.0.0.1:{port}", help="Host of every request ({port} filled in)")
    p.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE",
                   help="an environment variable for the server (repeatable), e.g. a rate limit")
    p.add_argument("--server-repo", default=os.environ.get("BENCH_PEER_REPO"),
                   help="run the server from another checkout (default $BENCH_PEER_REPO)")
    p.add_argument("--no-live-sse", action="store_true", help="no event-stream subscriber per live call")
    p.add_argument("--journal-days", type=int, default=14)
    p.add_argument("--keep", action="store_true", help="keep each run's state directory")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--markdown", help="write the table here")
    args = p.parse_args(argv)
    for kv in args.server_env:
        if "=" not in kv:
            p.error(f"--server-env wants KEY=VALUE, got {kv!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "_sim":
        return sim_main(argv[1:])
    if argv and argv[0] == "_flood":
        return flood_main(argv[1:])
    args = parse_args(argv)
    nofile = raise_nofile_limit()
    cap = max(0, nofile["after"]["soft"] - FD_MARGIN)
    requested = args.sse_subscribers
    args.sse_subscribers = min(requested, cap)
    facts = machine_facts()
    print(f"# machine: {facts}", flush=True)
    print(f"# RLIMIT_NOFILE {nofile}; SSE subscribers {args.sse_subscribers} (asked {requested})", flush=True)
    journal = sample_journal(args.journal_days)
    started = time.monotonic()
    report: dict[str, Any] = {"machine": facts, "argv": sys.argv if argv is None else argv,
                              "rlimit_nofile": nofile, "sse_subscribers_requested": requested,
                              "sse_subscribers": args.sse_subscribers, "repeats": []}
    print(TABLE_HEAD, flush=True)
    try:
        with LoadWatch() as watch:
            for repeat in range(1, args.repeats + 1):
                r = run_repeat(repeat, args, journal, watch)
                report["repeats"].append(r)
                for p in r["phases"]:
                    print(phase_row(repeat, p), flush=True)
    finally:
        report["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        report["wall_s"] = round(time.monotonic() - started, 1)
        if args.json:
            write_json(Path(args.json), report)
    if args.markdown:
        Path(args.markdown).write_text(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
