"""Who may reach the journal by phone, and the phone's settings: plain data, no I/O.

A phone call reaches the server as OpenAI's signed ``realtime.call.incoming``
webhook (``http/phone.py``), which carries the SIP INVITE's headers. The
caller's number is read from them here: ``P-Asserted-Identity`` where the
trunk sets it (the network's assertion of who is calling), else ``From``
(whatever the calling device put there). Both are untrusted metadata: a
trunk that passes a caller's own ``From`` lets anyone who can place a call
claim any number, which is why a PIN (``pin``) can be asked of every caller
too (docs/phone.md § Who gets in).

The journal's ``voice.phone`` block::

    "phone": {"allowed_callers": ["+15551234567"], "pin": "2468",
              "transfer_to": "tel:+15557654321"}

``parse`` checks it: each bad value is named and left out (an allowed
caller that is not E.164 allows nobody; a bad transfer target is unset; a
bad PIN refuses every call, as leaving it out would open the line), and
``serve`` refuses to start with one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Iterable

#: E.164: a plus, a country code not starting with 0, at most 15 digits in all
E164_RE = re.compile(r"^\+[1-9][0-9]{6,14}$")
#: a PIN keyed on a phone's keypad: 4 to 12 digits
PIN_RE = re.compile(r"^[0-9]{4,12}$")
#: a transfer target: a SIP URI or a tel URI with an E.164 number (RFC 3261, RFC 3966)
TRANSFER_RE = re.compile(r"^(?:sips?:[^\s<>\"]+@[^\s<>\"]+|tel:\+[1-9][0-9]{6,14})$")
#: the characters RFC 3966 allows inside a phone number for readability
_VISUAL_SEPARATORS = re.compile(r"[-.() ]")
#: the headers a caller is read from, in the order they are trusted
ASSERTED_IDENTITY = "p-asserted-identity"
FROM = "from"
#: a caller's number as records, logs and the console show it: this many digits kept at the end
MASK_KEEP = 2


@dataclass(frozen=True)
class PhoneSettings:
    """The journal's ``voice.phone`` block, checked."""

    allowed_callers: frozenset[str] = field(default_factory=frozenset)
    pin: str | None = None
    transfer_to: str | None = None
    # a PIN was given but is not one: no call is taken (unset, it would open the line to every allowed caller)
    pin_invalid: bool = False

    def view(self) -> dict[str, Any]:
        """What ``/status`` may say of it: never the numbers or the PIN."""
        return {"allowed_callers": len(self.allowed_callers), "pin": self.pin is not None,
                "transfer": self.transfer_to is not None}


def parse(block: Any) -> tuple[PhoneSettings, list[str]]:
    """``voice.phone`` as ``PhoneSettings`` and the problems found (each
    value named, never a PIN; the bad ones left out, but a bad PIN, which
    refuses every call: ``pin_invalid``)."""
    if block is None:
        return PhoneSettings(), []
    if not isinstance(block, dict):
        return PhoneSettings(), ["voice.phone must be an object"]
    problems: list[str] = []
    unknown = sorted(set(block) - {"allowed_callers", "pin", "transfer_to"})
    problems += [f"voice.phone.{name} is not a phone setting" for name in unknown]
    callers = block.get("allowed_callers", [])
    allowed: set[str] = set()
    if not isinstance(callers, list):
        problems.append("voice.phone.allowed_callers must be a list of E.164 numbers")
        callers = []
    for number in callers:
        if isinstance(number, str) and E164_RE.fullmatch(number):
            allowed.add(number)
        else:
            problems.append(f"voice.phone.allowed_callers: {str(number)[:32]!r} is not an E.164 number "
                            "(+ and up to 15 digits)")
    pin = block.get("pin")
    pin_invalid = pin is not None and not (isinstance(pin, str) and PIN_RE.fullmatch(pin))
    if pin_invalid:
        problems.append("voice.phone.pin must be a string of 4 to 12 digits")
        pin = None
    target = block.get("transfer_to")
    if target is not None and not (isinstance(target, str) and TRANSFER_RE.fullmatch(target)):
        problems.append(f"voice.phone.transfer_to: {str(target)[:64]!r} is not a sip: or tel: URI")
        target = None
    return PhoneSettings(frozenset(allowed), pin, target, pin_invalid), problems


