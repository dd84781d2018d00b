"""One brain for the cluster (``--redis``): single flight across processes.

The BrainActor of each process keeps its own instruction, as without Redis;
with a ``BrainFlight`` its runs go through Redis first:

* ``voiceactors:brain:current`` — a hash: the last instruction made by any
  process, its ``version``, the ``digest`` of the journal snapshot it was
  made from, the ``day`` it was made for and ``made_ms`` (Redis's clock).
* ``voiceactors:brain:version`` — the version counter, seeded from Redis's
  clock the first time it is missing (so a Redis restarted without its data
  never hands out a version already seen).
* ``voiceactors:brain:lock`` — the refresh lock: a random token set only
  when absent, with a TTL of the backend's time limit plus a margin, stored
  with the result and deleted in one Lua step only by its token.

``obtain`` is a run of the brain: a current instruction made from the same
snapshot, for today, young enough, is adopted as it is (no backend run); else
the process that wins the lock runs its backend and stores the result, and
every other one waits for that version (polling ``current``) and adopts it. A
lock whose holder died vanishes at its TTL and the next waiter takes it; a
holder whose backend failed deletes it at once, so a waiter tries its own.
Redis not answering: the process runs its own backend (``alone``), as
without Redis, and says so once in its log (``brain.cluster_unreachable``).
``current`` is also what each BrainActor polls to adopt a newer version made
elsewhere (an explicit refresh on another process).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import secrets
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import trio
from coredis.tokens import PureToken

from voiceactors.cluster import redis_client as rc
from voiceactors.cluster.redis_client import RegistryDown
from voiceactors.logs import get_logger

CURRENT_KEY = rc.PREFIX + "brain:current"
VERSION_KEY = rc.PREFIX + "brain:version"
LOCK_KEY = rc.PREFIX + "brain:lock"
LOCK_MARGIN_S = 5.0         # the lock outlives a run bounded by brain_timeout_s by this much
OP_TIMEOUT_S = 2.0          # one Redis request's bound
WAIT_POLL_S = 0.1           # how often a waiter looks for the holder's result
REFRESH_JOIN_S = 10.0       # an explicit refresh adopts a run this recent from the same journal state

#: KEYS: lock, current, version. ARGV: token, instruction, digest, day.
#: Stores the result only while ``token`` holds the lock, then deletes the
#: lock; the new version, or 0 when the lock was not ours any more.
STORE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
if redis.call('EXISTS', KEYS[3]) == 0 then
  redis.call('SET', KEYS[3], string.format('%d', ms))
end
local version = redis.call('INCR', KEYS[3])
redis.call('HSET', KEYS[2], 'instruction', ARGV[2], 'version', version, 'digest', ARGV[3],
           'day', ARGV[4], 'made_ms', string.format('%d', ms))
redis.call('DEL', KEYS[1])
return version
"""

#: KEYS: lock. ARGV: token. Compare-and-delete.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

#: KEYS: current. The hash and Redis's clock in ms, in one step (an age needs both).
READ = """
local now = redis.call('TIME')
local fields = redis.call('HGETALL', KEYS[1])
fields[#fields + 1] = 'now_ms'
fields[#fields + 1] = string.format('%d', tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000))
return fields
"""

_log = get_logger(actor="brain")

Generate = Callable[[], Awaitable[tuple[str, str | None]]]


def snapshot_digest(snapshot: Any) -> str:
    """The journal state an instruction came from: a digest of the snapshot
    the brain read (frozen dataclasses of strings, numbers and dates, whose
    ``repr`` is the same in every process)."""
    return hashlib.sha256(repr(snapshot).encode("utf-8")).hexdigest()[:32]


@dataclass(frozen=True)
class Shared:
    """The cluster's current instruction as Redis has it."""

    instruction: str
    version: int
    digest: str
    day: _dt.date
    age_s: float


@dataclass(frozen=True)
class Obtained:
    instruction: str
    session_id: str | None
    ran: bool                   # this process ran its backend (False: adopted another's)
    version: int | None         # None: not stored (Redis did not answer, or the lock was lost)
    age_s: float = 0.0


