"""A live call whose journal config becomes unreadable (issue 11, leftovers).

The call reads the OpenAI key from the journal config at every connect
attempt. When the config exists but cannot be read (a directory in its
place: ``EISDIR``, as ``EMFILE`` or ``EIO`` would), that attempt fails like a
failed connect: retried with backoff and counted toward the reconnect limit.
It used to crash the call (``call.crashed``, end reason ``error``).

Through the real server (``run_server``: hypercorn on loopback, the runtime,
the simulator as OpenAI); the key lives only in the journal config.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any, AsyncIterator

import httpx
import pytest
import trio

from voiceactors.call.record import read_record, record_path
from voiceactors.journal.sample import write_sample_journal
from voiceactors.simulator import Simulator
from voiceactors.server import run_server
from voiceactors.settings import Settings

DAY = dt.date(2026, 3, 27)
KEY = "sk-config-unreadable-test-42"
HOLD = [{"user_turn": {"text": "hi"}}, {"sleep": 600.0}, {"close": 1000}]


@pytest.fixture
async def served(tmp_path) -> AsyncIterator[dict[str, Any]]:
    journal = write_sample_journal(tmp_path / "journal", days=1, today=DAY)
    config_file = journal / "config" / "journal.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "voice": {"openai_api_key": KEY}}))
    sim = Simulator(None, api_key=KEY)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.serve, 0)
        settings = Settings(journal=journal, state_dir=tmp_path / "state", port=0, openai_base_url=sim.base_url,
                            reconnect_base_s=0.05, reconnect_max_s=0.3, reconnect_attempts=6,
                            shutdown_deadline_s=3.0, close_deadline_s=1.0, rate_limit_per_s=0)
        [base] = await nursery.start(lambda task_status: run_server(settings, shutdown_trigger=stop.wait,
                                                                     task_status=task_status))
        yield {"sim": sim, "base": base, "settings": settings, "config": config_file}
        stop.set()
        nursery.cancel_scope.cancel()


async def _start_call(served: dict[str, Any], call_id: str) -> Any:
    sim = served["sim"]
    sim_call = sim.add_call(call_id, HOLD)
    async with httpx.AsyncClient(base_url=served["base"], timeout=10) as client:
        response = await client.post("/api/voice/connect", json={"call_id": call_id})
        assert response.status_code == 200, response.text
    with trio.fail_after(10):
        await sim_call.wait_until(lambda c: c.connection is not None)
    return sim_call


async def _ended(served: dict[str, Any], call_id: str) -> list[dict]:
    path = record_path(served["settings"].state_dir, call_id)
    with trio.fail_after(15):
        while True:
            lines = read_record(path) if path.exists() else []
            if any(line.get("kind") == "end" or line.get("type") == "end" for line in lines):
                return lines
            await trio.sleep(0.05)


def _unreadable(config: Path) -> str:
    text = config.read_text()
    config.unlink()
    config.mkdir()          # reading it now fails with EISDIR
    return text


def _end_reason(lines: list[dict]) -> str:
    [end] = [line for line in lines if line.get("kind") == "end" or line.get("type") == "end"]
    return end["reason"]


def _reconnects(lines: list[dict]) -> list[dict]:
    return [line for line in lines if (line.get("kind") or line.get("type")) == "reconnect"]


async def test_an_unreadable_config_is_retried_and_the_call_goes_on_once_it_reads(served):
    sim_call = await _start_call(served, "rtc_cfg_back")
    text = _unreadable(served["config"])
    served["sim"].drop("rtc_cfg_back")                 # the next connect attempt reads the config
    await trio.sleep(0.4)                              # a few attempts fail meanwhile
    assert sim_call.connections == 1
    served["config"].rmdir()
    served["config"].write_text(text)
    with trio.fail_after(10):
        await sim_call.wait_until(lambda c: c.connections == 2)
    await served["sim"].end_call("rtc_cfg_back", 1000)
    lines = await _ended(served, "rtc_cfg_back")
    assert _end_reason(lines) == "closed_by_service"
    assert len(_reconnects(lines)) >= 2                # the failed attempts were retried with backoff


async def test_a_config_that_never_reads_again_ends_the_call_with_a_clear_reason(served):
    sim_call = await _start_call(served, "rtc_cfg_gone")
    _unreadable(served["config"])
    served["sim"].drop("rtc_cfg_gone")
    lines = await _ended(served, "rtc_cfg_gone")
    assert _end_reason(lines) == "config_unreadable"
    assert len(_reconnects(lines)) == 6                # counted toward reconnect_attempts
    assert sim_call.connections == 1
