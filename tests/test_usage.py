"""Usage and cost: reading the service's usage, pricing it, the call's
totals on the simulator (to the token), the feed's usage events, metrics,
and the ``voiceactors calls`` report."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import pytest
import trio

from calls_support import rig, steady
from voiceactors import metrics as metrics_module
from voiceactors.call.protocol import CallProtocol, Connected, CountUsage, Log, Publish, Received, RecordLine
from voiceactors.call.meter import meter_for
from voiceactors.calls_report import render_table, report
from voiceactors.cli import main as cli_main
from voiceactors.http.history import list_calls
from voiceactors.metrics import Metrics
from voiceactors.realtime.events import parse_server_event
from voiceactors.settings import InvalidSettings, Settings
from voiceactors.simulator.billing import ConversationTokens, text_tokens
from voiceactors.usage.cost import Prices, Tokens, cost_usd, parse_audio_prices, parse_price_table, read_usage

GPT_REALTIME = Prices(text_in=4, text_out=16, audio_in=32, audio_out=64, cached_in=0.4)

FULL = {"total_tokens": 1190, "input_tokens": 1000, "output_tokens": 190,
        "input_token_details": {"text_tokens": 300, "audio_tokens": 700, "image_tokens": 0, "cached_tokens": 600,
                                "cached_tokens_details": {"text_tokens": 200, "audio_tokens": 400, "image_tokens": 0}},
        "output_token_details": {"text_tokens": 40, "audio_tokens": 150}}


# --- reading and pricing --------------------------------------------------------------------

def test_the_breakdown_as_the_service_reports_it():
    tokens, malformed = read_usage(FULL)
    assert malformed == []
    # cached tokens are a subset of the input: the uncached remainder is priced at the full rate
    assert tokens == Tokens(text_in=100, text_out=40, audio_in=300, audio_out=150, cached_in=600)
    assert tokens.total == 1190


def test_the_sdk_model_reads_the_same_as_the_dict():
    from openai.types.realtime import RealtimeResponseUsage
    assert read_usage(RealtimeResponseUsage.model_validate(FULL)) == read_usage(FULL)


def test_absent_fields_count_zero_and_cached_without_details_come_off_the_audio_first():
    assert read_usage({}) == (Tokens(), [])
    tokens, malformed = read_usage({"input_token_details": {"text_tokens": 10, "audio_tokens": 50,
                                                            "cached_tokens": 55}})
    assert malformed == [] and tokens == Tokens(text_in=5, audio_in=0, cached_in=55)


def test_malformed_fields_are_named_and_skipped():
    usage = {"input_token_details": {"text_tokens": "12", "audio_tokens": 100, "cached_tokens": -3},
             "output_token_details": {"text_tokens": True, "audio_tokens": 20.5}}
    tokens, malformed = read_usage(usage)
    assert tokens == Tokens(audio_in=100)
    assert malformed == ["input_token_details.text_tokens", "input_token_details.cached_tokens",
                         "output_token_details.text_tokens", "output_token_details.audio_tokens"]
    assert read_usage("lots") == (Tokens(), ["usage"])
    assert read_usage({"output_token_details": 7}) == (Tokens(), ["output_token_details"])


def test_cost_from_the_price_table_and_unknown_without_prices():
    tokens, _ = read_usage(FULL)
    # 100*4 + 40*16 + 300*32 + 150*64 + 600*0.4 = 400 + 640 + 9600 + 9600 + 240 = 20480 per million
    assert cost_usd(tokens, GPT_REALTIME) == pytest.approx(0.02048)
    assert cost_usd(tokens, None) is None
    table = parse_price_table(Settings.from_env({}).prices)
    assert table == {"gpt-realtime": GPT_REALTIME}
    assert meter_for("gpt-realtime-mini", Settings.from_env({}).prices, 0).prices is None


def test_a_bad_price_table_fails_the_startup_check():
    for bad in ("gpt-realtime=4/16/32/64", "gpt-realtime=4/16/x/64/0.4", "=1/1/1/1/1", "m=1/1/1/1/-1"):
        with pytest.raises(InvalidSettings, match="prices"):
            Settings.from_env({"VOICEACTORS_PRICES": bad}).validate()
    two = Settings.from_env({"VOICEACTORS_PRICES": "a=1/2/3/4/0.5, b=0/0/0/0/0"}).validate()
    assert set(parse_price_table(two.prices)) == {"a", "b"}


def test_a_live_model_s_audio_is_priced_per_minute_beside_the_token_entries():
    """``<model>=audio_min:<USD>``: the other form of a ``prices`` entry, for a
    Live model's seconds of audio; the token entries read as before."""
    entries = Settings.from_env({"VOICEACTORS_PRICES": "gpt-realtime=4/16/32/64/0.4, gpt-live-1=audio_min:0.06"}
                                ).validate().prices
    assert parse_price_table(entries) == {"gpt-realtime": GPT_REALTIME}
    assert parse_audio_prices(entries) == {"gpt-live-1": 0.06}
    for bad in ("gpt-live-1=audio_min:", "gpt-live-1=audio_min:x", "=audio_min:1", "m=audio_min:-1",
                "m=audio_min:inf"):
        with pytest.raises(InvalidSettings, match="prices"):
            Settings.from_env({"VOICEACTORS_PRICES": bad}).validate()
    # a Realtime call's meter has no audio: its totals are as they were
    assert "audio_s" not in meter_for("gpt-realtime", entries, 0).totals()
    live = meter_for("gpt-5-mini", entries, 0, audio_model="gpt-live-1")
    assert live.prices is None and live.audio is not None and live.audio.usd_per_min == 0.06


