"""The command line every peer process takes (see ``benchmarks.peers``)."""

from __future__ import annotations

import argparse


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
