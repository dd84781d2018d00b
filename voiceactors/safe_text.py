"""Text every encoder can take: lone surrogates replaced where text comes in.

A Python ``str`` may hold a surrogate code point (U+D800–U+DFFF) alone, but
UTF-8 has no bytes for one: ``.encode()``, orjson, a Redis client's packer,
an SSE write or a log line on a UTF-8 stream raises ``UnicodeEncodeError``
on it, far from where it came in. Strict UTF-8 decoding never yields one;
JSON does, from an escape (``"\\udc80"``, exactly what ``json.dumps`` writes
for a surrogate-escaped byte), and so do file names (``os.listdir`` decodes
undecodable bytes as surrogates).

The rule: wherever outside text is decoded from JSON (the journal's reader
pair, the sideband's events, a tool call's arguments, a request body, a
brain backend's answer) or named by the file system, every surrogate left
in a string is replaced by U+FFFD (a valid pair is one character by then,
so what remains is lone). Nothing downstream checks again.

A lone surrogate can only come out of JSON through a ``\\ud8xx``–``\\udfxx``
escape, so decoded text is walked only when its raw text holds ``\\ud`` or
``\\uD``; text without a backslash at all (most of the service's events) is
told by one memchr: the hot paths pay next to nothing more
(docs/reliability.md § 14.1).
"""

from __future__ import annotations

import json
import re
from typing import Any

#: What replaces a lone surrogate (the Unicode replacement character).
REPLACEMENT = "\ufffd"

_SURROGATE = re.compile("[\ud800-\udfff]")


def may_hold_surrogate_escape(raw: str | bytes | bytearray) -> bool:
    """Whether JSON text ``raw`` has an escape that may decode to a surrogate
    (``\\ud`` or ``\\uD``; a false alarm costs one walk, never a miss)."""
    # a one-character search is a memchr (~0.1 ns a byte, a multi-character
    # one ~1 ns): most events have no backslash at all
    if type(raw) is str:
        return "\\" in raw and ("\\ud" in raw or "\\uD" in raw)
    return b"\\" in raw and (b"\\ud" in raw or b"\\uD" in raw)


def clean_str(text: str) -> str:
    """``text`` with every surrogate code point replaced by U+FFFD."""
    return _SURROGATE.sub(REPLACEMENT, text)


def clean(value: Any) -> Any:
    """A decoded JSON value with every string (keys too) ``clean_str``-ed;
    containers are copied only along the way down, other values returned as
    they are."""
    kind = type(value)
    if kind is str:
        return clean_str(value)
    if kind is dict:
        return {clean(key): clean(item) for key, item in value.items()}
    if kind is list:
        return [clean(item) for item in value]
    return value


def decoded(raw: str | bytes | bytearray, value: Any) -> Any:
    """``value`` (what ``raw`` decoded to) made safe: walked only when
    ``raw`` may hold a surrogate escape."""
    return clean(value) if may_hold_surrogate_escape(raw) else value


def loads(raw: str | bytes, **options: Any) -> Any:
    """``json.loads(raw, **options)`` made safe (``ValueError`` as it raises)."""
    return decoded(raw, json.loads(raw, **options))