# --- the protocol's hook ----------------------------------------------------------------------

def _proto(model: str = "gpt-realtime") -> CallProtocol:
    p = CallProtocol("rtc_usage")
    p.meter = meter_for(model, Settings.from_env({}).prices, 0)
    p.handle(Connected(), 0.0)
    return p


def _done(rid: str, usage: object) -> object:
    body = {"type": "response.done", "event_id": "ev",
            "response": {"id": rid, "status": "completed", "output": [], "usage": usage}}
    event = parse_server_event(json.dumps(body))
    assert event is not None
    return event


def test_each_response_gets_a_usage_line_a_feed_event_and_a_count_and_the_end_its_totals():
    p = _proto()
    effects = p.handle(Received(_done("r1", FULL)), 1.0) + p.handle(Received(_done("r2", FULL)), 2.0)
    lines = [e.fields for e in effects if isinstance(e, RecordLine) and e.kind == "usage"]
    assert [line["response_id"] for line in lines] == ["r1", "r2"]
    assert lines[0]["tokens"] == {"text_in": 100, "text_out": 40, "audio_in": 300, "audio_out": 150,
                                  "cached_in": 600}
    assert lines[0]["cost_usd"] == 0.02048 and lines[0]["model"] == "gpt-realtime"
    feed = [e.fields for e in effects if isinstance(e, Publish) and e.kind == "usage"]
    assert feed[1]["call"]["tokens"]["audio_in"] == 600 and feed[1]["call"]["cost_usd"] == 0.04096
    counts = [e for e in effects if isinstance(e, CountUsage)]
    assert [(c.model, c.cost_usd) for c in counts] == [("gpt-realtime", pytest.approx(0.02048))] * 2
    (total,) = [line.fields for line in p.closing_lines() if line.kind == "usage_total"]
    assert total == {"model": "gpt-realtime", "responses": 2, "budget_usd": None, "cost_usd": 0.04096,
                     "tokens": {"text_in": 200, "text_out": 80, "audio_in": 600, "audio_out": 300, "cached_in": 1200}}


def test_an_unpriced_model_counts_tokens_and_says_its_cost_is_unknown():
    p = _proto("some-new-realtime")
    effects = p.handle(Received(_done("r1", FULL)), 1.0)
    (line,) = [e.fields for e in effects if isinstance(e, RecordLine) and e.kind == "usage"]
    assert line["cost_usd"] is None and line["tokens"]["audio_in"] == 300
    (total,) = [line.fields for line in p.closing_lines() if line.kind == "usage_total"]
    assert total["cost_usd"] is None and total["tokens"]["audio_in"] == 300