class BrainFlight:
    """Redis's side of the cluster brain. The URL is never logged."""

    def __init__(self, url: str, lock_ttl_s: float) -> None:
        self.lock_ttl_s = lock_ttl_s
        self._redis = rc.client(url)
        self._reach = rc.Reachability()

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the client's connection pool while the brain runs."""
        async with self._redis:
            task_status.started()
            await trio.sleep_forever()

    async def _request(self, request: Awaitable[Any]) -> Any:
        try:
            answer = await rc.bounded(request, OP_TIMEOUT_S)
        except RegistryDown as exc:
            if self._reach.failed():
                _log.warning("brain.cluster_unreachable", error=exc.error_name)
            raise RegistryDown(exc.error_name, timed_out=exc.timed_out) from None
        if self._reach.answered():
            _log.info("brain.cluster_reachable")
        return answer

    async def _script(self, script: str, keys: list[str], args: list[Any]) -> Any:
        return await self._request(rc.eval_script(self._redis, script, keys, args))

    async def current(self) -> Shared | None:
        """The cluster's instruction, or None when none was stored (or it is
        unreadable). ``RegistryDown`` when Redis does not answer."""
        flat = list(await self._script(READ, [CURRENT_KEY], []))
        fields = dict(zip(flat[0::2], flat[1::2]))
        try:
            return Shared(str(fields["instruction"]), int(fields["version"]), str(fields["digest"]),
                          _dt.date.fromisoformat(str(fields["day"])),
                          max(0.0, (int(fields["now_ms"]) - int(fields["made_ms"])) / 1000))
        except (KeyError, ValueError):
            return None

    async def obtain(self, digest: str, day: _dt.date, *, refresh: bool, max_age_s: float,
                     generate: Generate) -> Obtained:
        """One brain run for this process (see the module docstring).
        ``refresh``: an explicit refresh, which adopts a version made from
        the same journal state only within ``REFRESH_JOIN_S`` (a refresh
        asked of several processes at once runs once), else one made after
        it began. Backend errors propagate (the lock is released)."""
        try:
            seen = await self.current()
        except RegistryDown:
            return await _alone(generate)
        if (seen is not None and seen.digest == digest and seen.day == day
                and seen.age_s <= (min(max_age_s, REFRESH_JOIN_S) if refresh else max_age_s)):
            return _adopted(seen)
        floor = seen.version if seen is not None else 0
        while True:
            token = secrets.token_hex(8)
            try:
                won = await self._request(self._redis.set(LOCK_KEY, token, condition=PureToken.NX,
                                                          px=round(self.lock_ttl_s * 1000)))
            except RegistryDown:
                return await _alone(generate)
            if won:
                return await self._run_holding(token, floor, digest, day, generate)
            try:
                newer = await self._wait_for_holder(floor)
            except RegistryDown:
                return await _alone(generate)
            if newer is not None:
                return _adopted(newer)
            # the lock went without a newer version: its holder failed or died; try again

    async def _wait_for_holder(self, floor: int) -> Shared | None:
        """Wait while another process holds the lock: its stored result
        (a version above ``floor``), or None once the lock is gone without one."""
        while True:
            await trio.sleep(WAIT_POLL_S)
            latest = await self.current()
            if latest is not None and latest.version > floor:
                return latest
            if not await self._request(self._redis.exists([LOCK_KEY])):
                latest = await self.current()       # stored just before the lock went
                return latest if latest is not None and latest.version > floor else None

    async def _run_holding(self, token: str, floor: int, digest: str, day: _dt.date,
                           generate: Generate) -> Obtained:
        stored = False
        try:
            try:
                latest = await self.current()
            except RegistryDown:
                latest = None
            if latest is not None and latest.version > floor:
                return _adopted(latest)     # stored by a holder that let the lock go just before we took it
            instruction, session_id = await generate()
            try:
                version = int(await self._script(STORE, [LOCK_KEY, CURRENT_KEY, VERSION_KEY],
                                                 [token, instruction, digest, day.isoformat()]))
            except RegistryDown:
                return Obtained(instruction, session_id, ran=True, version=None)
            stored = version > 0
            if not stored:
                _log.warning("brain.cluster_store_refused")     # the lock expired under the run
            return Obtained(instruction, session_id, ran=True, version=version or None)
        finally:
            if not stored:
                with trio.CancelScope(shield=True), trio.move_on_after(OP_TIMEOUT_S):
                    try:
                        await self._script(RELEASE, [LOCK_KEY], [token])
                    except RegistryDown:
                        pass        # it expires at its TTL


def _adopted(shared: Shared) -> Obtained:
    return Obtained(shared.instruction, None, ran=False, version=shared.version, age_s=shared.age_s)


async def _alone(generate: Generate) -> Obtained:
    """Redis did not answer: this process's own run, as without Redis."""
    instruction, session_id = await generate()
    return Obtained(instruction, session_id, ran=True, version=None)


def make_flight(settings: Any) -> BrainFlight | None:
    url = getattr(settings, "redis_url", None)
    if not url:
        return None
    return BrainFlight(url, settings.brain_timeout_s + LOCK_MARGIN_S)
