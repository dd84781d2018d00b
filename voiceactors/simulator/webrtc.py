"""The simulator's WebRTC side: a real peer answering a browser's offer.

``POST /v1/realtime/calls`` with a real offer gets a real answer from aiortc
(the optional ``webrtc`` extra, imported lazily: without it the offer gets a
501). The call's server events go out on the peer's ``oai-events`` data
channel once it is open, client events come back on it, and an audio track
plays the simulated assistant's replies: spoken by ``espeak-ng`` where it is
installed, else a tone.

aiortc is asyncio; the product is trio. So aiortc runs on one thread that owns
its own asyncio loop (``LoopThread``, the one place asyncio runs in this
project), and the two sides cross only through ``loop.call_soon_threadsafe``
(trio → asyncio) and ``TrioToken.run_sync_soon`` (asyncio → trio): neither
side ever blocks on the other.
"""

from __future__ import annotations

import array
import asyncio
import fractions
import importlib
import io
import json
import math
import secrets
import shutil
import threading
import time
import wave
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Coroutine

import trio

from voiceactors.logs import get_logger

__all__ = ["WebRTCUnavailable", "WebRTCOfferError", "LoopThread", "WebRTCPeer", "Voice", "load_aiortc",
           "is_media_offer", "find_speaker", "INSTALL_HINT", "CHANNEL_LABEL"]

INSTALL_HINT = "the simulator needs the webrtc extra for a WebRTC offer: pip install 'voiceactors[webrtc]'"
CHANNEL_LABEL = "oai-events"
LOOPBACK = "127.0.0.1"

SAMPLE_RATE = 48_000
FRAME_S = 0.020
FRAME_SAMPLES = int(SAMPLE_RATE * FRAME_S)
TONE_HZ = 440                # 440 whole cycles per second: one second of samples loops seamlessly
TONE_AMPLITUDE = 6000        # of 32767: clearly audible, not harsh
TONE_S_PER_CHAR = 0.04       # 25 characters a second, a brisk speaking pace
TONE_MIN_S = 0.3
SPEECH_WPM = 190             # espeak-ng's words per minute
SPEECH_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 5.0
OPEN_TIMEOUT_S = 30.0        # a peer whose data channel never opens is given up (the browser left early)

_log = get_logger(actor="simulator")


class WebRTCUnavailable(RuntimeError):
    """aiortc is not installed (the ``webrtc`` extra)."""


class WebRTCOfferError(ValueError):
    """The offer could not be answered (malformed SDP, no usable media)."""


def load_aiortc() -> Any:
    """The aiortc module, imported on first use (a WebRTC offer); raises
    ``WebRTCUnavailable`` with the install hint when it is absent."""
    try:
        aiortc = importlib.import_module("aiortc")
        ice = importlib.import_module("aioice.ice")
    except ImportError as exc:
        raise WebRTCUnavailable(INSTALL_HINT) from exc
    _loopback_only(ice)
    return aiortc


async def _load_aiortc_async() -> Any:
    return load_aiortc()


def _loopback_only(ice: Any) -> None:
    # aioice leaves 127.0.0.1 out of its host candidates, so on a loopback-only
    # machine an answer would have none; the simulator is a local stand-in, so
    # it offers loopback and only loopback (nothing it answers leaves the host).
    # This is process-wide for aioice: every peer in the process gathers only
    # 127.0.0.1 once a WebRTC offer has been answered.
    if getattr(ice.get_host_addresses, "_voiceactors_loopback", False):
        return

    def loopback_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return [LOOPBACK] if use_ipv4 else []

    loopback_addresses._voiceactors_loopback = True  # type: ignore[attr-defined]
    ice.get_host_addresses = loopback_addresses


