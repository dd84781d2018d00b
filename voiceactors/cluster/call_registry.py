"""The call registry: which process runs each call's actor, and its lease.

One interface, two backends. The supervisor asks ``acquire`` before it
starts a call's actor, runs the actor inside the lease's ``lease_stop``
while the registry keeps the lease, and asks ``release`` when the actor
ends. The executor asks ``claim_write`` before it applies a write and
``record_write`` after.

* ``LocalRegistry`` (no Redis configured): every call is this process's;
  ``shared`` is False and the supervisor keeps its synchronous Connect, so a
  single process behaves exactly as it did before the registry existed.
* ``RedisRegistry`` (``--redis URL``): a lease per call in Redis (set when
  absent with a TTL, renewed and deleted only by its token, see
  ``redis_client``), a fencing token per lease, the shared write log, and the
  mirror of each call's unsettled tool calls that a takeover answers from,
  with the call's linked context (its link, current selection and the
  brain's instruction it was connected with) that the taker carries on with.
  Every sixth of ``ttl_s`` (``RENEWALS_PER_TTL``) one ``RENEW_MANY`` script
  renews every lease whose actor runs here (``_renew_kept``): one request per
  process per tick, not one per call.

A call is taken over only when a holder confirmed it runs it: the takeover
entry (``calls``) is written by a renewal, and the first renewal of a lease
is sent as its actor starts (``lease_stop``), never by the acquire. A
connect refused after its acquire went out (its bound passed while Redis
stalled) may still have its lease set by Redis later; that lease is never
confirmed, so no scan adopts the call, and the request is voided as soon as
Redis answers again (``VOID_ACQUIRE``: the lease deleted, or a tombstone that
keeps the late request from setting it; ``registry.acquire_abandoned``).
An acquire that finds a lease not confirmed yet asks again within its bound
(``acquire``), so it wins a call whose lease is voided or released a moment
later instead of answering it held by nobody that runs it.

A lease alone is not mutual exclusion (a paused holder may act after it
expired): the write log refuses a claim whose token is not the call's current
lease in the same Lua step that claims, so a stale holder cannot apply a
write, and the mirror refuses its lines the same way (``MIRROR``), so it
cannot overwrite what a new holder mirrored; a refused line is answered as a
renewal would be (``_settle_mirror``). What Redis cannot see (sideband frames, the hangup, a journal file's
replace) the holder fences itself with each held call's ``SendFence``
(``fence_of``, ``cluster/fence.py``), moved at every grant here.
"""

from __future__ import annotations

import itertools
import json
import os
import secrets
import socket
from collections import deque
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

import trio
from coredis.tokens import PureToken

from voiceactors.call.call_context import LinkedContext, carried_agent, carried_view, taken_over_context
from voiceactors.call.handoff import in_charge_after, recorded_output
from voiceactors.call.record_kind import TOOL_KINDS, RecordKind
from voiceactors.call.recovery import PendingCall
from voiceactors.tool_effect import tool_effect
from voiceactors.cluster import redis_client as rc
from voiceactors.cluster.batched import MAX_ITEMS, Batched
from voiceactors.cluster.fence import LeaseStop, SendFence
from voiceactors.cluster.redis_client import RegistryDown
from voiceactors.logs import get_logger

__all__ = ["CallRegistry", "Carried", "ClaimAnswer", "Lease", "LocalRegistry", "RedisRegistry", "RegistryDown",
           "WriteClaim", "make_registry"]

WRITE_RECORD_TTL_S = 7 * 24 * 3600     # a tool call id is never retried a week later
OP_TIMEOUT_MAX_S = 2.0                 # one Redis request's bound (less for short leases)
# Renewals per TTL. A call stops ``stop_margin`` (5 s of the default 10 s
# TTL) after its last grant, so a renewal's answer may take the rest of that
# minus the interval: 3.3 s at a sixth (1.7 s at a third, where one stalled
# answer in a starved process stopped every call at once), for one
# request per 1.7 s.
RENEWALS_PER_TTL = 6
# A lease held by a token not confirmed yet is asked for again (its holder's
# first renewal is a round trip away, or it is a refused connect's, about to
# be voided), pausing from the first to the last, doubling (``acquire``)
UNCONFIRMED_POLL_S = (0.005, 0.1)
VOIDS_KEPT = 4096                      # acquire requests waiting to be voided (Redis down meanwhile)
MIRROR_PASS_INTERVAL_S = 0.05          # the mirror's passes at most this often (a takeover's view lags by that)

_log = get_logger(actor="registry")


