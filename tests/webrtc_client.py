"""A browser stand-in for the WebRTC tests: an aiortc offerer on its own
asyncio thread, doing what the console page does (a mic track, the
``oai-events`` data channel, an offer, the answer) and recording what
arrives: the channel's events and the peak level of every audio frame.

The trio test drives it through ``LoopThread.run`` and polls its records
(plain lists appended on the asyncio thread) with ``wait_for``."""

from __future__ import annotations

import array
import json
import time
from typing import Any, Callable

import trio

from voiceactors.simulator.webrtc import LoopThread, load_aiortc

SILENT_PEAK = 200   # of 32767: below this a decoded frame counts as silence


class BrowserPeer:
    def __init__(self) -> None:
        self.aiortc = load_aiortc()   # also makes this side gather 127.0.0.1
        self.thread = LoopThread("test-browser-peer")
        self.pc: Any = None
        self.channel: Any = None
        self.events: list[tuple[float, dict]] = []      # (monotonic time, event)
        self.frames: list[tuple[float, int]] = []       # (monotonic time, peak sample)
        self.channel_state: list[str] = []
        self.opened_at: float | None = None

    # -- asyncio side

    async def _offer(self) -> str:
        aiortc = self.aiortc
        self.pc = pc = aiortc.RTCPeerConnection(aiortc.RTCConfiguration(iceServers=[]))
        pc.addTrack(aiortc.AudioStreamTrack())       # the "microphone": silence
        self.channel = channel = pc.createDataChannel("oai-events")

        @channel.on("open")
        def on_open() -> None:
            self.opened_at = time.monotonic()
            self.channel_state.append("open")

        @channel.on("close")
        def on_close() -> None:
            self.channel_state.append("closed")

        @channel.on("message")
        def on_message(message: Any) -> None:
            self.events.append((time.monotonic(), json.loads(message)))

        @pc.on("track")
        def on_track(track: Any) -> None:
            import asyncio
            asyncio.ensure_future(self._listen(track))

        await pc.setLocalDescription(await pc.createOffer())
        return pc.localDescription.sdp

    async def _listen(self, track: Any) -> None:
        while True:
            try:
                frame = await track.recv()
            except Exception:
                return
            channels = len(frame.layout.channels)
            raw = bytes(frame.planes[0])[: frame.samples * channels * 2]
            samples = array.array("h", raw)
            self.frames.append((time.monotonic(), max((abs(v) for v in samples), default=0)))

    async def _answer(self, sdp: str) -> None:
        await self.pc.setRemoteDescription(self.aiortc.RTCSessionDescription(sdp=sdp, type="answer"))

    async def _send(self, text: str) -> None:
        self.channel.send(text)

    async def _close(self) -> None:
        if self.pc is not None:
            await self.pc.close()

    # -- trio side

    async def offer(self) -> str:
        return await self.thread.run(self._offer)

    async def answer(self, sdp: str) -> None:
        await self.thread.run(self._answer, sdp)

    async def send(self, event: dict) -> None:
        await self.thread.run(self._send, json.dumps(event))

    async def close(self) -> None:
        with trio.move_on_after(5):
            await self.thread.run(self._close)
        await trio.to_thread.run_sync(self.thread.stop)

    def types(self) -> list[str]:
        return [e["type"] for _, e in self.events]

    def loud_frames(self, start: float = 0.0, end: float = float("inf")) -> int:
        return sum(1 for at, peak in self.frames if start <= at < end and peak > SILENT_PEAK)

    def frames_between(self, start: float, end: float) -> list[int]:
        return [peak for at, peak in self.frames if start <= at < end]


async def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll a record of the other thread until ``predicate()`` holds."""
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)
