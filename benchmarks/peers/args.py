"""The command line every peer process takes, and the stdin/stdout protocol
the asyncio peers share with the driver (see ``benchmarks.peers``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any, Callable, Coroutine, Iterable


def peer_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--base-url", required=True, help="the simulator's http://127.0.0.1:PORT/v1")
    p.add_argument("--api-key", required=True)
    p.add_argument("--prefix", default="rtc_bench")
    p.add_argument("--calls", type=int, default=1)
    p.add_argument("--journal", required=True)
    p.add_argument("--state-dir", required=True)
    p.add_argument("--log", default="/dev/null", help="where the peer's own log lines go")
    p.add_argument("--log-level", default="info")
    p.add_argument("--max-seconds", type=float, default=120.0)
    return p


def call_ids(prefix: str, calls: int) -> list[str]:
    return [f"{prefix}-{n}" for n in range(calls)]


def join_rate() -> float:
    """``BENCH_JOIN_RATE``: the peer joins its calls at most this many per
    second (``benchmarks.capacity --join-rate``); 0 or unset: as fast as it can."""
    return float(os.environ.get("BENCH_JOIN_RATE") or 0)


def join_due(first: float, n: int, rate: float) -> float:
    """When the ``n``-th join may start (``first``: the first one's time; the
    same clock), at ``rate`` joins a second (0: at once)."""
    return first + n / rate if rate > 0 else first


def run_asyncio_peer(description: str, main: Callable[[argparse.Namespace], Coroutine[Any, Any, None]],
                     argv: list[str] | None = None) -> int:
    """Parse the command line, print ``STARTED``, wait for ``GO``, run ``main``."""
    args = peer_parser(description).parse_args(argv)
    print("STARTED", flush=True)
    sys.stdin.readline()  # GO
    asyncio.run(main(args))
    return 0


async def serve_calls(name: str, calls: Iterable[Coroutine[Any, Any, None]], counts: dict[str, int],
                      max_seconds: float) -> None:
    """Start every call, print ``JOINED``, wait for them all (at most
    ``max_seconds``), then report ``counts`` on stderr."""
    tasks = [asyncio.create_task(call) for call in calls]
    print("JOINED", flush=True)
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), max_seconds)
    except asyncio.TimeoutError:
        print(f"{name}: --max-seconds passed", file=sys.stderr, flush=True)
    print(f"{name}: {json.dumps(counts)}", file=sys.stderr, flush=True)
