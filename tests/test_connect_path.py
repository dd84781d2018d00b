"""The connect path stays cheap (issue 14, "the connect"; docs/benchmarks.md
§ 13): a call's start does no worker-thread hop for its model, and the
model read still prices the call (or falls back to the default with a
warning when the journal config cannot be read). Real actors against the
simulator on loopback."""

from __future__ import annotations

import threading

from structlog.testing import capture_logs

from voiceactors.config import DEFAULT_VOICE_MODEL, ConfigUnreadable

from tests.calls_support import rig, steady


async def test_the_model_is_read_on_the_trio_thread_and_prices_the_call(tmp_path):
    asked_on: list[threading.Thread] = []

    def model() -> str:
        asked_on.append(threading.current_thread())
        return "gpt-realtime-mini"

    async with rig(tmp_path, steady("clean_close")) as r:
        actor, _ = await r.run_call("rtc_model_thread", model=model)
    assert actor.end_reason == "closed_by_service"
    # a worker-thread hop per connect cost a tenth of its CPU: no hop
    assert asked_on == [threading.main_thread()]
    assert actor.protocol.meter is not None and actor.protocol.meter.model == "gpt-realtime-mini"


async def test_an_unreadable_config_prices_the_call_as_the_default_model(tmp_path):
    def model() -> str:
        raise ConfigUnreadable("voice config unreadable: EIO")

    async with rig(tmp_path, steady("clean_close")) as r:
        with capture_logs() as logs:
            actor, _ = await r.run_call("rtc_model_unreadable", model=model)
    assert actor.end_reason == "closed_by_service"
    assert actor.protocol.meter is not None and actor.protocol.meter.model == DEFAULT_VOICE_MODEL
    warned = [line for line in logs if line["event"] == "call.model_unreadable"]
    assert [line["error"] for line in warned] == ["ConfigUnreadable"]
