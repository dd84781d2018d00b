"""One stuck journal lock (issue 11, item 7): a real second process holds
``fcntl.flock`` on one day file's lock, as a hung solstone writer would.

Writes to that file answer ``journal busy`` once ``journal_lock_timeout_s``
has passed on trio's clock, with nothing applied and nothing recorded (a
retry with the same id applies once the lock is free). Everything else goes
on meanwhile: a write to another day file, a read tool, ``GET
/api/voice/status`` (its key lookup runs in a worker thread) and a call
record, through the server's real app and runtime.

The waiting writes poll the lock on trio's clock (``settled_clock``). While
the other requests run, a task that never sleeps keeps the clock from
jumping, so "while the writes are stuck" holds by construction: trio time
does not move until the others are done.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import trio

from clock_support import real_time_limit, serving, without_clock_jumps
from voiceactors import storage
from voiceactors.executor import write_log
from voiceactors.call.record import CallRecord, read_record
from voiceactors.messages import ToolRequest, ask
from voiceactors.executor.actor import JOURNAL_BUSY
from voiceactors.http import create_app, voice_state
from voiceactors.journal import ledger
from voiceactors.journal.sample import write_sample_journal
from voiceactors.settings import Settings

DAY = dt.date(2026, 3, 27)
KEY = "sk-test-stuck-lock-0123456789"
BOUND_S = 3.0
STUCK = 20          # more than storage.THREADS: before the fix these alone froze every worker thread

LOCK_HOLDER = """
import fcntl, sys
with open(sys.argv[1] + ".lock", "a+b") as lock:
    fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
    print("locked", flush=True)
    sys.stdin.readline()                 # hold it until told
"""


def day_file(journal: Path, item_id: str) -> Path:
    ref = ledger._derived(journal).opening[item_id]   # noqa: SLF001 - where the item lives
    return journal / "facets" / ref.facet / "activities" / f"{ref.day}.jsonl"


def close_edits(path: Path, item_id: str) -> list[dict]:
    return [e for line in storage.jsonl_lines(path.read_text(encoding="utf-8"))
            for e in json.loads(line).get("edits") or []
            if e.get("fields") == ["ledger_close"] and e["ledger_close"]["item_id"] == item_id]


async def tool(inbox, name: str, args: dict, tool_call_id: str, call_id: str) -> Any:
    return await ask(inbox, lambda reply: ToolRequest(call_id=call_id, tool_call_id=tool_call_id, name=name,
                                                      arguments=json.dumps(args), epoch=0, turn=0, reply=reply),
                     timeout=math.inf)   # autojump: the test bounds it


async def exercise(app, test_app, settings, journal, stuck_item, stuck_path, other_item, before, holder):
    """The test's body, inside the running app: returns the retry's two answers."""
    client = test_app.test_client()
    inbox = voice_state(app).runtime.tools
    answered: list[tuple[float, Any]] = []
    async with trio.open_nursery() as nursery:
        started = trio.current_time()

        async def stuck_write(n: int) -> None:
            result = await tool(inbox, "commitments.complete",
                                {"commitment_id": stuck_item.id, "resolution": "done"},
                                f"call_stuck_{n}", f"rtc_stuck_{n}")
            answered.append((trio.current_time() - started, result))

        for n in range(STUCK):
            nursery.start_soon(stuck_write, n)

        async def the_others() -> dict[str, Any]:
            with real_time_limit(30):
                while storage.write_limiter().borrowed_tokens < STUCK:   # every stuck write is waiting
                    await trio.sleep(0)
                out = {
                    "write": await tool(inbox, "commitments.complete",
                                        {"commitment_id": other_item.id, "resolution": "sent"},
                                        "call_other", "rtc_other"),
                    "read": await tool(inbox, "commitments.list", {"state": "open"}, "call_read", "rtc_read"),
                }
                response = await client.get("/api/voice/status")
                out["status"] = (response.status_code, await response.get_json())
                record = CallRecord("rtc_record", settings.state_dir, write_now=True)
                async with trio.open_nursery() as writer:
                    await writer.start(record.run)
                    record.add("end", reason="test")
                    await record.close()
                out["record"] = read_record(record.path)
                out["stuck_answered"] = list(answered)
                out["elapsed"] = trio.current_time() - started
                return out

        others = await without_clock_jumps(the_others)

    # everything else answered while every stuck write was still waiting
    assert others["stuck_answered"] == [] and others["elapsed"] == 0
    assert others["write"].outcome == "ok" and json.loads(others["write"].output)["ok"] is True
    assert ledger.get_item(journal, other_item.id).state == "closed"
    assert others["read"].outcome == "ok" and "commitments" in json.loads(others["read"].output)
    assert others["status"][0] == 200 and others["status"][1]["openai_configured"] is True
    assert [line["kind"] for line in others["record"]] == ["start", "end"]

    # each stuck write: a clear error once the bound has passed, nothing applied or recorded
    assert len(answered) == STUCK
    for elapsed, result in answered:
        assert json.loads(result.output) == JOURNAL_BUSY and result.outcome == "busy"
        assert BOUND_S <= elapsed <= BOUND_S + 0.3
    assert stuck_path.read_bytes() == before
    assert all(write_log.load(settings.state_dir, f"call_stuck_{n}") is None for n in range(STUCK))
    assert ledger.get_item(journal, stuck_item.id).state == "open"

    # the other writer lets go: the model's retry (same id) applies, once
    holder.stdin.write("\n")
    holder.stdin.flush()
    await trio.to_thread.run_sync(holder.wait, 10)

    async def retry_twice() -> tuple[Any, Any]:
        # the write runs in a worker thread; on a loaded machine it can take
        # longer than settled_clock's 50 ms of idleness, and a jump then would
        # fire the write's deadline (20 s on trio's clock) that real time never reaches
        with real_time_limit(30):
            args = {"commitment_id": stuck_item.id, "resolution": "done"}
            retried = await tool(inbox, "commitments.complete", args, "call_stuck_0", "rtc_stuck_0")
            again = await tool(inbox, "commitments.complete", args, "call_stuck_0", "rtc_stuck_0")
            return retried, again

    return await without_clock_jumps(retry_twice)


async def test_a_stuck_day_file_lock_fails_its_writes_in_time_and_holds_up_nothing_else(tmp_path, settled_clock):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    items = ledger.list_items(journal, state="open", top=None)
    stuck_item = items[0]
    stuck_path = day_file(journal, stuck_item.id)
    other_item = next(i for i in items if day_file(journal, i.id) != stuck_path)
    before = stuck_path.read_bytes()
    settings = Settings(journal=journal, state_dir=tmp_path / "state", openai_api_key_env=KEY,
                        openai_base_url="http://127.0.0.1:9/v1", journal_lock_timeout_s=BOUND_S)
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(stuck_path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert (await trio.to_thread.run_sync(holder.stdout.readline)).strip() == "locked"
    app = create_app(settings)
    async with serving(app) as test_app:
        try:
            retried, again = await exercise(app, test_app, settings, journal, stuck_item, stuck_path,
                                            other_item, before, holder)
        finally:   # before the app's shutdown waits for writes: let stuck ones (old code: forever) go
            if holder.poll() is None:
                holder.kill()
            await trio.to_thread.run_sync(holder.wait, 10)
    assert retried.outcome == "ok" and json.loads(retried.output)["commitment"]["state"] == "closed"
    assert again.outcome == "replayed" and again.output == retried.output
    assert len(close_edits(stuck_path, stuck_item.id)) == 1
