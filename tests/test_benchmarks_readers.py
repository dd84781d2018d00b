"""Two benchmark helpers that drifted from the server.

``benchmarks/roundtrip.py`` read the call records with ``str.splitlines``
(a record holding U+2028 was split in two and lost, as the server's own
readers once did); ``benchmarks/peers/ours.py``'s ``BENCH_INLINE_SYNC`` knob
replaced only ``storage.run_sync``, so once writes went through
``storage.run_in_write_slot`` they still hopped to a worker thread and the
experiment no longer measured what it says.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import trio

from voiceactors import storage

pytest.importorskip("psutil")
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def benchmarks(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))


def test_roundtrip_reads_records_holding_line_separators(benchmarks, tmp_path):
    from benchmarks.roundtrip import server_timings

    calls = tmp_path / "calls"
    calls.mkdir()
    lines = [{"kind": "tool_call", "tool_call_id": "call_a", "duration_ms": 3.5, "overhead_ms": 0.5,
              "args": "pasted\u2028text"},
             {"kind": "tool_call", "tool_call_id": "call_b", "duration_ms": 1.0, "note": "x\u0085y"}]
    (calls / "rtc_1.jsonl").write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines),
                                       encoding="utf-8")
    timings = server_timings(tmp_path)
    assert timings["durations"] == {"call_a": 3.5, "call_b": 1.0}
    assert timings["overhead_ms"]["n"] == 1


def test_the_inline_knob_covers_reads_and_writes(benchmarks, monkeypatch):
    from benchmarks.peers import ours

    monkeypatch.setattr(storage, "run_sync", storage.run_sync)           # restored after the test
    monkeypatch.setattr(storage, "run_in_write_slot", storage.run_in_write_slot)
    ours._inline_run_sync()

    async def main() -> tuple[int, int]:
        return (await storage.run_sync(threading.get_ident),
                await storage.run_in_write_slot(threading.get_ident))

    here = threading.get_ident()
    assert trio.run(main) == (here, here)          # neither hops to a worker thread
