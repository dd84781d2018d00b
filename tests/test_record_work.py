"""Work in proportion to a call record stays off the trio thread and linear
(issue 34): a ``voiceactors serve`` child with a large record in its state
folder draws its timeline quickly and answers other requests meanwhile.
The record is a real file, as a long call leaves it."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import httpx
import pytest
import trio

from calls_support import DAY, KEY
from clock_support import serving
from test_call_crash import Server, stop_all, stop_cleanly
from voiceactors import storage
from voiceactors.http import create_app, history, timeline_svg
from voiceactors.http.history import MAX_RECORD_BYTES
from voiceactors.journal.sample import write_sample_journal
from voiceactors.settings import Settings
from voiceactors.simulator import Simulator

BIG_CALL = "rtc_big_record"
RESPONSES = 7_000


def big_record(responses: int = RESPONSES) -> list[dict]:
    """A call of ``responses`` model responses, each with one tool call."""
    lines: list[dict] = [{"kind": "start", "t": 0.0, "call_id": BIG_CALL, "at": "2026-03-27T09:00:00+00:00"}]
    for i in range(responses):
        response_id = f"resp_{i:06d}"
        lines.append({"kind": "tool_call", "t": round(i * 0.01, 3), "tool_call_id": f"call_{i:06d}",
                      "tool": "calendar.today", "response_id": response_id, "epoch": 0, "turn": i,
                      "duration_ms": 1.5, "outcome": "ok"})
        lines.append({"kind": "response", "t": round(i * 0.01 + 0.005, 3), "response_id": response_id,
                      "status": "completed", "epoch": 0, "origin": "model", "tool_calls": [f"call_{i:06d}"]})
    lines.append({"kind": "end", "t": responses * 0.01, "reason": "hangup", "duration_s": responses * 0.01})
    return lines


def write_record(state: Path, lines: list[dict], name: str = BIG_CALL) -> Path:
    path = state / "calls" / f"{name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert path.stat().st_size < MAX_RECORD_BYTES      # a record the history does load
    return path


def test_a_timeline_is_drawn_in_time_linear_in_its_record():
    lines = big_record()
    started = time.perf_counter()
    svg = timeline_svg.render(lines)
    took = time.perf_counter() - started
    assert svg.count("<title>response resp_") == RESPONSES      # every response drawn
    assert took < 1.0, f"{RESPONSES} responses drawn in {took:.2f} s"


async def test_a_large_records_timeline_does_not_hold_up_other_requests(tmp_path):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    state = tmp_path / "state"
    write_record(state, big_record())
    sim = Simulator(None, api_key=KEY)
    server: Server | None = None
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            server = Server(journal, state, sim)
            url = await server.start(nursery)
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                assert (await client.get("/api/voice/status")).status_code == 200
                drawn = trio.Event()
                timeline: dict = {}

                async def draw() -> None:
                    began = trio.current_time()
                    answer = await client.get(f"/api/voice/calls/{BIG_CALL}/timeline.svg")
                    timeline.update(status=answer.status_code, took=trio.current_time() - began,
                                    svg=answer.text)
                    drawn.set()

                nursery.start_soon(draw)
                await trio.sleep(0.02)          # the timeline's request goes first
                waits = []
                while not drawn.is_set():
                    began = trio.current_time()
                    assert (await client.get("/api/voice/status")).status_code == 200
                    waits.append(trio.current_time() - began)
                assert timeline["status"] == 200 and timeline["svg"].startswith("<svg")
                # 4.8 s before the drawing was linear; well under a second on a quiet machine, and the
                # bound leaves room for a loaded one (the in-process test above bounds the drawing itself)
                assert timeline["took"] < 3.0, timeline["took"]
                # Drawn on the trio thread, the first status request waited for the whole drawing and
                # was the only one. Off it, several are answered meanwhile, each in a fraction of the
                # drawing's time; on a loaded machine the GIL stretches both alike, so the bound is
                # relative to the drawing rather than an absolute wall-clock figure.
                assert len(waits) >= 2, (waits, timeline["took"])
                assert max(waits) < max(0.5, timeline["took"] / 2), (waits, timeline["took"])
                detail = await client.get(f"/api/voice/calls/{BIG_CALL}")
                assert detail.status_code == 200 and detail.headers["content-type"] == "application/json"
                assert detail.json()["call"]["responses"] == RESPONSES
            await stop_cleanly(server)
            nursery.cancel_scope.cancel()
    finally:
        stop_all(server)


async def test_a_fifo_among_the_records_is_listed_unreadable_at_once(tmp_path):
    """A FIFO named like a record: its open waited for a writer for good,
    holding a worker thread and the request."""
    state = tmp_path / "state"
    write_record(state, big_record(3))
    fifo = state / "calls" / "rtc_fifo.jsonl"
    os.mkfifo(fifo)
    try:
        with trio.fail_after(10):
            calls = await trio.to_thread.run_sync(history.list_calls, state, abandon_on_cancel=True)
            assert {c["call_id"]: c.get("unreadable", False) for c in calls} == {BIG_CALL: False, "rtc_fifo": True}
            with pytest.raises(history.RecordUnreadable):
                await trio.to_thread.run_sync(history.call_detail, state, "rtc_fifo", abandon_on_cancel=True)
    finally:
        with contextlib.suppress(OSError):     # a reader still blocked in its open (the old code) gets its EOF
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def test_a_record_past_the_bound_is_unreadable_and_read_no_further(tmp_path):
    state = tmp_path / "state"
    path = write_record(state, big_record(3))
    with open(path, "ab") as handle:
        handle.write(b" " * MAX_RECORD_BYTES)
    with pytest.raises(history.RecordUnreadable, match="too large"):
        history.call_detail(state, BIG_CALL)


async def test_history_requests_leave_the_tools_worker_threads_free(tmp_path):
    """Sixteen history lists of large records at once, in the app's own
    process: a tool's thread hop (``storage.run_sync``, as a journal read
    takes it) is not queued behind them (the history read on the same 16
    slots, and a read waited for the first of them to finish)."""
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    state = tmp_path / "state"
    for i in range(4):
        write_record(state, big_record(), name=f"{BIG_CALL}_{i}")
    app = create_app(Settings(journal=journal, state_dir=state, openai_api_key_env="VOICEACTORS_TEST_NO_KEY"))
    async with serving(app) as test_app:
        client = test_app.test_client()
        finished: list[float] = []

        async def list_all() -> None:
            response = await client.get("/api/voice/calls")
            assert response.status_code == 200 and len((await response.get_json())["calls"]) == 4
            finished.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            for _ in range(storage.THREADS):
                nursery.start_soon(list_all)
            await trio.sleep(0.05)              # every request has reached its thread hop
            began = trio.current_time()
            await storage.run_sync(time.monotonic)
            hop = trio.current_time() - began
        assert len(finished) == storage.THREADS
        # Queued behind them, the hop would end only once the first list's
        # thread was done; a loaded machine slows both alike (GIL), so the
        # bound is that first list's time, not a figure in seconds.
        first = min(finished) - began
        assert hop < 0.75 * first, (hop, first)
