"""Everything the state folder holds is its user's alone (issue 34): call
records carry transcripts, captures the service's events, the write log the
tools' results. Under a umask of 022 a real ``voiceactors serve`` child's
call (a write, a search, usage, a capture) leaves only files of mode 0600
and folders of mode 0700; so do the brain's session file and the journal's
lock files."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import httpx
import trio

from calls_support import DAY, KEY
from test_call_crash import Server, stop_all, stop_cleanly
from test_reliability_faults import open_item
from voiceactors.brain.session_file import save_session_id, session_path
from voiceactors.journal.sample import write_sample_journal
from voiceactors.simulator import Simulator
from voiceactors.storage import file_lock

CALL = "rtc_private"
UMASK = 0o022


def modes(root: Path) -> dict[str, str]:
    """Each entry under ``root`` (and ``root``) by its mode, in octal."""
    found = {".": oct(stat.S_IMODE(root.stat().st_mode))}
    for path in sorted(root.rglob("*")):
        found[str(path.relative_to(root))] = oct(stat.S_IMODE(path.lstat().st_mode))
    return found


def not_private(root: Path) -> dict[str, str]:
    wrong = {}
    for name, mode in modes(root).items():
        path = root / name
        want = "0o700" if path.is_dir() else "0o600"
        if mode != want:
            wrong[name] = mode
    return wrong


async def test_a_servers_state_folder_is_private_whatever_the_umask(tmp_path):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    item = open_item(journal)
    state = tmp_path / "state"
    sim = Simulator(None, api_key=KEY)
    call = sim.add_call(CALL, [
        {"user_turn": {"text": "close it, and find the standup"}},
        {"response": {"tool_calls": [
            {"name": "commitments.complete", "call_id": "call_w",
             "arguments": {"commitment_id": item.id, "resolution": "done"}},
            {"name": "journal.search", "call_id": "call_s", "arguments": {"query": "standup"}},
        ]}},
        {"wait_outputs": {"timeout_s": 60}},
        {"response": {"text": "Done, and found it."}},
        {"close": 1000},
    ])
    server: Server | None = None
    previous = os.umask(UMASK)          # the child inherits it
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            server = Server(journal, state, sim)
            server.args.append("--record-events")
            url = await server.start(nursery)
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                assert (await client.post("/api/voice/connect", json={"call_id": CALL})).status_code == 200
                with trio.fail_after(60):
                    await call.wait_until(lambda c: c.closed and c.connection is None)
                with trio.fail_after(30):
                    while not (await client.get(f"/api/voice/calls/{CALL}")).json()["call"]["ended"]:
                        await trio.sleep(0.05)
            await stop_cleanly(server)
            nursery.cancel_scope.cancel()
    finally:
        os.umask(previous)
        stop_all(server)
    held = {name.split("/")[0] for name in modes(state)}
    assert {"calls", "captures", "tool-writes", "usage", "search", "server.lock"} <= held, sorted(held)
    assert not_private(state) == {}, json.dumps(modes(state))


def test_the_brain_session_file_and_lock_files_are_private_whatever_the_umask(tmp_path):
    journal = tmp_path / "journal"
    journal.mkdir()
    previous = os.umask(UMASK)
    try:
        save_session_id(journal, "session-1")
        with file_lock(journal / "facets.jsonl", timeout_s=1):
            pass
    finally:
        os.umask(previous)
    path = session_path(journal)
    assert oct(stat.S_IMODE(path.stat().st_mode)) == "0o600"
    assert oct(stat.S_IMODE(path.parent.stat().st_mode)) == "0o700"
    assert oct(stat.S_IMODE((journal / "facets.jsonl.lock").stat().st_mode)) == "0o600"
