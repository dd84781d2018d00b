"""The phone webhook (``POST /api/voice/phone/incoming``, ``http/phone.py``):
its signature checked through the SDK before anything else, each delivery
acting once (also across a restart and when two arrive at once), and who
may call: the owner's numbers only, read from ``P-Asserted-Identity`` else
``From``. Against the simulator and a served app over loopback."""

from __future__ import annotations

import json
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import httpx
import pytest
import trio

from voiceactors.http import errors as E
from voiceactors.http.phone import deliveries_path
from voiceactors.server import run_server
from voiceactors.settings import Settings
from voiceactors.simulator import Simulator
from voiceactors.simulator import phone as sim_phone
from simulator_support import serving_simulator

SIM_KEY = "sk-test-phone-7c1d2e3f"
OWNER = "+15551234567"
STRANGER = "+447700900123"


@pytest.fixture
async def sim():
    async with serving_simulator(Simulator("silence", api_key=SIM_KEY)) as simulator:
        yield simulator


def write_voice(journal: Path, **voice: Any) -> None:
    path = journal / "config" / "journal.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data["voice"] = {**data.get("voice", {}), **voice}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


@asynccontextmanager
async def served(settings: Settings) -> AsyncIterator[str]:
    """The app served over loopback; yields its base URL."""
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        [base] = await nursery.start(lambda task_status: run_server(settings, shutdown_trigger=stop.wait,
                                                                     task_status=task_status))
        try:
            yield base
        finally:
            stop.set()


def make_settings(journal: Path, state: Path, sim: Simulator, **changes: Any) -> Settings:
    return Settings(journal=journal, state_dir=state, openai_api_key_env=SIM_KEY, openai_base_url=sim.base_url,
                    port=0, close_deadline_s=1.0).replace(**changes)


@pytest.fixture
def journal(make_sample) -> Path:
    return make_sample(days=2)


@pytest.fixture
def secret() -> str:
    return sim_phone.new_secret()


def placed(sim: Simulator, secret: str, caller: str | None = OWNER, *, asserted: str | None = None,
           **signing: Any) -> tuple[Any, sim_phone.Delivery]:
    call = sim.place_phone_call()
    event = sim_phone.incoming_event(call.call_id, sim_phone.sip_headers(caller, asserted=asserted))
    return call, sim_phone.delivery(event, secret, **signing)


async def test_without_a_secret_the_webhook_is_unavailable_and_status_says_so(journal, tmp_path, sim, secret):
    settings = make_settings(journal, tmp_path / "state", sim)
    async with served(settings) as base:
        call, sent = placed(sim, secret)
        answer = await sim_phone.post(base, sent)
        assert answer.status_code == 503 and answer.json() == {"error": E.PHONE_UNAVAILABLE}
        async with httpx.AsyncClient(base_url=base) as client:
            assert (await client.get("/api/voice/status")).json()["phone_configured"] is False
    assert call.accepted is None and call.rejected_with is None


async def test_each_bad_signature_is_400_and_nothing_happens(journal, tmp_path, sim, secret):
    write_voice(journal, webhook_secret=secret, phone={"allowed_callers": [OWNER]})
    settings = make_settings(journal, tmp_path / "state", sim)
    async with served(settings) as base:
        async with httpx.AsyncClient(base_url=base) as client:
            assert (await client.get("/api/voice/status")).json()["phone_configured"] is True
        call, forged = placed(sim, secret, signed_with=sim_phone.new_secret())
        stale = placed(sim, secret, timestamp=int(time.time()) - 301)[1]
        ahead = placed(sim, secret, timestamp=int(time.time()) + 400)[1]
        altered = placed(sim, secret)[1]
        altered.body = altered.body.replace(OWNER.encode(), STRANGER.encode())
        expected = [(forged, E.WEBHOOK_FORGED), (stale, E.WEBHOOK_STALE), (ahead, E.WEBHOOK_STALE),
                    (altered, E.WEBHOOK_FORGED)]
        for header in ("webhook-id", "webhook-timestamp", "webhook-signature"):
            missing = placed(sim, secret)[1]
            del missing.headers[header]
            expected.append((missing, E.WEBHOOK_UNSIGNED))
        unsigned = placed(sim, secret)[1]
        unsigned.headers = {"content-type": "application/json"}
        expected.append((unsigned, E.WEBHOOK_UNSIGNED))
        for sent, message in expected:
            answer = await sim_phone.post(base, sent)
            assert (answer.status_code, answer.json()) == (400, {"error": message}), sent.headers
    # no call was answered, no sideband opened, no delivery remembered
    assert all(c.accepted is None and c.rejected_with is None for c in sim.calls.values())
    assert sim.handshakes == []
    assert not deliveries_path(settings.state_dir).exists()


async def test_a_verified_body_that_is_not_the_event_is_malformed_and_other_events_are_ignored(
        journal, tmp_path, sim, secret):
    write_voice(journal, webhook_secret=secret, phone={"allowed_callers": [OWNER]})
    async with served(make_settings(journal, tmp_path / "state", sim)) as base:
        broken = sim_phone.delivery({"type": "realtime.call.incoming", "data": {"call_id": 7}}, secret)
        answer = await sim_phone.post(base, broken)
        assert (answer.status_code, answer.json()) == (400, {"error": E.WEBHOOK_MALFORMED})
        other = sim_phone.delivery({"id": "evt_1", "object": "event", "created_at": 1, "type": "batch.completed",
                                    "data": {"id": "batch_1"}}, secret)
        answer = await sim_phone.post(base, other)
        assert (answer.status_code, answer.json()) == (200, {"status": "ignored"})


