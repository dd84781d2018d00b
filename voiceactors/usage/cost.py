"""Token usage and cost, with no I/O (sans-IO: no trio, no files).

The Realtime service reports a ``usage`` object on every ``response.done``
(``openai.types.realtime.RealtimeResponseUsage``)::

    {"total_tokens", "input_tokens", "output_tokens",
     "input_token_details": {"text_tokens", "audio_tokens", "image_tokens", "cached_tokens",
                             "cached_tokens_details": {"text_tokens", "audio_tokens", "image_tokens"}},
     "output_token_details": {"text_tokens", "audio_tokens"}}

Cached tokens are a subset of the input tokens. ``read_usage`` turns one such
object (an SDK model, a light read-only view or a plain dict: fields are read
by name, a missing one is None) into ``Tokens``: the five kinds a price table
prices, which add up to what is billed:

* ``text_in`` — input text tokens not cached (``text_tokens`` − cached text),
* ``audio_in`` — input audio tokens not cached (``audio_tokens`` − cached audio),
* ``cached_in`` — cached input tokens (``cached_tokens``),
* ``text_out``, ``audio_out`` — the output details.

A field that is absent (or null) counts zero; a field that is present but not
a non-negative whole number is malformed: it counts zero too and its name is
returned, for the caller to log. Without ``cached_tokens_details`` the cached
tokens are taken from the audio input first (a voice call's context is mostly
audio), then from the text. Image input tokens (the voice server sends no
images) are neither counted as a kind nor priced.

``Prices`` are US dollars per million tokens per kind; ``parse_price_table``
reads the ``prices`` setting. ``CallUsage`` keeps one call's usage per
response and its totals; a model without prices counts tokens and has an
unknown cost (None).

A Live session bills seconds of audio, not tokens: ``session.usage.updated``
reports the session's *cumulative* billable seconds, so ``AudioUsage`` keeps
the highest total reported (a repeated or late report adds nothing) and
prices it per minute, by a ``prices`` entry of the other form,
``<model>=audio_min:<US dollars per minute>`` (``parse_audio_prices``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

#: The priced kinds, in the order the price table lists them.
TOKEN_KINDS = ("text_in", "text_out", "audio_in", "audio_out", "cached_in")
MILLION = 1_000_000


@dataclass(frozen=True)
class Prices:
    """US dollars per million tokens of each kind."""

    text_in: float
    text_out: float
    audio_in: float
    audio_out: float
    cached_in: float


@dataclass
class Tokens:
    """Token counts by kind (see the module docstring)."""

    text_in: int = 0
    text_out: int = 0
    audio_in: int = 0
    audio_out: int = 0
    cached_in: int = 0

    @property
    def total(self) -> int:
        return self.text_in + self.text_out + self.audio_in + self.audio_out + self.cached_in

    # spelled out, in TOKEN_KINDS' order: these run for every response.done
    def add(self, other: "Tokens") -> None:
        self.text_in += other.text_in
        self.text_out += other.text_out
        self.audio_in += other.audio_in
        self.audio_out += other.audio_out
        self.cached_in += other.cached_in

    def as_dict(self) -> dict[str, int]:
        return {"text_in": self.text_in, "text_out": self.text_out, "audio_in": self.audio_in,
                "audio_out": self.audio_out, "cached_in": self.cached_in}

    @classmethod
    def from_dict(cls, data: Any) -> "Tokens":
        """From a record's ``tokens`` object; anything that is not a count is zero."""
        tokens = cls()
        if isinstance(data, dict):
            for kind in TOKEN_KINDS:
                value = data.get(kind)
                if _is_count(value):
                    setattr(tokens, kind, value)
        return tokens


def cost_usd(tokens: Tokens, prices: Prices | None) -> float | None:
    """What ``tokens`` cost at ``prices`` in US dollars (None: no prices)."""
    if prices is None:
        return None
    # TOKEN_KINDS' order, added left to right (as Python 3.11's sum() over them did)
    return (tokens.text_in * prices.text_in + tokens.text_out * prices.text_out
            + tokens.audio_in * prices.audio_in + tokens.audio_out * prices.audio_out
            + tokens.cached_in * prices.cached_in) / MILLION


def round_usd(value: float | None) -> float | None:
    """Dollars as records and APIs show them: to a millionth of a dollar."""
    return None if value is None else round(value, 6)


# --- reading the service's usage ---------------------------------------------------------

