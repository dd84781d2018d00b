"""The simulator answers a browser: real WebRTC on loopback.

The browser is ``webrtc_client.BrowserPeer`` (aiortc as the offerer, on its
own asyncio thread); the simulator is real, on a loopback port; the sideband
is joined by our own client or by our real server (``/api/voice/connect``).
Real time throughout: a WebRTC connection cannot run on trio's virtual clock.
"""

from __future__ import annotations

import json
import shutil
import sys
import time

import httpx
import pytest
import trio

from voiceactors.realtime import sideband
from voiceactors.simulator import Simulator, conformance

KEY = "sk-test-webrtc"


@pytest.fixture(autouse=True)
def _conformance(monkeypatch):
    """Every simulator of this file holds its events to the SDK's types exactly
    (docs/simulator.md § Conformance; the suite's fixture fails a test that meets one that does not)."""
    monkeypatch.setenv(conformance.ENV_FLAG, "1")


def _offer_headers(key: str, origin: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/sdp"}
    if origin:
        headers["Origin"] = origin
    return headers


MEDIA_OFFER = ("v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n"
               "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\nc=IN IP4 0.0.0.0\r\na=rtpmap:111 opus/48000/2\r\n")


# -- without the extra: the lazy import's seam (runs whether or not aiortc is installed)


async def test_without_aiortc_a_media_offer_gets_501_and_signalling_still_works(monkeypatch, nursery):
    # aiortc made unimportable, as on a machine without the webrtc extra
    monkeypatch.setitem(sys.modules, "aiortc", None)
    sim = Simulator(api_key=KEY)
    await nursery.start(sim.serve, 0)
    async with httpx.AsyncClient(base_url=sim.base_url) as http:
        r = await http.post("/realtime/calls", content=MEDIA_OFFER, headers=_offer_headers(KEY))
        assert r.status_code == 501
        error = r.json()["error"]
        assert error["code"] == "webrtc_unavailable"
        assert "pip install 'voiceactors[webrtc]'" in error["message"]
        assert sim.calls == {}
        # a signalling-only offer keeps today's behaviour: a call and a placeholder answer
        r = await http.post("/realtime/calls", content=b"v=0\r\n", headers=_offer_headers(KEY))
        assert r.status_code == 201 and r.headers["content-type"] == "application/sdp"
        assert r.headers["location"].rsplit("/", 1)[1] in sim.calls


async def test_offer_errors_are_400_and_401_with_cors(nursery):
    sim = Simulator(api_key=KEY)
    await nursery.start(sim.serve, 0)
    origin = "http://127.0.0.1:8765"
    async with httpx.AsyncClient(base_url=sim.base_url) as http:
        r = await http.post("/realtime/calls", content=MEDIA_OFFER, headers=_offer_headers("sk-wrong", origin))
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert r.headers["access-control-allow-origin"] == origin     # the page can read why
        r = await http.post("/realtime/calls", content=b"hello", headers=_offer_headers(KEY, origin))
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_offer"
        r = await http.post("/realtime/calls", content=b"",
                            headers={"Authorization": f"Bearer {KEY}", "Content-Type": "text/plain"})
        assert r.status_code == 400 and "v=" in r.json()["error"]["message"]
        r = await http.post("/realtime/calls", files={"sdp": (None, MEDIA_OFFER), "session": (None, "{nope")},
                            headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 400 and "'session'" in r.json()["error"]["message"]
        r = await http.post("/realtime/calls", files={"session": (None, '{"type": "realtime"}')},
                            headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 400 and "'sdp'" in r.json()["error"]["message"]
    assert sim.calls == {}


async def test_cors_preflight_allows_the_pages_origin(nursery):
    sim = Simulator(api_key=KEY)
    await nursery.start(sim.serve, 0)
    origin = "http://127.0.0.1:8765"
    async with httpx.AsyncClient(base_url=sim.base_url) as http:
        r = await http.options("/realtime/calls", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"})
        assert r.status_code == 204
        assert r.headers["access-control-allow-origin"] == origin
        assert "POST" in r.headers["access-control-allow-methods"]
        allowed = {h.strip().lower() for h in r.headers["access-control-allow-headers"].split(",")}
        assert {"authorization", "content-type"} <= allowed
        assert r.headers["access-control-expose-headers"].lower() == "location"
        # no Origin, no CORS headers (a same-process client needs none)
        r = await http.options("/realtime/calls")
        assert r.status_code == 204 and "access-control-allow-origin" not in r.headers
        # other endpoints are not opened to pages
        r = await http.options("/realtime/client_secrets", headers={"Origin": origin})
        assert "access-control-allow-origin" not in r.headers


# -- with aiortc: a real peer


@pytest.fixture
def aiortc():
    return pytest.importorskip("aiortc", reason="the webrtc extra (aiortc) is not installed: "
                                                "pip install -e '.[webrtc]'")


@pytest.fixture
async def browser(aiortc):
    from webrtc_client import BrowserPeer

    peer = BrowserPeer()
    try:
        yield peer
    finally:
        with trio.CancelScope(shield=True):
            await peer.close()


async def test_an_offer_aiortc_cannot_answer_is_400(aiortc, nursery):
    sim = Simulator(api_key=KEY)
    await nursery.start(sim.serve, 0)
    async with httpx.AsyncClient(base_url=sim.base_url) as http:
        # a media section without ICE credentials or a DTLS fingerprint
        r = await http.post("/realtime/calls", content=MEDIA_OFFER, headers=_offer_headers(KEY, "http://a.test"))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_offer" and r.headers["access-control-allow-origin"] == "http://a.test"
    assert sim.calls == {} and sim.peers == {}


TALK = [
    {"user_turn": {"text": "Hello there.", "duration_ms": 200}},
    {"response": {"text": "Hello. This reply is long enough to be heard as a tone for a while.",
                  "delta_interval_s": 0.02}},
    {"sleep": 1.5},
    {"close": 1000},
]


async def _call(sim: Simulator, browser, key: str, origin: str | None = None) -> tuple[httpx.Response, str]:
    offer = await browser.offer()
    async with httpx.AsyncClient(base_url=sim.base_url) as http:
        r = await http.post("/realtime/calls", content=offer, headers=_offer_headers(key, origin))
    assert r.status_code == 201, r.text
    await browser.answer(r.text)
    return r, r.headers["location"].rsplit("/", 1)[1]


async def test_browser_call_gets_events_and_audio_and_ends_with_the_scenario(browser, nursery):
    from webrtc_client import wait_for

    sim = Simulator(TALK, api_key=KEY, speech=False)
    await nursery.start(sim.serve, 0)
    async with httpx.AsyncClient(base_url=sim.base_url) as http:
        ek = (await http.post("/realtime/client_secrets", json={},
                              headers={"Authorization": f"Bearer {KEY}"})).json()["value"]
    origin = "http://127.0.0.1:8765"
    r, call_id = await _call(sim, browser, ek, origin)
    assert r.headers["content-type"] == "application/sdp"
    assert r.headers["location"] == f"/v1/realtime/calls/{call_id}" and call_id.startswith("rtc_")
    assert r.headers["access-control-allow-origin"] == origin
    candidates = [line for line in r.text.splitlines() if line.startswith("a=candidate")]
    assert candidates and all(" 127.0.0.1 " in line for line in candidates), candidates
    await wait_for(lambda: browser.channel_state == ["open"])
    call = sim.calls[call_id]

    async with sideband.open_sideband(sim.base_url, KEY, call_id) as ws:
        with trio.fail_after(15):
            while True:
                try:
                    await ws.get_message()
                except Exception:
                    break
    await wait_for(lambda: "closed" in browser.channel_state)
    assert call.closed and call.close_code == 1000
    # the channel carried what the sideband saw, in order
    assert browser.types() == call.sent_types()
    types = browser.types()
    for kind in ("input_audio_buffer.speech_started", "conversation.item.input_audio_transcription.completed",
                 "output_audio_buffer.started", "response.output_audio_transcript.delta",
                 "response.output_audio_transcript.done", "output_audio_buffer.stopped", "response.done"):
        assert kind in types, kind
    said = [e["transcript"] for _, e in browser.events
            if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert said == ["Hello there."]
    # the reply was audible, and only around the reply
    started = next(at for at, e in browser.events if e["type"] == "output_audio_buffer.started")
    assert browser.loud_frames(start=started) > 20          # > 0.4 s of tone
    assert browser.loud_frames(end=started) == 0
    assert sim.peers[call_id].closed_by == "local"


async def test_hangup_closes_the_data_channel(browser, nursery):
    from webrtc_client import wait_for

    sim = Simulator([{"sleep": 60}], api_key=KEY)
    await nursery.start(sim.serve, 0)
    _, call_id = await _call(sim, browser, KEY)
    await wait_for(lambda: browser.channel_state == ["open"])
    async with sideband.open_sideband(sim.base_url, KEY, call_id) as ws:
        async with httpx.AsyncClient(base_url=sim.base_url) as http:
            r = await http.post(f"/realtime/calls/{call_id}/hangup", headers={"Authorization": f"Bearer {KEY}"})
            assert r.status_code == 200
        start = time.monotonic()
        await wait_for(lambda: "closed" in browser.channel_state, timeout=5)
        assert time.monotonic() - start < 5
        with pytest.raises(Exception):
            await ws.get_message()
    assert sim.calls[call_id].closed


async def test_browser_leaving_ends_the_call(browser, nursery):
    from webrtc_client import wait_for

    sim = Simulator([{"sleep": 60}], api_key=KEY)
    await nursery.start(sim.serve, 0)
    _, call_id = await _call(sim, browser, KEY)
    await wait_for(lambda: browser.channel_state == ["open"])
    async with sideband.open_sideband(sim.base_url, KEY, call_id) as ws:
        await browser.thread.run(browser._close)
        with trio.fail_after(10):
            with pytest.raises(Exception):
                while True:
                    await ws.get_message()
    call = sim.calls[call_id]
    assert call.closed and call.close_code == 1000
    assert sim.peers[call_id].closed_by == "remote"


async def test_the_sdks_multipart_form_with_a_standard_key(browser, nursery):
    from openai import AsyncOpenAI
    from webrtc_client import wait_for

    sim = Simulator([{"sleep": 60}], api_key=KEY)
    await nursery.start(sim.serve, 0)
    offer = await browser.offer()
    async with AsyncOpenAI(api_key=KEY, base_url=sim.base_url, max_retries=0) as client:
        raw = await client.realtime.calls.with_raw_response.create(
            sdp=offer, session={"type": "realtime", "model": "gpt-realtime", "instructions": "Be brief."})
    assert raw.status_code == 201
    call_id = raw.headers["location"].rsplit("/", 1)[1]
    await browser.answer(raw.http_response.text)
    await wait_for(lambda: browser.channel_state == ["open"])
    call = sim.calls[call_id]
    assert call.session["model"] == "gpt-realtime" and call.session["instructions"] == "Be brief."
    assert call.peer is sim.peers[call_id]


async def test_client_events_on_the_data_channel_are_answered(browser, nursery):
    from webrtc_client import wait_for

    sim = Simulator([{"response": {"text": "Let me think about that for a good long while.", "hold_s": 20}},
                     {"sleep": 20}], api_key=KEY)
    await nursery.start(sim.serve, 0)
    _, call_id = await _call(sim, browser, KEY)
    await wait_for(lambda: browser.channel_state == ["open"])
    # before the sideband joins, the call does not play: a clear error says why
    await browser.send({"type": "output_audio_buffer.clear", "event_id": "evt_page_1"})
    await wait_for(lambda: "error" in browser.types())
    error = next(e for _, e in browser.events if e["type"] == "error")["error"]
    assert error["code"] == "sideband_not_joined" and error["event_id"] == "evt_page_1"
    call = sim.calls[call_id]
    assert call.errors_sent == []          # not part of the call's own record
    async with sideband.open_sideband(sim.base_url, KEY, call_id):
        await wait_for(lambda: "output_audio_buffer.stopped" in browser.types())
        await browser.send({"type": "response.cancel", "event_id": "evt_page_2"})
        await wait_for(lambda: "response.done" in browser.types())
        done = next(e for _, e in browser.events if e["type"] == "response.done")["response"]
        assert done["status"] == "cancelled" and done["status_details"]["reason"] == "client_cancelled"
        await browser.send({"type": "output_audio_buffer.clear"})
        await browser.send({"type": "response.cancel", "event_id": "evt_page_3"})   # nothing active now
        await wait_for(lambda: call.error_codes == ["response_cancel_not_active"])
        await wait_for(lambda: browser.types()[-1] == "error")
    assert "output_audio_buffer.cleared" in browser.types()
    assert call.errors_sent[0]["error"]["event_id"] == "evt_page_3"
    assert [e["type"] for e in call.channel_received] == ["output_audio_buffer.clear", "response.cancel",
                                                          "output_audio_buffer.clear", "response.cancel"]
    assert call.responses[0].status == "cancelled"


LONG = ("This is a long reply, long enough that its tone would go on for several seconds "
        "if nobody interrupted it, which is exactly what the user is about to do.")


# a mark, not a skip inside the test: raised within the trio run, pytest-trio's
# report lost the reason ("Skipped", at _pytest/python.py)
NO_SPEAKER = pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                reason="espeak-ng is not installed (apt-get install espeak-ng): replies are a tone")


@pytest.mark.parametrize("speech", [False, pytest.param(True, marks=NO_SPEAKER)], ids=["tone", "espeak-ng"])
async def test_a_barge_in_stops_the_reply_audio(browser, nursery, speech):
    from webrtc_client import wait_for

    sim = Simulator([{"response": {"text": LONG, "delta_interval_s": 0.01, "hold_s": 10}},
                     {"barge_in": {"after_ms": 800}}, {"sleep": 3}, {"close": 1000}], api_key=KEY, speech=speech)
    await nursery.start(sim.serve, 0)
    _, call_id = await _call(sim, browser, KEY)
    await wait_for(lambda: browser.channel_state == ["open"])
    async with sideband.open_sideband(sim.base_url, KEY, call_id):
        await wait_for(lambda: "closed" in browser.channel_state, timeout=20)
    started = next(at for at, e in browser.events if e["type"] == "output_audio_buffer.started")
    cleared = next(at for at, e in browser.events if e["type"] == "output_audio_buffer.cleared")
    assert browser.loud_frames(start=started, end=cleared) > 20     # it was speaking ...
    after = browser.frames_between(cleared + 0.5, cleared + 2.5)
    assert len(after) > 50 and max(after) <= 200                    # ... and the barge-in silenced it
    voice = sim.peers[call_id].voice
    assert voice.cut == 1 and voice.replies == 1 and voice.spoken == (1 if speech else 0)


# -- serve --demo: a browser call to the embedded simulator, our real server on the sideband


async def test_demo_scenario_plays_to_a_browser_call_through_our_server(browser, make_sample, tmp_path, pin_today):
    from functools import partial

    from conftest import SAMPLE_TODAY
    from voiceactors.demo import open_demo_simulator
    from voiceactors.server import run_server
    from voiceactors.settings import Settings
    from webrtc_client import wait_for

    pin_today(SAMPLE_TODAY)
    settings = Settings(journal=make_sample(days=14), state_dir=tmp_path / "state", host="127.0.0.1", port=0)
    async with open_demo_simulator(settings) as env:       # what `voiceactors serve --demo` runs
        sim = env.simulator
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            [base] = await nursery.start(partial(run_server, env.settings, shutdown_trigger=stop.wait))
            async with httpx.AsyncClient(base_url=base, timeout=15) as client:
                key = (await client.post("/api/voice/session")).json()["ephemeral_key"]
                r, call_id = await _call(sim, browser, key, origin=base)
                assert r.headers["access-control-allow-origin"] == base
                await wait_for(lambda: browser.channel_state == ["open"])
                r = await client.post("/api/voice/connect", json={"call_id": call_id})   # once the channel is open
                assert r.status_code == 200, r.text
                call = sim.calls[call_id]
                with trio.fail_after(60):
                    await call.wait_until(lambda c: c.closed and c.connection is None)
                await wait_for(lambda: "closed" in browser.channel_state)
            stop.set()

    events = [e for _, e in browser.events]
    assert [e["type"] for e in events] == call.sent_types()
    said = [e["transcript"] for e in events if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert said == ["Good morning. What does today look like?",
                    "What's on my calendar, what do I owe people, and what did I write about the launch?",
                    "And what's the weather in Lisbon tomorrow?",     # the demo's MCP source (docs/mcp.md)
                    "Look up the offsite notes from last week.", "Never mind, that's all for now."]
    replies = [e["transcript"] for e in events if e["type"] == "response.output_audio_transcript.done"]
    assert "Good morning. Here is your briefing." in replies and replies[-1] == "Alright, talk soon."
    tools = [e["name"] for e in events if e["type"] == "response.function_call_arguments.done"]
    assert tools == ["briefing.get", "calendar.today", "commitments.list", "journal.search", "weather.forecast",
                     "journal.search"]
    batches = [[o["name"] for o in e["response"]["output"] if o["type"] == "function_call"]
               for e in events if e["type"] == "response.done"]
    assert ["calendar.today", "commitments.list", "journal.search"] in batches       # the parallel batch
    cancelled = [e["response"]["status_details"]["reason"] for e in events
                 if e["type"] == "response.done" and e["response"]["status"] == "cancelled"]
    assert cancelled == ["turn_detected"] and "output_audio_buffer.cleared" in [e["type"] for e in events]
    # the sideband rules held: every tool call answered once by our server, no error
    assert len(call.tool_calls) == 6
    assert all(len(call.outputs.get(c, [])) == 1 for c in call.tool_calls)
    forecast = next(c for c, t in call.tool_calls.items() if t.name == "weather.forecast")
    assert json.loads(call.outputs[forecast][0])["source"] == "weather"
    assert call.errors_sent == [] and call.violations == []
    assert call.close_code == 1000
    # the replies were audible
    first_reply = next(at for at, e in browser.events if e["type"] == "output_audio_buffer.started")
    assert browser.loud_frames(start=first_reply) > 50
    assert browser.loud_frames(end=first_reply) == 0


async def test_a_peer_whose_channel_never_opens_is_given_up(browser, nursery, autojump_clock):
    from voiceactors.simulator.webrtc import OPEN_TIMEOUT_S

    # the clock jumps only once trio has been idle for two real seconds, so
    # the real-time WebRTC answer below is not overtaken by virtual timeouts
    autojump_clock.autojump_threshold = 2.0
    sim = Simulator([{"sleep": 600}], api_key=KEY)
    await nursery.start(sim.serve, 0)
    offer = await browser.offer()
    async with httpx.AsyncClient(base_url=sim.base_url) as http:
        r = await http.post("/realtime/calls", content=offer, headers=_offer_headers(KEY))
    assert r.status_code == 201
    call_id = r.headers["location"].rsplit("/", 1)[1]
    start = trio.current_time()
    # the browser never applies the answer: no connection, no channel
    with trio.fail_after(OPEN_TIMEOUT_S + 10):
        await sim.calls[call_id].wait_until(lambda c: c.closed)
    assert trio.current_time() - start == pytest.approx(OPEN_TIMEOUT_S, abs=1.0)
    with trio.fail_after(10):
        await sim.peers[call_id].closed.wait()
    assert sim.peers[call_id].closed_by == "open_timeout"
    async with httpx.AsyncClient(base_url=sim.base_url) as http:
        r = await http.post(f"/realtime/calls/{call_id}/hangup", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 404      # the call is over
