"""kill -9 mid-call (issue 11, item 10), with real server processes.

A ``voiceactors serve`` child joins a simulated call whose model asks for a
write (``commitments.complete``, held up: the test holds the journal file's
lock) and a read. When the child's call record shows the write started, the
child is SIGKILLed; a torn half line is left at the end of its record (a
crash mid-append). A fresh server on the same state directory rejoins the
call and answers the pending write exactly once, honestly (it had not been
applied); the record of the crashed run stays readable; nothing is applied
twice. The in-process tests below cover the other answers (from the write
log, a read run again) with the same recovery code.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import trio

from calls_support import DAY, KEY, real_time_limit, rig, steady
from child_support import CHILD_START_S, Child
from test_reliability_faults import ROOT, item_file, ledger_close_edits, open_item
from voiceactors.executor import write_log
from voiceactors.call.record import append_block, read_record, record_path
from voiceactors.call.recovery import RESTARTED_OUTPUT
from voiceactors.call.supervisor import CallSupervisor
from voiceactors.journal.sample import write_sample_journal
from voiceactors.simulator import Simulator, ToolCallRecord

CALL = "rtc_crash"


def crash_scenario(item_id: str) -> list:
    return [
        {"user_turn": {"text": "close that and what is on today"}},
        {"response": {"tool_calls": [
            {"name": "commitments.complete", "call_id": "call_w",
             "arguments": {"commitment_id": item_id, "resolution": "done"}},
            {"name": "calendar.today", "call_id": "call_r", "arguments": {}},
        ]}},
        {"wait_outputs": {"timeout_s": 120}},
        {"response": {"text": "Done."}},
        {"sleep": 120},
    ]


class Server:
    """One ``voiceactors serve`` child and its JSON log lines."""

    def __init__(self, journal: Path, state: Path, sim: Simulator) -> None:
        self.args = [sys.executable, "-m", "voiceactors.cli", "serve", "--journal", str(journal),
                     "--state-dir", str(state), "--host", "127.0.0.1", "--port", "0", "--today", DAY.isoformat()]
        self.env = {**os.environ, "OPENAI_BASE_URL": sim.base_url, "OPENAI_API_KEY": KEY,
                    "VOICEACTORS_LOG_FORMAT": "json"}
        self.env.pop("VOICEACTORS_API_TOKEN", None)
        self.lines: list[dict] = []
        self.proc: Child | None = None

    async def start(self, nursery: trio.Nursery) -> str:
        self.proc = Child(self.args, stderr=subprocess.PIPE, env=self.env, cwd=ROOT)   # dies with pytest
        nursery.start_soon(self._read_log)
        with trio.fail_after(CHILD_START_S):
            while not any(line.get("event") == "server.serving" for line in self.lines):
                assert self.proc.poll() is None, self.lines[-20:]
                await trio.sleep(0.05)
        [serving] = [line for line in self.lines if line.get("event") == "server.serving"]
        return serving["urls"][0]

    async def _read_log(self) -> None:
        buffer = b""
        async for chunk in self.proc.stderr:
            buffer += chunk
            *done, buffer = buffer.split(b"\n")
            for raw in done:
                try:
                    self.lines.append(json.loads(raw))
                except ValueError:
                    self.lines.append({"raw": raw.decode("utf-8", "replace")})

    def events(self, name: str) -> list[dict]:
        return [line for line in self.lines if line.get("event") == name]


async def stop_cleanly(*servers: Server, bound_s: float = 20) -> None:
    """SIGTERM every server, then each must exit 0 (a graceful stop), all
    within ``bound_s``."""
    for server in servers:
        server.proc.terminate()
    with trio.fail_after(bound_s):
        for server in servers:
            assert await server.proc.wait() == 0


def stop_all(*servers: Server | None) -> None:
    """Kill every server still running (a test's ``finally``)."""
    for server in servers:
        if server is not None and server.proc is not None and server.proc.poll() is None:
            server.proc.kill()


async def _wait_for_line(path: Path, kind: str, tool_call_id: str) -> None:
    with trio.fail_after(30):
        while True:
            if path.exists() and any(line.get("kind") == kind and line.get("tool_call_id") == tool_call_id
                                     for line in read_record(path)):
                return
            await trio.sleep(0.05)


async def test_kill_9_mid_call_then_a_fresh_server_answers_the_pending_call_once(tmp_path):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    state = tmp_path / "state"
    item = open_item(journal)
    day_file = item_file(journal, item)
    before = day_file.read_bytes()
    sim = Simulator(None, api_key=KEY)
    sc = sim.add_call(CALL, crash_scenario(item.id))
    record = record_path(state, CALL)
    first = second = None
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            first, second = Server(journal, state, sim), Server(journal, state, sim)
            lock = open(f"{day_file}.lock", "a+b")
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)      # the write waits for it
            try:
                base = await first.start(nursery)
                async with httpx.AsyncClient(base_url=base, timeout=10) as client:
                    response = await client.post("/api/voice/connect", json={"call_id": CALL})
                    assert response.status_code == 200, response.text
                await _wait_for_line(record, "tool_started", "call_w")   # written as the call goes
                await _wait_for_line(record, "tool_call", "call_r")      # the read settled
                first.proc.kill()                                          # SIGKILL mid-call
                with trio.fail_after(10):
                    assert await first.proc.wait() == -9
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
                lock.close()
            with trio.fail_after(10):
                await sc.wait_until(lambda c: c.connection is None)
            assert "call_w" not in sc.outputs and len(sc.outputs["call_r"]) == 1   # the turn hangs on call_w
            crashed = read_record(record)
            assert crashed[0]["kind"] == "start" and not any(x["kind"] == "end" for x in crashed)
            # a crash mid-append: half a line without its newline
            with open(record, "a", encoding="utf-8") as handle:
                handle.write('{"kind": "tool_call", "tool_call_id": "call_')

            await second.start(nursery)                    # rejoins at start-up, no /connect needed
            with trio.fail_after(30):
                await sc.wait_until(lambda c: "call_w" in c.outputs and c.step_index >= 4)
            assert sc.outputs["call_w"] == [RESTARTED_OUTPUT]   # exactly one, honest answer
            assert len(sc.outputs["call_r"]) == 1               # the settled read is not answered again
            assert sc.violations == []
            assert [e["call_id"] for e in second.events("supervisor.rejoin")] == [CALL]
            # the service's echo of the output may still be on its way when the
            # simulator's script moves on: stop once the call settled it
            await _wait_for_line(record, "tool_call", "call_w")
            await stop_cleanly(second)
            nursery.cancel_scope.cancel()
    finally:
        stop_all(first, second)
    lines = read_record(record)                            # the torn line is skipped, nothing merged
    starts = [i for i, x in enumerate(lines) if x["kind"] == "start"]
    assert len(starts) == 2
    old, new = lines[:starts[1]], lines[starts[1]:]
    assert not any(x["kind"] == "end" for x in old)
    assert new[0]["rejoined"] is True and new[0]["recovered"] == ["call_w"]
    assert new[-1]["kind"] == "end" and new[-1]["reason"] == "shutdown"
    [settled] = [x for x in new if x["kind"] == "tool_call"]
    assert settled["tool_call_id"] == "call_w" and settled["outcome"] == "restarted" and settled["delivered"]
    raw = record.read_text(encoding="utf-8").split("\n")
    assert raw[-1] == "" and any(x == '{"kind": "tool_call", "tool_call_id": "call_' for x in raw)
    # the write never applied (no record, the day file untouched): never twice
    assert write_log.load(state, "call_w") is None
    assert ledger_close_edits(day_file, item.id) == [] and day_file.read_bytes() == before