class CallerVerdict(StrEnum):
    """What the webhook does with a caller."""

    ALLOWED = "allowed"      # one of the owner's numbers
    UNKNOWN = "unknown"      # a number, not one of them
    WITHHELD = "withheld"    # no number at all (anonymous, or nothing we can read)


@dataclass(frozen=True)
class Caller:
    """The caller as the INVITE's headers name them: the E.164 number (None:
    withheld) and the header it was read from."""

    number: str | None
    header: str | None

    def verdict(self, phone: PhoneSettings) -> CallerVerdict:
        if self.number is None:
            return CallerVerdict.WITHHELD
        return CallerVerdict.ALLOWED if self.number in phone.allowed_callers else CallerVerdict.UNKNOWN

    @property
    def masked(self) -> str | None:
        return masked(self.number) if self.number is not None else None


def masked(number: str) -> str:
    """``+15551234567`` as ``+1••••••••67``: the country code's first digit
    and the last two kept, enough for the owner to tell their own numbers apart."""
    if len(number) <= MASK_KEEP + 2:
        return "•" * len(number)
    return number[:2] + "•" * (len(number) - 2 - MASK_KEEP) + number[-MASK_KEEP:]


def _uri(value: str) -> str:
    """The URI of a name-addr (``"Name" <sip:…>;tag=…``) or an addr-spec."""
    start = value.find("<")
    if start >= 0:
        end = value.find(">", start)
        return value[start + 1:end if end > start else len(value)].strip()
    return value.split(";", 1)[0].strip()   # an addr-spec's header parameters follow a ';'


def number_of(value: str) -> str | None:
    """The E.164 number a ``From`` or ``P-Asserted-Identity`` value names,
    or None (anonymous, a SIP user that is not a number, a malformed value)."""
    uri = _uri(value)
    scheme, _, rest = uri.partition(":")
    scheme = scheme.strip().lower()
    if scheme in ("sip", "sips"):
        user = rest.split("@", 1)[0] if "@" in rest else ""
    elif scheme == "tel":
        user = rest
    else:
        return None
    user = _VISUAL_SEPARATORS.sub("", user.split(";", 1)[0])
    return user if E164_RE.fullmatch(user) else None


def _values(headers: Iterable[tuple[str, str]], name: str) -> list[str]:
    """Every value of header ``name`` (repeated headers, and a ``P-Asserted-Identity``'s comma-separated list)."""
    found: list[str] = []
    for header, value in headers:
        if header.strip().lower() != name:
            continue
        found += [part for part in re.split(r",(?=(?:[^\"]*\"[^\"]*\")*[^\"]*$)", value)
                  if part.strip()] if name == ASSERTED_IDENTITY else [value]
    return found


def caller_of(headers: Iterable[tuple[str, str]]) -> Caller:
    """The caller of an INVITE with ``headers`` (name, value): the first
    number ``P-Asserted-Identity`` names, else ``From``'s, else withheld.
    A trunk that asserts identity but withholds it (anonymous) gives no
    number: ``From`` is not read then, as the network said who it is not."""
    pairs = list(headers)
    asserted = _values(pairs, ASSERTED_IDENTITY)
    if asserted:
        for value in asserted:
            number = number_of(value)
            if number is not None:
                return Caller(number, ASSERTED_IDENTITY)
        return Caller(None, ASSERTED_IDENTITY)
    for value in _values(pairs, FROM)[:1]:
        number = number_of(value)
        if number is not None:
            return Caller(number, FROM)
    return Caller(None, FROM if _values(pairs, FROM) else None)
