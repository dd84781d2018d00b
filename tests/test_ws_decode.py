"""The fast path for whole text frames (``ws_frames.decode_whole_frames``)
against wsproto itself: the same bytes, cut into reads in many ways, fed to
a plain wsproto client connection and to one with the fast path, must give
the same events in the same order (and the same refusals)."""

from __future__ import annotations

import random
import struct
from importlib.metadata import version
from typing import Any

import pytest
from wsproto.connection import Connection, ConnectionType

from voiceactors.realtime import ws_frames


def frame(payload: bytes, *, opcode: int = 0x1, fin: bool = True, rsv: int = 0, mask: bytes | None = None,
          length_bytes: int | None = None) -> bytes:
    """One frame as a server writes it (unmasked unless ``mask``); ``length_bytes``
    forces a length form (2 or 8) even where a shorter one would do."""
    first = (0x80 if fin else 0) | rsv | opcode
    size = len(payload)
    form = length_bytes or (0 if size < 126 else 2 if size < 1 << 16 else 8)
    mask_bit = 0x80 if mask else 0
    if form == 0:
        head = bytes([first, mask_bit | size])
    elif form == 2:
        head = bytes([first, mask_bit | 126]) + struct.pack("!H", size)
    else:
        head = bytes([first, mask_bit | 127]) + struct.pack("!Q", size)
    if mask:
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        head += mask
    return head + payload


def text(value: str, **kw: Any) -> bytes:
    return frame(value.encode(), **kw)


WHOLE_TEXTS = ["", "x", "a" * 125, "b" * 126, "c" * 127, "d" * 65535, '{"type":"response.done","note":"é€😀"}',
               "ü" * 200]
WHOLE = [text(t) for t in WHOLE_TEXTS]

STREAMS = {
    "whole text frames": b"".join(WHOLE),
    "a large frame (8-byte length)": text("e" * 70000) + text("after"),
    "a ping between": text("one") + frame(b"hi", opcode=0x9) + text("two") + text("three"),
    "a fragmented message": text("one") + frame(b"par", fin=False) + frame(b"ts", opcode=0x0) + text("two"),
    "a binary frame": text("one") + frame(b"\x00\x01", opcode=0x2) + text("two"),
    "a close, then more": text("one") + frame(struct.pack("!H", 1000) + b"bye", opcode=0x8) + text("late"),
    "invalid UTF-8": text("one") + frame(b"\xff\xfe") + text("two"),
    # a lone surrogate's would-be UTF-8 bytes: refused, so a frame's text never holds one (safe_text)
    "an encoded surrogate": text("one") + frame(b'{"t":"\xed\xb2\x80"}') + text("two"),
    "UTF-8 cut by a fragment": frame("é".encode()[:1], fin=False) + frame("é".encode()[1:], opcode=0x0),
    "a masked frame": text("one") + text("two", mask=b"\x01\x02\x03\x04"),
    "a length not in its shortest form": text("one") + text("short", length_bytes=2),
    "an RSV bit": text("one") + text("two", rsv=0x40),
    "a reserved opcode": text("one") + frame(b"?", opcode=0x3),
}


def events(data: bytes, cuts: list[int], fast: bool) -> list[tuple[Any, ...]]:
    """What a client connection makes of ``data`` read in pieces ending at
    ``cuts``: every event (taken after each read) and any refusal."""
    conn = Connection(ConnectionType.CLIENT)
    if fast:
        ws_frames.decode_whole_frames(conn)
    seen: list[tuple[Any, ...]] = []
    start = 0
    for end in [*cuts, len(data)]:
        try:
            conn.receive_data(data[start:end])
        except Exception as exc:  # noqa: BLE001 - a refusal is part of what is compared
            seen.append(("refused", type(exc).__name__, str(exc)))
        seen.extend((type(e).__name__, *sorted(vars(e).items())) for e in conn.events())
        start = end
    return seen


def ways_to_cut(data: bytes, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    ways: list[list[int]] = [[], list(range(1, len(data)))[:4000]]    # at once; byte by byte (its head)
    if len(data) < 2000:
        ways += [[at] for at in range(1, len(data))]                  # in two, at every place
    ways += [sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(1, 12)))) for _ in range(40)]
    return ways


def test_wsproto_is_the_pinned_version():
    # the fast path reads wsproto's private state: a new version must be checked first
    assert version("wsproto") == "1.3.2"


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_the_fast_path_gives_wsprotos_own_events(name):
    data = STREAMS[name]
    for cuts in ways_to_cut(data, seed=len(name)):
        assert events(data, cuts, fast=True) == events(data, cuts, fast=False), cuts


def test_whole_frames_read_at_once_never_reach_wsprotos_decoder():
    conn = Connection(ConnectionType.CLIENT)
    ws_frames.decode_whole_frames(conn)
    ws_frames.decode_whole_frames(conn)      # idempotent: one fast path, not two stacked
    decoder = conn._proto._frame_decoder
    calls = []
    plain = decoder.process_buffer
    decoder.process_buffer = lambda: calls.append(1) or plain()
    conn.receive_data(STREAMS["whole text frames"])
    got = [e.data for e in conn.events()]
    assert got == WHOLE_TEXTS
    assert len(calls) == 1    # only the look for more, which finds the buffer empty
    assert len(decoder.buffer) == 0


def test_a_frame_split_across_reads_is_wsprotos_and_the_next_whole_one_is_fast_again():
    conn = Connection(ConnectionType.CLIENT)
    ws_frames.decode_whole_frames(conn)
    data = text("first") + text("f" * 300) + text("third")
    conn.receive_data(data[:20])
    assert [(e.data, e.message_finished) for e in conn.events()] == [("first", True), ("f" * 9, False)]
    conn.receive_data(data[20:])
    assert [(e.data, e.message_finished) for e in conn.events()] == [("f" * 291, True), ("third", True)]


def test_a_wsproto_without_the_state_it_reads_is_refused_by_name():
    class Bare:
        _proto = object()
    with pytest.raises(RuntimeError, match="FrameProtocol._frame_decoder"):
        ws_frames.decode_whole_frames(Bare())
