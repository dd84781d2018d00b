"""Sort a py-spy ``--format raw`` profile of the server into a connect's phases.

``benchmarks.profile_summary`` says which functions the samples are in;
this says which *phase of a connect* they belong to (docs/benchmarks.md
§ 13): each stack goes to the first phase below with a frame in it, so the
order matters (a worker thread's append is the record's, not "threads";
the HTTP response's send is counted apart from the route that made it).
Stacks py-spy cut short (no frame of any phase) count as the scheduler's.

Run::

    .venv/bin/python -m benchmarks.profile_phases <run folder>/peer.pyspy.txt [--cpu-ms 4.5]

``--cpu-ms`` (the run's CPU per connect) adds each phase's share of it. A
sample counts a thread that runs or waits (on the GIL, in a system call),
so the shares are of busy threads' time, not of CPU.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

#: (phase, the frames that put a stack in it), first match wins
PHASES: list[tuple[str, tuple[str, ...]]] = [
    ("the usage meter's model read in a worker thread", (
        "CallActor._start_meter", "CallSupervisor.__init__.<locals>.<lambda>")),
    ("the call record's append + fsync in its worker thread", ("_append_all", "append_block")),
    ("worker threads, besides the record's append", ("WorkerThread._work", "Thread._bootstrap")),
    ("the record writer on the trio thread", ("RecordWriter.run",)),
    ("the plain connect's answer without Quart (fast_connect: parse, guards, the route's step, the log line)", (
        "FirstReadConnect.answer", "FastConnect.serve")),
    ("the HTTP response's send", ("ClosingHTTPConnection.__call__.<locals>.send_marking_the_end",)),
    ("the route and Quart's dispatch", ("QuartTrio.full_dispatch_request",)),
    ("Quart's request context, hypercorn/h11 connection and accept", (
        "TrioASGIHTTPConnection.handle_request", "ASGIWrapper.__call__", "Quart.__call__", "serve_connection",
        "TCPServer.run", "_serve_one_listener", "CappedListener.accept")),
    ("the sideband: TCP connect, handshake, trio-websocket's reader task", (
        "open_tcp_stream", "open_tcp_stream.<locals>.attempt_connect", "open_sideband",
        "WebSocketConnection._reader_task")),
    ("the call actor and the supervisor", (
        "CallActor._reader", "CallActor._writer", "CallActor._watch", "CallActor.run",
        "CallActor.run.<locals>.shielded", "CallActor.run_shielded", "CallActor._serve_call",
        "CallSupervisor._run_call", "CallSupervisor.run", "CallSupervisor._handle")),
    ("log lines elsewhere", ("WriteLogger.msg", "BoundLoggerBase._proxy_to_logger")),
    ("epoll (wait and events)", ("EpollIOManager.get_events", "EpollIOManager.process_events")),
]
REST = "trio's scheduler and stacks py-spy cut short"


def phase_counts(path: Path) -> tuple[int, collections.Counter[str]]:
    total = 0
    counts: collections.Counter[str] = collections.Counter()
    for line in path.read_text(errors="replace").splitlines():
        stack, _, n = line.rstrip().rpartition(" ")
        try:
            samples = int(n)
        except ValueError:
            continue
        total += samples
        frames = {frame.split(" (")[0] for frame in stack.split(";")}
        for name, keys in PHASES:
            if not frames.isdisjoint(keys):
                counts[name] += samples
                break
        else:
            counts[REST] += samples
    return total, counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="a py-spy raw profile by connect phase")
    p.add_argument("profile", type=Path)
    p.add_argument("--cpu-ms", type=float, default=None, help="the run's CPU ms per connect")
    args = p.parse_args(argv)
    total, counts = phase_counts(args.profile)
    for name in [n for n, _ in PHASES] + [REST]:
        share = counts[name] / total if total else 0.0
        ms = f" {args.cpu_ms * share:5.2f} ms" if args.cpu_ms is not None else ""
        print(f"{counts[name]:6d} {100 * share:5.1f} %{ms}  {name}")
    print(f"{total:6d} samples")
    return 0


if __name__ == "__main__":
    sys.exit(main())
