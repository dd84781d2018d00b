"""Takeover time: kill -9 of a call's holder → the call's next tool output, from the taker.

What it measures, per repeat: a fresh 3-day sample journal, a throwaway
``redis-server`` (unix socket, no persistence), the Realtime simulator (in
this process, on loopback) and two ``voiceactors serve --redis`` processes,
each with its own state folder. One call is connected on the first; its model
asks for a write (``commitments.complete``, held up by the driver holding the
journal file's lock) and a read. Once the read has settled, the write is
pending and the holder's mirror of it is in Redis, the holder is killed with
SIGKILL. The clock runs from the kill to the simulator receiving the pending
write's output (the restart error, honestly: it never applied) from the other
process, which found the expired lease itself (no new ``/connect``). Also
reported: when the taker logged ``supervisor.take_over`` (its scan found the
lease expired) after the kill.

Expected: the lease's TTL (``--ttl``, the setting's default 10 s) minus the
time since its last renewal (up to a sixth of a TTL), plus up to a third of
a TTL (the scan period), plus the taker's reconnect. Each repeat kills at a
random delay (up to a third of a TTL, ``--seed``) after the mirror is seen,
so the repeats sample the renewal's and the scan's phases.

Run::

    .venv/bin/python -m benchmarks.takeover --repeats 5
    .venv/bin/python -m benchmarks.takeover --repeats 5 --ttl 2
    BENCH_PEER_REPO=/tmp/before .venv/bin/python -m benchmarks.takeover    # that checkout's servers

Bounded: every wait has a timeout; every process is a child on loopback.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import trio

from benchmarks.common import BENCH_KEY, BENCH_TODAY, machine_facts, server_checkout, work_dir
from benchmarks.connect_cost import throwaway_redis

CALL = "rtc_takeover"


def _scenario(item_id: str) -> list[dict[str, Any]]:
    return [
        {"user_turn": {"text": "close that and what is on today"}},
        {"response": {"tool_calls": [
            {"name": "commitments.complete", "call_id": "call_w",
             "arguments": {"commitment_id": item_id, "resolution": "done"}},
            {"name": "calendar.today", "call_id": "call_r", "arguments": {}},
        ]}},
        {"wait_outputs": {"timeout_s": 300}},
        {"response": {"text": "Done."}},
        {"sleep": 300},
    ]


class Served:
    """One ``voiceactors serve --redis`` child and its JSON log lines."""

    def __init__(self, journal: Path, state: Path, sim_url: str, redis_url: str, ttl: float) -> None:
        self.checkout = server_checkout()
        self.args = [self.checkout.python, "-m", "voiceactors.cli", "serve", "--journal", str(journal), "--state-dir",
                     str(state), "--host", "127.0.0.1", "--port", "0", "--today", BENCH_TODAY.isoformat(),
                     "--redis", redis_url]
        self.env = {**os.environ, "OPENAI_BASE_URL": sim_url, "OPENAI_API_KEY": BENCH_KEY,
                    "VOICEACTORS_LOG_FORMAT": "json", "VOICEACTORS_API_TOKEN": "",
                    "VOICEACTORS_REDIS_LEASE_TTL": str(ttl), "VOICEACTORS_CLOSE_DEADLINE": str(min(5.0, ttl / 2)),
                    **self.checkout.env()}
        self.lines: list[dict[str, Any]] = []
        self.proc: trio.Process | None = None

    async def start(self, nursery: trio.Nursery) -> str:
        self.proc = await trio.lowlevel.open_process(self.args, stderr=subprocess.PIPE, env=self.env,
                                                   cwd=self.checkout.start_folder())
        nursery.start_soon(self._read)
        with trio.fail_after(90):
            while not self.events("server.serving"):
                if self.proc.poll() is not None:
                    raise RuntimeError(f"serve exited: {self.lines[-5:]}")
                await trio.sleep(0.05)
        return str(self.events("server.serving")[0]["urls"][0])

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        buffer = b""
        async for chunk in self.proc.stderr:
            *done, buffer = (buffer + chunk).split(b"\n")
            for raw in done:
                try:
                    self.lines.append(json.loads(raw))
                except ValueError:
                    pass

    def events(self, name: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line.get("event") == name]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()


async def _record_has(path: Path, kind: str, tool_call_id: str) -> None:
    from voiceactors.call.record import read_record

    with trio.fail_after(60):
        while not (path.exists() and any(x.get("kind") == kind and x.get("tool_call_id") == tool_call_id
                                         for x in read_record(path))):
            await trio.sleep(0.02)


async def _mirrored(redis_url: str) -> None:
    from voiceactors.cluster import redis_client as rc

    with trio.fail_after(30):
        async with rc.client(redis_url) as redis:
            while "call_w" not in set(await redis.hgetall(rc.pending_key(CALL))):
                await trio.sleep(0.02)


async def one_repeat(repeat: int, ttl: float, redis_url: str, folder: Path, kill_delay_s: float) -> dict[str, Any]:
    import httpx

    from voiceactors.call.record import record_path
    from voiceactors.journal import ledger
    from voiceactors.journal.sample import write_sample_journal
    from voiceactors.simulator import Simulator

    journal = write_sample_journal(folder / "journal", days=3, today=BENCH_TODAY)
    item = ledger.list_items(journal, state="open", top=1)[0]
    day_file = ledger.opening_file(journal, item.id)      # the file the write locks
    sim = Simulator(None, api_key=BENCH_KEY)
    sc = sim.add_call(CALL, _scenario(item.id))
    a = b = None
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            a = Served(journal, folder / "state_a", sim.base_url, redis_url, ttl)
            b = Served(journal, folder / "state_b", sim.base_url, redis_url, ttl)
            url_a = await a.start(nursery)
            await b.start(nursery)
            with open(f"{day_file}.lock", "a+b") as lock:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX)     # the write waits on the holder
                async with httpx.AsyncClient(base_url=url_a, timeout=10) as client:
                    answer = await client.post("/api/voice/connect", json={"call_id": CALL})
                    assert answer.status_code == 200, answer.text
                record = record_path(folder / "state_a", CALL)
                await _record_has(record, "tool_started", "call_w")
                await _record_has(record, "tool_call", "call_r")
                await _mirrored(redis_url)
                # The kill lands at a random phase of the holder's renewals and the
                # taker's scans (both periodic from the servers' start): without it
                # every repeat measured the same point of the range.
                await trio.sleep(kill_delay_s)
                assert a.proc is not None
                a.proc.send_signal(signal.SIGKILL)
                killed_wall, killed = time.time(), trio.current_time()
                with trio.fail_after(10):
                    await a.proc.wait()
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
            with trio.fail_after(ttl * 2 + 60):
                await sc.wait_until(lambda c: "call_w" in c.outputs)
            takeover_s = trio.current_time() - killed
            take_over = b.events("supervisor.take_over")
            scan_s = None
            if take_over:
                at = datetime.fromisoformat(take_over[0]["timestamp"].replace("Z", "+00:00")).timestamp()
                scan_s = round(at - killed_wall, 3)
            nursery.cancel_scope.cancel()
    finally:
        for server in (a, b):
            if server is not None:
                server.stop()
    return {"repeat": repeat, "ttl_s": ttl, "kill_delay_s": round(kill_delay_s, 3), "takeover_s": round(takeover_s, 3), "take_over_logged_s": scan_s,
            "outputs_call_w": len(sc.outputs.get("call_w", [])), "connections": sc.connections,
            "violations": len(sc.violations)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--ttl", type=float, default=10.0, help="redis_lease_ttl_s of both servers (default 10)")
    p.add_argument("--seed", type=int, default=1, help="the kill delays' seed")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    from voiceactors import logs

    logs.configure("console", "warning")     # the in-process simulator's lines: only its warnings
    print(f"# machine: {machine_facts()}", flush=True)
    runs = []
    work_dir().mkdir(parents=True, exist_ok=True)
    for repeat in range(1, args.repeats + 1):
        with tempfile.TemporaryDirectory(dir=work_dir()) as tmp:
            with throwaway_redis(Path(tmp) / "redis") as (redis_url, _):
                # up to a scan period: every phase of the renewals (a sixth of
                # the TTL) and of the scans (a third) is as likely
                r = trio.run(one_repeat, repeat, args.ttl, redis_url, Path(tmp), rng.uniform(0, args.ttl / 3))
        runs.append(r)
        print(f"repeat {repeat}: killed {r['kill_delay_s']} s after the mirror, takeover {r['takeover_s']} s (take_over logged {r['take_over_logged_s']} s "
              f"after the kill), write answered {r['outputs_call_w']}x, sidebands {r['connections']}, "
              f"violations {r['violations']}", flush=True)
    times = [r["takeover_s"] for r in runs]
    print(f"takeover with TTL {args.ttl:g} s: median {statistics.median(times):.2f} s, "
          f"min {min(times):.2f}, max {max(times):.2f} over {len(times)} repeats", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine_facts(), "args": vars(args), "runs": runs},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
