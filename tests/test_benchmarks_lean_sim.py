"""The lean benchmark peer (``benchmarks/lean_sim.py``): its websocket framing
against wsproto, and its runs against a real ``voiceactors serve`` — every
round answered and counted, and a round's server events the same as the
simulator's for the same workload (both captured from real runs, so the
comparison follows the simulator when it changes).

Skipped without the ``bench`` extra (psutil), like the other benchmark smoke tests.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import wsproto
import wsproto.connection
import wsproto.events
import wsproto.frame_protocol

pytest.importorskip("psutil")

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def bench(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))
    monkeypatch.setenv("VOICEACTORS_BENCH_DIR", str(tmp_path / "bench"))
    return tmp_path


def _main(tmp_path: Path, module: str, name: str, *args: str) -> dict:
    import importlib

    out = tmp_path / f"{name}.json"
    assert importlib.import_module(module).main([*args, "--json", str(out)]) == 0
    return json.loads(out.read_text())


# --- framing ----------------------------------------------------------------------------------

def _client() -> wsproto.connection.Connection:
    return wsproto.connection.Connection(wsproto.connection.ConnectionType.CLIENT)


def test_the_frame_reader_reads_what_a_wsproto_client_sends(bench):
    from benchmarks.lean_frames import OP_CLOSE, OP_PING, OP_TEXT, FrameReader

    client = _client()
    big = "x" * 70_000                                       # a 64-bit length
    wire = (client.send(wsproto.events.TextMessage("{}")) + client.send(wsproto.events.Ping(b"hi"))
            + client.send(wsproto.events.TextMessage("é" * 200))     # a 16-bit length
            + client.send(wsproto.events.TextMessage("ab", message_finished=False))
            + client.send(wsproto.events.Ping(b"mid"))                  # between two fragments
            + client.send(wsproto.events.TextMessage("cd", message_finished=True))
            + client.send(wsproto.events.TextMessage(big))
            + client.send(wsproto.events.CloseConnection(1000)))
    reader = FrameReader()
    got = []
    for i in range(0, len(wire), 7):                         # arriving in small pieces
        got += reader.feed(wire[i:i + 7])
    assert got == [(OP_TEXT, b"{}"), (OP_PING, b"hi"), (OP_TEXT, ("é" * 200).encode()), (OP_PING, b"mid"),
                   (OP_TEXT, b"abcd"), (OP_TEXT, big.encode()), (OP_CLOSE, b"\x03\xe8")]
    assert reader.buf == b""


def test_server_frames_are_read_by_a_wsproto_client(bench):
    from benchmarks.lean_frames import close_frame, frame

    client = _client()
    sizes = [0, 125, 126, 65535, 65536]
    client.receive_data(b"".join(frame(b"a" * n) for n in sizes) + close_frame(1000))
    events = list(client.events())
    assert [len(e.data) for e in events if isinstance(e, wsproto.events.TextMessage)] == sizes
    assert isinstance(events[-1], wsproto.events.CloseConnection) and events[-1].code == 1000


# --- against a real server --------------------------------------------------------------------

_ID = re.compile(r"^(event|item|resp|call)_[0-9a-f]+$")


def _normal(value: Any, key: str = "") -> Any:
    """An event with what may differ between two runs taken out: ids (the
    simulator's are random, the lean peer's counters) and the audio clock."""
    if isinstance(value, dict):
        if value.get("type") == "function_call_output":      # the server's tool output: its shape only
            value = {**value, "output": "<output>"}
        return {k: _normal(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_normal(v) for v in value]
    if isinstance(value, str) and _ID.match(value):
        return "<id>"
    if key in ("audio_start_ms", "audio_end_ms"):
        return 0
    return value


def _rounds(events: list[dict]) -> list[list[dict]]:
    """The events of each round (a round begins with the user's speech)."""
    out: list[list[dict]] = []
    for event in events:
        if event["type"] == "input_audio_buffer.speech_started":
            out.append([])
        if out:
            out[-1].append(event)
    return out


QUICK = ("--peers", "ours", "--rounds", "2", "--think-ms", "10", "20", "--warm-calls", "0", "--idle-s", "0",
         "--settle-max-s", "1", "--trace-sent")


def test_burst_with_the_lean_peer_answers_every_round_and_sends_the_simulators_frames(bench):
    lean = _main(bench, "benchmarks.burst", "lean", "--sim", "lean", "--calls", "3", "--spread", "0.2",
                 "--hold-s", "0.1", *QUICK)
    (r,) = lean["results"]
    assert r["sim"] == "lean" and r["coalesce_writes"] is False
    connect, burst = r["phases"]["connect"], r["phases"]["burst"]
    assert connect["join_statuses"] == {"200": 3} and connect["closed"] == 3 and connect["rounds_done"] == 0
    assert burst["join_statuses"] == {"200": 3} and burst["closed"] == 3
    assert burst["tool_calls"] == 6 and burst["rounds_done"] == 6
    assert burst["output_ms"]["n"] == 6 and burst["create_ms"]["n"] == 6 and burst["missing_create"] == 0
    assert burst["errors"] == 0 and burst["violations"] == 0 and burst["unanswered"] == 0
    assert burst["duplicate_outputs"] == 0 and len(burst["per_call_output_p99_ms"]) == 3
    assert "server_ms_per_round_net" in burst and "server_ms_per_connect" in connect

    simulated = _main(bench, "benchmarks.burst", "simulator", "--mode", "one", *QUICK)
    (s,) = simulated["results"]
    assert s["sim"] == "simulator"
    lean_rounds = _rounds(burst["sent_events_first_call"])
    sim_rounds = _rounds(s["phases"]["one"]["sent_events_first_call"])
    assert len(lean_rounds) == len(sim_rounds) == 2
    # the second round: the first may meet the connect's own events in either order
    lean_round, sim_round = lean_rounds[1], sim_rounds[1]
    assert [e["type"] for e in lean_round] == [e["type"] for e in sim_round]
    assert "response.function_call_arguments.done" in [e["type"] for e in sim_round]
    assert [_normal(e) for e in lean_round] == [_normal(e) for e in sim_round]


def test_roundtrip_with_the_lean_peer_answers_every_round(bench):
    data = _main(bench, "benchmarks.roundtrip", "roundtrip", "--sim", "lean", "--peer", "ours", "--calls", "2",
                 "--rounds", "2", "--gap", "0.2", "--rate-hz", "20")
    (r,) = data["results"]
    assert r["sim"] == "lean" and r["calls_connected"] == 2 and r["calls_closed"] == 2
    assert r["tool_calls"] == 4 and r["output_ms"]["n"] == 4 and r["create_ms"]["n"] == 4
    assert r["response_creates"] == 4 and r["missing_create"] == 0
    assert r["overhead_ms"]["n"] == 4           # every output joined with the server's own record
    assert r["error_codes"] == {} and r["violations"] == 0 and r["unanswered"] == 0
    assert r["responses"] == {"scenario:completed": 4, "client:completed": 4}
    assert r["frames_sent"] > 4 * 28            # the background transcript deltas went out too


def test_capacity_idle_with_the_lean_peer_holds_every_call(bench):
    data = _main(bench, "benchmarks.capacity", "idle", "--sim", "lean", "--steps", "--idle", "3",
                 "--idle-peers", "ours", "--settle", "0.3")
    (m,) = data["idle"]
    assert m["calls_connected"] == 3 and m["handshakes_rejected"] == 0 and m["errors"] == {}
    assert m["rss_joined_mib"] > 0
