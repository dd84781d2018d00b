"""The simulator side of the sideband benchmarks, as its own process.

Runs ``voiceactors.simulator.Simulator`` on loopback with ``--calls``
joinable call ids ``<prefix>-<n>``, each playing a benchmark workload, with
``timestamps=True``: every event it sends (``call.sent_at``, stamped when the
event is queued, before it is encoded and written) and every client event it
receives (``call.received_at``, right after it was read) gets a
``trio.current_time()`` stamp. All round trips are differences of two stamps
in this one process, so no clock is shared between processes.

Made cheap, so that it measures the peer rather than itself:

* ``validate_sent=False`` — the simulator does not validate every event it
  sends against the SDK's models (``--validate`` turns it back on; the tests
  keep it on, where it catches simulator bugs);
* the cyclic garbage collector is off (``--gc`` keeps it): the records only
  grow, so every full collection walked all of them — at 1,000 calls that
  stalled every call for up to 0.5 s, and the calls woken together then
  stayed in step, round after round;
* rounds follow a timetable (``sleep_until``): a late round does not push
  the call's later ones back, so one stall cannot bunch calls together.

``create_by_second`` in the output is the create round trip by the second
(after every call joined) in which its round started: it shows whether a
tail comes from the join burst, a stall, or the steady state;
``create_phases`` the same round trips apart, ``join`` (started before the
last call joined) and ``steady`` (after).

Workloads (``--workload``):

* ``roundtrip`` — round ``k`` (of ``--rounds``) starts at ``offset + k * gap``
  after the call joined (``offset`` = ``--warmup`` (2 s) + random in [0, gap):
  the rounds start once the join burst is over — at 1,500 calls the
  handshakes alone put 100 ms into the first second's rounds): a user turn, a
  response carrying one ``briefing.get`` call, ``wait_outputs`` (the client's
  output and one ``response.create``), the answer; background transcript
  deltas at ``--rate-hz`` from ``offset`` on; then close 1000.
* ``idle`` — no script: the calls stay open until ``STOP`` on stdin.
* ``scenario:NAME`` — a shipped scenario (``parallel_tools``,
  ``barge_in_during_tool``, ...).

Protocol (stdout): ``PORT <n>``, ``CONNECTED <n>`` once every call has a
sideband, ``DONE <json path>`` at the end. stdin: ``STOP`` ends every call
(close 1000) and finishes. Bounded by ``--timeout`` seconds.

Not run by hand; the drivers (``benchmarks.roundtrip`` ...) start it.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import random
import sys
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Any

import trio

from voiceactors import logs
from voiceactors.simulator import SimCall, Simulator
from voiceactors.simulator.scenario import Scenario, Step, as_scenario

from benchmarks.common import BENCH_KEY, summary

TOOL_TEXT = "What does my day look like?"


def roundtrip_steps(rounds: int, gap_s: float, rate_hz: float, offset_s: float, wait_s: float) -> list[Step]:
    """The ``roundtrip`` workload of one call (see the module docstring):
    round ``k`` starts ``offset_s + k * gap_s`` after the call joined."""
    total = offset_s + rounds * (gap_s + 0.1) + 1.0
    steps: list[Step] = [{"sleep_until": round(offset_s, 4)}]
    if rate_hz > 0:
        steps.append({"transcript_deltas": {"rate_hz": rate_hz, "count": int(rate_hz * total),
                                            "background": True}})
    for k in range(rounds):
        steps += [
            {"user_turn": {"text": TOOL_TEXT, "duration_ms": 0}},
            {"response": {"tool_calls": [{"name": "briefing.get", "arguments": {}}]}},
            {"wait_outputs": {"timeout_s": wait_s}},
            {"response": {"text": "Here is your day."}},
            {"sleep_until": round(offset_s + (k + 1) * gap_s, 4)},
        ]
    steps.append({"close": 1000})
    return steps


def make_scenario(args: argparse.Namespace, rng: random.Random) -> Scenario:
    if args.workload == "roundtrip":
        offset = args.warmup + rng.uniform(0, args.gap)
        steps = roundtrip_steps(args.rounds, args.gap, args.rate_hz, offset, args.wait)
        return Scenario("bench_roundtrip", "benchmark workload", tuple(steps))
    if args.workload == "idle":
        return as_scenario(None)
    if args.workload.startswith("scenario:"):
        return as_scenario(args.workload.split(":", 1)[1])
    raise SystemExit(f"unknown workload {args.workload!r}")


@dataclass(frozen=True)
class BatchTimes:
    """One completed ``response.done`` carrying function calls (sent at ``t0``)."""

    t0: float
    outputs: list[tuple[str, float | None]]   # per tool call id: first output − t0 (ms), None: never
    create_ms: float | None                   # the first response.create at or after the last output − t0
    all_answered: bool                        # every tool call of the batch got an output


def stamps(call: SimCall, wire: bool) -> tuple[list[float | None], list[float]]:
    """(sent, received) stamps of ``call``: on the wire (``written_at``,
    ``read_at``: what the peer could know) or at the simulator's queues
    (``sent_at``, ``received_at``: the older measure, which adds the
    simulator's own waits at both ends)."""
    if wire:
        return list(call.written_at or []), list(call.read_at or [])
    return list(call.sent_at or []), list(call.received_at or [])


def batch_times(call: SimCall, wire: bool = False) -> list[BatchTimes]:
    """The round-trip times of every tool batch of ``call``, from its stamped
    records (``wire``: see ``stamps``). A ``response.done`` never written is skipped."""
    sent_at, received_at = stamps(call, wire)
    first_output: dict[str, float] = {}
    creates: list[float] = []
    for event, t in zip(call.received, received_at):
        kind = event.get("type")
        item = event.get("item")
        if not isinstance(item, dict):
            item = {}
        if kind == "conversation.item.create" and item.get("type") == "function_call_output":
            first_output.setdefault(str(item.get("call_id")), t)
        elif kind == "response.create":
            creates.append(t)
    batches: list[BatchTimes] = []
    for event, t0 in zip(call.sent, sent_at):
        if t0 is None or event.get("type") != "response.done" or event["response"].get("status") != "completed":
            continue
        ids = [o["call_id"] for o in event["response"].get("output", []) if o.get("type") == "function_call"]
        if not ids:
            continue
        outputs = [(i, (first_output[i] - t0) * 1000 if i in first_output else None) for i in ids]
        answered = all(i in first_output for i in ids)
        create_ms = None
        if answered:
            after = [c for c in creates if c >= max(first_output[i] for i in ids)]
            create_ms = (after[0] - t0) * 1000 if after else None
        batches.append(BatchTimes(t0, outputs, create_ms, answered))
    return batches


def analyse(call: SimCall, wire: bool = False) -> dict[str, Any]:
    """Round trips of one call from its stamped records.

    For every *completed* ``response.done`` carrying function calls (time t0):
    ``output_ms`` = first ``function_call_output`` for each call id − t0;
    ``create_ms`` = the first ``response.create`` received at or after the
    batch's last output − t0.
    """
    outputs: list[tuple[str, float]] = []
    create_ms: list[float] = []
    create_at: list[float] = []
    missing_create = 0
    for batch in batch_times(call, wire):
        outputs.extend((i, ms) for i, ms in batch.outputs if ms is not None)
        if batch.all_answered:
            if batch.create_ms is not None:
                create_ms.append(batch.create_ms)
                create_at.append(batch.t0)
            else:
                missing_create += 1
    duplicates = sum(len(v) - 1 for v in call.outputs.values() if len(v) > 1)
    return {
        "outputs": outputs, "create_ms": create_ms, "create_at": create_at, "missing_create": missing_create,
        "error_codes": [c for c in call.error_codes], "violations": list(call.violations),
        "unanswered": list(call.pending_call_ids()), "tool_calls": len(call.tool_calls),
        "duplicate_outputs": duplicates, "response_creates": call.response_creates,
        "connections": call.connections, "closed": call.closed,
        "responses": collections.Counter(f"{r.origin}:{r.status}" for r in call.responses),
    }


def timeline(per_call: dict[str, dict[str, Any]], since: float, bucket_s: float = 1.0) -> list[list[float]]:
    """``create_ms`` by when its round trip started: ``[s, n, p50, p99, max]``
    per ``bucket_s`` seconds after every call had joined (negative: before).
    Shows whether the tail comes from the join burst or from the steady state."""
    buckets: dict[int, list[float]] = collections.defaultdict(list)
    for r in per_call.values():
        for t0, ms in zip(r["create_at"], r["create_ms"]):
            buckets[int((t0 - since) // bucket_s)].append(ms)
    out = []
    for b in sorted(buckets):
        s = summary(buckets[b])
        out.append([round(b * bucket_s, 1), s["n"], round(s["p50"], 1), round(s["p99"], 1), round(s["max"], 1)])
    return out


def create_phases(per_call: dict[str, dict[str, Any]], since: float) -> dict[str, dict[str, float]]:
    """``create_ms`` apart by when its round trip started: ``join`` before
    the last call joined (``since``), ``steady`` from then on (every call
    joined; the calls that joined first may have ended by the end of it)."""
    join: list[float] = []
    steady: list[float] = []
    for r in per_call.values():
        for t0, ms in zip(r["create_at"], r["create_ms"]):
            (join if t0 < since else steady).append(ms)
    return {"join": summary(join), "steady": summary(steady)}


def aggregate(per_call: dict[str, dict[str, Any]], handshakes: list[dict[str, Any]]) -> dict[str, Any]:
    outputs = [(i, ms) for r in per_call.values() for i, ms in r["outputs"]]
    creates = [ms for r in per_call.values() for ms in r["create_ms"]]
    errors = collections.Counter(c for r in per_call.values() for c in r["error_codes"])
    violations = [v for r in per_call.values() for v in r["violations"]]
    responses: collections.Counter[str] = collections.Counter()
    for r in per_call.values():
        responses.update(r["responses"])
    return {
        "calls": len(per_call),
        "calls_connected": sum(1 for r in per_call.values() if r["connections"] > 0),
        "calls_closed": sum(1 for r in per_call.values() if r["closed"]),
        "tool_calls": sum(r["tool_calls"] for r in per_call.values()),
        "output_ms": summary(ms for _, ms in outputs),
        "create_ms": summary(creates),
        "outputs": outputs,                      # (tool call id, ms): joined with the server's log
        "missing_create": sum(r["missing_create"] for r in per_call.values()),
        "error_codes": dict(errors),
        "violations": len(violations),
        "violation_examples": violations[:5],
        "unanswered": sum(len(r["unanswered"]) for r in per_call.values()),
        "duplicate_outputs": sum(r["duplicate_outputs"] for r in per_call.values()),
        "response_creates": sum(r["response_creates"] for r in per_call.values()),
        "responses": dict(responses),
        "handshakes_rejected": sum(1 for h in handshakes if h["status"] != 101),
        "reconnects": sum(max(0, r["connections"] - 1) for r in per_call.values()),
    }


async def stdin_lines(send: trio.MemorySendChannel[str]) -> None:
    async with send:
        while True:
            line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
            if not line:
                await send.send("EOF")
                return
            await send.send(line.strip())


async def play_calls(nursery: trio.Nursery, calls: list[Any], timeout_s: float) -> tuple[float, bool]:
    """The host's protocol while its calls play (the simulator's and the lean
    peer's alike: each call has ``wait_until``, ``connections``, ``closed``):
    print ``CONNECTED <n>`` once every call has a sideband, then wait until
    every call closed or ``STOP`` / end of stdin. Returns when every call
    connected (trio time) and whether ``timeout_s`` ran out first."""
    commands_send, commands = trio.open_memory_channel[str](8)
    nursery.start_soon(stdin_lines, commands_send)
    connected_at = trio.current_time()
    with trio.move_on_after(timeout_s) as bound:
        for call in calls:
            await call.wait_until(lambda c: c.connections > 0 or c.closed)
        connected_at = trio.current_time()
        print(f"CONNECTED {len(calls)}", flush=True)
        async with trio.open_nursery() as waiters:
            async def all_closed() -> None:
                for call in calls:
                    await call.wait_until(lambda c: c.closed)
                waiters.cancel_scope.cancel()

            async def stop_command() -> None:
                async for line in commands:
                    if line in ("STOP", "EOF"):
                        waiters.cancel_scope.cancel()
                        return

            waiters.start_soon(all_closed)
            waiters.start_soon(stop_command)
    return connected_at, bound.cancelled_caught


async def end_open_calls(sim: Simulator, ids: list[str], bound_s: float = 5.0) -> None:
    """Close (1000) every call of ``ids`` still open, concurrently (a close
    waits for the peer's reply), within ``bound_s``."""
    with trio.move_on_after(bound_s):
        async with trio.open_nursery() as enders:
            for cid in ids:
                if not sim.calls[cid].closed:
                    enders.start_soon(sim.end_call, cid, 1000)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    sim = Simulator(None, api_key=BENCH_KEY, validate_sent=args.validate, timestamps=True)
    ids = [f"{args.prefix}-{n}" for n in range(args.calls)]
    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(sim.serve, 0)
        for cid in ids:
            sim.add_call(cid, make_scenario(args, rng))
        print(f"PORT {port}", flush=True)
        calls = [sim.calls[c] for c in ids]
        connected_at, timed_out = await play_calls(nursery, calls, args.timeout)
        await end_open_calls(sim, ids)
        await trio.sleep(0.2)
        nursery.cancel_scope.cancel()
    per_call = {cid: analyse(sim.calls[cid]) for cid in ids}
    result = aggregate(per_call, sim.handshakes)
    result.update(create_by_second=timeline(per_call, connected_at), create_phases=create_phases(per_call, connected_at))
    result.update(workload=args.workload, timed_out=timed_out, wall_s=round(time.perf_counter() - started, 3))
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="simulator host for the benchmarks")
    p.add_argument("--calls", type=int, default=1)
    p.add_argument("--prefix", default="rtc_bench")
    p.add_argument("--workload", default="roundtrip")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--gap", type=float, default=1.0)
    p.add_argument("--rate-hz", type=float, default=20.0)
    p.add_argument("--wait", type=float, default=10.0, help="wait_outputs timeout per round")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", required=True)
    p.add_argument("--validate", action="store_true", help="validate every sent event (the tests' default)")
    p.add_argument("--gc", action="store_true", help="keep the cyclic garbage collector on")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds before a call's first round (roundtrip)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logs.configure("json", "warning")
    if not args.gc:
        # the records only grow (every event of every call), so each full
        # collection walks all of them: at 1,000 calls that stalled every call
        # for up to 0.5 s, and the calls woken together stayed in step
        gc.freeze()
        gc.disable()
    result = trio.run(run, args)
    Path(args.out).write_text(json.dumps(result, default=str))
    print(f"DONE {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
