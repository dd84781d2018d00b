"""The Redis side of the cluster registry: keys, Lua scripts, one client.

Redis 7.0 (Debian's) has no ``SET ... IFEQ``, so every compare-and-set or
compare-and-delete is a Lua script: Redis runs a script as one step, so no
other client's command lands between its check and its change.

Keys (``PREFIX`` first):

* ``lease:<call_id>`` — the holder's token ``<node>:<fence>``, with a TTL
  (``PX``): set only when absent, renewed and deleted only by that token.
* ``fence`` — the fencing counter. The first lease after Redis lost its data
  (a restart without persistence) seeds it from Redis's clock in milliseconds,
  so a token never repeats one issued before the restart.
* ``calls`` — a hash ``call_id -> token`` of the calls a holder confirmed it
  runs (its renewal writes the entry, ``RENEW_MANY``; an acquire never does)
  and whose holder died (the lease expired, the entry stays): what a
  takeover scans. A lease won for a connect that was then refused is never
  confirmed, so nothing ever adopts its call.
* ``voided:<request>`` — a tombstone of an acquire request whose outcome its
  sender never learnt (it timed out or its connection broke): written by
  ``VOID_ACQUIRE``, checked first by that request's ``ACQUIRE_MANY``, so the
  request sets nothing if Redis runs it after the void (``VOID_TTL_S``).
* ``pending:<call_id>`` — a hash ``tool_call_id -> JSON`` of the call's tool
  calls started and not yet settled (its holder's call record, mirrored),
  and in field ``CONTEXT_FIELD`` the call's linked context when it has one
  (``call_context.carried_view``: the brain's instruction at connect, the
  link, the current selection), so a taker carries the call on whole.
  Written only under the call's current lease token (``MIRROR``).
* ``write:<sha256(tool_call_id)>`` — the shared write log: ``applying:<token>``
  while a write runs, then its record's JSON.
* ``feed:<call_id>`` — the call's client feed, a stream capped with ``MAXLEN ~``
  (``feed_stream_max_len``): one entry per feed event, field ``e`` its JSON,
  the entry id the event's own id ``<fence>-<seq>`` (so a holder whose lease
  was taken over, with a lower fence, cannot append). A holder writes every
  call's waiting events in one script per pass (``FEED_APPEND_MANY``). It expires
  ``feed_retention_s`` after ``call.ended``, and at the latest
  ``call_max_duration_s`` plus that after its last entry.
* ``navhints:<call_id>`` — the call's nav hints not taken yet, a list of
  ``<ms>|<json>`` (Redis time of the push), capped at ``feed_max_items``;
  ``observer_actions`` — the same for every call's observer actions. A take
  reads and deletes the list in one script, so a hint is taken once.
* ``usage:<YYYY-MM-DD>`` — the day's spend across the cluster: a hash
  ``source -> micro-dollars``, each process's own total for the day (its
  ``usage/source_id``), set only upward (``USAGE_SYNC``); expires after
  ``USAGE_TTL_S`` (``usage/cluster_total.py``).

Every request is bounded (``bounded``: its timeout and the client's own
errors surface as ``RegistryDown``); ``Reachability`` tells its user when a
failure or an answer is a change worth one log line.

No request is ever sent twice by the client (``NoRetryPolicy``; coredis's
default resends one, on a new connection, when its connection failed or
timed out). A connection lost after Redis ran a request and before its
reply came leaves the outcome unknown: a script run again would answer
from its own first run (``CLAIM_WRITE``: ``taken`` by its own ``applying:``
marker, with no record; ``ACQUIRE_MANY``: held by its own token). The
request fails as ``RegistryDown`` instead, and its caller answers as for
Redis down (a write: nothing applied, "shared write log unreachable").
Reads are not retried either (one policy per client, kept simple): a failed
read is ``RegistryDown`` as Redis down is, and its caller's handling of that
applies (its next pass, its fallback, a 503). Pinned by
tests/test_cluster_no_retry.py.

Cancellation: a request can be cancelled (its bound, its caller) after it
was sent and before its reply came. That never puts a connection out of
step: coredis queues each request on its connection in order and a
cancelled one stays queued, so its reply is consumed by it, never read by
the next request. A blocking read (``XREAD BLOCK``) cancelled so has its
connection closed by coredis; ``_SlotKeepingPool`` gives that connection's
pool slot back (coredis 6.9 lost it). Both are pinned against a real
redis-server made to hold its replies (``CLIENT PAUSE``) in
tests/test_cluster_cancelled_requests.py.
"""

from __future__ import annotations

