"""One call's output, piece by piece: where the time goes from the function
call's ``response.output_item.done`` written by the peer to our output read
back (issue 14's one-call target; docs/benchmarks.md § 35).

Runs ``benchmarks.burst --sim lean --mode one`` (``--peers``, default ours
and the do-nothing server; ``--rounds`` 50) with every process of the run
stamped by ``benchmarks/path_stamps.py`` (a ``sitecustomize`` on
``PYTHONPATH`` loads it; nothing in the product changes), then pairs the
stamps of each tool call by its call id. One clock for every process
(``time.perf_counter_ns``, CLOCK_MONOTONIC). For our server, per round:

* ``wire in``: the peer's write of the item's done → the server's socket
  read that returned those bytes (trio-websocket's reader task);
* ``hand-off``: that read → the frame put in the message channel (wsproto's
  parsing of the read's frames before it);
* ``to our reader``: the hand-off → ``get_messages`` returned the batch
  holding it (a wake-up and a task step of our reader, unless it was
  already running);
* ``frames before it``: the batch returned → the item's done's decoding
  started (the frames of the same batch handled first: the arguments' done
  with its in-step answer, the item's added events, ...);
* ``decode``, ``protocol``, ``effects``: ``read_server_event``,
  ``handle_event`` and ``_apply`` of the item's done;
* ``to the write``: the effects done → ``start_send`` began (``_write_step``);
* ``write``: ``start_send`` (the frame's JSON, wsproto's framing, ``os.write``);
* ``wire out``: the write returned → the peer's read of the output.

For the do-nothing server: ``wire in`` to its read of the arguments' done
(it answers that) and from its read to its ``send_all``. It also counts the
task steps (by task) and returns from the I/O wait between the server's read
of the item's done and the output's write. The stamps cost a little
(~1 µs a call wrapped, ~1 µs a task step): read the parts, not the total,
against ``benchmarks.burst`` without them.

Run::

    .venv/bin/python -m benchmarks.output_path --json op.json
    BENCH_PEER_REPO=/tmp/onecall-before .venv/bin/python -m benchmarks.output_path   # another checkout's server
"""

from __future__ import annotations

import argparse
import bisect
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

SITECUSTOMIZE = """\
import importlib.util, os
_spec = importlib.util.spec_from_file_location("_path_stamps", os.environ["PATH_STAMPS_HOOKS"])
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
_mod.install()
"""

PARTS_OURS = ["wire in", "hand-off", "to our reader", "frames before it", "decode", "protocol", "effects",
              "to the write", "write", "wire out", "total"]
PARTS_NOTHING = ["wire in (its arguments' done)", "read → send", "wire out", "total (from the item's done)"]


def _load(directory: Path) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for path in sorted(directory.glob("*.json")):
        role = path.name.split("-")[0]
        out[role].append(json.loads(path.read_text()))
    return out


def _first(rows: list, pred: Any) -> Any:
    for row in rows:
        if pred(row):
            return row
    return None


def _steps_between(steps: list, times: list[int], t0: int, t1: int) -> collections.Counter[str]:
    lo, hi = bisect.bisect_right(times, t0), bisect.bisect_right(times, t1)
    counts: collections.Counter[str] = collections.Counter()
    for _, name in steps[lo:hi]:
        counts[name.rsplit(".", 1)[-1] if "." in name else name] += 1
    return counts


