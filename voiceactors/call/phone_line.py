"""A phone call's own rules, without I/O: the PIN keyed on the keypad
before any journal tool answers, and the transfer to a person.

Owned by the call's ``CallProtocol`` (``protocol.py`` hands it every
``input_audio_buffer.dtmf_event_received`` and asks it, for each tool call,
whether the call answers it itself; the rules live here):

* **The PIN** (``voice.phone.pin``): until the caller keys it, followed by
  ``#``, every tool call is answered with ``LOCKED`` (an honest refusal the
  model can speak) and nothing reads the journal (no prefetch either).
  ``*`` clears what was keyed. A wrong PIN leaves ``PIN_ATTEMPTS - 1``
  more tries; the last wrong one ends the call (the model says goodbye,
  then the call hangs up: ``EndReason.PIN_REFUSED``). The PIN's length is
  never told: an entry ends at ``#`` (or at ``PIN_MAX`` digits).
* **The transfer** (``voice.phone.transfer_to``, a SIP or tel URI): the
  ``call.transfer`` tool, or keypad ``0`` once the line is open, asks for
  it; the model says it is transferring, and when that response is done
  (or after ``TRANSFER_SPEAK_S`` at most) the call is referred to the
  target (``Refer``: the service's ``refer``, which ends our session).

A call rejoined after a crash or taken over by another process keeps the
caller but not the keyed PIN: it is locked again (the PIN read from the
journal's config again), and the caller keys it again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from voiceactors.call.state import ToolOutcome

PIN_ATTEMPTS = 3
#: an entry longer than any PIN is a wrong one (``phone_policy.PIN_RE``: up to 12 digits)
PIN_MAX = 12
SUBMIT, CLEAR, OPERATOR = "#", "*", "0"
#: the transfer tool, in each tool-name style (``settings.tool_name_style``)
TRANSFER_TOOL = "call.transfer"
TRANSFER_TOOL_NAMES = frozenset({"call.transfer", "call_transfer"})
#: the longest the model's "transferring you now" may take before the call is referred anyway
TRANSFER_SPEAK_S = 8.0
#: the longest the goodbye after the last wrong PIN may take before the call hangs up
REFUSED_PARTING_S = 8.0

LOCKED = json.dumps({"error": "locked: the caller has not keyed the PIN yet. Ask them to key their PIN on the "
                              "phone's keypad, followed by the pound key (#). No journal tool answers until then."})
NO_TRANSFER = json.dumps({"error": "transfer unavailable: no transfer number is configured for this phone."})
TRANSFERRING = json.dumps({"ok": True, "note": "Tell the caller, in one short sentence, that you are transferring "
                                               "them to a person now. The call is transferred when you finish."})

PIN_ASKED = ("Speak first. This is a phone call. Greet the caller briefly and ask them to key their PIN on the "
             "phone's keypad, followed by the pound key. Nothing from the journal until then. One short sentence.")
PIN_ACCEPTED = {"instructions": "The caller keyed the right PIN: the journal is open to them now. Say so in a few "
                                "words and ask what they would like to talk about.", "tool_choice": "none"}
TRANSFER_WORDS = {"instructions": "The caller asked for a person. Tell them, in one short sentence, that you are "
                                  "transferring them now, and say nothing else.", "tool_choice": "none"}
REFUSED_WORDS = {"instructions": "The PIN was wrong too many times. Say, in one short sentence, that you cannot "
                                 "open the journal and goodbye, and say nothing else.", "tool_choice": "none"}


def wrong_pin_words(left: int) -> dict[str, Any]:
    tries = "one more try" if left == 1 else f"{left} more tries"
    return {"instructions": f"The caller keyed a wrong PIN. Tell them so in one short sentence: they have {tries}, "
                            "keying the PIN followed by the pound key.", "tool_choice": "none"}


def transfer_tool(style: str) -> dict[str, Any]:
    """The ``call.transfer`` function tool for a phone call's session (in
    the manifest's name style: ``dotted`` or ``underscore``)."""
    return {"type": "function", "name": TRANSFER_TOOL if style == "dotted" else TRANSFER_TOOL.replace(".", "_"),
            "description": ("Transfer this phone call to a person (the journal owner's chosen number). Use it only "
                            "when the caller asks to speak with a person. The call leaves you once you have said "
                            "you are transferring."),
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}


class Keyed(StrEnum):
    """What a keypad press did."""

    NOTHING = "nothing"      # a digit of an entry, a clear, or a key that means nothing here
    ACCEPTED = "accepted"    # the right PIN: the line is open
    WRONG = "wrong"          # a wrong PIN, tries left
    REFUSED = "refused"      # the last try was wrong: the call ends
    TRANSFER = "transfer"    # keypad 0 on an open line with a transfer target


@dataclass(frozen=True)
class ToolAnswer:
    """A tool call the phone line answers itself (the executor never sees it)."""

    output: str
    outcome: ToolOutcome
    transfer: bool = False


class PhoneLine:
    """One phone call's PIN and transfer (see the module doc). ``locked``
    (default: a PIN is given): the PIN is due; locked without a PIN (a
    rejoined call whose configuration could not be read) no entry opens it."""

    def __init__(self, pin: str | None, transfer_to: str | None, *, locked: bool | None = None) -> None:
        self._pin = pin
        self.transfer_to = transfer_to
        self.open = not (pin is not None if locked is None else locked)
        self.refused = False
        self.left = PIN_ATTEMPTS
        self._keyed = ""

    def key(self, key: str) -> Keyed:
        """One keypad press."""
        if self.refused:
            return Keyed.NOTHING
        if self.open:
            return Keyed.TRANSFER if key == OPERATOR and self.transfer_to is not None else Keyed.NOTHING
        if key == CLEAR:
            self._keyed = ""
            return Keyed.NOTHING
        if key.isdigit() and len(key) == 1:
            self._keyed += key
            if len(self._keyed) <= PIN_MAX:
                return Keyed.NOTHING
        elif key != SUBMIT:
            return Keyed.NOTHING
        return self._submit()

    def _submit(self) -> Keyed:
        keyed, self._keyed = self._keyed, ""
        if not keyed:
            return Keyed.NOTHING         # a lone '#': nothing was keyed
        if self._pin is not None and keyed == self._pin:
            self.open = True
            return Keyed.ACCEPTED
        self.left -= 1
        if self.left > 0:
            return Keyed.WRONG
        self.refused = True
        return Keyed.REFUSED

    def answer_for(self, tool: str) -> ToolAnswer | None:
        """The answer the line gives a tool call itself, or None (it runs as any other)."""
        if tool in TRANSFER_TOOL_NAMES:
            if self.transfer_to is None:
                return ToolAnswer(NO_TRANSFER, ToolOutcome.REJECTED)
            if not self.open:
                return ToolAnswer(LOCKED, ToolOutcome.REJECTED)
            return ToolAnswer(TRANSFERRING, ToolOutcome.OK, transfer=True)
        if not self.open:
            return ToolAnswer(LOCKED, ToolOutcome.REJECTED)
        return None

    @property
    def opening(self) -> str | None:
        """The first greeting's instruction while the PIN is due (None: the usual one)."""
        return None if self.open else PIN_ASKED
