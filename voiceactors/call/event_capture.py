"""Raw capture of a call's server events (setting ``record_events``).

With ``VOICEACTORS_RECORD_EVENTS=1`` every call actor run appends one block
to ``<state_dir>/captures/<call id>.jsonl`` (the file name as the call
record's): the server events as received on the sideband, each with its
receive time, and where each connection began and how it closed. It is the
input of ``voiceactors replay`` (``voiceactors/replay/``). Off by default.

Off the hot path: the reader hands each frame over as it is (``frame``: an
append to a list, no decoding; ``connected`` and ``closed`` mark the
connections); a background task of the actor (``run``)
decodes, scrubs and writes what piled up, in a worker thread, at most every
``FLUSH_S``. The call never waits for the disk.

The block, one JSON object a line, ``t`` in seconds since the actor started
(trio clock, as the call record's):

* ``{"kind": "capture", "version": 1, "call_id", "at" (UTC), "max_chars"}`` — the block's head;
* ``{"kind": "connect", "t", "connection"}`` — a sideband connection began (1, 2, …);
* ``{"kind": "event", "t", "event": {...}}`` — one server event, decoded;
* ``{"kind": "frame", "t", "note"}`` — a frame that is not a JSON object (binary, not JSON);
* ``{"kind": "close", "t", "code"}`` — the service closed the connection (1000, 1001, 1006, …);
* ``{"kind": "truncated", "t", "max_chars"}`` — the bound was reached (below);
* ``{"kind": "end", "t", "events", "dropped", "audio_dropped"}`` — the run ended.

Secrets are never written: every value goes through ``logs.scrub`` (fields
named like a key or token become ``[redacted]``, ``sk-…``/``ek_…``/``Bearer``
strings too). Audio is dropped: an event carrying audio (``*.audio.delta``;
the sideband normally has none) is counted in ``audio_dropped``, not written.

Bounded: a run captures at most ``MAX_CAPTURE_CHARS`` characters of frames.
The frame that would pass the bound is not written; a ``truncated`` line is,
and every later frame of the run is only counted (``dropped`` in ``end``).
The call goes on unchanged; a replay of a truncated capture says so.
"""

from __future__ import annotations

import json
import os
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, assert_never

import trio

from voiceactors import clock, storage
from voiceactors.call.record import record_path
from voiceactors.logs import get_logger, scrub
from voiceactors.realtime.sideband import ConnectionClosed, close_code

if TYPE_CHECKING:
    from voiceactors.settings import Settings

__all__ = ["CAPTURE_VERSION", "EventCapture", "MAX_CAPTURE_CHARS", "MAX_CAPTURE_FILE_BYTES", "MAX_CAPTURE_LINE_BYTES",
           "capture_path", "read_capture"]

CAPTURE_VERSION = 1
#: Characters of server frames one actor run captures at most (about 8 MB).
MAX_CAPTURE_CHARS = 8 * 1024 * 1024
#: A capture line holds one frame's event (at most ``MAX_CAPTURE_CHARS``
#: characters, each at most 4 bytes of UTF-8): a longer line is not ours.
MAX_CAPTURE_LINE_BYTES = 4 * MAX_CAPTURE_CHARS
#: A capture file holds one block per actor run of its call: a reader takes
#: at most this much of one (32 runs that each reached the bound).
MAX_CAPTURE_FILE_BYTES = 32 * MAX_CAPTURE_CHARS
#: What the reader handed over is written within this long.
FLUSH_S = 0.5


def capture_path(state_dir: Path, call_id: str) -> Path:
    """``<state_dir>/captures/<name>.jsonl``, ``name`` as the call record's."""
    return Path(state_dir) / "captures" / record_path(state_dir, call_id).name


def _is_audio(event: dict[str, Any]) -> bool:
    kind = event.get("type")
    return isinstance(kind, str) and kind.endswith("audio.delta") and "transcript" not in kind


class Taken(StrEnum):
    """What the reader handed the capture: a connection opened (its number),
    a frame (its text or bytes), the size cap reached, the connection closed
    (its code). The writer makes each one's lines (``_line``)."""

    CONNECT = "connect"
    FRAME = "frame"
    TRUNCATED = "truncated"
    CLOSE = "close"


#: One thing taken, with its time (seconds since the start) and value.
_Pending = tuple[Taken, float, int | str | bytes | None]


