"""One socket write per fixed-length HTTP response (a connect's answer among them).

hypercorn writes a response as separate sends: the head (``h11.Response``)
when the app starts the response, the body (``h11.Data``) when it sends it,
then the end (``h11.EndOfMessage``: no bytes for a body of known length).
Each non-empty send is a system call, and on loopback the sender's call also
runs the receiver's TCP path: the response's two sends were 6–8 % of a
connect's Python samples, and each saved send is a scheduler turn saved
too. ``HeadHold`` is the rule
that joins them, with no I/O: a *whole head of a fixed-length response*
(one write that is exactly a head, ``content-length`` above 0, no
``transfer-encoding``) is kept back and goes out in front of the next write,
so the head and a small body leave in one send.

What is never held: a chunked head (a streaming response, e.g. the SSE
feeds: its first chunk may be minutes away, and the client must see the
head now), an informational (1xx) head, a head with ``content-length: 0``,
and anything that is not a head. A held head never stays behind: hypercorn
always writes after a head (the body; or, where the body is suppressed — a
HEAD request, a 304 — the end's empty write, which releases it), and the
stream's ``send_eof`` releases it too (``serving.SlotStream``).

It reads only the bytes hypercorn's h11 writes (the status line, the
header lines, the blank line), not hypercorn's objects.
"""

from __future__ import annotations

#: A body larger than this goes in its own send after the held head (no copy of a big buffer).
JOIN_MAX_BYTES = 2**16


def holdable_head(data: bytes | bytearray | memoryview) -> bool:
    """Whether ``data`` is exactly one HTTP/1.x response head (status 200 or
    above) announcing a body of a known, non-zero length."""
    if not isinstance(data, bytes) or not data.startswith(b"HTTP/1.") or not data.endswith(b"\r\n\r\n"):
        return False
    if data.find(b"\r\n\r\n") != len(data) - 4:        # a head and the start of a body: not a head alone
        return False
    status = data[9:12]
    if not status.isdigit() or status[:1] == b"1":
        return False
    lower = data.lower()
    if b"\r\ntransfer-encoding:" in lower:
        return False
    at = lower.find(b"\r\ncontent-length:")
    if at < 0:
        return False
    value = lower[at + len(b"\r\ncontent-length:"):lower.find(b"\r\n", at + 2)].strip()
    return value.isdigit() and int(value) > 0


class HeadHold:
    """The writes of one connection, with a fixed-length response's head
    held until its next write. ``take(data)`` is what to send now (None:
    nothing, the head is held); ``release()`` is what is held (b"": none)."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held = b""

    @property
    def holding(self) -> bool:
        return bool(self._held)

    def take(self, data: bytes | bytearray | memoryview) -> list[bytes | bytearray | memoryview] | None:
        """The sends for a write of ``data``, in order: None when ``data`` is
        a head to hold; else the held head joined to ``data`` (one send), or
        both apart when ``data`` is big, or ``data`` alone."""
        held = self._held
        if not held:
            if holdable_head(data):
                self._held = bytes(data)
                return None
            return [data]
        self._held = b""
        if len(data) <= JOIN_MAX_BYTES:
            return [held + bytes(data)]
        return [held, data]

    def release(self) -> bytes:
        held, self._held = self._held, b""
        return held