import hashlib
from typing import Any, Awaitable, TypeVar

import anyio
import coredis
import coredis.exceptions
from coredis.connection import BaseConnection
from coredis.retry import NoRetryPolicy
import trio

PREFIX = "voiceactors:"
FENCE_KEY = PREFIX + "fence"
CALLS_KEY = PREFIX + "calls"
OBSERVER_ACTIONS_KEY = PREFIX + "observer_actions"
APPLYING = "applying:"
VOID_TTL_S = 24 * 3600  # a voided acquire request's tombstone: far longer than it can sit in a socket
UNFENCED = "*"          # a claim's token for a write of no call (an MCP client's)
CONTEXT_FIELD = "~context"  # a pending hash's field that is not a tool call: the call's linked context
T = TypeVar("T")


def lease_key(call_id: str) -> str:
    return f"{PREFIX}lease:{call_id}"


def void_key(request: str) -> str:
    return f"{PREFIX}voided:{request}"


def pending_key(call_id: str) -> str:
    return f"{PREFIX}pending:{call_id}"


def feed_key(call_id: str) -> str:
    return f"{PREFIX}feed:{call_id}"


def nav_hints_key(call_id: str) -> str:
    return f"{PREFIX}navhints:{call_id}"


def usage_key(day: str) -> str:
    return f"{PREFIX}usage:{day}"


def write_key(tool_call_id: str) -> str:
    return PREFIX + "write:" + hashlib.sha256(tool_call_id.encode("utf-8")).hexdigest()


