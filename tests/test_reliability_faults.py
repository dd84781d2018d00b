"""Faults: what breaks around a call, and what the server does about it.

* the sideband drops while a write runs — the write applies once and its real
  result is delivered after the reconnect, or recorded when the call is over;
* a tool that hangs forever — ``{"error": "tool timed out"}``, the call goes on;
* another process rewrites the journal file during a close — it holds the
  same ``<file>.lock``; our close waits for it and both changes survive;
* the disk refuses the write (ENOSPC from ``os.fsync``, and a real
  ``RLIMIT_FSIZE`` in a child process) — the close reports
  ``{"error": "tool failed"}`` and the file is byte-for-byte intact;
* the mint endpoint answers 5xx, times out or returns garbage — 500
  ``voice session unavailable``;
* the brain backend (the stand-in Claude CLI) hangs, crashes or prints
  garbage — the previous instruction is kept, ``brain refresh failed``,
  ``brain not ready``;
* SIGTERM during live calls — ``voiceactors serve`` in a child process exits 0
  within 15 s, every call record ends ``shutdown``, no write half-applied.

Real clock throughout: tool handlers block in worker threads here, and an
autojump clock would jump deadlines while they run (see ``calls_support``).
All waits are short and bounded.
"""

from __future__ import annotations

import errno
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from calls_support import DAY, KEY, real_time_limit, rig
from child_support import CHILD_START_S, Child
from clock_support import serving
from voiceactors.executor import write_log
from voiceactors.call.record import read_record, record_path
from voiceactors.messages import ToolRequest
from voiceactors.executor.actor import ToolExecutor
from voiceactors.http import create_app
from voiceactors.journal import ledger
from voiceactors.journal.sample import write_sample_journal
from voiceactors.simulator import Simulator
from voiceactors.settings import Settings
from voiceactors.tools import REGISTRY, ToolContext, ToolSpec, make_registry
from voiceactors.tools.commitment_tools import complete as complete_commitment
from simulator_support import serving_simulator

ROOT = Path(__file__).resolve().parents[1]
FAKE_CLAUDE = Path(__file__).parent / "bin" / "fake-claude"
CALL = "rtc_fault"


# --- helpers ----------------------------------------------------------------------

class SlowWrite:
    """The real ``commitments.complete``, held at its start until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def handler(self, ctx: ToolContext, args: dict) -> dict:
        self.calls += 1
        self.entered.set()
        self.release.wait(20)
        return complete_commitment(ctx, args)


def with_handler(name: str, handler: Any) -> dict[str, ToolSpec]:
    """The real registry with ``name``'s handler replaced (schema and effect kept)."""
    specs = []
    for spec in REGISTRY.values():
        if spec.name == name:
            spec = ToolSpec(name=spec.name, description=spec.description, parameters=spec.parameters,
                            effect=spec.effect, handler=handler, errors=spec.errors)
        specs.append(spec)
    return make_registry(specs)


async def wait_for(event: threading.Event, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not event.is_set():
        assert time.monotonic() < deadline, "timed out waiting for a worker thread"
        await trio.sleep(0.005)


def open_item(journal: Path) -> ledger.LedgerItem:
    return ledger.list_items(journal, state="open", top=1)[0]


def item_file(journal: Path, item: ledger.LedgerItem) -> Path:
    opening = ledger._derived(journal).opening[item.id]   # noqa: SLF001 - where the item lives
    return journal / "facets" / opening.facet / "activities" / f"{opening.day}.jsonl"


def ledger_close_edits(path: Path, item_id: str) -> list[dict]:
    edits = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)          # every line still parses: nothing half-written
        for edit in row.get("edits") or []:
            if edit.get("fields") == ["ledger_close"] and edit["ledger_close"]["item_id"] == item_id:
                edits.append(edit)
    return edits


def write_scenario(item_id: str, *, hold_s: float = 0.0, tail: list | None = None) -> list:
    return [
        {"response": {"tool_calls": [{"name": "commitments.complete", "call_id": "call_w",
                                      "arguments": {"commitment_id": item_id, "resolution": "done"}}],
                      "hold_s": hold_s}},
        {"wait_outputs": {"timeout_s": 15}},
        {"response": {"text": "Marked it done."}},
    ] + (tail if tail is not None else [{"close": 1000}])


