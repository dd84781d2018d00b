"""The command line every peer process takes, and the stdin/stdout protocol
the peers share with the driver (see ``benchmarks.peers``)."""

from __future__ import annotations

import argparse
import os


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
