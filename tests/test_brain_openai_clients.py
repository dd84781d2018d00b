"""The ``openai`` brain backend shares its OpenAI client across runs (issue 11, leftovers).

It used to build an ``AsyncOpenAI`` client per run (~46 ms of CPU on the
trio thread each). Through the brain actor (the backend chosen by the
journal config) against a loopback stand-in for Chat Completions; counted
with the ``voiceactors_openai_clients_created_total`` metric.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.trio import serve
from quart import request
from quart_trio import QuartTrio

from voiceactors import metrics
from voiceactors.brain.actor import BrainActor
from voiceactors.messages import AwaitReady, RefreshBrain, ask
from voiceactors.journal.sample import write_sample_journal
from voiceactors.settings import Settings

DAY = dt.date(2026, 3, 27)
ANSWER = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-5-mini",
          "choices": [{"index": 0, "finish_reason": "stop",
                       "message": {"role": "assistant", "content": "<voice_instruction>Hi.</voice_instruction>"}}]}


def _clients_created() -> float:
    text = metrics.render()[0].decode()
    match = re.search(r"^voiceactors_openai_clients_created_total (\S+)$", text, re.M)
    assert match, "metric missing"
    return float(match.group(1))


async def test_brain_runs_share_one_openai_client(tmp_path):
    journal = write_sample_journal(tmp_path / "journal", days=1, today=DAY)
    config_file = journal / "config" / "journal.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()),
                                       "voice": {"brain": "openai", "openai_api_key": "sk-brain-clients-1"}}))
    seen: list[str | None] = []
    app = QuartTrio("chat-standin")

    @app.post("/v1/chat/completions")
    async def completions() -> Any:
        seen.append(request.headers.get("Authorization"))
        return ANSWER

    config = HyperConfig()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = config.errorlog = None
    async with trio.open_nursery() as nursery:
        [base] = await nursery.start(lambda task_status: serve(app, config, task_status=task_status))
        actor = BrainActor(Settings(journal=journal, state_dir=tmp_path / "state", openai_base_url=base + "/v1"))
        await nursery.start(actor.run)
        before = _clients_created()
        assert (await ask(actor.inbox, AwaitReady, timeout=30)).instruction == "Hi."
        for _ in range(2):
            state = await ask(actor.inbox, RefreshBrain, timeout=30)
            assert getattr(state, "instruction", None) == "Hi.", state
        assert len(seen) == 3 and set(seen) == {"Bearer sk-brain-clients-1"}
        assert _clients_created() - before == 1          # one client for three runs, not three
        nursery.cancel_scope.cancel()