def analyse_ours(server: dict[str, Any], peer: dict[str, Any]) -> dict[str, Any]:
    """Per tool call of ``peer``: our server's stamps paired by call id."""
    steps, io = server["steps"], server["io"]
    step_times = [s[0] for s in steps]
    rows = []
    step_totals: collections.Counter[str] = collections.Counter()
    io_counts = []
    before_kinds: collections.Counter[str] = collections.Counter()
    effect_kinds: collections.Counter[str] = collections.Counter()
    same_batch_args = 0
    answered_in_step = 0
    answer_us = []
    decoded_behind = 0
    for cid, p in peer.items():
        a, z = p.get("item_done_written"), p.get("output_read")
        recv = _first(server["recv"], lambda r: r[1] == "item_done" and r[2] == cid)
        hand = _first(server["handoff"], lambda r: r[1] == cid)
        batch = _first(server["batch"], lambda r: cid in r[2])
        dec = _first(server["decode"], lambda r: r[3] == cid)
        write = _first(server["start_send"], lambda r: r[2] == cid)
        if None in (a, z, recv, hand, batch, dec, write):
            continue
        proto = _first(server["protocol"], lambda r: r[0] >= dec[1])
        applied = [r for r in server["apply"] if r[0] >= proto[1] and r[1] <= write[0]]
        outer = min(applied, key=lambda r: r[0]) if applied else None
        if outer is None:
            continue
        index = batch[2].index(cid)
        for kind in batch[1][:index]:
            before_kinds[kind] += 1
        if "response.function_call_arguments.done" in batch[1][:index]:
            same_batch_args += 1
        answer = _first(server["answer"], lambda r: r[2] == cid)
        if answer is not None:
            answer_us.append((answer[1] - answer[0]) / 1000)
            answered_in_step += bool(answer[3])
        for kind in proto[3]:
            effect_kinds[kind] += 1
        parts = [recv[0] - a, hand[0] - recv[0], batch[0] - hand[0], dec[0] - batch[0], dec[1] - dec[0],
                 proto[1] - proto[0], outer[1] - outer[0], write[0] - outer[1], write[1] - write[0], z - write[1],
                 z - a]
        rows.append([x / 1000 for x in parts])
        # a frame behind it in the same read decoded before the output's write (§ 24: none should be)
        decoded_behind += any(dec[1] <= r[0] < write[0] for r in server["decode"])
        step_totals.update(_steps_between(steps, step_times, recv[0], write[1]))
        io_counts.append(sum(1 for t in io if recv[0] < t <= write[1]))
    n = len(rows)
    reader_tasks: collections.Counter[str] = collections.Counter()
    for _, name in steps:      # the whole run (warm-up and connect included), per round of this phase
        if name.endswith(("WebSocketConnection._reader_task", "CallActor._reader")):
            reader_tasks[name.rsplit(".", 1)[-1]] += 1
    return {
        "rounds": n,
        "reader_steps_per_round_whole_run": {k: round(v / n, 2) for k, v in reader_tasks.items()} if n else {},
        "parts_us_p50": {name: round(statistics.median(r[i] for r in rows), 1) for i, name in enumerate(PARTS_OURS)}
        if n else {},
        "parts_us_mean": {name: round(statistics.fmean(r[i] for r in rows), 1) for i, name in enumerate(PARTS_OURS)}
        if n else {},
        "task_steps_read_to_write_per_round": {k: round(v / n, 2) for k, v in step_totals.most_common()} if n else {},
        "io_waits_read_to_write_per_round": round(sum(io_counts) / n, 2) if n else None,
        "frames_before_it_in_its_batch_per_round": {k: round(v / n, 2) for k, v in before_kinds.most_common()}
        if n else {},
        "arguments_done_in_the_same_batch": same_batch_args,
        "rounds_with_a_frame_behind_it_decoded_before_the_write": decoded_behind,
        "item_done_effects_per_round": {k: round(v / n, 2) for k, v in effect_kinds.most_common()} if n else {},
        "answer_now_us_p50": round(statistics.median(answer_us), 1) if answer_us else None,
        "answered_in_step": answered_in_step,
    }


def analyse_nothing(server: dict[str, Any], peer: dict[str, Any]) -> dict[str, Any]:
    rows = []
    for cid, p in peer.items():
        a, z = p.get("item_done_written"), p.get("output_read")
        recv = _first(server["recv"], lambda r: r[1] == "args_done" and r[2] == cid)
        send = _first(server["send"], lambda r: r[1] == cid)
        if None in (a, z, recv, send):
            continue
        rows.append([(recv[0] - a) / 1000, (send[0] - recv[0]) / 1000, (z - send[0]) / 1000, (z - a) / 1000])
    n = len(rows)
    return {"rounds": n, "parts_us_p50": {name: round(statistics.median(r[i] for r in rows), 1)
                                          for i, name in enumerate(PARTS_NOTHING)} if n else {}}


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for peer_name in args.peers:
        tmp_path = Path(tempfile.mkdtemp(prefix="output-path-"))
        try:
            (tmp_path / "site").mkdir()
            (tmp_path / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
            stamps = tmp_path / "stamps"
            stamps.mkdir()
            env = {**os.environ, "PATH_STAMPS_DIR": str(stamps), "PATH_STAMPS_HOOKS": str(HERE / "path_stamps.py"),
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "site"), os.environ.get("PYTHONPATH")]))}
            cmd = [sys.executable, "-m", "benchmarks.burst", "--sim", "lean", "--mode", "one", "--peers", peer_name,
                   "--rounds", str(args.rounds), "--json", str(tmp_path / "burst.json")]
            done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                raise SystemExit(f"burst failed: {done.stderr[-2000:]}")
            burst = json.loads((tmp_path / "burst.json").read_text())
            loaded = _load(stamps)
            peer = {}
            for p in loaded["peer"]:
                peer.update(p["peer"])
            warm_out = {cid for cid in list(peer)[: max(0, len(peer) - args.rounds)]}
            peer = {cid: v for cid, v in peer.items() if cid not in warm_out}   # the warm phase's rounds out
            server = max(loaded[peer_name], key=lambda s: len(s["recv"]))
            one = burst["results"][0]["phases"]["one"]
            report = analyse_ours(server, peer) if peer_name == "ours" else analyse_nothing(server, peer)
            report["burst_output_ms"] = one["output_ms"]
            results[peer_name] = report
        finally:
            if args.keep:
                print(f"stamps kept in {tmp_path}", file=sys.stderr)
            else:
                shutil.rmtree(tmp_path)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peers", nargs="*", default=["ours", "nothing"], choices=["ours", "nothing"])
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--json", type=Path)
    p.add_argument("--keep", action="store_true", help="keep the stamps folder (its path is printed)")
    args = p.parse_args(argv)
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    results = run(args)
    results["load_at_start"] = load
    results["server_repo"] = os.environ.get("BENCH_PEER_REPO", "")
    print(json.dumps(results, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
