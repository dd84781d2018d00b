"""The simulator answers a browser: real WebRTC on loopback.

The browser is ``webrtc_client.BrowserPeer`` (aiortc as the offerer, on its
own asyncio thread); the simulator is real, on a loopback port; the sideband
is joined by our own client or by our real server (``/api/voice/connect``).
Real time throughout: a WebRTC connection cannot run on trio's virtual clock.
"""

from __future__ import annotations

import json
import sys
import time

import httpx
import pytest
import trio

from voiceactors.realtime import sideband
from voiceactors.realtime.simulator import Simulator

KEY = "sk-test-webrtc"


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
        r = await http.post("/realtime/calls", content=b"v=0\r\n",
                            headers={"Authorization": f"Bearer {KEY}", "Content-Type": "text/plain"})
        assert r.status_code == 400 and "Content-Type" in r.json()["error"]["message"]
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

    sim = Simulator(TALK, api_key=KEY)
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