async def test_the_webhook_needs_no_bearer_token_its_signature_is_its_authentication(
        journal, tmp_path, sim, secret):
    write_voice(journal, webhook_secret=secret, phone={"allowed_callers": []})
    async with served(make_settings(journal, tmp_path / "state", sim, api_token="tok-phone-123")) as base:
        call, sent = placed(sim, secret, STRANGER)
        answer = await sim_phone.post(base, sent)
        assert (answer.status_code, answer.json()) == (200, {"status": "rejected"})
        assert call.rejected_with == 403
        async with httpx.AsyncClient(base_url=base) as client:    # the rest of the API still wants it
            assert (await client.get("/api/voice/status")).status_code == 401


async def test_a_replayed_delivery_acts_once_in_turn_at_once_and_after_a_restart(journal, tmp_path, sim, secret):
    write_voice(journal, webhook_secret=secret, phone={"allowed_callers": [OWNER]})
    settings = make_settings(journal, tmp_path / "state", sim)
    call, sent = placed(sim, secret, STRANGER)
    twin_call, twin = placed(sim, secret, STRANGER)
    async with served(settings) as base:
        first = await sim_phone.post(base, sent)
        again = await sim_phone.post(base, sent)
        assert [first.json(), again.json()] == [{"status": "rejected"}, {"status": "duplicate"}]
        assert again.status_code == 200
        answers: list[dict] = []

        async def post_twin() -> None:
            answers.append((await sim_phone.post(base, twin)).json())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(post_twin)
            nursery.start_soon(post_twin)
        assert sorted(a["status"] for a in answers) == ["duplicate", "rejected"]
    remembered = json.loads(deliveries_path(settings.state_dir).read_text())
    assert set(remembered) == {sent.webhook_id, twin.webhook_id}
    # a new server on the same state folder remembers them
    async with served(settings) as base:
        assert (await sim_phone.post(base, sent)).json() == {"status": "duplicate"}
    rejects = [c.rejected_with for c in (call, twin_call)]
    assert rejects == [403, 403]
    assert sim.handshakes == []


@pytest.mark.parametrize("caller, asserted, status", [
    (STRANGER, None, 403),                 # a number not the owner's
    (None, None, 433),                     # withheld: anonymous From, nothing asserted
    (OWNER, STRANGER, 403),                # From spoofed as the owner's; the trunk asserts who it is
    (OWNER, "anonymous", 433),             # the trunk asserts nothing we can check: From is not read
], ids=["unknown", "withheld", "spoofed_from", "asserted_anonymous"])
async def test_a_caller_not_the_owner_is_rejected_through_the_service_with_no_sideband(
        journal, tmp_path, sim, secret, caller, asserted, status):
    write_voice(journal, webhook_secret=secret, phone={"allowed_callers": [OWNER]})
    async with served(make_settings(journal, tmp_path / "state", sim)) as base:
        call = sim.place_phone_call()
        headers = sim_phone.sip_headers(caller)
        if asserted == "anonymous":
            headers.append(("P-Asserted-Identity", "<sip:anonymous@anonymous.invalid>"))
        elif asserted is not None:
            headers.append(("P-Asserted-Identity", f"<tel:{asserted}>"))
        answer = await sim_phone.post(base, sim_phone.delivery(sim_phone.incoming_event(call.call_id, headers),
                                                               secret))
        assert (answer.status_code, answer.json()) == (200, {"status": "rejected"})
    assert call.rejected_with == status and call.accepted is None
    assert sim.handshakes == [] and not (tmp_path / "state" / "calls" / f"{call.call_id}.jsonl").exists()


async def test_a_pin_edited_into_something_that_is_not_one_refuses_calls_rather_than_open_them(
        journal, tmp_path, sim, secret):
    write_voice(journal, webhook_secret=secret, phone={"allowed_callers": [OWNER], "pin": "2468"})
    async with served(make_settings(journal, tmp_path / "state", sim)) as base:
        write_voice(journal, phone={"allowed_callers": [OWNER], "pin": "24"})      # while serving
        call, sent = placed(sim, secret)
        answer = await sim_phone.post(base, sent)
        assert (answer.status_code, answer.json()) == (200, {"status": "rejected"})
    assert call.rejected_with == 480 and call.accepted is None and sim.handshakes == []


async def test_a_call_the_service_cannot_be_told_about_is_forgotten_so_its_retry_acts(
        journal, tmp_path, sim, secret):
    write_voice(journal, webhook_secret=secret, phone={"allowed_callers": [OWNER]})
    settings = make_settings(journal, tmp_path / "state", sim)
    async with served(settings) as base:
        call, sent = placed(sim, secret, STRANGER)
        call.sip = False                      # the service does not know the call: its reject is 404
        answer = await sim_phone.post(base, sent)
        assert (answer.status_code, answer.json()) == (502, {"error": E.PHONE_ANSWER_FAILED})
        call.sip = True                       # the service's retry of the same delivery
        answer = await sim_phone.post(base, sent)
        assert (answer.status_code, answer.json()) == (200, {"status": "rejected"})
    assert call.rejected_with == 403


async def test_the_owners_call_when_the_server_is_full_is_turned_away_with_480(journal, tmp_path, sim, secret):
    write_voice(journal, webhook_secret=secret, phone={"allowed_callers": [OWNER]})
    async with served(make_settings(journal, tmp_path / "state", sim, max_calls=1)) as base:
        first, sent = placed(sim, secret)
        assert (await sim_phone.post(base, sent)).json() == {"status": "accepted"}
        with trio.fail_after(20):
            await first.wait_until(lambda c: c.connection is not None)       # live: "silence"
        second, sent = placed(sim, secret)
        assert (await sim_phone.post(base, sent)).json() == {"status": "rejected"}
    assert first.accepted is not None and (second.rejected_with, second.accepted) == (480, None)