def is_media_offer(sdp: str) -> bool:
    """Whether an offer asks for a real peer (it has a media or data section).
    An SDP with none (``v=0`` alone) is a signalling-only offer: the simulator
    registers the call and answers a placeholder, as before WebRTC existed here
    (``voiceactors demo`` and the sideband tests use that)."""
    return any(line.startswith("m=") for line in sdp.splitlines())


# --- the asyncio thread ----------------------------------------------------------

class LoopThread:
    """A daemon thread running its own asyncio loop, driven from trio.

    ``await run(fn, *args)`` runs the coroutine ``fn(*args)`` on the loop and
    returns its result in trio (the trio side waits on a trio Event set via
    ``run_sync_soon``, not on a blocked thread); ``call_soon(fn, *args)``
    schedules a plain callback on the loop and returns at once."""

    def __init__(self, name: str = "voiceactors-sim-webrtc") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        if not self.loop.is_closed():
            try:
                self.loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:
                pass  # the loop closed meanwhile

    async def run(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> Any:
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        future = asyncio.run_coroutine_threadsafe(fn(*args), self.loop)

        def wake(_: Any) -> None:
            try:
                token.run_sync_soon(done.set)
            except trio.RunFinishedError:
                pass

        future.add_done_callback(wake)
        try:
            await done.wait()
        except BaseException:
            future.cancel()
            raise
        return future.result()

    def stop(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Stop the loop and join the thread (blocking; call via ``trio.to_thread``)."""
        self.call_soon(self.loop.stop)
        self._thread.join(timeout)


# --- the assistant's voice -------------------------------------------------------

def _tone_second() -> bytes:
    samples = array.array("h", (int(TONE_AMPLITUDE * math.sin(2 * math.pi * TONE_HZ * i / SAMPLE_RATE))
                                for i in range(SAMPLE_RATE)))
    return samples.tobytes()


_TONE = _tone_second()
_TONE_LOOP = _TONE + _TONE[:FRAME_SAMPLES * 2]   # any frame-long slice from any phase
FRAME_BYTES = FRAME_SAMPLES * 2
_SILENCE = bytes(FRAME_BYTES)


def find_speaker() -> str | None:
    """The ``espeak-ng`` binary, when installed (then replies are spoken)."""
    return shutil.which("espeak-ng")


class Voice:
    """What the assistant's track plays (asyncio-thread state, fed the call's
    events in order).

    With a speech synthesiser (``espeak-ng``), each reply's transcript is
    spoken once its ``response.output_audio_transcript.done`` arrives. Without
    one — or when synthesis fails — a tone plays instead. The simulator sends
    a reply's events far faster than speech, so the tone lasts as long as the
    transcript would take to say (``TONE_S_PER_CHAR`` per character of the
    deltas, at least ``TONE_MIN_S`` from ``output_audio_buffer.started``).

    Either stops at once on a barge-in (``input_audio_buffer.speech_started``,
    ``output_audio_buffer.cleared`` or a cancelled ``response.done``)."""

    def __init__(self, speaker: str | None = None) -> None:
        self.speaker = speaker
        self.until = 0.0                 # the tone plays until then (monotonic time)
        self.pcm = bytearray()           # speech still to play: 48 kHz mono s16
        self.replies = 0                 # output_audio_buffer.started seen
        self.spoken = 0                  # replies synthesised to speech
        self.cut = 0                     # times a barge-in stopped audio that was playing
        self._generation = 0             # bumped by a cut: a synthesis started before it is dropped

    def observe(self, event: dict, now: float) -> None:
        kind = event.get("type")
        if kind == "output_audio_buffer.started":
            self.replies += 1
            if self.speaker is None:
                self.until = max(self.until, now + TONE_MIN_S)
        elif kind == "response.output_audio_transcript.delta" and self.speaker is None:
            self.until = max(self.until, now) + len(event.get("delta", "")) * TONE_S_PER_CHAR
        elif kind == "response.output_audio_transcript.done" and self.speaker is not None:
            asyncio.ensure_future(self._speak(event.get("transcript", ""), self._generation))
        elif kind in ("output_audio_buffer.cleared", "input_audio_buffer.speech_started") or (
                kind == "response.done" and event.get("response", {}).get("status") == "cancelled"):
            if self.speaking(now):
                self.cut += 1
            self.until = 0.0
            self.pcm.clear()
            self._generation += 1

    def speaking(self, now: float) -> bool:
        return bool(self.pcm) or now < self.until

    def next_frame(self, now: float, phase: int) -> bytes:
        """The next 20 ms of audio (``phase``: the tone's sample position)."""
        if self.pcm:
            chunk = bytes(self.pcm[:FRAME_BYTES])
            del self.pcm[:FRAME_BYTES]
            return chunk.ljust(FRAME_BYTES, b"\0")
        if now < self.until:
            return _TONE_LOOP[phase * 2:phase * 2 + FRAME_BYTES]
        return _SILENCE

    async def _speak(self, text: str, generation: int) -> None:
        if not text.strip():
            return
        try:
            pcm = await _synthesise(self.speaker or "espeak-ng", text)
        except Exception as exc:   # a missing voice, a crash: the reply is still audible
            _log.warning("simulator.speech_failed", error=type(exc).__name__)
            pcm = b""
        if generation != self._generation:
            return  # a barge-in came first
        if pcm:
            self.spoken += 1
            self.pcm += pcm
        else:
            self.until = max(self.until, time.monotonic()) + len(text) * TONE_S_PER_CHAR


async def _synthesise(speaker: str, text: str) -> bytes:
    """``text`` as speech: 48 kHz mono s16 samples (espeak-ng's WAV, resampled)."""
    proc = await asyncio.create_subprocess_exec(
        speaker, "--stdout", "-s", str(SPEECH_WPM), "--", text,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    wav, _ = await asyncio.wait_for(proc.communicate(), SPEECH_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"espeak-ng exited {proc.returncode}")
    with wave.open(io.BytesIO(wav)) as reader:
        rate, width, channels = reader.getframerate(), reader.getsampwidth(), reader.getnchannels()
        data = reader.readframes(reader.getnframes())   # streamed WAV: the header's count is a placeholder
    if width != 2 or channels != 1:
        raise RuntimeError("unexpected WAV format")
    av = importlib.import_module("av")
    frame = av.AudioFrame(format="s16", layout="mono", samples=len(data) // 2)
    frame.planes[0].update(data[:frame.planes[0].buffer_size].ljust(frame.planes[0].buffer_size, b"\0"))
    frame.sample_rate = rate
    frame.pts = 0
    frame.time_base = fractions.Fraction(1, rate)
    resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
    out = resampler.resample(frame) + resampler.resample(None)
    return b"".join(bytes(f.planes[0])[:f.samples * 2] for f in out)


_VOICE_TRACK: list[type] = []


def _voice_track(aiortc: Any) -> type:
    if not _VOICE_TRACK:
        _VOICE_TRACK.append(_voice_track_class(aiortc))
    return _VOICE_TRACK[0]


def _voice_track_class(aiortc: Any) -> type:
    av = importlib.import_module("av")
    mediastreams = importlib.import_module("aiortc.mediastreams")

    class VoiceTrack(aiortc.MediaStreamTrack):  # type: ignore[misc, name-defined]
        """48 kHz mono, 20 ms frames in real time, from ``voice``."""

        kind = "audio"

        def __init__(self, voice: Voice) -> None:
            super().__init__()
            self.voice = voice
            self._start: float | None = None
            self._pts = 0
            self._phase = 0

        async def recv(self) -> Any:
            if self.readyState != "live":
                raise mediastreams.MediaStreamError
            if self._start is None:
                self._start = time.monotonic()
            else:
                self._pts += FRAME_SAMPLES
                await asyncio.sleep(self._start + self._pts / SAMPLE_RATE - time.monotonic())
            frame = av.AudioFrame(format="s16", layout="mono", samples=FRAME_SAMPLES)
            frame.planes[0].update(self.voice.next_frame(time.monotonic(), self._phase))
            self._phase = (self._phase + FRAME_SAMPLES) % SAMPLE_RATE
            frame.pts = self._pts
            frame.sample_rate = SAMPLE_RATE
            frame.time_base = fractions.Fraction(1, SAMPLE_RATE)
            return frame

    return VoiceTrack


# --- one peer --------------------------------------------------------------------

@dataclass
class _Asyncio:
    """The peer's asyncio-side objects (touched on the loop thread only)."""

    pc: Any = None
    channel: Any = None
    track: Any = None
    voice: Voice = field(default_factory=Voice)
    sinks: list[asyncio.Task] = field(default_factory=list)


class WebRTCPeer:
    """The simulator's side of one browser call.

    Trio side: ``channel_open`` and ``closed`` (trio Events), ``inbox`` (raw
    client messages from the data channel, in order), ``closed_by`` (``"local"``
    when the simulator closed it, ``"remote"`` when the browser's channel or
    connection went away, ``"open_timeout"`` when its channel never opened),
    ``server_event(event)`` (sync, never blocks: queues it for the channel). Create with ``await WebRTCPeer.answer(...)``."""

    def __init__(self, loop: LoopThread, call_id: str, token: trio.lowlevel.TrioToken,
                 speaker: str | None = None) -> None:
        self.loop = loop
        self.call_id = call_id
        self._token = token
        self._a = _Asyncio(voice=Voice(speaker))
        self.channel_open = trio.Event()
        self.closed = trio.Event()
        self.closed_by: str | None = None
        self.connection_states: list[str] = []
        send, self.inbox = trio.open_memory_channel[str](math.inf)
        self._inbox_send = send
        self.channel_sent = 0
        self._closing = False
        self.log = _log.bind(call_id=call_id)

    # -- crossing to trio (called on the asyncio thread)

    def _to_trio(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            self._token.run_sync_soon(fn, *args)
        except trio.RunFinishedError:
            pass

    def _on_open(self) -> None:
        self.log.info("simulator.webrtc_channel", state="open")
        self.channel_open.set()

    def _on_message(self, message: str) -> None:
        try:
            self._inbox_send.send_nowait(message)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass

    def _on_gone(self, how: str) -> None:
        if self.closed_by is None:
            self.closed_by = how
        self._inbox_send.close()
        self.closed.set()

    # -- set-up

    @classmethod
    async def answer(cls, loop: LoopThread, call_id: str, offer_sdp: str, *,
                     speaker: str | None = None) -> tuple["WebRTCPeer", str]:
        """Answer ``offer_sdp``: (the peer, the answer SDP). ``speaker``: the
        speech synthesiser's binary (None: a tone). Raises
        ``WebRTCUnavailable`` or ``WebRTCOfferError``."""
        aiortc = await loop.run(_load_aiortc_async)   # the first import is slow: not on trio's thread
        peer = cls(loop, call_id, trio.lowlevel.current_trio_token(), speaker)
        answer = await loop.run(peer._answer, aiortc, offer_sdp)
        return peer, answer

    async def _answer(self, aiortc: Any, offer_sdp: str) -> str:
        a = self._a
        a.pc = pc = aiortc.RTCPeerConnection(aiortc.RTCConfiguration(iceServers=[]))  # no STUN: loopback only

        @pc.on("datachannel")
        def on_datachannel(channel: Any) -> None:
            if channel.label != CHANNEL_LABEL or a.channel is not None:
                return
            a.channel = channel
            channel.on("message", lambda m: self._to_trio(self._on_message, m) if isinstance(m, str) else None)
            channel.on("close", lambda: self._to_trio(self._on_gone, "remote"))
            if channel.readyState == "open":
                self._to_trio(self._on_open)
            else:
                channel.on("open", lambda: self._to_trio(self._on_open))

        @pc.on("track")
        def on_track(track: Any) -> None:
            a.sinks.append(asyncio.ensure_future(_discard(track)))   # the mic: read, so it does not pile up

        @pc.on("connectionstatechange")
        def on_state() -> None:
            state = pc.connectionState
            self._to_trio(self.connection_states.append, state)
            if state in ("failed", "closed"):
                self._to_trio(self._on_gone, "remote")

        try:
            await pc.setRemoteDescription(aiortc.RTCSessionDescription(sdp=offer_sdp, type="offer"))
            if any(t.kind == "audio" for t in pc.getTransceivers()):
                # binds to the offer's audio section (an answer may add none)
                a.track = _voice_track(aiortc)(a.voice)
                pc.addTrack(a.track)
            await pc.setLocalDescription(await pc.createAnswer())
        except asyncio.CancelledError:
            asyncio.ensure_future(pc.close())   # the offer's request went away meanwhile
            raise
        except Exception as exc:
            await pc.close()
            raise WebRTCOfferError(f"could not answer the offer: {exc}") from exc
        return pc.localDescription.sdp

    # -- trio side

    def server_event(self, event: dict) -> None:
        """A server event of the call (already recorded in ``call.sent``): it
        drives the reply audio and, once the channel is open, goes out on it."""
        if self.closed.is_set():
            return
        self.loop.call_soon(self._deliver, json.dumps(event) if self.channel_open.is_set() else None, event)
        if self.channel_open.is_set():
            self.channel_sent += 1

    def _deliver(self, text: str | None, event: dict) -> None:   # on the asyncio thread
        a = self._a
        a.voice.observe(event, time.monotonic())
        if text is not None and a.channel is not None and a.channel.readyState == "open":
            try:
                a.channel.send(text)
            except Exception as exc:   # e.g. larger than the browser's max-message-size
                self.log.warning("simulator.webrtc_send_failed", type=event.get("type"), size=len(text),
                                 error=type(exc).__name__)

    def voice_event(self, event: dict) -> None:
        """An event for the reply audio only (``Voice``), never sent on the
        channel: a Live session's words, told in the Realtime events the voice
        follows (``live.py``)."""
        if not self.closed.is_set():
            self.loop.call_soon(lambda: self._a.voice.observe(event, time.monotonic()))

    def channel_error(self, message: str, code: str, event_id: str | None) -> None:
        """An ``error`` event on the channel only (not part of the call's record)."""
        error = {"type": "error", "event_id": "event_" + secrets.token_hex(8),
                 "error": {"type": "invalid_request_error", "code": code, "message": message,
                           "param": None, "event_id": event_id}}
        if self.channel_open.is_set() and not self.closed.is_set():
            self.loop.call_soon(self._deliver, json.dumps(error), error)

    @property
    def voice(self) -> Voice:
        """The reply audio's state (``replies``, ``spoken``, ``cut``); read only."""
        return self._a.voice

    async def close(self) -> None:
        """Close the data channel and the peer connection (idempotent)."""
        if self.closed_by is None:
            self.closed_by = "local"
        if not self._closing:
            self._closing = True
            # shielded: a close cancelled half-way would leave aiortc's own
            # close task failing on a cancelled future
            with trio.move_on_after(CLOSE_TIMEOUT_S) as scope:
                scope.shield = True
                try:
                    await self.loop.run(self._close)
                except RuntimeError:
                    pass  # the loop has already stopped: nothing left to close
        self._inbox_send.close()
        self.closed.set()

    async def _close(self) -> None:
        a = self._a
        if a.channel is not None and a.channel.readyState in ("connecting", "open"):
            a.channel.close()
        if a.pc is not None:
            await a.pc.close()
        for sink in a.sinks:
            sink.cancel()


async def _discard(track: Any) -> None:
    while True:
        try:
            await track.recv()
        except Exception:
            return