# --- the sideband drops while a write runs -----------------------------------------

async def test_drop_mid_write_applies_once_and_delivers_after_reconnect(tmp_path):
    """The socket drops while ``commitments.complete`` runs (its response still
    active): after the reconnect the real result — not a synthetic
    "cancelled" — is delivered once, and the ledger has exactly one edit."""
    slow = SlowWrite()
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    item = open_item(journal)
    path = item_file(journal, item)
    async with rig(tmp_path, registry=with_handler("commitments.complete", slow.handler),
                   reconnect_base_s=0.01) as r:
        sc = r.sim.add_call(CALL, write_scenario(item.id, hold_s=1.0))
        actor = r.actor(CALL)
        with real_time_limit(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(actor.run)
                await wait_for(slow.entered)
                r.sim.drop(CALL)
                await sc.wait_until(lambda c: c.connections == 2)
                slow.release.set()
        record = r.record(CALL)
    assert actor.end_reason == "closed_by_service"
    assert slow.calls == 1
    [output] = sc.outputs["call_w"]
    result = json.loads(output)
    assert result.get("ok") is True, result
    assert result["ok"] is True and result["commitment"]["id"] == item.id
    assert sc.response_creates == 1 and sc.violations == []
    assert write_log.load(r.settings.state_dir, "call_w")["output"] == output
    assert len(ledger_close_edits(path, item.id)) == 1
    [line] = [x for x in record if x["kind"] == "tool_call"]
    assert line["outcome"] == "ok" and line["delivered"] is True and line["synthetic"] is False


async def test_call_over_mid_write_the_write_completes_and_is_recorded(tmp_path):
    """The service ends the call while the write runs: the write still
    finishes (within the close deadline), the write log and the call record
    have it, the ledger has one edit; nothing is sent on the dead socket."""
    slow = SlowWrite()
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    item = open_item(journal)
    path = item_file(journal, item)
    async with rig(tmp_path, registry=with_handler("commitments.complete", slow.handler),
                   close_deadline_s=5.0) as r:
        sc = r.sim.add_call(CALL, write_scenario(item.id))
        actor = r.actor(CALL)
        with real_time_limit(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(actor.run)
                await wait_for(slow.entered)
                await r.sim.end_call(CALL, 1000)
                await trio.sleep(0.2)
                slow.release.set()
        record = r.record(CALL)
    assert actor.end_reason == "closed_by_service"
    assert sc.outputs == {}                      # the socket was gone: nothing sent
    assert json.loads(write_log.load(r.settings.state_dir, "call_w")["output"])["ok"] is True
    assert len(ledger_close_edits(path, item.id)) == 1
    [line] = [x for x in record if x["kind"] == "tool_call"]
    assert line["outcome"] == "ok" and line["delivered"] is False
    assert record[-1]["kind"] == "end" and record[-1]["reason"] == "closed_by_service"


# --- a tool that hangs forever -----------------------------------------------------------

async def test_hanging_tool_times_out_and_the_call_goes_on(tmp_path):
    hang = threading.Event()

    def hanging(ctx: Any, args: dict) -> dict:
        hang.wait(30)      # "forever", as far as the call is concerned
        return {"never": "seen"}

    scenario = [
        {"response": {"tool_calls": [{"name": "calendar.today", "arguments": {}, "call_id": "call_hang"}]}},
        {"wait_outputs": {"timeout_s": 15}},
        {"response": {"tool_calls": [{"name": "commitments.list", "arguments": {}, "call_id": "call_next"}]}},
        {"wait_outputs": {"timeout_s": 15}},
        {"response": {"text": "There you go."}},
        {"close": 1000},
    ]
    try:
        async with rig(tmp_path, registry=with_handler("calendar.today", hanging), tool_timeout_read_s=0.3) as r:
            actor, sc = await r.run_call(CALL, scenario)
    finally:
        hang.set()
    assert actor.end_reason == "closed_by_service"
    assert [json.loads(o) for o in sc.outputs["call_hang"]] == [{"error": "tool timed out"}]
    assert "commitments" in json.loads(sc.outputs["call_next"][0])
    assert sc.response_creates == 2 and sc.violations == [] and sc.error_codes == []
    assert actor.calls["call_hang"].outcome == "timeout"


# --- another process rewrites the journal file during a close ---------------------------

REWRITER = textwrap.dedent("""
    import fcntl, json, os, sys, time
    path = sys.argv[1]
    with open(path + ".lock", "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        print("locked", flush=True)
        sys.stdin.readline()                      # hold the lock until told
        rows = [json.loads(l) for l in open(path, encoding="utf-8") if l.strip()]
        rows[0]["rewritten_by"] = "other-process"
        rows.append({"id": "other_process_record", "title": "added while we waited"})
        tmp = path + ".other.tmp"
        with open(tmp, "w", encoding="utf-8") as out:
            out.write("".join(json.dumps(r) + "\\n" for r in rows))
            out.flush(); os.fsync(out.fileno())
        os.replace(tmp, path)
        print("released", time.monotonic(), flush=True)
        fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
""")


async def executor_request(executor: ToolExecutor, name: str, args: dict, tool_call_id: str):
    send, receive = trio.open_memory_channel(1)
    await executor.inbox.send(ToolRequest(call_id=CALL, tool_call_id=tool_call_id, name=name,
                                          arguments=json.dumps(args), epoch=0, turn=0, reply=send))
    return await receive.receive()


async def test_close_waits_for_another_process_holding_the_lock_and_both_changes_survive(tmp_path):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    item = open_item(journal)
    path = item_file(journal, item)
    settings = Settings(journal=journal, state_dir=tmp_path / "state")
    executor = ToolExecutor(settings, ToolContext(journal, settings.state_dir, lambda: DAY))
    other = subprocess.Popen([sys.executable, "-c", REWRITER, str(path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "locked"
        async with trio.open_nursery() as nursery:
            await nursery.start(executor.run)
            results: list[Any] = []

            async def close() -> None:
                results.append(await executor_request(executor, "commitments.complete",
                                                      {"commitment_id": item.id, "resolution": "sent"}, "call_lock"))
                results.append(time.monotonic())

            nursery.start_soon(close)
            await trio.sleep(0.5)
            assert results == []                 # blocked on the other process's lock
            other.stdin.write("go\n")
            other.stdin.flush()
            released = float(other.stdout.readline().split()[1])
            with trio.fail_after(10):
                while len(results) < 2:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    finally:
        other.wait(10)
    result, finished = results
    assert result.outcome == "ok" and json.loads(result.output)["ok"] is True
    assert finished > released
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert rows[0]["rewritten_by"] == "other-process"              # their change
    assert rows[-1]["id"] == "other_process_record"
    assert len(ledger_close_edits(path, item.id)) == 1            # ours
    assert ledger.get_item(journal, item.id).state == "closed"


# --- the disk refuses the write ----------------------------------------------------------

async def test_disk_full_on_close_reports_failure_and_leaves_the_file_intact(tmp_path, monkeypatch, log_stream):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    item = open_item(journal)
    path = item_file(journal, item)
    before = path.read_bytes()
    settings = Settings(journal=journal, state_dir=tmp_path / "state")
    executor = ToolExecutor(settings, ToolContext(journal, settings.state_dir, lambda: DAY))
    real_fsync = os.fsync

    def full_disk(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    async with trio.open_nursery() as nursery:
        await nursery.start(executor.run)
        monkeypatch.setattr(os, "fsync", full_disk)
        failed = await executor_request(executor, "commitments.complete",
                                        {"commitment_id": item.id, "resolution": "done"}, "call_full")
        monkeypatch.setattr(os, "fsync", real_fsync)
        assert failed.outcome == "failed" and json.loads(failed.output) == {"error": "tool failed"}
        assert '"tool.failed"' in log_stream.getvalue() and "No space left on device" in log_stream.getvalue()
        assert path.read_bytes() == before                          # intact, byte for byte
        assert not list(path.parent.glob("*.tmp"))                  # no temp file left behind
        assert write_log.load(settings.state_dir, "call_full") is None   # a failure is not recorded
        # the disk has room again: the model's retry (same id) applies, once
        retried = await executor_request(executor, "commitments.complete",
                                         {"commitment_id": item.id, "resolution": "done"}, "call_full")
        again = await executor_request(executor, "commitments.complete",
                                       {"commitment_id": item.id, "resolution": "done"}, "call_full")
        nursery.cancel_scope.cancel()
    assert retried.outcome == "ok" and again.outcome == "replayed" and again.output == retried.output
    assert len(ledger_close_edits(path, item.id)) == 1


FSIZE_CHILD = textwrap.dedent("""
    import json, resource, signal, sys, trio
    from pathlib import Path
    from voiceactors.messages import ToolRequest
    from voiceactors.executor.actor import ToolExecutor
    from voiceactors.settings import Settings
    from voiceactors.tools import ToolContext
    journal, state, item_id, limit = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    from voiceactors import logs
    logs.configure("json", "info")                     # JSON lines on stderr
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)     # a write past the limit fails with EFBIG instead
    async def main():
        settings = Settings(journal=journal, state_dir=state)
        executor = ToolExecutor(settings, ToolContext(journal, state))
        async with trio.open_nursery() as nursery:
            await nursery.start(executor.run)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
            send, receive = trio.open_memory_channel(1)
            await executor.inbox.send(ToolRequest(call_id="rtc_fsize", tool_call_id="call_fsize",
                name="commitments.complete", arguments=json.dumps({"commitment_id": item_id,
                "resolution": "done"}), epoch=0, turn=0, reply=send))
            result = await receive.receive()
            print(json.dumps({"outcome": result.outcome, "output": result.output}), flush=True)
            nursery.cancel_scope.cancel()
    trio.run(main)
""")


def test_file_size_limit_in_a_child_process_fails_the_close_cleanly(tmp_path):
    """A real limit: the child may not write a file bigger than the journal
    file is now (``RLIMIT_FSIZE``), so the rewritten file cannot be written."""
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    item = open_item(journal)
    path = item_file(journal, item)
    before = path.read_bytes()
    run = subprocess.run([sys.executable, "-c", FSIZE_CHILD, str(journal), str(tmp_path / "state"), item.id,
                          str(len(before))], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result == {"outcome": "failed", "output": json.dumps({"error": "tool failed"}, separators=(",", ":"))}
    assert '"tool.failed"' in run.stderr and "File too large" in run.stderr   # the detail: in the log only
    assert path.read_bytes() == before
    assert not list(path.parent.glob("*.tmp"))
    assert ledger.get_item(journal, item.id).state == "open"


# --- the mint endpoint fails --------------------------------------------------------------

def set_voice_config(journal: Path, **voice: Any) -> None:
    path = journal / "config" / "journal.json"
    data = json.loads(path.read_text())
    data["voice"] = voice
    path.write_text(json.dumps(data))


async def error_of(response: Any) -> str:
    data = await response.get_json()
    assert set(data) == {"error"}, data
    return data["error"]


@pytest.fixture
async def sim():
    async with serving_simulator(Simulator(None, api_key=KEY)) as simulator:
        yield simulator


@pytest.mark.parametrize("fault", [500, 502, 503, "timeout", "garbage"])
async def test_mint_fault_is_500_session_unavailable_and_the_next_mint_works(tmp_path, sim, fault):
    journal = write_sample_journal(tmp_path / "journal", days=2, today=DAY)
    settings = Settings(journal=journal, state_dir=tmp_path / "state", openai_api_key_env=KEY,
                        openai_base_url=sim.base_url, mint_timeout_s=0.5)
    app = create_app(settings)
    async with serving(app) as test_app:
        client = test_app.test_client()
        sim.fail_next_mint(fault)
        started = time.monotonic()
        response = await client.post("/api/voice/session")
        assert response.status_code == 500
        assert await error_of(response) == "voice session unavailable"
        assert time.monotonic() - started < 5          # a hung mint is bounded by mint_timeout_s
        response = await client.post("/api/voice/session")
        assert response.status_code == 200
        assert (await response.get_json())["ephemeral_key"] == sim.minted[-1]


# --- the brain backend fails ------------------------------------------------------------------

def claude_settings(journal: Path, tmp_path: Path, sim: Simulator, **changes: Any) -> Settings:
    set_voice_config(journal, brain="claude")
    return Settings(journal=journal, state_dir=tmp_path / "state", openai_api_key_env=KEY,
                    openai_base_url=sim.base_url, claude_command=str(FAKE_CLAUDE)).replace(**changes)


async def test_brain_crash_garbage_and_hang_keep_the_previous_instruction(tmp_path, sim, monkeypatch,
                                                                         autojump_clock):
    """Each failure of the CLI answers 500 and keeps the instruction.

    The clock: trio's runs at real speed and never jumps by itself
    (``rate`` 1, no autojump), with a brain deadline far beyond any
    machine's slowness (a 0.5 s one on real time failed the good run on a
    loaded machine). In ``hang`` mode, once the fake CLI is seen running
    (its ``FAKE_CLAUDE_LOG`` line), the test moves the clock to just short
    of the deadline (still waiting), then past it: the hung CLI is killed
    (SIGTERM) and the refresh answers 500."""
    timeout_s = 20.0
    autojump_clock.rate = 1.0
    autojump_clock.autojump_threshold = math.inf
    runs = tmp_path / "claude-runs.jsonl"
    monkeypatch.setenv("FAKE_CLAUDE_LOG", str(runs))
    journal = write_sample_journal(tmp_path / "journal", days=2, today=DAY)
    app = create_app(claude_settings(journal, tmp_path, sim, brain_timeout_s=timeout_s,
                                     brain_refresh_wait_s=3 * timeout_s))   # the route waits out the kill
    monkeypatch.setenv("FAKE_CLAUDE_MODE", "normal")

    def runs_so_far() -> int:
        return len(runs.read_text().splitlines()) if runs.exists() else 0

    async with serving(app) as test_app:
        client = test_app.test_client()
        response = await client.post("/api/voice/refresh-brain")
        assert response.status_code == 200
        preview = (await response.get_json())["instruction_preview"]
        assert preview.startswith("You are sol.")
        for mode in ("crash", "garbage", "is_error", "nowrap", "hang"):
            monkeypatch.setenv("FAKE_CLAUDE_MODE", mode)
            before = runs_so_far()
            answers: list[Any] = []
            started = trio.current_time()
            async with trio.open_nursery() as nursery:
                async def refresh() -> None:
                    answers.append(await client.post("/api/voice/refresh-brain"))

                nursery.start_soon(refresh)
                if mode == "hang":
                    while runs_so_far() == before:    # the CLI is running (and will never answer)
                        await trio.sleep(0.01)
                    # the brain's run began between `started` and now, its deadline brain_timeout_s later
                    seen = trio.current_time()
                    autojump_clock.jump(max(0.0, started + timeout_s - 0.5 - seen))   # short of it
                    await trio.testing.wait_all_tasks_blocked(cushion=0.05)
                    assert answers == [], "the CLI was given up on before brain_timeout_s"
                    autojump_clock.jump(seen + timeout_s + 0.5 - trio.current_time())  # past it
            elapsed = trio.current_time() - started
            (response,) = answers
            assert response.status_code == 500, mode
            assert await error_of(response) == "brain refresh failed"
            assert runs_so_far() > before, mode           # the CLI ran (a failed --resume runs it again)
            if mode == "hang":       # killed at the deadline (a 202 had the route given up first)
                assert elapsed > timeout_s, elapsed
            else:                                              # it failed by itself
                assert elapsed < timeout_s, (mode, elapsed)
            status = await (await client.get("/api/voice/status")).get_json()
            assert status["brain_ready"] is True, mode           # the previous instruction is kept
        # the voice goes on with the previous instruction
        response = await client.post("/api/voice/session")
        assert response.status_code == 200
        assert sim.client_secret_requests[-1]["body"]["session"]["instructions"].startswith(preview)


@pytest.mark.parametrize("mode", ["crash", "garbage", "hang"])
async def test_brain_that_never_succeeds_is_503_not_ready(tmp_path, sim, monkeypatch, mode):
    journal = write_sample_journal(tmp_path / "journal", days=2, today=DAY)
    app = create_app(claude_settings(journal, tmp_path, sim, brain_timeout_s=0.5, brain_ready_wait_s=0.3))
    monkeypatch.setenv("FAKE_CLAUDE_MODE", mode)
    async with serving(app) as test_app:
        client = test_app.test_client()
        response = await client.post("/api/voice/session")
        assert response.status_code == 503
        assert await error_of(response) == "voice unavailable — brain not ready"
        assert sim.client_secret_requests == []              # nothing minted without an instruction
        status = await (await client.get("/api/voice/status")).get_json()
        assert status["brain_ready"] is False


# --- SIGTERM during live calls -------------------------------------------------------------------

async def test_sigterm_during_live_calls_exits_0_and_flushes_every_record(tmp_path, sim):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    state = tmp_path / "state"
    item = open_item(journal)
    path = item_file(journal, item)
    sim.add_call("rtc_term_idle")                                  # live, nothing happens
    sim.add_call("rtc_term_write", write_scenario(item.id, tail=[]))   # a write, then stays live
    sim.add_call("rtc_term_read", [{"response": {"tool_calls": [{"name": "calendar.today", "arguments": {}}],
                                                 "hold_s": 30}}])    # its response never ends
    env = {**os.environ, "OPENAI_BASE_URL": sim.base_url, "OPENAI_API_KEY": KEY,
           "VOICEACTORS_LOG_FORMAT": "json"}
    env.pop("VOICEACTORS_API_TOKEN", None)
    proc = Child(
        [sys.executable, "-m", "voiceactors.cli", "serve", "--journal", str(journal), "--state-dir", str(state),
         "--host", "127.0.0.1", "--port", "0", "--today", DAY.isoformat()],
        stderr=subprocess.PIPE, env=env, cwd=ROOT)
    lines: list[dict] = []

    async def read_log() -> None:
        buffer = b""
        async for chunk in proc.stderr:
            buffer += chunk
            *done, buffer = buffer.split(b"\n")
            for raw in done:
                try:
                    lines.append(json.loads(raw))
                except ValueError:
                    lines.append({"raw": raw.decode("utf-8", "replace")})

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_log)
            with trio.fail_after(CHILD_START_S):
                while not any(line.get("event") == "server.serving" for line in lines):
                    assert proc.poll() is None, lines
                    await trio.sleep(0.05)
            [serving] = [line for line in lines if line.get("event") == "server.serving"]
            base = serving["urls"][0]
            async with httpx.AsyncClient(base_url=base, timeout=10) as client:
                for call_id in sim.calls:
                    response = await client.post("/api/voice/connect", json={"call_id": call_id})
                    assert response.status_code == 200, response.text
                with trio.fail_after(15):
                    await sim.calls["rtc_term_write"].wait_until(lambda c: "call_w" in c.answered)
                    await sim.calls["rtc_term_read"].wait_until(lambda c: c.outputs != {})
                    for call in sim.calls.values():
                        await call.wait_until(lambda c: c.connection is not None)
                    assert (await client.get("/api/voice/status")).json()["active_sessions"] == 3
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            with trio.fail_after(15):
                code = await proc.wait()
            elapsed = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, lines[-20:]
    assert elapsed < 15
    events = [line.get("event") for line in lines]
    assert "server.shutdown_signal" in events and "server.stopped" in events
    # serving froze the startup heap (gc_policy) after the runtime started
    assert events.index("runtime.started") < events.index("server.heap_frozen")
    [frozen] = [line for line in lines if line.get("event") == "server.heap_frozen"]
    assert frozen["objects"] > 50_000 and frozen["full_collection_every_s"] == 300
    for call_id, call in sim.calls.items():
        record = read_record(record_path(state, call_id))
        assert record[-1]["kind"] == "end" and record[-1]["reason"] == "shutdown", (call_id, record[-1])
        assert call.connection is None                       # every sideband closed
        for out in call.outputs.values():
            assert len(out) == 1                              # nothing answered twice on the way out
    # no write half-applied: the file parses line by line, one edit, its record kept
    assert len(ledger_close_edits(path, item.id)) == 1
    assert json.loads(write_log.load(state, "call_w")["output"])["ok"] is True
    assert not list(journal.rglob("*.tmp"))
