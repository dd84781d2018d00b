"""A leased call's local deadline for acting on the outside.

Redis fences the shared write log and the takeover mirror itself
(``CLAIM_WRITE`` and ``MIRROR`` check the token in the step that writes),
but nothing on the other side of a sideband or a journal file can check a
token. So the holder fences itself: ``SendFence.until`` is the last moment
(trio's clock) it may send a sideband frame, hang up, open a new sideband or
replace a journal file for the call, ``send_guard`` before its lease can
expire. The registry moves it at every grant and closes it when another
token holds the call.

Why one float compare is enough: the deadline counts from just before the
request that granted the lease (or renewed it) was *sent*; Redis set the
key's TTL when it *received* that request, later. So however late the answer
comes back (a paused process, a slow network), ``until`` is earlier than
Redis's expiry, the earliest moment another process can win the call, and a
late answer can never push it past what Redis granted. The clock is trio's,
CLOCK_MONOTONIC, which keeps running while a process is stopped (SIGSTOP): a
holder that wakes after its lease expired finds ``until`` passed before it
can act. Each check and the action it guards happen in one trio step (no
schedule point between them); docs/reliability.md § Fencing names the
windows that are left.
"""

from __future__ import annotations

import math

import trio

SEND_GUARD_MAX_S = 1.0


def send_guard(ttl_s: float) -> float:
    """How long before the lease can expire the holder stops acting: room for
    a frame in flight to arrive and for Redis's clock to run a little faster
    than ours (a tenth of the TTL, at most a second)."""
    return min(ttl_s / 10, SEND_GUARD_MAX_S)


class SendFence:
    """One leased call's deadline (see the module docstring)."""

    __slots__ = ("until",)

    def __init__(self, until: float = math.inf) -> None:
        self.until = until

    def granted(self, sent_at: float, ttl_s: float) -> None:
        """A lease (or renewal) whose request was sent at ``sent_at`` was granted."""
        self.until = sent_at + ttl_s - send_guard(ttl_s)

    def close(self) -> None:
        """Another holder may have the call: act on nothing from now on."""
        self.until = -math.inf

    def allows(self) -> bool:
        return trio.current_time() < self.until


class LeaseStop:
    """When a leased call's actor must stop: ``margin`` before its lease can
    expire (``why`` stays ``unrenewable``), or at once when another token
    holds the call (``lost``). The actor runs inside ``scope``; the
    registry's renewal batch moves the scope's deadline at every grant, so
    trio's own deadline does the waiting: a held call costs no task and no
    wake-up of its own for its lease. The deadline counts from just before
    the granting request was sent, as ``SendFence`` does. ``ended``: the
    actor is done with it (the batch renews the lease no more)."""

    __slots__ = ("scope", "margin", "why", "ended")

    def __init__(self, margin: float) -> None:
        self.scope = trio.CancelScope()
        self.margin = margin
        self.why = "unrenewable"
        self.ended = False

    def granted(self, sent_at: float, ttl_s: float) -> None:
        self.scope.deadline = sent_at + ttl_s - self.margin

    def lost(self) -> None:
        if not self.scope.cancel_called:     # already past its deadline: it stopped as unrenewable
            self.why = "lost"
        self.scope.cancel()