def test_malformed_usage_is_logged_and_the_rest_counted():
    """As a light read-only view delivers it (no pydantic validation in front)."""
    p = _proto()
    view = SimpleNamespace(type="response.done", response=SimpleNamespace(
        id="r1", status="completed", output=[],
        usage=SimpleNamespace(input_token_details={"audio_tokens": "many", "text_tokens": 10},
                              output_token_details={"audio_tokens": 5})))
    effects = p.handle(Received(view), 1.0)
    (log,) = [e for e in effects if isinstance(e, Log) and e.event == "usage.malformed"]
    assert log.level == "warning" and log.fields["fields"] == ["input_token_details.audio_tokens"]
    (line,) = [e.fields for e in effects if isinstance(e, RecordLine) and e.kind == "usage"]
    assert line["tokens"] == {"text_in": 10, "text_out": 0, "audio_in": 0, "audio_out": 5, "cached_in": 0}


def test_a_response_without_usage_counts_nothing():
    p = _proto()
    body = {"type": "response.done", "event_id": "ev", "response": {"id": "r1", "status": "completed", "output": []}}
    effects = p.handle(Received(parse_server_event(json.dumps(body))), 1.0)
    assert not [e for e in effects if isinstance(e, (CountUsage, Publish))]
    assert p.closing_lines() == []


# --- the simulator: usage like the service's, totals to the token -------------------------------

TWO_TURNS = [
    {"user_turn": {"text": "hello there"}},          # 11 bytes: 3 text tokens, 24 audio tokens of context
    {"response": {"text": "Hi."}},                   # 1 text + 8 audio out
    {"user_turn": {"text": "and tomorrow?"}},        # 13 bytes: 4 text tokens, 32 audio tokens
    {"response": {"text": "Nothing yet."}},          # 3 text + 24 audio out
    {"sleep": 0.5},
    {"close": 1000},
]


def test_the_simulators_counting_rule():
    assert [text_tokens(s) for s in ("", "a", "abcd", "abcde", "é")] == [0, 1, 1, 2, 1]
    ctx = ConversationTokens()
    ctx.user_said("hello there")
    first = ctx.response_usage([{"type": "message", "content": [{"type": "output_audio", "transcript": "Hi."}]}],
                               None)
    assert first["input_token_details"]["audio_tokens"] == 24 and first["output_token_details"] == \
        {"text_tokens": 1, "audio_tokens": 8}
    second = ctx.response_usage([{"type": "function_call", "name": "calendar.today", "arguments": "{}"}], "Be brief.")
    # input: the context (1 text + 32 audio) and the 3 tokens of instructions; the first response's input cached
    assert second["input_token_details"] == {"text_tokens": 4, "audio_tokens": 32, "image_tokens": 0,
                                             "cached_tokens": 24, "cached_tokens_details": {
                                                 "text_tokens": 0, "audio_tokens": 24, "image_tokens": 0}}
    assert second["output_token_details"] == {"text_tokens": 4 + 1, "audio_tokens": 0}