# --- the other answers, in process ---------------------------------------------------------------

def _crashed_block(state: Path, call_id: str, *tool_lines: dict) -> Path:
    """A record as a killed server leaves it: a start, tool_started lines, no end."""
    path = record_path(state, call_id)
    lines = [{"kind": "start", "t": 0.0, "call_id": call_id, "at": "2026-03-27T10:00:00+00:00"},
             {"kind": "connect", "t": 0.01, "reconnects": 0}, *tool_lines]
    append_block(path, [json.dumps(x) for x in lines])
    return path


RESUME = [{"wait_outputs": {"timeout_s": 60}}, {"response": {"text": "There."}}, {"close": 1000}]


async def test_rejoin_answers_an_applied_write_from_the_write_log_and_reruns_a_read(tmp_path, autojump_clock):
    state = tmp_path / "state"
    applied = {"output": json.dumps({"ok": True, "item": "x"}), "outcome": "ok", "tool": "commitments.complete"}
    write_log.apply_once(state, "call_done", lambda: applied)
    path = _crashed_block(
        state, "rtc_rejoin",
        {"kind": "tool_started", "t": 1.0, "tool_call_id": "call_done", "tool": "commitments.complete",
         "response_id": "resp_1", "epoch": 0, "turn": 1, "effect": "write"},
        {"kind": "tool_started", "t": 1.0, "tool_call_id": "call_read", "tool": "calendar.today",
         "response_id": "resp_1", "epoch": 0, "turn": 1, "effect": "read", "arguments": "{}"},
        {"kind": "tool_started", "t": 1.0, "tool_call_id": "call_lost", "tool": "commitments.complete",
         "response_id": "resp_1", "epoch": 0, "turn": 1, "effect": "write"},
        {"kind": "tool_started", "t": 1.0, "tool_call_id": "call_ok", "tool": "calendar.today",
         "response_id": "resp_1", "epoch": 0, "turn": 1, "effect": "read", "arguments": "{}"},
        {"kind": "tool_call", "t": 1.2, "tool_call_id": "call_ok", "outcome": "ok", "delivered": True},
    )
    async with rig(tmp_path) as r:
        sc = r.sim.add_call("rtc_rejoin", steady(RESUME))
        for tool_call_id, name in (("call_done", "commitments.complete"), ("call_read", "calendar.today"),
                                   ("call_lost", "commitments.complete")):
            # the service still waits for these three
            sc.add_tool_call(ToolCallRecord(tool_call_id, name, "{}", "resp_1", "item_" + tool_call_id,
                                            complete=True))
        sup = CallSupervisor(r.settings, r.executor.inbox, KEY)
        with real_time_limit():
            await r.nursery.start(sup.run)
            await sc.wait_until(lambda c: c.closed)
            while sup.calls:
                await trio.sleep(0.01)
    assert sc.outputs["call_done"] == [applied["output"]]
    assert sc.outputs["call_lost"] == [RESTARTED_OUTPUT]
    [read] = sc.outputs["call_read"]
    assert "error" not in json.loads(read)                 # the read ran again
    assert "call_ok" not in sc.outputs
    assert sc.response_creates == 1 and sc.violations == []
    new = read_record(path)
    block = new[[i for i, x in enumerate(new) if x["kind"] == "start"][-1]:]
    outcomes = {x["tool_call_id"]: x["outcome"] for x in block if x["kind"] == "tool_call"}
    assert outcomes == {"call_done": "replayed", "call_read": "ok", "call_lost": "restarted"}
    assert block[-1]["kind"] == "end"


async def test_a_crashed_record_too_old_or_ended_is_not_rejoined(tmp_path, autojump_clock):
    state = tmp_path / "state"
    old = _crashed_block(state, "rtc_old")
    os.utime(old, (1_000_000, 1_000_000))                    # changed long ago
    ended = _crashed_block(state, "rtc_ended", {"kind": "end", "t": 2.0, "reason": "closed_by_service"})
    async with rig(tmp_path, call_max_duration_s=3900.0) as r:
        sup = CallSupervisor(r.settings, r.executor.inbox, KEY)
        await r.nursery.start(sup.run)
        assert sup.calls == {} and r.sim.handshakes == []
    assert read_record(ended)[-1]["kind"] == "end"
