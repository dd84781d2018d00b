"""Keeping a call's lease while its actor runs (the supervisor's side).

The registry renews every kept lease of this process in one request every
sixth of the TTL (``RedisRegistry._renew_kept``); a call only waits on its
``LeaseStop``: a cancel scope whose deadline each grant moves to
``stop_margin`` before the lease can expire, and which the registry cancels
when another token holds the call. Time is counted from just before each
granting request was sent, on trio's monotonic clock, so the local view of
the lease ends no later than Redis's (whose clock expires the key).
``stop_margin`` leaves room for the actor's bounded graceful close.
"""

from __future__ import annotations

from typing import Awaitable, Callable

import trio

from voiceactors.cluster.call_registry import CallRegistry, Lease, RegistryDown
from voiceactors.logs import get_logger

_log = get_logger(actor="supervisor")


def stop_margin(ttl_s: float, close_deadline_s: float) -> float:
    """How long before the lease's end a holder that cannot renew stops: a
    third of the TTL, more (up to half of it) for a longer graceful close."""
    return max(ttl_s / 3, min(close_deadline_s, ttl_s / 2))


async def run_leased(registry: CallRegistry, lease: Lease, close_deadline_s: float,
                     run: Callable[[], Awaitable[object]]) -> str | None:
    """Await ``run()`` while ``lease`` is kept; cancel it (its graceful stop)
    when the lease is lost. None when ``run`` ended by itself, else why it
    was stopped: ``lost`` (another token holds the call) or ``unrenewable``
    (no renewal in time). A lease nobody held any more is taken again with a
    new token by the registry (``registry.lease_of`` then has it)."""
    stop = registry.lease_stop(lease, stop_margin(registry.ttl_s, close_deadline_s))
    try:
        with stop.scope:
            await run()
    finally:
        stop.ended = True
    return stop.why if stop.scope.cancelled_caught else None


async def keep_lease(registry: CallRegistry, lease: Lease, close_deadline_s: float) -> str:
    """Keep ``lease`` until it is lost; the reason (``lost`` or ``unrenewable``)."""
    why = await run_leased(registry, lease, close_deadline_s, trio.sleep_forever)
    assert why is not None          # sleep_forever ends only by the stop's cancel
    return why


async def release_quietly(registry: CallRegistry, lease: Lease, timeout_s: float) -> None:
    """Release ``lease`` even while the caller is cancelled (bounded); a Redis
    that does not answer leaves it to expire at its TTL."""
    with trio.CancelScope(shield=True), trio.move_on_after(timeout_s):
        try:
            await registry.release(lease)
        except RegistryDown:
            _log.warning("supervisor.lease_release_failed", call_id=lease.call_id)