async def test_exact_token_totals_and_cost_of_a_simulated_call(tmp_path, autojump_clock):
    async with rig(tmp_path) as r:
        feed = r.hub.open("rtc_tokens")
        events = feed.subscribe()
        actor, sc = await r.run_call("rtc_tokens", steady(TWO_TURNS), feed=feed)
        record = r.record("rtc_tokens")
    assert actor.end_reason == "closed_by_service"
    usage = [line for line in record if line["kind"] == "usage"]
    # response 1: 24 audio in, 1 text + 8 audio out; response 2: the context (1 text, 64 audio), of which
    # the first response's input (24 audio) is cached, and 3 text + 24 audio out
    assert [line["tokens"] for line in usage] == [
        {"text_in": 0, "text_out": 1, "audio_in": 24, "audio_out": 8, "cached_in": 0},
        {"text_in": 1, "text_out": 3, "audio_in": 40, "audio_out": 24, "cached_in": 24},
    ]
    (total,) = [line for line in record if line["kind"] == "usage_total"]
    assert total["tokens"] == {"text_in": 1, "text_out": 4, "audio_in": 64, "audio_out": 32, "cached_in": 24}
    # 1*4 + 4*16 + 64*32 + 32*64 + 24*0.4 = 4173.6 per million
    assert total["cost_usd"] == 0.004174 and total["responses"] == 2
    # what we counted is what the simulator reported
    reported = [e["response"]["usage"] for e in sc.sent if e["type"] == "response.done"]
    summed = Tokens()
    for item in reported:
        summed.add(read_usage(item)[0])
    assert summed.as_dict() == total["tokens"]
    # the feed: a usage event after each response, with the call's totals so far
    seen = []
    while True:
        try:
            seen.append(events.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            break
    usage_events = [e for e in seen if e["type"] == "usage"]
    assert [e["call"]["tokens"]["audio_in"] for e in usage_events] == [24, 64]
    assert usage_events[-1]["call"]["cost_usd"] == 0.004174 and usage_events[0]["cost_usd"] == 0.001296
    # and the history's summary
    (summary,) = list_calls(r.settings.state_dir)
    assert summary["total_tokens"] == 125 and summary["cost_usd"] == 0.004174 and summary["model"] == "gpt-realtime"


# --- metrics ------------------------------------------------------------------------------------

def test_tokens_by_kind_and_model_and_cost_counters():
    m = Metrics()
    m.count_usage("call", "gpt-realtime", {"audio_in": 120, "text_out": 0}, 0.00384)
    m.count_usage("call", "gpt-realtime", {"audio_in": 30}, 0.00096)
    m.count_usage("brain", "gpt-5-mini", {"text_in": 500}, None)
    text = m.render()[0].decode()
    assert 'voiceactors_tokens_total{kind="audio_in",model="gpt-realtime",source="call"} 150.0' in text
    assert 'kind="text_out"' not in text
    assert 'voiceactors_tokens_total{kind="text_in",model="gpt-5-mini",source="brain"} 500.0' in text
    assert 'voiceactors_cost_usd_total{model="gpt-realtime",source="call"} 0.0048' in text
    assert 'voiceactors_cost_usd_total{model="gpt-5-mini"' not in text


async def test_a_call_counts_into_the_process_metrics(tmp_path, autojump_clock):
    before = metrics_module.METRICS.tokens.labels(source="call", model="gpt-realtime", kind="audio_out")._value.get()
    async with rig(tmp_path) as r:
        await r.run_call("rtc_metrics", steady(TWO_TURNS))
    after = metrics_module.METRICS.tokens.labels(source="call", model="gpt-realtime", kind="audio_out")._value.get()
    assert after - before == 32


# --- voiceactors calls --------------------------------------------------------------------------

def _write_record(state_dir, call_id: str, lines: list[dict]) -> None:
    folder = state_dir / "calls"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{call_id}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def _records(state_dir) -> None:
    start = {"kind": "start", "t": 0.0, "at": "2026-03-27T09:15:00+00:00"}
    _write_record(state_dir, "rtc_priced", [
        {**start, "call_id": "rtc_priced"},
        {"kind": "tool_call", "t": 1.0, "tool_call_id": "c1", "outcome": "ok"},
        {"kind": "usage", "t": 1.5, "response_id": "r1", "model": "gpt-realtime", "cost_usd": 0.0125,
         "tokens": {"text_in": 10, "text_out": 20, "audio_in": 300, "audio_out": 100, "cached_in": 70}},
        {"kind": "end", "t": 4.25, "reason": "budget_spent", "duration_s": 4.25},
    ])
    _write_record(state_dir, "rtc_unpriced", [
        {**start, "call_id": "rtc_unpriced"},
        {"kind": "usage", "t": 1.0, "response_id": "r1", "model": "other", "cost_usd": None,
         "tokens": {"text_in": 5, "text_out": 0, "audio_in": 0, "audio_out": 0, "cached_in": 0}},
        {"kind": "end", "t": 2.0, "reason": "closed_by_service", "duration_s": 2.0},
    ])


def test_the_calls_table_and_its_json(tmp_path, capsys):
    state = tmp_path / "state"
    _records(state)
    assert cli_main(["calls", "--state-dir", str(state)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["started", "call", "duration", "ended", "tools", "tokens", "cost", "turn", "median",
                                "worst", "turn"]
    rows = {line.split()[1]: line.split() for line in table[1:3]}
    assert rows["rtc_priced"][2:] == ["4.2", "s", "budget_spent", "1", "500", "$0.0125", "—", "—"]
    assert rows["rtc_unpriced"][2:] == ["2.0", "s", "closed_by_service", "0", "5", "unknown", "—", "—"]
    assert table[3] == "2 calls, 505 tokens, unknown (some calls' models have no prices)"
    assert cli_main(["calls", "--state-dir", str(state), "--json", "--limit", "1"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["calls"]) == 1 and set(data["calls"][0]) >= {"call_id", "tokens", "cost_usd", "duration_s"}


def test_the_table_totals_priced_calls_and_says_when_there_are_none(tmp_path):
    out = io.StringIO()
    report(tmp_path / "nothing", 20, False, out)
    assert out.getvalue().startswith(f"no calls recorded in {tmp_path / 'nothing' / 'calls'}\n")
    assert "temporary folder unless given --state-dir" in out.getvalue()   # why the demo's calls are not here
    text = render_table([{"call_id": "rtc_a", "started_at": None, "duration_s": 1.0, "ended": None,
                          "tool_calls": 2, "tool_failures": 1, "total_tokens": 7, "cost_usd": 0.5}])
    assert "2 (1 failed)" in text and "live or crashed" in text and text.endswith("1 call, 7 tokens, $0.5000\n")


def test_a_response_done_with_malformed_usage_still_reaches_the_protocol():
    """Validated with the SDK's models, a usage count that is not a number
    would fail the whole response.done (and with it the batch's follow-up):
    the event is kept, its usage handed on raw for the meter to judge."""
    body = {"type": "response.done", "event_id": "ev",
            "response": {"id": "r1", "status": "completed", "output": [],
                         "usage": {"input_tokens": "many", "output_token_details": {"audio_tokens": 5},
                                   "input_token_details": {"audio_tokens": [1]}}}}
    event = parse_server_event(json.dumps(body))
    assert event is not None and event.response.id == "r1" and event.response.status == "completed"
    p = _proto()
    effects = p.handle(Received(event), 1.0)
    (log,) = [e for e in effects if isinstance(e, Log) and e.event == "usage.malformed"]
    assert log.fields["fields"] == ["input_token_details.audio_tokens"]
    (line,) = [e.fields for e in effects if isinstance(e, RecordLine) and e.kind == "usage"]
    assert line["tokens"]["audio_out"] == 5
    # anything else malformed in the event still fails it as before
    bad = {**body, "response": {**body["response"], "status": 7}}
    assert parse_server_event(json.dumps(bad)) is None


# --- read_usage's one-pass reading of the usual case agrees with the general one

from hypothesis import given, settings as hsettings, strategies as st  # noqa: E402

from voiceactors.usage import cost as usage_module  # noqa: E402

_COUNTS = st.sampled_from([None, 0, 3, 56, 422, -1, True, False, 1.5, "7", [], {}]) | st.integers(0, 10_000)
_DETAILS = st.none() | st.sampled_from([5, "x", []]) | st.fixed_dictionaries(
    {}, optional={"text_tokens": _COUNTS, "audio_tokens": _COUNTS, "image_tokens": _COUNTS})
_INPUTS = st.none() | st.sampled_from([7, "x", []]) | st.fixed_dictionaries({}, optional={
    "text_tokens": _COUNTS, "audio_tokens": _COUNTS, "cached_tokens": _COUNTS, "cached_tokens_details": _DETAILS})
_OUTPUTS = st.none() | st.sampled_from([7, "x"]) | st.fixed_dictionaries(
    {}, optional={"text_tokens": _COUNTS, "audio_tokens": _COUNTS})
_USAGES = st.none() | st.sampled_from([3, "x", []]) | st.fixed_dictionaries({}, optional={
    "total_tokens": _COUNTS, "input_token_details": _INPUTS, "output_token_details": _OUTPUTS})


@hsettings(max_examples=400, deadline=None)
@given(_USAGES)
def test_read_usage_of_any_usage_is_what_the_general_reading_gives(usage):
    """The one-pass reading (a plain JSON usage, every count a whole number)
    and the general one (any object; it names the malformed fields) agree on
    every usage: tokens and malformed names alike."""
    assert usage_module.read_usage(usage) == usage_module._read_general(usage)


def test_the_usual_usage_is_read_in_one_pass_and_counts_as_before():
    usual = {"total_tokens": 500, "input_token_details": {
        "text_tokens": 422, "audio_tokens": 56, "cached_tokens": 56,
        "cached_tokens_details": {"text_tokens": 0, "audio_tokens": 56}},
        "output_token_details": {"text_tokens": 2, "audio_tokens": 20}}
    assert usage_module._read_plain(usual) is not None
    tokens, malformed = usage_module.read_usage(usual)
    assert (tokens.as_dict(), malformed) == ({"text_in": 422, "text_out": 2, "audio_in": 0, "audio_out": 20,
                                              "cached_in": 56}, [])
    assert usage_module._read_plain({**usual, "output_token_details": {"text_tokens": True}}) is None