@dataclass(frozen=True)
class Lease:
    """A call held by one process: ``token`` is ``<node>/<request>:<fence>``
    (``<request>``: the acquire request that won it, numbered per process)."""

    call_id: str
    token: str
    acquired_at: float = 0.0               # trio time just before the acquiring request was sent
    previous: str | None = None            # a dead holder's token: this lease takes its call over

    @property
    def fence(self) -> int:
        return int(self.token.rsplit(":", 1)[1])


class WriteClaim(StrEnum):
    CLAIMED = "claimed"     # apply it now (nobody else has, nobody else will)
    TAKEN = "taken"         # another run claimed it: its record, or None while unknown
    STALE = "stale"         # this process's lease of the call is gone: apply nothing


@dataclass(frozen=True)
class ClaimAnswer:
    state: WriteClaim
    record: dict[str, Any] | None = None


@dataclass(frozen=True)
class _Unconfirmed:
    """An acquire's answer: the call is held by a token whose holder has not
    confirmed it (no actor known to run it yet)."""

    token: str


@dataclass(frozen=True)
class Carried:
    """What a dead holder's call carries on with (its mirror in Redis): the
    tool calls it left unsettled and its linked context (None: it had none)."""

    pending: list[PendingCall]
    context: LinkedContext | None = None


class CallRegistry(Protocol):
    shared: bool
    ttl_s: float

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None: ...
    async def acquire(self, call_id: str) -> Lease | None: ...
    async def renew(self, lease: Lease) -> Lease | None: ...
    async def release(self, lease: Lease) -> None: ...
    def lease_of(self, call_id: str) -> Lease | None: ...
    def fence_of(self, call_id: str) -> SendFence | None: ...
    def lease_stop(self, lease: Lease, margin: float) -> LeaseStop: ...
    async def claim_write(self, call_id: str | None, tool_call_id: str) -> ClaimAnswer: ...
    async def record_write(self, tool_call_id: str, record: dict[str, Any]) -> None: ...
    async def unclaim_write(self, call_id: str | None, tool_call_id: str) -> None: ...
    def note_record(self, call_id: str, line: dict[str, Any]) -> None: ...
    def note_context(self, call_id: str, linked: LinkedContext) -> None: ...
    async def orphans(self) -> list[tuple[str, str]]: ...
    async def carried(self, call_id: str) -> Carried: ...
    def health(self) -> dict[str, Any] | None: ...
    async def claim_once(self, key: str, ttl_s: float) -> bool: ...
    async def unclaim(self, key: str) -> None: ...


class LocalRegistry:
    """One process: every call is ours, writes are claimed by the file write
    log alone (``write_log.apply_once``)."""

    shared = False
    ttl_s = float("inf")

    def __init__(self) -> None:
        self._held: dict[str, Lease] = {}

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.sleep_forever()

    async def acquire(self, call_id: str) -> Lease | None:
        lease = self._held[call_id] = Lease(call_id, "local:0", trio.current_time())
        return lease

    async def renew(self, lease: Lease) -> Lease | None:
        return lease

    async def release(self, lease: Lease) -> None:
        self._held.pop(lease.call_id, None)

    def lease_of(self, call_id: str) -> Lease | None:
        return self._held.get(call_id)

    def fence_of(self, call_id: str) -> SendFence | None:
        return None         # one process: nobody else can hold the call

    def lease_stop(self, lease: Lease, margin: float) -> LeaseStop:
        return LeaseStop(margin)        # never granted: no deadline, never lost

    async def claim_write(self, call_id: str | None, tool_call_id: str) -> ClaimAnswer:
        return ClaimAnswer(WriteClaim.CLAIMED)

    async def record_write(self, tool_call_id: str, record: dict[str, Any]) -> None:
        return None

    async def unclaim_write(self, call_id: str | None, tool_call_id: str) -> None:
        return None

    def note_record(self, call_id: str, line: dict[str, Any]) -> None:
        return None

    def note_context(self, call_id: str, linked: LinkedContext) -> None:
        return None

    async def orphans(self) -> list[tuple[str, str]]:
        return []

    async def carried(self, call_id: str) -> Carried:
        return Carried([])

    def health(self) -> dict[str, Any] | None:
        return None

    async def claim_once(self, key: str, ttl_s: float) -> bool:
        """One process: whoever asks holds it (the caller keeps its own memory: ``http/phone.py``)."""
        return True

    async def unclaim(self, key: str) -> None:
        return None


def _node_id() -> str:
    """This process in a token: host, pid and a random part (a pid is reused)."""
    return f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(4)}"


