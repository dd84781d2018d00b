"""What the call does with each ``error`` the service sends in reply to us:
one table, ``REFUSALS`` (code → ``Refusal``), read by the protocol's error
handler (``protocol.py``) and nowhere else. ``docs/calls.md`` § Refusals has
it as prose.

An error names the client event it refuses by that event's ``event_id``
(null for an error about the session itself, e.g. ``session_expired`` at the
cap). Whatever the action, a refused event was not applied: a refused
``response.create`` is not counted as sent (its result is not ``sent``) and
a refused output is not counted as answered (its tool call is ``rejected``,
and a batch whose every output was refused asks for no response).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from voiceactors.call.end_reason import EndReason

__all__ = ["ACTIVE_RESPONSE", "BACKOFF_S", "Refusal", "RefusalAction", "REFUSALS", "UNKNOWN", "backoff_s",
           "refusal_of"]

ACTIVE_RESPONSE = "conversation_already_has_active_response"

#: The waits before a refused ``response.create`` is sent again (``BACKOFF``):
#: one per retry, so their count is the limit (per refusal streak: a create
#: the service accepts starts the count afresh). Then its batches are given
#: up (``failed``) and the call goes on: the user's next turn still gets a
#: response, where ending the call would lose it.
BACKOFF_S = (1.0, 2.0, 4.0)


class RefusalAction(StrEnum):
    """What a refusal does to the call (the ``action`` of the log line)."""

    #: a response is active on the service: the refused ``response.create``'s
    #: batches wait for its ``response.done`` (a blind retry when we saw none)
    WAIT_FOR_RESPONSE = "wait_for_response"
    #: try the refused ``response.create`` again after ``BACKOFF_S``, then give up
    BACKOFF = "backoff"
    #: the service does not know the tool call: its output is never resent
    FORGET_CALL = "forget_call"
    #: the call cannot go on: it ends with ``Refusal.end``
    END_CALL = "end_call"
    #: nothing to undo: a ``response.cancel`` of a response that had already ended
    IGNORE = "ignore"


@dataclass(frozen=True, slots=True)
class Refusal:
    """One row: the action and, for ``END_CALL``, the end reason."""

    action: RefusalAction
    end: EndReason | None = None


#: Every code the service is known to refuse a client event of ours with.
#: Any error naming one of our outputs (other than an end) rejects it: an
#: output is never resent to a service that refused it.
REFUSALS: dict[str, Refusal] = {
    ACTIVE_RESPONSE: Refusal(RefusalAction.WAIT_FOR_RESPONSE),
    "invalid_tool_call_id": Refusal(RefusalAction.FORGET_CALL),
    "rate_limit_exceeded": Refusal(RefusalAction.BACKOFF),
    "inference_rate_limit_exceeded": Refusal(RefusalAction.BACKOFF),
    "session_expired": Refusal(RefusalAction.END_CALL, EndReason.SESSION_EXPIRED),
    "invalid_api_key": Refusal(RefusalAction.END_CALL, EndReason.UNAUTHORIZED),
    "insufficient_quota": Refusal(RefusalAction.END_CALL, EndReason.QUOTA),
    "response_cancel_not_active": Refusal(RefusalAction.IGNORE),
}
#: A code not in the table (or none): logged, the call goes on; a
#: ``response.create`` it refused is retried like a rate limit (bounded), so
#: the model still speaks the answer if the refusal was passing.
UNKNOWN = Refusal(RefusalAction.BACKOFF)


def refusal_of(code: str | None) -> Refusal:
    """The row for an error's ``code``."""
    return REFUSALS.get(code or "", UNKNOWN)


def backoff_s(retries_used: int) -> float | None:
    """The wait before retry number ``retries_used + 1``; None when the retries are spent."""
    return BACKOFF_S[retries_used] if retries_used < len(BACKOFF_S) else None
