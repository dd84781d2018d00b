"""Keeping a call's lease while its actor runs (the supervisor's side).

``keep_lease`` renews every third of the TTL and returns when the lease is
lost (another token holds it) or could not be renewed in time. Time is
counted from just before each renewal was sent, on trio's monotonic clock,
so the local view of the lease ends no later than Redis's (whose clock
expires the key). The actor must be stopped at the return: ``stop_margin``
before the lease can expire, long enough for its bounded graceful close.
"""

from __future__ import annotations

import trio

from voiceactors.cluster.registry import CallRegistry, Lease, RegistryDown
from voiceactors.logs import get_logger

_log = get_logger(actor="supervisor")


def stop_margin(ttl_s: float, close_deadline_s: float) -> float:
    """How long before the lease's end a holder that cannot renew stops: a
    third of the TTL, more (up to half of it) for a longer graceful close."""
    return max(ttl_s / 3, min(close_deadline_s, ttl_s / 2))


async def keep_lease(registry: CallRegistry, lease: Lease, close_deadline_s: float) -> str:
    """Renew ``lease`` until it is lost; the reason (``lost`` or
    ``unrenewable``). A lease nobody held any more is taken again with a new
    token (``registry.lease_of`` then has it)."""
    ttl = registry.ttl_s
    margin = stop_margin(ttl, close_deadline_s)
    stop_at = lease.acquired_at + ttl - margin
    next_renewal = lease.acquired_at + ttl / 3
    while True:
        await trio.sleep_until(min(next_renewal, stop_at))
        now = trio.current_time()
        if now >= stop_at:
            return "unrenewable"
        try:
            renewed = await registry.renew(lease)
        except RegistryDown:
            next_renewal = now + ttl / 12       # try again soon, until stop_at
            continue
        if renewed is None:
            return "lost"
        lease = renewed
        stop_at = now + ttl - margin
        next_renewal = now + ttl / 3


async def release_quietly(registry: CallRegistry, lease: Lease, timeout_s: float) -> None:
    """Release ``lease`` even while the caller is cancelled (bounded); a Redis
    that does not answer leaves it to expire at its TTL."""
    with trio.CancelScope(shield=True), trio.move_on_after(timeout_s):
        try:
            await registry.release(lease)
        except RegistryDown:
            _log.warning("supervisor.lease_release_failed", call_id=lease.call_id)