class RegistryDown(Exception):
    """Redis did not answer in time (down, unreachable, refused). The
    message names the client's error, or ``TooSlowError`` for a timeout."""

    def __init__(self, message: str = "", *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out

    @property
    def error_name(self) -> str:
        """What the logs' ``error`` field says: ``TooSlowError`` for a
        timeout, else ``RegistryDown``."""
        return "TooSlowError" if self.timed_out else "RegistryDown"


class Reachability:
    """Whether Redis answered its user's last request, so the user logs one
    line per change (not one per request)."""

    __slots__ = ("reachable",)

    def __init__(self) -> None:
        self.reachable: bool | None = None     # None: nothing asked yet

    def failed(self) -> bool:
        """A request failed: True when Redis was not known down (log it)."""
        changed = self.reachable is not False
        self.reachable = False
        return changed

    def answered(self) -> bool:
        """A request was answered: True when Redis was down until now (log it)."""
        back = self.reachable is False
        self.reachable = True
        return back


#: KEYS: per lease asked for, its lease key; then the fence, calls and the
#: request's ``void_key``. ARGV: the request (``<node>/<n>``, unique per
#: request: the tokens' prefix), ttl_ms, then one call_id per lease key. Per
#: lease, in order, in one step: {1, token, previous} when won (previous: the
#: ``calls`` entry of a holder that ran the call and never released it, ''
#: when none), {0, holder's token, 1 when that token is confirmed (its
#: ``calls`` entry) else 0} when held. A voided request (its sender
#: gave up on it, ``VOID_ACQUIRE`` ran first) sets nothing: {0, ''} each.
#: The ``calls`` entry is not written here: the holder's renewal writes it
#: once an actor runs the call (``RENEW_MANY``). One round trip for every
#: lease asked for at once (``cluster/batched.py``).
ACQUIRE_MANY = """
local fence_key, calls_key, void_key = KEYS[#KEYS - 2], KEYS[#KEYS - 1], KEYS[#KEYS]
local answers = {}
if redis.call('EXISTS', void_key) == 1 then
  for i = 1, #KEYS - 3 do answers[i] = {0, ''} end
  return answers
end
for i = 1, #KEYS - 3 do
  local held = redis.call('GET', KEYS[i])
  if held then
    answers[i] = {0, held, redis.call('HGET', calls_key, ARGV[i + 2]) == held and 1 or 0}
  else
    if redis.call('EXISTS', fence_key) == 0 then
      local now = redis.call('TIME')
      redis.call('SET', fence_key, string.format('%d', tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)))
    end
    local token = ARGV[1] .. ':' .. string.format('%d', redis.call('INCR', fence_key))
    redis.call('SET', KEYS[i], token, 'PX', ARGV[2])
    answers[i] = {1, token, redis.call('HGET', calls_key, ARGV[i + 2]) or ''}
  end
end
return answers
"""

#: KEYS: per acquire request voided, its ``void_key`` then the lease key of
#: each call it asked for. ARGV: the tombstones' ttl_s, then per request its
#: tokens' prefix (``<request>:``) and how many calls it asked for. In one
#: step, per request in order: its tombstone set (the request, run later,
#: sets nothing), and each lease key holding one of its tokens deleted (it
#: ran before this). Per call, in order, the token deleted, '' when none.
#: The ``calls`` entry and the mirror are never touched: the request's
#: leases were never confirmed (no actor ran them), so an entry there is a
#: previous holder's, still to be taken over.
VOID_ACQUIRE = """
local deleted = {}
local k = 1
for a = 2, #ARGV, 2 do
  local prefix, asked = ARGV[a], tonumber(ARGV[a + 1])
  redis.call('SET', KEYS[k], '1', 'EX', ARGV[1])
  for i = k + 1, k + asked do
    local held = redis.call('GET', KEYS[i])
    if held and string.sub(held, 1, #prefix) == prefix then
      redis.call('DEL', KEYS[i])
      deleted[#deleted + 1] = held
    else
      deleted[#deleted + 1] = ''
    end
  end
  k = k + asked + 1
end
return deleted
"""

#: Who holds a lease key, as the scripts that act only for its holder ask:
#: 1 ``token`` does; 0 another token does; -1 nobody does (it expired, or
#: Redis restarted without its data). Put in front of those scripts.
_HOLDER = """
local function holder(key, token)
  local held = redis.call('GET', key)
  if held == token then return 1 end
  if held then return 0 end
  return -1
end
"""

#: KEYS: lease. ARGV: token, ttl_ms. ``holder``'s answer, the lease renewed on 1.
RENEW = _HOLDER + """
local answer = holder(KEYS[1], ARGV[1])
if answer == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return answer
"""

#: KEYS: every lease a process renews, then calls. ARGV: ttl_ms, then per
#: lease its token and its call_id. Per lease ``RENEW``'s answer (1, 0 or
#: -1), in order: one round trip per process per renewal tick, however many
#: calls it holds. A lease renewed here is also confirmed: its ``calls``
#: entry names its token (what a takeover adopts once the lease expires
#: unreleased). Only a holder whose actor runs the call renews it, so only a
#: call some connect was answered for is ever taken over.
RENEW_MANY = _HOLDER + """
local calls_key = KEYS[#KEYS]
local answers = {}
for i = 1, #KEYS - 1 do
  local token, call_id = ARGV[i * 2], ARGV[i * 2 + 1]
  answers[i] = holder(KEYS[i], token)
  if answers[i] == 1 then
    redis.call('PEXPIRE', KEYS[i], ARGV[1])
    if redis.call('HGET', calls_key, call_id) ~= token then redis.call('HSET', calls_key, call_id, token) end
  end
end
return answers
"""

#: KEYS: per lease released, its lease key then its pending key; calls last.
#: ARGV: per lease its token then its call_id. Deletes only what is ours, per
#: lease in order, in one step: 1 when its lease key was ours (deleted), else 0.
#: The ``calls`` entry and the mirror go with a lease that was confirmed
#: (the entry names it) or with a new call's never confirmed (no entry); a
#: taker's lease never confirmed leaves the dead holder's entry and mirror,
#: so the call is taken over again at once.
RELEASE_MANY = """
local calls_key = KEYS[#KEYS]
local answers = {}
for i = 1, (#KEYS - 1) / 2 do
  local lease_key, pending_key = KEYS[i * 2 - 1], KEYS[i * 2]
  local token, call_id = ARGV[i * 2 - 1], ARGV[i * 2]
  local entry = redis.call('HGET', calls_key, call_id)
  local ours = redis.call('GET', lease_key) == token
  if entry == token then
    redis.call('HDEL', calls_key, call_id)
    redis.call('DEL', pending_key)
  elseif ours and not entry then
    redis.call('DEL', pending_key)
  end
  if ours then
    redis.call('DEL', lease_key)
    answers[i] = 1
  else
    answers[i] = 0
  end
end
return answers
"""

#: KEYS: lease, write. ARGV: token ('*': no fence), ttl_s. Check the write log
#: and the fence, then claim, in one step: {'claimed', ''}, {'taken', value},
#: {'stale', ''}.
CLAIM_WRITE = """
local done = redis.call('GET', KEYS[2])
if done then return {'taken', done} end
if ARGV[1] == '' or (ARGV[1] ~= '*' and redis.call('GET', KEYS[1]) ~= ARGV[1]) then return {'stale', ''} end
redis.call('SET', KEYS[2], 'applying:' .. ARGV[1], 'EX', ARGV[2])
return {'claimed', ''}
"""

#: KEYS: write. ARGV: the claim's marker (``applying:<token>``). A claim
#: whose write applied nothing (its journal file's lock never came) given
#: back in one step, only while the key still holds that marker: 1 when
#: deleted, else 0. The next claim of the tool call id, here or elsewhere,
#: then applies it.
UNCLAIM_WRITE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""

#: KEYS: calls. ARGV: the lease keys' prefix. The ``calls`` entries whose
#: lease key is gone, flat ``{call_id, token, ...}``: one round trip for the
#: whole scan. (It reads lease keys it was not given, so it needs one Redis,
#: not Redis Cluster.)
ORPHANS = """
local found = {}
local entries = redis.call('HGETALL', KEYS[1])
for i = 1, #entries, 2 do
  if redis.call('EXISTS', ARGV[1] .. entries[i]) == 0 then
    found[#found + 1] = entries[i]
    found[#found + 1] = entries[i + 1]
  end
end
return found
"""

#: KEYS: per entry, its feed stream then its polling queue's list (the
#: stream again for none). ARGV: max_len, max_items, retention_ms, then per
#: entry: entry id, event JSON, stream ttl_ms, queue item JSON ('' for none).
#: The entries in order, one step, each as the single append was: the XADD
#: first (``pcall``), and only when it took the entry its stream's TTL and its
#: queue item. Returns a status per entry: 1 written, 0 refused as stale (an
#: id at or below its stream's last one: a stale holder's, or a retry of an
#: applied batch), nothing else changed for it and the next entries go on;
#: any other error ends the list with its text, the entries after it not tried.
FEED_APPEND_MANY = """
local statuses = {}
local ms = nil
for i = 1, #KEYS / 2 do
  local stream, queue, at = KEYS[i * 2 - 1], KEYS[i * 2], 3 + (i - 1) * 4
  local added = redis.pcall('XADD', stream, 'MAXLEN', '~', ARGV[1], ARGV[at + 1], 'e', ARGV[at + 2])
  if type(added) == 'table' and added.err then
    if not string.find(added.err, 'equal or smaller', 1, true) then
      statuses[i] = added.err
      return statuses
    end
    statuses[i] = 0
  else
    redis.call('PEXPIRE', stream, ARGV[at + 3])
    if ARGV[at + 4] ~= '' then
      if not ms then
        local now = redis.call('TIME')
        ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
      end
      redis.call('RPUSH', queue, string.format('%d', ms) .. '|' .. ARGV[at + 4])
      redis.call('LTRIM', queue, -tonumber(ARGV[2]), -1)
      redis.call('PEXPIRE', queue, ARGV[3])
    end
    statuses[i] = 1
  end
end
return statuses
"""

#: KEYS: a polling queue's list. ARGV: retention_ms. Its items younger than
#: the retention, oldest first; the list is gone afterwards (taken once).
QUEUE_TAKE = """
local items = redis.call('LRANGE', KEYS[1], 0, -1)
redis.call('DEL', KEYS[1])
local now = redis.call('TIME')
local cutoff = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) - tonumber(ARGV[1])
local out = {}
for _, item in ipairs(items) do
  local sep = string.find(item, '|', 1, true)
  if sep and tonumber(string.sub(item, 1, sep - 1)) > cutoff then out[#out + 1] = string.sub(item, sep + 1) end
end
return out
"""

#: KEYS: calls. ARGV: the lease keys' prefix. How many calls hold a live
#: lease now, on any process (one Redis, as ``ORPHANS``).
LIVE_CALLS = """
local live = 0
local entries = redis.call('HKEYS', KEYS[1])
for i = 1, #entries do
  if redis.call('EXISTS', ARGV[1] .. entries[i]) == 1 then live = live + 1 end
end
return live
"""

#: KEYS: per line its ``pending:<call_id>`` then that call's lease key.
#: ARGV: per line ``op`` ('set' or 'del'), ``tool_call_id``, the line's JSON
#: ('' for 'del'), the writer's lease token. In order, one step, each line
#: fenced as ``CLAIM_WRITE`` is: written only while the lease key holds the
#: writer's token, so a stale holder (paused past its TTL, its call taken
#: over) cannot overwrite what the new holder mirrored. Per line, in order:
#: 1 written, 0 refused (another token holds the call), -1 refused (nobody
#: holds it: ``holder``'s answers).
MIRROR = _HOLDER + """
local answers = {}
for i = 1, #KEYS / 2 do
  local pending_key, lease_key = KEYS[i * 2 - 1], KEYS[i * 2]
  local op, field, text, token = ARGV[i * 4 - 3], ARGV[i * 4 - 2], ARGV[i * 4 - 1], ARGV[i * 4]
  answers[i] = holder(lease_key, token)
  if answers[i] == 1 then
    if op == 'set' then redis.call('HSET', pending_key, field, text) else redis.call('HDEL', pending_key, field) end
  end
end
return answers
"""

#: A day's usage hash outlives its day (a process whose clock seam lags).
USAGE_TTL_S = 3 * 24 * 3600

#: KEYS: usage:<day>. ARGV: source, its day's total in micro-dollars, ttl_s.
#: Raise this source's field to the total (never lower it: a restarted
#: process whose file missed its last second keeps what it had sent), then
#: {this source's field, the sum of every other field}, one step.
USAGE_SYNC = """
local mine = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0') or 0
local total = tonumber(ARGV[2])
if total > mine then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  mine = total
end
redis.call('EXPIRE', KEYS[1], ARGV[3])
local others = 0
local entries = redis.call('HGETALL', KEYS[1])
for i = 1, #entries, 2 do
  if entries[i] ~= ARGV[1] then others = others + (tonumber(entries[i + 1]) or 0) end
end
return {mine, others}
"""

#: anyio's: a pooled connection a cancelled request closed, met by the next request on it
ERRORS: tuple[type[BaseException], ...] = (coredis.exceptions.RedisError, OSError,
                                           anyio.ClosedResourceError, anyio.BrokenResourceError)


class _SlotKeepingPool(coredis.ConnectionPool[BaseConnection]):
    """coredis's pool, except that a connection released unusable gives its
    slot back.

    coredis 6.9 puts a released connection back only while it is usable, and
    refills a slot only for a connection that dies while it sits in the pool.
    A connection leased across an await and unusable at its release (a
    blocking ``XREAD`` cancelled mid-request, which coredis invalidates; or
    one that died while leased: Redis restarted) was dropped with its slot,
    so after ``max_connections`` of them every request waited for a
    connection for ever (the shared feed's readers: each client that left
    mid-read cost one). Reads ``_available_connections``, coredis's private
    queue of slots (pinned ``<7``; tests/test_cluster_cancelled_requests.py)."""

    def release(self, connection: BaseConnection) -> None:
        super().release(connection)
        slots = self._available_connections
        if not connection.usable and len(slots) < self.max_connections:
            slots.append_nowait(None)      # a fresh connection is made in its place when asked


def client(url: str, *, max_connections: int | None = None) -> Any:
    """A client for ``url`` (``redis://``, ``rediss://``, ``unix://``); use it
    inside ``async with``, which holds its connection pool (``max_connections``:
    its size, coredis's default 64 when None; a blocked ``XREAD`` holds one;
    ``_SlotKeepingPool``: one cancelled or broken while leased gives its slot
    back). It never sends a request again after a failure (``NoRetryPolicy``:
    the first run's outcome is unknown, a second would misreport it)."""
    options: dict[str, Any] = {"decode_responses": True, "connect_timeout": 2.0}
    if max_connections is not None:
        options["max_connections"] = max_connections
    return coredis.Redis(connection_pool=_SlotKeepingPool.from_url(url, **options), decode_responses=True,
                         retry_policy=NoRetryPolicy())


async def guarded(request: Awaitable[T]) -> T:
    """Await one Redis request; its failure (also an ``ExceptionGroup`` of
    them, as a refused connection can raise) becomes ``RegistryDown``."""
    try:
        return await request
    except ERRORS as exc:
        raise RegistryDown(type(exc).__name__) from exc
    except BaseExceptionGroup as group:
        matched, rest = group.split(ERRORS)
        if rest is not None or matched is None:
            raise
        raise RegistryDown(type(matched.exceptions[0]).__name__) from group


async def bounded(request: Awaitable[T], timeout_s: float) -> T:
    """One request, at most ``timeout_s``: its failure or its timeout
    (``timed_out``, message ``TooSlowError``) is ``RegistryDown``."""
    try:
        with trio.fail_after(timeout_s):
            return await guarded(request)
    except trio.TooSlowError:
        raise RegistryDown("TooSlowError", timed_out=True) from None


def eval_script(redis: coredis.Redis[str], script: str, keys: list[str], args: list[object]) -> Awaitable[Any]:
    """The request running ``script`` (every argument sent as text)."""
    return redis.eval(script, keys=keys, args=[str(a) for a in args])


async def run_script(redis: Any, script: str, keys: list[str], args: list[Any]) -> Any:
    return await guarded(eval_script(redis, script, keys, args))
