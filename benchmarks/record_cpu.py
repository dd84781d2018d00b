"""CPU of the call records alone, per tool round, in one process (issue 14).

What it measures: process CPU time (``time.process_time``: the trio thread
and the worker threads the writer uses) of ``--calls`` call records living
at once in one trio run, each doing ``--rounds`` tool rounds: a
``tool_started`` line, ``--tool-ms`` later its ``tool_call`` line (both
urgent: written at once), then a think time drawn from ``--think-ms``
(seeded), then the next round; then the ``end`` line and ``close()``. No
sockets, no protocol: the record's writes and fsyncs only, as the burst
benchmark's calls make them (100 calls, 20 rounds, 50–250 ms think by
default; ``--full-round``: the nine lines a burst round writes, not two; ``--latency``: also how long each ``tool_started`` line took from
``add`` to written, the window a kill -9 could lose it in; ``--null``: the same calls with records that only keep their lines,
the harness's own floor: lines kept, never rendered nor written). Reported: CPU ms per round (the total over rounds), the writer's
passes, the wall time, and the files' total size (a check both versions
wrote the same lines; not for ``--null``, and since § 26 the lines are
compact JSON: ~10 % fewer bytes than before).

It uses only APIs every version of ``CallRecord`` has (``CallRecord(call_id,
state_dir)``, ``opened``, ``add``, ``close``), so the same script measures
an older checkout::

    .venv/bin/python -m benchmarks.record_cpu --repeats 3
    git worktree add --detach /tmp/records-before main
    PYTHONPATH=/tmp/records-before .venv/bin/python benchmarks/record_cpu.py --repeats 3

``--state-dir`` puts the records on another file system (default: a fresh
temp dir under ``$TMPDIR``); fsync's cost depends on it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio


async def _until_written(record: Any, waits: list[float]) -> None:
    """``--latency``: how long the line just added took to be written (polled every ms)."""
    t0, want = trio.current_time(), len(record.lines)
    while record._flushed < want:
        await trio.sleep(0.001)
    waits.append(trio.current_time() - t0)


#: ``--full-round``: the burst's other lines of a round, of the kinds and about the sizes its
#: call records hold (docs/benchmarks.md § 18; the order differs a little, the two urgent
#: lines are the same): the user's transcript before the tool call; after its ``tool_call``,
#: its response and usage, our ``response_create``, the answer's transcript, response, usage.
_USAGE = {"model": "gpt-realtime", "tokens": {"text_in": 422, "text_out": 2, "audio_in": 0, "audio_out": 16,
                                              "cached_in": 56}, "cost_usd": 0.002766}


def _before_tool(record: Any, n: int) -> None:
    record.add("transcript", role="user", item_id=f"item_u{n:020d}", text="What does my day look like?",
               order=4.0 * n + 1)


def _after_tool(record: Any, n: int) -> None:
    record.add("response", response_id=f"resp_{n}", status="completed", epoch=1, origin="model",
               tool_calls=[f"call_{n}"])
    record.add("usage", response_id=f"resp_{n}", **_USAGE)
    record.add("response_create", event_id=f"evt_{n}", epoch=1, **{"for": [f"resp_{n}"]}, result="sent",
               response_id=f"resp_{n}a", turnaround_ms=1.2)
    record.add("transcript", role="assistant", item_id=f"item_a{n:020d}", text="Okay.", order=4.0 * n + 4)
    record.add("response", response_id=f"resp_{n}a", status="completed", epoch=1, origin="ours", tool_calls=[])
    record.add("usage", response_id=f"resp_{n}a", **_USAGE)


async def _one_call(record: Any, rounds: int, tool_s: float, think: list[float],
                    waits: list[float] | None = None, full: bool = False) -> None:
    record.opened()
    for n in range(rounds):
        if full:
            _before_tool(record, n)
        record.add("tool_started", tool_call_id=f"call_{n}", tool="briefing.get", response_id=f"resp_{n}",
                   epoch=1, turn=n + 1, effect="read", arguments="{}")
        if waits is not None:
            await _until_written(record, waits)
        await trio.sleep(tool_s)
        record.add("tool_call", tool_call_id=f"call_{n}", tool="briefing.get", response_id=f"resp_{n}",
                   epoch=1, turn=n + 1, duration_ms=1.0, outcome="ok", output_bytes=120, sends=1,
                   delivered=True, synthetic=False, state="delivered", overhead_ms=0.5)
        if full:
            _after_tool(record, n)
        await trio.sleep(think[n])
    record.add("end", reason="closed_by_service", duration_s=1.0, epoch=1, reconnects=0, tool_calls=rounds,
               responses=rounds, close_code=1000, feed_dropped=0)
    await record.close()


class NullRecord:
    """The harness's floor (``--null``): the same calls, lines kept in memory
    as dicts, never rendered; the close writes only their count. (It used to
    render each line with ``json.dumps``, which put the record's rendering
    into the floor: ~35 us a round of nine lines, benchmarks § 26.)"""

    def __init__(self, call_id: str, state_dir: Path) -> None:
        self.call_id, self.failed = call_id, None
        self.lines: list[dict[str, Any]] = []
        self.path = state_dir / f"{call_id}.null"

    def opened(self) -> None:
        pass

    def add(self, kind: str, **fields: Any) -> None:
        self.lines.append({"kind": kind, **fields})

    async def close(self) -> bool:
        self.path.write_text(f"{len(self.lines)}\n")
        return True


class _NoWriter:
    passes = 0
    fsync_passes = 0


async def _run(state_dir: Path, calls: int, rounds: int, tool_s: float, think_ms: tuple[float, float],
               seed: int, null: bool = False, latency: bool = False, full: bool = False) -> dict[str, Any]:
    from voiceactors.actors.call_record import CallRecord, shared_writer

    rng = random.Random(seed)
    plans = [[rng.uniform(*think_ms) / 1000 for _ in range(rounds)] for _ in range(calls)]
    cpu0, wall0 = time.process_time(), time.perf_counter()
    make: Any = NullRecord if null else CallRecord
    records = [make(f"rtc_bench_{i}", state_dir) for i in range(calls)]
    writer: Any = _NoWriter() if null else shared_writer()
    waits: list[float] | None = [] if latency else None
    async with trio.open_nursery() as nursery:
        for record, think in zip(records, plans):
            nursery.start_soon(_one_call, record, rounds, tool_s, think, waits, full)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    failed = [r.call_id for r in records if r.failed is not None]
    size = sum(r.path.stat().st_size for r in records)
    out = {"cpu_ms_per_round": round(cpu * 1000 / (calls * rounds), 4), "cpu_s": round(cpu, 3),
           "wall_s": round(wall, 3), "passes": writer.passes, "fsync_passes": getattr(writer, "fsync_passes", None),
           "bytes": size, "failed": failed}
    if waits:
        waits.sort()
        out["written_ms_p50_p99_max"] = [round(waits[int(q * (len(waits) - 1))] * 1000, 1) for q in (0.5, 0.99, 1.0)]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--tool-ms", type=float, default=2.0)
    p.add_argument("--think-ms", type=float, nargs=2, default=(50.0, 250.0), metavar=("MIN", "MAX"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--state-dir", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--latency", action="store_true",
                   help="also time each tool_started line from add to written (polled every ms: CPU not comparable)")
    p.add_argument("--null", action="store_true", help="the harness alone: records that write nothing until close")
    p.add_argument("--full-round", action="store_true",
                   help="every line a burst round writes (9: transcripts, responses, usage, response_create), not 2")
    args = p.parse_args(argv)
    import voiceactors

    runs = []
    for i in range(args.repeats):
        base = Path(tempfile.mkdtemp(prefix="record-cpu-", dir=args.state_dir))
        try:
            result = trio.run(_run, base, args.calls, args.rounds, args.tool_ms / 1000,
                              tuple(args.think_ms), args.seed + i, args.null, args.latency, args.full_round)
        finally:
            shutil.rmtree(base, ignore_errors=True)
        result["load_1m"] = os.getloadavg()[0]
        result["when_utc"] = time.strftime("%H:%M:%S", time.gmtime())
        runs.append(result)
        print(json.dumps(result), flush=True)
    summary = {"code": str(Path(voiceactors.__file__).parent.parent), "argv": sys.argv[1:], "runs": runs}
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
