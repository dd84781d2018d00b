"""Peer: a whole ``voiceactors serve`` (HTTP in front, ``--workers N`` when
``BENCH_SERVE_WORKERS`` is above 1, ``--redis`` when ``BENCH_SERVE_REDIS`` is
a URL) joined by ``POST /api/voice/connect`` for every call id (at most
``BENCH_JOIN_RATE`` a second when set), each on its own TCP connection (so the kernel's ``SO_REUSEPORT`` hash spreads them over
the workers as it would spread separate clients).

The driver measures this process and every process under it (the serve
parent, its workers, its private redis-server): ``TREE_PEERS`` in
``benchmarks.roundtrip``. The server's JSON log lines go to ``--log``. Same
stdin/stdout protocol as the other peers (``benchmarks.peers``): STARTED once
serving, GO, JOINED once every connect was answered, then it stops the
server (SIGTERM, then waits for it) when stdin closes or ``--max-seconds``
passes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from benchmarks.peers.args import call_ids, join_due, join_rate, peer_parser

CONNECT_PARALLEL = 8


def _connect(port: int, call_id: str) -> int:
    """One ``POST /api/voice/connect`` on its own connection; its status.

    A plain socket and the request's bytes made by hand, not
    ``http.client``: the driver runs on the machine under test and inside
    the measured process tree, and ``http.client`` (its ``email`` header
    parser, its response object) cost ~165 us of CPU a request against
    ~55 us here, the load generator's, not the
    server's."""
    body = json.dumps({"call_id": call_id}).encode()
    request = (b"POST /api/voice/connect HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
               b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (port, len(body), body))
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        return _read_status(sock)


def _read_status(sock: socket.socket) -> int:
    """The status of the response on ``sock``, once all of it (by its
    ``Content-Length``, or to the close) is read."""
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"served: the connection closed inside a response head: {got[:80]!r}")
        got += chunk
    head, _, rest = got.partition(b"\r\n\r\n")
    status = int(head[9:12])
    length = re.search(rb"(?im)^content-length:\s*(\d+)\s*$", head)
    want = int(length.group(1)) if length else None
    while want is None or len(rest) < want:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return status


def _serve_command(args: argparse.Namespace, workers: int) -> list[str]:
    command = [sys.executable, "-m", "voiceactors.cli", "serve", "--journal", args.journal,
               "--state-dir", args.state_dir, "--host", "127.0.0.1", "--port", "0"]
    if workers > 1:
        command += ["--workers", str(workers)]
    redis = os.environ.get("BENCH_SERVE_REDIS")
    if redis:
        command += ["--redis", redis]
    return command


def run(argv: list[str] | None = None) -> int:
    args = peer_parser("voiceactors serve peer (HTTP, optional --workers)").parse_args(argv)
    workers = int(os.environ.get("BENCH_SERVE_WORKERS", "1"))
    ids = call_ids(args.prefix, args.calls)
    env = {**os.environ, "OPENAI_BASE_URL": args.base_url, "OPENAI_API_KEY": args.api_key,
           "VOICEACTORS_API_TOKEN": "", "VOICEACTORS_LOG_LEVEL": args.log_level,
           "VOICEACTORS_MAX_CALLS": str(max(1000, args.calls + 16)), "VOICEACTORS_CALL_IDLE_TIMEOUT": "3600",
           "VOICEACTORS_RATE_LIMIT_PER_S": "0"}
    log = open(args.log, "w")
    server = subprocess.Popen(_serve_command(args, workers), env=env, stdout=subprocess.PIPE, stderr=log,
                              stdin=subprocess.DEVNULL, text=True)
    try:
        assert server.stdout is not None
        port = None
        deadline = time.monotonic() + 90
        while port is None and time.monotonic() < deadline:
            line = server.stdout.readline()
            if not line:
                raise SystemExit(f"served: the server exited ({server.poll()}) before serving")
            found = re.search(r"console is at http://127\.0\.0\.1:(\d+)/", line)
            port = int(found.group(1)) if found else None
        if port is None:
            raise SystemExit("served: the server did not serve within 90 s")
        print("STARTED", flush=True)
        sys.stdin.readline()   # GO
        rate, first = join_rate(), time.monotonic()

        def paced(n: int) -> int:     # BENCH_JOIN_RATE: the n-th connect not before its slot
            time.sleep(max(0.0, join_due(first, n, rate) - time.monotonic()))
            return _connect(port, ids[n])

        with ThreadPoolExecutor(CONNECT_PARALLEL) as pool:
            statuses = list(pool.map(paced, range(len(ids))))
        refused = [s for s in statuses if s != 200]
        if refused:
            print(f"served: {len(refused)} connects answered {sorted(set(refused))}", file=sys.stderr, flush=True)
        print("JOINED", flush=True)
        ends = time.monotonic() + args.max_seconds
        while time.monotonic() < ends:         # until the driver closes stdin (or sends STOP)
            line = sys.stdin.readline()
            if not line or line.strip() == "STOP":
                break
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(25)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(10)
        log.close()
    return 0


if __name__ == "__main__":
    # the driver's terminate must still stop the server (the finally above), not orphan it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    sys.exit(run())