def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _field(obj: object, name: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


_SCALARS = (str, bytes, int, float, bool, list, tuple)


#: Each usage path split once (``read_usage`` reads the same seven on every response.done).
_PATH_PARTS: dict[str, tuple[str, ...]] = {}


class _Reader:
    """Reads counts off one usage object, noting malformed fields."""

    def __init__(self) -> None:
        self.malformed: list[str] = []

    def count(self, obj: object, path: str) -> int:
        value: Any = obj
        walked: list[str] = []
        parts = _PATH_PARTS.get(path)
        if parts is None:
            parts = _PATH_PARTS[path] = tuple(path.split("."))
        for part in parts:
            if isinstance(value, _SCALARS):
                # a detail object that is a number or a string: malformed, once
                where = ".".join(walked) or "usage"
                if where not in self.malformed:
                    self.malformed.append(where)
                return 0
            walked.append(part)
            value = _field(value, part)
        if value is None:
            return 0
        if not _is_count(value):
            self.malformed.append(path)
            return 0
        count: int = value
        return count


def _plain_count(value: object) -> int | None:
    """A well-formed count as it is, an absent one as 0; None: not plain
    (``read_usage``'s general path decides)."""
    if value is None:
        return 0
    if type(value) is int and value >= 0:
        return value
    return None


def _read_plain(usage: object) -> Tokens | None:
    """``read_usage`` of the usual case, in one pass: a decoded JSON object
    whose detail objects are objects (or absent) and whose counts are plain
    whole numbers (or absent). Anything else (None: not the usual case) goes
    the general way, which also names what is malformed."""
    if type(usage) is not dict:
        return None
    inputs = usage.get("input_token_details")
    outputs = usage.get("output_token_details")
    if inputs is None:
        inputs = _NO_DETAILS
    if outputs is None:
        outputs = _NO_DETAILS
    if type(inputs) is not dict or type(outputs) is not dict:
        return None
    details = inputs.get("cached_tokens_details")
    if details is not None and type(details) is not dict:
        return None
    text, audio, cached = (_plain_count(inputs.get("text_tokens")), _plain_count(inputs.get("audio_tokens")),
                           _plain_count(inputs.get("cached_tokens")))
    text_out, audio_out = _plain_count(outputs.get("text_tokens")), _plain_count(outputs.get("audio_tokens"))
    if text is None or audio is None or cached is None or text_out is None or audio_out is None:
        return None
    if details is not None:
        details_text, details_audio = (_plain_count(details.get("text_tokens")),
                                       _plain_count(details.get("audio_tokens")))
        if details_text is None or details_audio is None:
            return None
        cached_text, cached_audio = min(text, details_text), min(audio, details_audio)
    else:
        cached_audio = min(audio, cached)
        cached_text = min(text, cached - cached_audio)
    return Tokens(text_in=text - cached_text, audio_in=audio - cached_audio, cached_in=cached,
                  text_out=text_out, audio_out=audio_out)


_NO_DETAILS: dict[str, Any] = {}


def read_usage(usage: object) -> tuple[Tokens, list[str]]:
    """The priced kinds of one ``response.done``'s ``usage`` and the names of
    its malformed fields (counted zero). ``usage`` None: no tokens."""
    plain = _read_plain(usage)
    if plain is not None:
        return plain, []
    return _read_general(usage)


def _read_general(usage: object) -> tuple[Tokens, list[str]]:
    """``read_usage`` of any usage: a model, a view or a dict, malformed or not."""
    reader = _Reader()
    text = reader.count(usage, "input_token_details.text_tokens")
    audio = reader.count(usage, "input_token_details.audio_tokens")
    cached = reader.count(usage, "input_token_details.cached_tokens")
    details = _field(_field(usage, "input_token_details"), "cached_tokens_details")
    if details is not None:
        cached_text = min(text, reader.count(usage, "input_token_details.cached_tokens_details.text_tokens"))
        cached_audio = min(audio, reader.count(usage, "input_token_details.cached_tokens_details.audio_tokens"))
    else:
        cached_audio = min(audio, cached)
        cached_text = min(text, cached - cached_audio)
    tokens = Tokens(
        text_in=text - cached_text,
        audio_in=audio - cached_audio,
        cached_in=cached,
        text_out=reader.count(usage, "output_token_details.text_tokens"),
        audio_out=reader.count(usage, "output_token_details.audio_tokens"),
    )
    return tokens, reader.malformed


# --- the price table --------------------------------------------------------------------------

class PriceTableError(ValueError):
    """A ``prices`` entry that does not parse."""


#: The per-minute form of a ``prices`` entry: ``<model>=audio_min:<US dollars per minute>``.
AUDIO_MIN_PREFIX = "audio_min:"


def _is_audio_entry(entry: str) -> bool:
    return entry.partition("=")[2].strip().startswith(AUDIO_MIN_PREFIX)


def parse_audio_entry(entry: str) -> tuple[str, float]:
    """``<model>=audio_min:<US dollars per minute of session audio>``."""
    model, _, rest = entry.strip().partition("=")
    price = rest.strip()[len(AUDIO_MIN_PREFIX):]
    if not model.strip():
        raise PriceTableError(f"price entry {entry!r} is not <model>=audio_min:<US dollars per minute>")
    try:
        value = float(price)
    except ValueError:
        raise PriceTableError(f"price entry {entry!r} has a price that is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise PriceTableError(f"price entry {entry!r} has a negative or infinite price")
    return model.strip(), value


def parse_audio_prices(entries: tuple[str, ...] | list[str]) -> dict[str, float]:
    """The ``prices`` setting's per-minute entries as model -> US dollars per
    minute of audio (a later entry for the same model wins)."""
    return dict(parse_audio_entry(entry) for entry in entries if entry.strip() and _is_audio_entry(entry))


def parse_price_entry(entry: str) -> tuple[str, Prices]:
    """``<model>=<text in>/<text out>/<audio in>/<audio out>/<cached in>``
    (US dollars per million tokens)."""
    model, sep, rest = entry.strip().partition("=")
    parts = rest.split("/")
    if not sep or not model.strip() or len(parts) != len(TOKEN_KINDS):
        raise PriceTableError(f"price entry {entry!r} is not <model>=<text in>/<text out>/<audio in>/"
                              "<audio out>/<cached in>")
    try:
        values = [float(part) for part in parts]
    except ValueError:
        raise PriceTableError(f"price entry {entry!r} has a price that is not a number") from None
    if any(not math.isfinite(v) or v < 0 for v in values):
        raise PriceTableError(f"price entry {entry!r} has a negative or infinite price")
    return model.strip(), Prices(*values)


def parse_price_table(entries: tuple[str, ...] | list[str]) -> dict[str, Prices]:
    """The ``prices`` setting's per-token entries as model -> Prices (a later
    entry for the same model wins; the per-minute entries are
    ``parse_audio_prices``')."""
    return dict(parse_price_entry(entry) for entry in entries if entry.strip() and not _is_audio_entry(entry))


def price_table_problem(entries: Any) -> str | None:
    """Why the ``prices`` setting is unusable (None: it is fine)."""
    try:
        parse_price_table(tuple(entries))
        parse_audio_prices(tuple(entries))
    except PriceTableError as error:
        return str(error)
    return None


# --- one call ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class ResponseUsage:
    response_id: str
    tokens: Tokens
    cost_usd: float | None


@dataclass
class AudioUsage:
    """A Live session's billable seconds of audio, priced per minute
    (``usd_per_min`` None: the model has no per-minute price, the cost is
    unknown). ``seconds``: the highest cumulative total reported (a rejoined
    call starts from what its earlier runs counted); ``counted``: the
    seconds this call's reports added, which its cost is of."""

    model: str
    usd_per_min: float | None
    seconds: float = 0.0
    counted: float = 0.0

    def report(self, seconds: object) -> float:
        """One ``session.usage.updated``'s cumulative ``seconds``: the seconds
        it adds (0: not above a total already reported, or not a count)."""
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
            return 0.0
        added = float(seconds) - self.seconds
        if added <= 0:
            return 0.0
        self.seconds = float(seconds)
        self.counted += added
        return added

    def cost_of(self, seconds: float) -> float | None:
        return None if self.usd_per_min is None else seconds / 60 * self.usd_per_min

    @property
    def cost_usd(self) -> float | None:
        return self.cost_of(self.counted)


@dataclass
class CallUsage:
    """One call's usage: per response and in total, priced at ``prices``
    (None: the model has no prices, the cost is unknown); a Live call's
    audio too (``audio``). The cost is what is priced: a Live call whose
    audio has a price and whose delegated model has none costs its audio."""

    model: str
    prices: Prices | None
    responses: list[ResponseUsage] = field(default_factory=list)
    total: Tokens = field(default_factory=Tokens)
    audio: AudioUsage | None = None

    @property
    def cost_usd(self) -> float | None:
        tokens = cost_usd(self.total, self.prices)
        audio = self.audio.cost_usd if self.audio is not None else None
        if audio is None:
            return tokens
        return audio if tokens is None else tokens + audio

    def add(self, response_id: str, usage: object) -> tuple[ResponseUsage, list[str]]:
        """Count one response's ``usage``; the entry and its malformed fields."""
        tokens, malformed = read_usage(usage)
        entry = ResponseUsage(response_id, tokens, cost_usd(tokens, self.prices))
        self.responses.append(entry)
        self.total.add(tokens)
        return entry, malformed