class EventCapture:
    """The capture of one actor run: ``connected``/``frame``/``closed`` from
    the reader (never block), ``run`` as a task of the actor (writes; on
    cancellation it writes what is left and the ``end`` line, bounded)."""

    def __init__(self, call_id: str, state_dir: Path, *, started: float,
                 max_chars: int = MAX_CAPTURE_CHARS) -> None:
        self.call_id = call_id
        self.path = capture_path(state_dir, call_id)
        self.started = started
        self.max_chars = max_chars
        self.chars = 0
        self.events = 0
        self.dropped = 0
        self.audio_dropped = 0
        self.connections = 0
        self.failed: str | None = None
        self.log = get_logger(actor="call", call_id=call_id)
        self._pending: list[_Pending] = []
        self._truncated = False
        self._head_written = False
        self._wake = trio.Event()

    @classmethod
    def for_settings(cls, settings: Settings, call_id: str, started: float) -> "EventCapture | None":
        return cls(call_id, settings.state_dir, started=started) if settings.record_events else None

    # -- the reader's side (synchronous, O(1))

    def connected(self, now: float) -> None:
        """A new sideband connection: its frames follow (``frame``)."""
        self.connections += 1
        self._add(Taken.CONNECT, now, self.connections)

    def frame(self, raw: str | bytes, now: float) -> None:
        if self._truncated:
            self.dropped += 1
            return
        if self.chars + len(raw) > self.max_chars:
            self._truncated = True
            self.dropped += 1
            self._add(Taken.TRUNCATED, now, None)
            return
        self.chars += len(raw)
        self._add(Taken.FRAME, now, raw)

    def closed(self, code: int | None, now: float) -> None:
        if not self._truncated:
            self._add(Taken.CLOSE, now, code)

    def _add(self, kind: Taken, now: float, value: int | str | bytes | None) -> None:
        self._pending.append((kind, round(now - self.started, 4), value))
        self._wake.set()

    # -- the writer

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                await self._wake.wait()
                await trio.sleep(FLUSH_S)    # let a burst pile up: one write for many frames
                self._wake = trio.Event()
                await self._flush(final=False)
        finally:
            with trio.move_on_after(2.0, shield=True):
                await self._flush(final=True)

    async def _flush(self, *, final: bool) -> None:
        pending, self._pending = self._pending, []
        if not pending and not (final and self._head_written):
            return
        end = None
        if final:
            end = {"kind": "end", "t": round(trio.current_time() - self.started, 4)}
        try:
            await storage.run_sync(self._write, pending, end, cancellable=False)
        except OSError as exc:
            if self.failed is None:
                self.log.warning("call.capture_failed", error=type(exc).__name__, path=str(self.path))
            self.failed = str(exc)

    def _write(self, pending: list[_Pending], end: dict[str, Any] | None) -> None:
        """Decode, scrub and append (in a worker thread)."""
        lines = []
        if not self._head_written:
            lines.append({"kind": "capture", "version": CAPTURE_VERSION, "call_id": self.call_id,
                          "at": clock.now_utc().isoformat(timespec="seconds"), "max_chars": self.max_chars})
        for kind, t, value in pending:
            lines.extend(self._line(kind, t, value))
        if end is not None:
            end.update(events=self.events, dropped=self.dropped, audio_dropped=self.audio_dropped)
            lines.append(end)
        # dumps_line: a lone surrogate an event's escape decoded to is written
        # escaped again (the capture keeps what was received; UTF-8 has no bytes for it)
        text = "".join(storage.dumps_line(line) + "\n" for line in lines)
        fd, _created = storage.open_append(self.path)
        with os.fdopen(fd, "a", encoding="utf-8") as handle:
            handle.write(text)
        self._head_written = True

    def _line(self, kind: Taken, t: float, value: int | str | bytes | None) -> list[dict[str, Any]]:
        match kind:
            case Taken.CONNECT:
                return [{"kind": "connect", "t": t, "connection": value}]
            case Taken.CLOSE:
                return [{"kind": "close", "t": t, "code": value}]
            case Taken.TRUNCATED:
                return [{"kind": "truncated", "t": t, "max_chars": self.max_chars}]
            case Taken.FRAME:
                return self._frame_line(t, value)
            case _:
                assert_never(kind)

    def _frame_line(self, t: float, value: int | str | bytes | None) -> list[dict[str, Any]]:
        if not isinstance(value, (str, bytes, bytearray)):
            raise TypeError(f"a frame is text or bytes, not {type(value).__name__}")
        if isinstance(value, (bytes, bytearray)):
            return [{"kind": "frame", "t": t, "note": f"binary frame of {len(value)} bytes"}]
        try:
            event = json.loads(value)
        except ValueError:
            return [{"kind": "frame", "t": t, "note": f"not JSON ({len(value)} characters)"}]
        if not isinstance(event, dict):
            return [{"kind": "frame", "t": t, "note": "not a JSON object"}]
        if _is_audio(event):
            self.audio_dropped += 1
            return []
        self.events += 1
        return [{"kind": "event", "t": t, "event": scrub(event)}]


def read_capture(path: Path) -> list[list[dict[str, Any]]]:
    """The blocks of a capture file (one per actor run), each a list of its
    lines from its ``capture`` head. Raises ``ValueError`` for a file that
    is not a capture (no head line, a newer version), that is not a regular
    file (a FIFO, a device: refused before it is opened for reading), or
    that is past the bounds a capture keeps within (a line longer than
    ``MAX_CAPTURE_LINE_BYTES``, a file larger than ``MAX_CAPTURE_FILE_BYTES``,
    nesting too deep to decode): nothing more than the bound is read."""
    blocks: list[list[dict[str, Any]]] = []
    with storage.open_regular(path) as handle:
        lines = storage.bounded_lines(handle, str(path), max_line=MAX_CAPTURE_LINE_BYTES,
                                      max_total=MAX_CAPTURE_FILE_BYTES)
        for number, raw in enumerate(lines, 1):
            line = _capture_line(path, number, raw)
            if line is None:
                continue
            if line.get("kind") == "capture":
                version = line.get("version")
                if not isinstance(version, int) or version > CAPTURE_VERSION:
                    raise ValueError(f"{path}: capture version {version!r} is not one this version reads")
                blocks.append([line])
            elif blocks:
                blocks[-1].append(line)
    if not blocks:
        raise ValueError(f"{path}: not an event capture (no 'capture' line)")
    return blocks


def _capture_line(path: Path, number: int, raw: bytes) -> dict[str, Any] | None:
    """One line of a capture as an object; None for a blank line or one that
    does not parse as an object (a torn last line)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: line {number} is not UTF-8 text") from None
    if not text.strip():
        return None
    try:
        line = json.loads(text)
    except RecursionError:
        raise ValueError(f"{path}: line {number} is nested too deeply to read") from None
    except ValueError:
        return None
    return line if isinstance(line, dict) else None