class RedisRegistry:
    """Leases, fencing and the shared write log in one Redis. The URL is
    never logged (it may carry a password)."""

    shared = True

    def __init__(self, url: str, ttl_s: float, *, node: str | None = None) -> None:
        self.ttl_s = ttl_s
        self.node = node or _node_id()
        self.op_timeout_s = min(OP_TIMEOUT_MAX_S, ttl_s / 4)
        self._redis = rc.client(url)
        self._held: dict[str, Lease] = {}
        self._fences: dict[str, SendFence] = {}     # per held call, kept across a re-acquire
        self._granted_at: dict[str, float] = {}     # per held call: when its last granting request was sent
        self._stops: dict[str, LeaseStop] = {}      # the held calls whose actor runs: renewed each tick
        self._mirrored: dict[str, set[str]] = {}    # per held call: the tool calls its mirror holds in Redis
        self._contexts: dict[str, dict[str, Any]] = {}  # per held call with a context: carried_view's JSON
        self._reach = rc.Reachability()
        # the leases asked for and released at once go in one script each
        # (a join's connects, many calls' ends): cluster/batched.py
        self._ask_bound_s = 2 * self.op_timeout_s      # a batch in flight ahead of ours, then ours
        self._acquires = Batched[str, Lease | _Unconfirmed | None](self._acquire_many, self._unwanted)
        self._releases = Batched[Lease, int](self._release_many, send_when_gone=True)
        self._confirms = Batched[Lease, int](self._confirm_many, send_when_gone=True)
        self._requests = itertools.count(1)             # each acquire request's number, in its tokens
        # acquire requests given up on, (request, call_ids), to void; past the
        # cap the oldest are dropped: such a lease is never confirmed, so it
        # only stays in the way until its TTL
        self._voids: deque[tuple[str, list[str]]] = deque(maxlen=VOIDS_KEPT)
        self._voiding = trio.Lock()
        self._void_wake = trio.Event()
        self._mirror_send, self._mirror_receive = trio.open_memory_channel[tuple[str, dict[str, Any]]](4096)

    @property
    def renew_every_s(self) -> float:
        return self.ttl_s / RENEWALS_PER_TTL

    # --- running -------------------------------------------------------------

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the client's connection pool; every sixth of a lease renew
        the kept leases in one request (or, holding none, check Redis for
        ``health``) and mirror call records' tool lines."""
        async with self._redis, trio.open_nursery() as nursery:
            nursery.start_soon(self._mirror_writer)
            nursery.start_soon(self._acquires.run)
            nursery.start_soon(self._releases.run)
            nursery.start_soon(self._confirms.run)
            nursery.start_soon(self._void_abandoned)
            await self._ping()
            _log.info("registry.started", node=self.node, reachable=self._reach.reachable, ttl_s=self.ttl_s)
            task_status.started()
            await self._renew_kept()

    async def _ping(self) -> None:
        try:
            await self._request(self._redis.ping())
        except RegistryDown:
            pass

    async def _request(self, request: Any) -> Any:
        """One request, bounded by ``op_timeout_s``; tracks reachability."""
        try:
            answer = await rc.bounded(request, self.op_timeout_s)
        except RegistryDown as exc:
            if self._reach.failed():
                _log.error("registry.unreachable", node=self.node, error=exc.error_name)
            raise
        if self._reach.answered():
            _log.info("registry.reachable", node=self.node)
        return answer

    async def _script(self, script: str, keys: list[str], args: list[Any]) -> Any:
        return await self._request(rc.eval_script(self._redis, script, keys, args))

    def health(self) -> dict[str, Any] | None:
        return {"backend": "redis", "reachable": bool(self._reach.reachable), "leases_held": len(self._held)}

    async def claim_once(self, key: str, ttl_s: float) -> bool:
        """True for the first process to claim ``key`` (``PREFIX`` added)
        within ``ttl_s`` (``SET NX EX``): a webhook delivered to every worker
        acts once. ``RegistryDown`` when Redis does not answer."""
        answer = await self._request(self._redis.set(rc.PREFIX + key, self.node, condition=PureToken.NX, ex=max(1, int(ttl_s))))
        return bool(answer)

    async def unclaim(self, key: str) -> None:
        """Give ``key`` back (the claimer's work failed; a retry may act)."""
        await self._request(self._redis.delete([rc.PREFIX + key]))

    # --- leases --------------------------------------------------------------

    async def acquire(self, call_id: str) -> Lease | None:
        """The call's lease when this process wins it (None: another token
        holds it). The leases asked for at once go in one ``ACQUIRE_MANY``.
        A token whose holder has not confirmed it yet may be a refused
        connect's, about to be voided, or released by a holder at capacity:
        asked again until it is confirmed (None), gone (won here) or while
        one more request fits in the bound (then None, as held), so a
        connect answered here as held elsewhere is one some actor runs,
        unless that holder dies first. The whole stays within the bound a
        single ask had."""
        until = trio.current_time() + self._ask_bound_s
        pause = UNCONFIRMED_POLL_S[0]
        while True:
            answer = await self._acquires.ask(call_id, until - trio.current_time())
            if not isinstance(answer, _Unconfirmed):
                return answer
            if trio.current_time() + pause + self.op_timeout_s > until:
                return None
            await trio.sleep(pause)
            pause = min(pause * 2, UNCONFIRMED_POLL_S[1])

    async def _acquire_many(self, call_ids: list[str]) -> list[Lease | _Unconfirmed | None]:
        """One batch: each lease's fence and stop count from just before the
        batch was sent (before Redis set any of its TTLs). A request whose
        outcome is unknown (``RegistryDown``: it timed out, or its connection
        broke after it was sent) is voided; the requests voided before it
        go first, so a connect retried here never finds its own abandoned
        lease in the way."""
        if self._voids:                 # (no lock, no schedule point, in the usual case)
            await self._send_voids()
        request = f"{self.node}/{next(self._requests)}"
        sent = trio.current_time()
        keys = [*map(rc.lease_key, call_ids), rc.FENCE_KEY, rc.CALLS_KEY, rc.void_key(request)]
        try:
            answers = await self._script(rc.ACQUIRE_MANY, keys, [request, round(self.ttl_s * 1000), *call_ids])
        except RegistryDown:
            self._voids.append((request, call_ids))
            self._void_wake.set()
            raise
        return [self._won(call_id, answer, sent) for call_id, answer in zip(call_ids, answers, strict=True)]

    def _won(self, call_id: str, answer: list[Any], sent: float) -> Lease | _Unconfirmed | None:
        if int(answer[0]) != 1:
            confirmed = len(answer) < 3 or int(answer[2]) == 1
            return None if confirmed else _Unconfirmed(str(answer[1]))
        lease = self._held[call_id] = Lease(call_id, str(answer[1]), sent, str(answer[2]) or None)
        self._fences.setdefault(call_id, SendFence())
        self._granted(call_id, sent)
        return lease

    def _unwanted(self, call_id: str, lease: Lease | _Unconfirmed | None) -> None:
        """A lease won for a caller that stopped waiting (its bound, or its
        cancel): no actor will run it, so it is released. It was never
        confirmed: a dead holder's call keeps that holder's takeover entry
        and mirror (``RELEASE_MANY``), and the scan finds it again at once."""
        if not isinstance(lease, Lease) or not self._holds(lease):
            return
        self._forget_held(lease)
        self._releases.submit(lease)
        _log.warning("registry.acquire_abandoned", call_id=call_id, fence=lease.fence, released=True)

    async def _void_abandoned(self) -> None:
        """Void the acquire requests given up on as soon as Redis answers
        (tried again every twelfth of a lease while it does not)."""
        while True:
            await self._void_wake.wait()
            self._void_wake = trio.Event()
            while self._voids:
                try:
                    await self._send_voids()
                except RegistryDown:
                    await trio.sleep(self.ttl_s / 12)

    async def _send_voids(self) -> None:
        """Void the requests given up on, oldest first, as many at once as
        one script carries (``VOID_ACQUIRE``); each call asked for logged once
        its void is in Redis: ``fence`` the lease it had set (deleted,
        ``released``), None when it had set none (and now never will)."""
        async with self._voiding:
            while self._voids:
                batch: list[tuple[str, list[str]]] = []
                while self._voids and (not batch or sum(len(c) for _, c in batch) + len(self._voids[0][1])
                                       <= MAX_ITEMS):
                    batch.append(self._voids.popleft())
                keys = [k for request, call_ids in batch for k in (rc.void_key(request), *map(rc.lease_key, call_ids))]
                args = [a for request, call_ids in batch for a in (f"{request}:", len(call_ids))]
                try:
                    deleted = await self._script(rc.VOID_ACQUIRE, keys, [rc.VOID_TTL_S, *args])
                except RegistryDown:
                    self._voids.extendleft(reversed(batch))     # kept, in order, for the next try
                    raise
                asked = [call_id for _, call_ids in batch for call_id in call_ids]
                for call_id, token in zip(asked, deleted, strict=True):
                    fence = Lease(call_id, str(token)).fence if token else None
                    _log.warning("registry.acquire_abandoned", call_id=call_id, fence=fence, released=bool(token))

    def _granted(self, call_id: str, sent: float) -> None:
        """A request sent at ``sent`` set or renewed the held call's lease:
        its fence and its actor's stop move on from then."""
        self._granted_at[call_id] = sent
        self._fences[call_id].granted(sent, self.ttl_s)
        stop = self._stops.get(call_id)
        if stop is not None:
            stop.granted(sent, self.ttl_s)

    async def renew(self, lease: Lease) -> Lease | None:
        """One lease renewed on its own (the kept leases are renewed together
        by ``_renew_kept``): ``lease`` renewed; a new lease when nobody held
        the key any more (it expired before a renewal reached it, or Redis
        restarted without its data: no other process holds the call, so this
        one may, with a new fencing token); None when another token holds
        it. The call's fence moves from just before the request was sent."""
        sent = trio.current_time()
        renewed = int(await self._script(rc.RENEW, [rc.lease_key(lease.call_id)],
                                         [lease.token, round(self.ttl_s * 1000)]))
        if renewed == 1:
            if self._holds(lease):
                self._granted(lease.call_id, sent)
            return lease
        if renewed == -1:
            again = await self.acquire(lease.call_id)
            if again is not None:
                _log.warning("registry.lease_reacquired", call_id=lease.call_id, fence=again.fence)
                return again
        self._forget_held(lease)
        return None

    def _holds(self, lease: Lease) -> bool:
        held = self._held.get(lease.call_id)
        return held is not None and held.token == lease.token

    def _forget_held(self, lease: Lease) -> None:
        held = self._held.get(lease.call_id)
        if held is not None and held.token == lease.token:
            del self._held[lease.call_id]
            self._granted_at.pop(lease.call_id, None)
            self._stops.pop(lease.call_id, None)
            self._mirrored.pop(lease.call_id, None)
            self._contexts.pop(lease.call_id, None)
            fence = self._fences.pop(lease.call_id, None)
            if fence is not None:
                fence.close()

    def _lose(self, lease: Lease) -> None:
        """Another token holds the call: act on nothing, stop its actor."""
        stop = self._stops.get(lease.call_id)
        self._forget_held(lease)
        if stop is not None:
            stop.lost()

    async def release(self, lease: Lease) -> None:
        """Delete the lease (and the call's takeover entry and mirror) if
        still ours; the releases asked for at once go in one ``RELEASE_MANY``,
        sent even when the caller stops waiting."""
        self._forget_held(lease)
        await self._releases.ask(lease, self._ask_bound_s)

    async def confirm(self, lease: Lease) -> bool:
        """Tell Redis an actor runs ``lease``'s call: its first renewal,
        which writes the call's takeover entry (``RENEW_MANY``). True when
        Redis renewed it (answers settled as a renewal's). ``lease_stop``
        sends it without waiting; every later renewal confirms again."""
        return await self._confirms.ask(lease, self._ask_bound_s) == 1

    async def _confirm_many(self, leases: list[Lease]) -> list[int]:
        kept = [(lease.call_id, lease) for lease in leases]
        sent = trio.current_time()
        answers = await self._renew_many(kept)
        await self._reacquire(self._settle_renewals(kept, answers, sent))
        return answers

    async def _renew_many(self, kept: list[tuple[str, Lease]]) -> list[int]:
        """``RENEW_MANY`` for ``kept``: each lease renewed and confirmed
        when its key holds its token; the answers in order."""
        keys = [*(rc.lease_key(call_id) for call_id, _ in kept), rc.CALLS_KEY]
        args = [a for call_id, lease in kept for a in (lease.token, call_id)]
        return [int(a) for a in await self._script(rc.RENEW_MANY, keys, [round(self.ttl_s * 1000), *args])]

    async def _release_many(self, leases: list[Lease]) -> list[int]:
        keys = [k for lease in leases for k in (rc.lease_key(lease.call_id), rc.pending_key(lease.call_id))]
        answers = await self._script(rc.RELEASE_MANY, [*keys, rc.CALLS_KEY],
                                     [a for lease in leases for a in (lease.token, lease.call_id)])
        return [int(a) for a in answers]

    def lease_of(self, call_id: str) -> Lease | None:
        return self._held.get(call_id)

    def fence_of(self, call_id: str) -> SendFence | None:
        return self._fences.get(call_id) if call_id in self._held else None

    def lease_stop(self, lease: Lease, margin: float) -> LeaseStop:
        """The stop of ``lease``'s actor (see ``LeaseStop``): from now on the
        lease is renewed in every tick's batch until it is released or lost.
        A lease no longer held here is lost at once. Its first renewal goes
        now (``confirm``): the call can be taken over from then on."""
        stop = LeaseStop(margin)
        if not self._holds(lease):
            stop.lost()
            return stop
        self._stops[lease.call_id] = stop
        stop.granted(self._granted_at[lease.call_id], self.ttl_s)
        self._confirms.submit(lease)
        return stop

    # --- renewing every kept lease in one request ---------------------------------

    async def _renew_kept(self) -> None:
        """Every ``renew_every_s``, renew each kept lease in one ``RENEW_MANY``
        (nothing kept: a PING, for ``health``). A lease kept between two
        ticks waits at most that long for its first renewal. Redis
        not answering: try again in a twelfth of a lease; each call's stop
        deadline, which no renewal moves then, stops its actor in time."""
        next_tick = trio.current_time() + self.renew_every_s
        while True:
            await trio.sleep_until(next_tick)
            for call_id in [c for c, stop in self._stops.items() if stop.ended]:
                del self._stops[call_id]        # its actor is done (its release follows)
            kept = [(call_id, self._held[call_id]) for call_id in self._stops]
            sent = trio.current_time()
            next_tick = sent + self.renew_every_s
            if not kept:
                await self._ping()
                continue
            try:
                answers = await self._renew_many(kept)
            except RegistryDown:
                next_tick = trio.current_time() + self.ttl_s / 12
                continue
            vanished = self._settle_renewals(kept, answers, sent)
            await self._reacquire(vanished)

    def _settle_renewals(self, kept: list[tuple[str, Lease]], answers: list[int], sent: float) -> list[Lease]:
        """Apply one batch's answers; the leases whose key was gone."""
        vanished = []
        for (call_id, lease), answer in zip(kept, answers, strict=True):
            if self._held.get(call_id) is not lease:
                continue                # released (or lost) while the batch was out
            if answer == 1:
                self._granted(call_id, sent)
            elif answer == 0:
                self._lose(lease)
            else:
                vanished.append(lease)
        return vanished

    async def _reacquire(self, vanished: list[Lease]) -> None:
        """Leases nobody holds any more (expired before a renewal reached them,
        or Redis restarted without its data): no other process holds those
        calls, so this one takes them again, each with a new fencing token.
        Redis failing meanwhile: the next tick finds them gone again."""
        for lease in vanished:
            if self._held.get(lease.call_id) is not lease:
                continue
            try:
                again = await self.acquire(lease.call_id)
            except RegistryDown:
                return
            if again is None:
                self._lose(lease)
            elif lease.call_id not in self._stops or self._stops[lease.call_id].ended:
                await self.release(again)               # its actor ended while we asked
            else:
                _log.warning("registry.lease_reacquired", call_id=lease.call_id, fence=again.fence)

    # --- the shared write log --------------------------------------------------

    def _claimer(self, call_id: str | None) -> str:
        """The token a claim for ``call_id`` is made with: ``UNFENCED`` for a
        request of no call, '' with no lease here (a record answers, nothing
        claims)."""
        if call_id is None:
            return rc.UNFENCED
        lease = self._held.get(call_id)
        return lease.token if lease is not None else ""

    async def claim_write(self, call_id: str | None, tool_call_id: str) -> ClaimAnswer:
        """Claim ``tool_call_id`` for the holder of ``call_id``'s lease (None:
        a request of no call, claimed unfenced)."""
        token = self._claimer(call_id)
        lease_key = rc.lease_key(call_id if call_id is not None else "")
        state, value = await self._script(rc.CLAIM_WRITE, [lease_key, rc.write_key(tool_call_id)],
                                          [token, WRITE_RECORD_TTL_S])
        if state == WriteClaim.CLAIMED:
            return ClaimAnswer(WriteClaim.CLAIMED)
        if state == WriteClaim.STALE:
            return ClaimAnswer(WriteClaim.STALE)
        record = None
        if isinstance(value, str) and not value.startswith(rc.APPLYING):
            try:
                loaded = json.loads(value)
            except ValueError:
                loaded = None
            record = loaded if isinstance(loaded, dict) and isinstance(loaded.get("output"), str) else None
        return ClaimAnswer(WriteClaim.TAKEN, record)

    async def record_write(self, tool_call_id: str, record: dict[str, Any]) -> None:
        text = json.dumps(record, ensure_ascii=False, sort_keys=True)
        await self._request(self._redis.set(rc.write_key(tool_call_id), text, ex=WRITE_RECORD_TTL_S))

    async def unclaim_write(self, call_id: str | None, tool_call_id: str) -> None:
        """Give back this process's claim of a write that applied nothing
        (``UNCLAIM_WRITE``: only while the key holds our marker), so its
        retry, or a request waiting for it elsewhere, applies it."""
        marker = rc.APPLYING + self._claimer(call_id)
        await self._script(rc.UNCLAIM_WRITE, [rc.write_key(tool_call_id)], [marker])

    # --- takeover ----------------------------------------------------------------

    def note_record(self, call_id: str, line: dict[str, Any]) -> None:
        """A call record line of a call held here: its tool lines are mirrored
        (``pending:<call_id>``) in order by one writer task, and so is a
        ``selection`` line of a call with a context (``note_context``: its
        carried context with the new selection), and an ``audio_usage`` line
        of a Live call (its context with the session's seconds counted so
        far: a taker counts only what its reports add). Never blocks; a full
        queue drops the line (logged: a takeover then misses it)."""
        kind = line.get("kind")
        if kind in (RecordKind.SELECTION, RecordKind.HANDOFF):
            carried = self._contexts.get(call_id)
            if carried is None:
                return
            if kind == RecordKind.SELECTION:
                carried["selection"] = line.get("selection")
            else:
                agent = in_charge_after(line, carried_agent(carried))
                if agent == carried_agent(carried):
                    return      # a refused handoff: nothing changed
                carried["agent"] = agent
                output = recorded_output(line)
                if output is not None:      # its call is answered so by a taker, not with the restart error
                    self._queue_mirror(call_id, {
                        "kind": RecordKind.TOOL_STARTED, "tool_call_id": line.get("tool_call_id"),
                        "tool": line.get("tool"), "response_id": line.get("response_id"), "effect": None,
                        "output": output})
            line = {"kind": rc.CONTEXT_FIELD, "context": dict(carried)}
        elif kind == RecordKind.AUDIO_USAGE:
            carried = self._contexts.get(call_id)
            if carried is None or not isinstance(carried.get("live"), dict):
                return
            carried["live"] = {**carried["live"], "audio_s": line.get("seconds")}
            line = {"kind": rc.CONTEXT_FIELD, "context": dict(carried)}
        elif kind not in TOOL_KINDS:
            return
        self._queue_mirror(call_id, line)

    def note_context(self, call_id: str, linked: LinkedContext) -> None:
        """A held call's linked context, as its actor starts: kept here for
        its ``selection`` lines, and mirrored at once when there is a link, a
        selection, a Live session or agents to carry (a taker needs the
        instruction its agents' parts are added to, and a Live call's taker
        its session to attach as a Live call at all; a context with none of
        them, a test's or an older caller's, costs Redis nothing until a
        ``journal.select`` gives it one)."""
        if call_id not in self._held:
            return
        carried = self._contexts[call_id] = carried_view(linked)
        if (carried["link"] is not None or carried["selection"] is not None or carried.get("live") is not None
                or linked.agents is not None):
            self._queue_mirror(call_id, {"kind": rc.CONTEXT_FIELD, "context": dict(carried)})

    def _queue_mirror(self, call_id: str, line: dict[str, Any]) -> None:
        try:
            self._mirror_send.send_nowait((call_id, line))
        except trio.WouldBlock:
            _log.warning("registry.mirror_dropped", call_id=call_id, kind=line.get("kind"))

    async def _mirror_writer(self) -> None:
        """Write the queued tool lines in order, everything queued at once in
        one Lua step (one round trip however many calls' lines wait). The
        first line after a quiet spell goes at once; under load the passes
        are ``MIRROR_PASS_INTERVAL_S`` apart, so a pass carries what every
        call logged meanwhile, and a tool call started and settled within
        one pass (most reads) costs Redis nothing (``_mirror_ops``)."""
        receive = self._mirror_receive
        last_pass = float("-inf")
        async for first in receive:
            await trio.sleep_until(last_pass + MIRROR_PASS_INTERVAL_S)
            last_pass = trio.current_time()
            batch = [first]
            while True:
                try:
                    batch.append(receive.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            ops = self._mirror_ops(batch)
            if not ops:
                continue
            # each line carries the token of the lease it was written under,
            # checked in the script (one round trip, as before the fence)
            leases = [self._held[call_id] for call_id, _, _ in ops]
            keys = [k for call_id, _, _ in ops for k in (rc.pending_key(call_id), rc.lease_key(call_id))]
            args = [a for (_, tool_call_id, text), lease in zip(ops, leases, strict=True)
                    for a in ("set" if text else "del", tool_call_id, text, lease.token)]
            try:
                answers = await self._script(rc.MIRROR, keys, args)
            except RegistryDown:
                for call_id, field, text in ops:
                    kind = (rc.CONTEXT_FIELD if field == rc.CONTEXT_FIELD
                            else RecordKind.TOOL_STARTED if text else RecordKind.TOOL_CALL)
                    _log.warning("registry.mirror_failed", call_id=call_id, kind=kind)
                continue
            refused = self._settle_mirror(ops, leases, [int(a) for a in answers])
            await self._reacquire(refused)

    def _settle_mirror(self, ops: list[tuple[str, str, str]], leases: list[Lease],
                       answers: list[int]) -> list[Lease]:
        """Apply one pass's answers as ``_settle_renewals`` does a renewal's:
        a line refused because another token holds its call loses that lease
        (its actor stops, its fence closes); the leases whose key was gone,
        to take again. A refused line is not in the mirror (logged)."""
        vanished: dict[str, Lease] = {}
        for (call_id, tool_call_id, text), lease, answer in zip(ops, leases, answers, strict=True):
            if answer != 1:
                _log.warning("registry.mirror_refused", call_id=call_id, fence=lease.fence,
                             held="other" if answer == 0 else "none")
            if self._held.get(call_id) is not lease:
                continue            # released or lost meanwhile (RELEASE deleted its hash)
            if answer == 0:
                self._lose(lease)
            elif answer == -1:
                vanished[call_id] = lease
            elif tool_call_id != rc.CONTEXT_FIELD:
                written = self._mirrored.setdefault(call_id, set())
                if text:
                    written.add(tool_call_id)
                else:
                    written.discard(tool_call_id)
        return list(vanished.values())

    def _mirror_ops(self, batch: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, str, str]]:
        """One pass's lines as ``(call_id, tool_call_id, JSON)`` writes (``''``:
        delete), the last line of each tool call winning. A start and its
        settle both in the pass write nothing when no earlier pass wrote
        that start: the hash ends as it was. A context line is the call's
        ``CONTEXT_FIELD``, the last of the pass written."""
        ops: dict[tuple[str, str], str] = {}
        for call_id, line in batch:
            if line["kind"] == rc.CONTEXT_FIELD:
                if call_id in self._held:
                    ops[(call_id, rc.CONTEXT_FIELD)] = json.dumps(line["context"], ensure_ascii=False)
                continue
            tool_call_id = line.get("tool_call_id")
            if not isinstance(tool_call_id, str) or call_id not in self._held:
                continue
            key = (call_id, tool_call_id)
            if line["kind"] == RecordKind.TOOL_STARTED:
                ops[key] = json.dumps(line)
            elif ops.get(key) and tool_call_id not in self._mirrored.get(call_id, ()):
                del ops[key]
            else:
                ops[key] = ""
        return [(call_id, tool_call_id, text) for (call_id, tool_call_id), text in ops.items()]

    async def orphans(self) -> list[tuple[str, str]]:
        """``(call_id, token)`` of the calls whose lease is gone but whose
        holder never released them (it died, or lost Redis)."""
        flat = list(await self._script(rc.ORPHANS, [rc.CALLS_KEY], [rc.lease_key("")]))
        pairs = zip(flat[0::2], flat[1::2])
        return [(str(call_id), str(token)) for call_id, token in pairs if call_id not in self._held]

    async def carried(self, call_id: str) -> Carried:
        """A dead holder's call as its mirror left it: its unsettled tool
        calls and its context, in one read."""
        entries = await self._request(self._redis.hgetall(rc.pending_key(call_id)))
        pending = []
        context = None
        for tool_call_id, text in dict(entries).items():
            try:
                line = json.loads(text)
            except ValueError:
                continue
            if tool_call_id == rc.CONTEXT_FIELD:
                context = taken_over_context(line)
                continue
            if not isinstance(line, dict):
                continue
            arguments, output = line.get("arguments"), line.get("output")
            pending.append(PendingCall(str(tool_call_id), str(line.get("tool") or ""),
                                       str(line.get("response_id") or ""), tool_effect(line.get("effect")),
                                       arguments if isinstance(arguments, str) else None,
                                       output if isinstance(output, str) else None))
        return Carried(pending, context)


def make_registry(settings: Any) -> CallRegistry:
    url = getattr(settings, "redis_url", None)
    if url:
        return RedisRegistry(url, settings.redis_lease_ttl_s)
    return LocalRegistry()
