"""Budgets: a call that reaches ``call_budget_usd`` says goodbye within the
protocol rules and is hung up (``budget_spent``); the day's total against
``daily_budget_usd`` closes ``POST /api/voice/session`` until the next day."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
import trio

from calls_support import rig, steady
from test_call_protocol import Wire, created, error, item_added, item_done
from clock_support import serving
from voiceactors.call.protocol import EndCall, EndReason, Send, Timer, WakeAt
from voiceactors.call.meter import FAREWELL, FAREWELL_MAX_S, GRACE_S, meter_for
from voiceactors.usage.daily import DailyUsage, daily_path
from voiceactors.http import create_app
from voiceactors.settings import Settings
from voiceactors.simulator import Simulator

DAY = dt.date(2026, 3, 27)
PRICES = Settings.from_env({}).prices
# 100*4 + 40*16 + 300*32 + 150*64 + 600*0.4 = 20480 per million: $0.02048 a response
USAGE = {"input_token_details": {"text_tokens": 300, "audio_tokens": 700, "cached_tokens": 600,
                                 "cached_tokens_details": {"text_tokens": 200, "audio_tokens": 400}},
         "output_token_details": {"text_tokens": 40, "audio_tokens": 150}}


def done(rid: str, output: list[dict] | None = None, status: str = "completed") -> dict:
    return {"type": "response.done",
            "response": {"id": rid, "status": status, "output": output or [], "usage": USAGE}}


def budgeted(budget_usd: float = 0.03) -> Wire:
    w = Wire()
    w.p.meter = meter_for("gpt-realtime", PRICES, budget_usd)
    return w


def farewells(w: Wire) -> list[Send]:
    return [c for c in w.creates() if c.event.get("response") == FAREWELL]


# --- the protocol -------------------------------------------------------------------------------

def test_under_the_budget_nothing_happens_then_one_farewell_then_the_end_after_the_grace():
    w = budgeted()
    w.server(created("r1"), done("r1"))                      # $0.02048: under
    assert w.creates() == [] and w.records("budget") == []
    w.now = 5.0
    w.server(created("r2"), done("r2"))                      # $0.04096: over
    (budget,) = w.records("budget")
    assert budget == {"budget_usd": 0.03, "cost_usd": 0.04096}
    assert w.of(WakeAt)[-1].at == 5.0 + FAREWELL_MAX_S      # the latest end, whatever comes
    (farewell,) = w.creates()
    assert farewell.event["response"] == {"instructions": FAREWELL["instructions"], "tool_choice": "none"}
    w.write()
    w.now = 6.0
    w.server(created("r3"))
    w.now = 8.0
    w.server(done("r3"))                                     # the goodbye was said
    assert w.of(WakeAt)[-1].at == 8.0 + GRACE_S
    w.now = 8.0 + GRACE_S - 0.1
    assert not [e for e in w.feed(Timer()) if isinstance(e, EndCall)]
    w.now = 8.0 + GRACE_S
    assert w.feed(Timer()) == [EndCall(EndReason.BUDGET)]
    assert w.feed(Timer()) == []                             # once
    assert len(w.creates()) == 1 and w.p.budget_wake == float("inf")


def test_the_farewell_waits_for_an_active_response_and_for_the_outputs_of_its_batch():
    w = budgeted(0.02)
    w.server(created("r1"), created("r_model"))              # the model has another response going
    w.server(item_added("r1", "c1"), item_done("r1", "c1"), done("r1", [
        {"id": "item_c1", "type": "function_call", "status": "completed", "name": "calendar.today",
         "call_id": "c1", "arguments": "{}"}]))
    assert w.records("budget") and w.started() == ["c1"]
    assert w.creates() == []                                 # a response is active: no create
    w.server(done("r_model"))
    assert w.creates() == []                                 # the tool's output is not written yet
    w.finish("c1")
    w.write()
    (farewell,) = w.creates()
    assert farewell.event["response"] == FAREWELL           # the farewell carries the batch forward too
    assert w.p.creates[farewell.event["event_id"]].batches == ["r1"]
    assert w.p.batches["r1"].follow_up == "ours"


def test_a_refused_farewell_is_asked_again_and_no_other_create_goes_out():
    w = budgeted(0.02)
    w.server(created("r1"), done("r1"))
    (first,) = w.creates()
    w.write()
    w.server(created("r_user"), error("conversation_already_has_active_response", first.event["event_id"]))
    assert len(w.creates()) == 1
    w.server(done("r_user"))
    assert [c.event["response"] for c in w.creates()] == [FAREWELL, FAREWELL]


def test_a_farewell_never_answered_still_ends_the_call():
    w = budgeted(0.02)
    w.server(created("r1"), done("r1"))
    w.write()
    w.now = FAREWELL_MAX_S
    assert w.feed(Timer()) == [EndCall(EndReason.BUDGET)]


def test_no_budget_or_no_prices_never_ends_a_call():
    for model, budget in (("gpt-realtime", 0.0), ("unpriced-model", 0.01)):
        w = Wire()
        w.p.meter = meter_for(model, PRICES, budget)
        for i in range(5):
            w.server(created(f"r{i}"), done(f"r{i}"))
        w.now = 10_000
        assert not [e for e in w.feed(Timer()) if isinstance(e, EndCall)] and w.creates() == []
    assert len(w.logs("usage.unpriced")) == 1


# --- end to end on the simulator ------------------------------------------------------------------

BUDGET_CALL = [
    {"user_turn": {"text": "hello there"}},
    {"response": {"text": "Hi."}},                 # $0.001296 (test_usage): past a $0.001 budget
    {"wait_outputs": {}},                          # our farewell's response.create
    {"response": {"text": "Sorry, this call has to end now."}},
    {"sleep": 600},
    {"close": 1000},
]


async def test_a_call_reaching_its_budget_says_goodbye_and_is_hung_up(tmp_path, autojump_clock):
    async with rig(tmp_path, call_budget_usd=0.001) as r:
        feed = r.hub.open("rtc_budget")
        events = feed.subscribe()
        actor, sc = await r.run_call("rtc_budget", steady(BUDGET_CALL), feed=feed)
        record = r.record("rtc_budget")
    assert actor.end_reason == "budget_spent"
    (create,) = [e for e in sc.received if e["type"] == "response.create"]
    assert create["response"] == FAREWELL
    assert sc.errors_sent == [] and sc.violations == []
    assert [x.status for x in sc.responses] == ["completed", "completed"]
    farewell_done = sc.responses[1].ended_at
    assert farewell_done is not None and actor.ended_at - farewell_done == pytest.approx(GRACE_S, abs=0.05)
    assert r.sim.hangups == ["rtc_budget"] and sc.closed
    kinds = [line["kind"] for line in record]
    assert kinds.index("budget") < kinds.index("end")
    assert record[-1]["reason"] == "budget_spent"
    seen = []
    while True:
        try:
            seen.append(events.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            break
    assert seen[-1] == {"call_id": "rtc_budget", "type": "call.ended", "reason": "budget_spent"}


# --- the day's total ------------------------------------------------------------------------------

async def test_the_daily_total_is_written_atomically_and_read_back_for_the_same_day_only(tmp_path,
                                                                                         autojump_clock):
    today = [DAY]
    daily = DailyUsage(tmp_path, 1.0, today=lambda: today[0])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(daily.run_writer)
        daily.add(0.25)
        daily.add(0.5)
        await trio.sleep(2)
        nursery.cancel_scope.cancel()
    assert json.loads(daily_path(tmp_path).read_text()) == {"day": "2026-03-27", "cost_usd": 0.75}
    assert [p.name for p in daily_path(tmp_path).parent.iterdir()] == ["daily.json"]   # no temp file left
    again = DailyUsage(tmp_path, 0.7, today=lambda: today[0])
    again.load()
    assert again.state().cost_usd == 0.75 and again.state().spent
    today[0] = DAY + dt.timedelta(days=1)
    assert again.state().cost_usd == 0.0 and not again.state().spent
    tomorrow = DailyUsage(tmp_path, 0.7, today=lambda: today[0])
    tomorrow.load()
    assert tomorrow.state().cost_usd == 0.0


def test_an_unreadable_daily_file_counts_zero_and_is_logged(tmp_path, log_stream):
    daily_path(tmp_path).parent.mkdir(parents=True)
    daily_path(tmp_path).write_text('{"day": "2026-03-27", "cost_usd": "lots"}')
    daily = DailyUsage(tmp_path, 1.0, today=lambda: DAY)
    daily.load()
    assert daily.state().cost_usd == 0.0
    assert "supervisor.daily_usage_unreadable" in log_stream.getvalue()


def _spent(state_dir: Path, day: dt.date, cost: float) -> None:
    daily_path(state_dir).parent.mkdir(parents=True, exist_ok=True)
    daily_path(state_dir).write_text(json.dumps({"day": day.isoformat(), "cost_usd": cost}))


async def test_daily_budget_spent_is_503_until_the_next_day(make_sample, tmp_path, pin_today):
    pin_today(DAY.isoformat())
    _spent(tmp_path / "state", DAY, 0.6)
    settings = Settings(journal=make_sample(days=2), state_dir=tmp_path / "state", openai_api_key_env="sk-test-1234",
                        openai_base_url="http://127.0.0.1:9/v1", daily_budget_usd=0.5, rate_limit_per_s=0)
    app = create_app(settings)
    async with serving(app) as test_app:
        client = test_app.test_client()
        response = await client.post("/api/voice/session")
        assert response.status_code == 503
        assert await response.get_json() == {"error": "voice unavailable — budget spent"}
        status = await (await client.get("/api/voice/status")).get_json()
        assert status["budget_spent"] is True and status["daily_cost_usd"] == 0.6
        assert status["daily_budget_usd"] == 0.5
        pin_today((DAY + dt.timedelta(days=1)).isoformat())
        response = await client.post("/api/voice/session")
        # past the budget check: the mint itself fails against the dead base URL
        assert response.status_code == 500
        assert await response.get_json() == {"error": "voice session unavailable"}
        status = await (await client.get("/api/voice/status")).get_json()
        assert status["budget_spent"] is False and status["daily_cost_usd"] == 0.0


async def test_calls_spend_the_daily_budget_and_it_survives_a_restart(make_sample, tmp_path, pin_today):
    pin_today(DAY.isoformat())
    key = "sk-test-daily-0123456789"
    sim = Simulator([{"user_turn": {"text": "hello there"}}, {"response": {"text": "Hi."}}, {"close": 1000}],
                    api_key=key)
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.serve, 0)
        settings = Settings(journal=make_sample(days=2), state_dir=tmp_path / "state", openai_api_key_env=key,
                            openai_base_url=sim.base_url, daily_budget_usd=0.001, rate_limit_per_s=0)
        app = create_app(settings)
        async with serving(app) as test_app:
            client = test_app.test_client()
            assert (await client.post("/api/voice/session")).status_code == 200
            call = sim.add_call("rtc_daily")
            assert (await client.post("/api/voice/connect", json={"call_id": "rtc_daily"})).status_code == 200
            with trio.fail_after(10):
                await call.wait_until(lambda c: c.closed and c.connection is None)
                while not (await (await client.get("/api/voice/status")).get_json())["budget_spent"]:
                    await trio.sleep(0.02)
            response = await client.post("/api/voice/session")
            assert response.status_code == 503 and (await response.get_json())["error"].endswith("budget spent")
        assert json.loads(daily_path(settings.state_dir).read_text())["cost_usd"] == pytest.approx(0.001296)
        restarted = create_app(settings)
        async with serving(restarted) as test_app:
            response = await test_app.test_client().post("/api/voice/session")
            assert response.status_code == 503
        nursery.cancel_scope.cancel()


def test_budgets_from_flags_and_environment_off_by_default():
    from voiceactors.cli import build_parser
    from voiceactors.server import settings_from_args
    assert (Settings.from_env({}).call_budget_usd, Settings.from_env({}).daily_budget_usd) == (0.0, 0.0)
    args = build_parser().parse_args(["serve", "--journal", "j", "--call-budget-usd", "0.5",
                                      "--daily-budget-usd", "20"])
    settings = settings_from_args(args)
    assert (settings.call_budget_usd, settings.daily_budget_usd) == (0.5, 20.0)
    env = Settings.from_env({"VOICEACTORS_CALL_BUDGET_USD": "0.25", "VOICEACTORS_DAILY_BUDGET_USD": "3"})
    assert (env.call_budget_usd, env.daily_budget_usd) == (0.25, 3.0)
    with pytest.raises(Exception, match="call_budget_usd"):
        Settings.from_env({"VOICEACTORS_CALL_BUDGET_USD": "-1"}).validate()
