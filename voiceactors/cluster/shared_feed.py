"""The client feed across processes (``--redis``): a capped Redis stream per
call, and the polling queues (nav hints, observer actions) as Redis lists.

The holder of a call appends each feed event to ``feed:<call_id>`` from one
writer task per process, in the order the call published them; ``append``
never blocks the call. Each pass of the writer takes every event waiting, of
every call (up to ``BATCH_ENTRIES`` / ``BATCH_BYTES``), and writes them in
one script (``redis_client.FEED_APPEND_MANY``): one round trip per pass, not
one per event, with each event's rules kept in it (its stream's order, cap
and TTL, its queue item, a stale id refused for that entry alone). The first
event after a quiet spell goes at once; under load the passes are at least
``PASS_INTERVAL_S`` apart, so a pass carries what every call published
meanwhile (a request's cost is mostly fixed). The entry id *is* the event's
id, ``<fence>-<seq>``: the fence of the holder's lease and the feed's own
count. The holder knows the id the moment it publishes (its own SSE clients
are served from memory with the same ids, no Redis round trip), a takeover's
higher fence keeps ids growing, and Redis itself refuses an append at or
below the stream's last id, so a holder whose call was taken over cannot add
to the feed. Any process reads the stream with ``XREAD`` from the last id a
client saw (``Last-Event-ID``), so a client moving to another process
resumes without loss or duplicate (within the cap).

While Redis does not answer, the writer keeps the events queued (at most
``WRITER_QUEUE``, the batch in flight included; past that the oldest waiting
are dropped, logged) and retries, a failed or cancelled batch back at the
head in order: a short outage loses nothing, and a batch Redis applied whose
answer was lost is refused entry by entry on its retry (each id is in its
stream already), so nothing lands twice. A stop writes what is left, for at
most ``FLUSH_AT_STOP_S`` (its cancellation does not reach the clients'
pools), and logs what it could not.

A nav hint or observer action is pushed in the same script as its feed
event, so a client that saw the event finds the item; a take anywhere reads
and deletes the list in one script, so each item is taken once.
"""

from __future__ import annotations

import collections
import json
import re
from dataclasses import dataclass
from typing import Any

import trio

from voiceactors.messages import SubscribeRefusal
from voiceactors.cluster import redis_client as rc
from voiceactors.cluster.redis_client import RegistryDown
from voiceactors.logs import get_logger

__all__ = ["EVENT_ID_RE", "SharedFeed", "StreamRefusal"]

#: An event id as the feed makes them (and as ``Last-Event-ID`` must be).
EVENT_ID_RE = re.compile(r"^[0-9]{1,20}-[0-9]{1,20}$")
WRITER_QUEUE = 4096          # events waiting for Redis, all calls together (the batch in flight too)
BATCH_ENTRIES = 256          # events per script (one round trip), all calls together
BATCH_BYTES = 1 << 20        # the batch's JSON at most (an event larger than it goes alone)
PASS_INTERVAL_S = 0.05       # passes at most this often (under load: a remote reader's added wait at most)
READ_BATCH = 100             # entries per XREAD
RETRY_MIN_S, RETRY_MAX_S = 0.2, 2.0
FLUSH_AT_STOP_S = 2.0        # a stopping server still writes what its calls published last
OP_TIMEOUT_S = 2.0

_log = get_logger(actor="shared_feed")
# One encoder for every event and item: ``json.dumps`` with these options
# builds a new ``JSONEncoder`` per call, a few us of each event's append;
# the text is the same.
_ENCODE = json.JSONEncoder(ensure_ascii=False, default=str).encode


@dataclass(slots=True)      # not frozen: a frozen dataclass sets each field through object.__setattr__
class _Append:
    call_id: str
    event_id: str
    event: str
    queue_key: str           # '' when the event carries no polling-queue item
    item: str
    ended: bool              # ``call.ended``: the stream expires after the retention


class StreamRefusal(Exception):
    """A remote stream refused at a subscriber cap (the message is the
    ``/events`` route's 503 error)."""


class SharedFeed:
    """The stream writer (holder side) and the readers (any process). The
    URL is never logged. ``append`` is the ``FeedHub``'s sink."""

    def __init__(self, url: str, *, max_len: int, retention_s: float, max_items: int,
                 max_duration_s: float, max_per_call: int, max_total: int) -> None:
        self.max_len = max_len
        self.retention_ms = round(retention_s * 1000)
        self.max_items = max_items
        self.live_ttl_ms = round((max_duration_s + retention_s) * 1000)
        self.max_per_call = max_per_call
        self.max_total = max_total
        self._redis = rc.client(url)
        # the remote streams' blocked XREADs hold a connection each: their own
        # pool, so they never make the writer or a take wait for a connection
        self._blocking = rc.client(url, max_connections=max_total + 1)
        self._waiting: collections.deque[_Append] = collections.deque()
        self._wake = trio.Event()
        self._in_flight = 0      # the entries of the batch being written (they count in WRITER_QUEUE)
        self.dropped = 0
        self._readers: dict[str, int] = {}

    # --- running -------------------------------------------------------------

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # The clients' pools run their connections in tasks of their own: the
        # stop's cancellation would reach them too and leave the stop's last
        # flush without a connection. So the pools live in a shielded scope,
        # and a watcher outside it turns the stop into the writer's end.
        stopping = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_set_when_cancelled, stopping)
            with trio.CancelScope(shield=True):
                async with self._redis, self._blocking:
                    task_status.started()
                    try:
                        async with trio.open_nursery() as writer:
                            writer.start_soon(self._write_forever)
                            await stopping.wait()
                            writer.cancel_scope.cancel()
                    finally:
                        with trio.move_on_after(FLUSH_AT_STOP_S):
                            await self._flush_at_stop()
                        if self._waiting:
                            _log.warning("shared_feed.unwritten_at_stop", events=len(self._waiting))

    async def _flush_at_stop(self) -> None:
        """Write what is left, retrying within the stop's bound (Redis away,
        or a connection the cancelled batch left broken). What is left after
        is logged, never raised: a stop does not fail for it."""
        while True:
            try:
                await self._flush()
                return
            except RegistryDown:
                await trio.sleep(RETRY_MIN_S)

    async def _request(self, request: Any, timeout_s: float = OP_TIMEOUT_S) -> Any:
        return await rc.bounded(request, timeout_s)

    # --- the holder's side -------------------------------------------------------

    def append(self, call_id: str, event: dict[str, Any], queued: tuple[str, dict[str, Any]] | None) -> None:
        """Queue one feed event (with its ``id``) of a call held here, and the
        nav hint / observer action it carries (``("nav" | "observer", item)``)."""
        queue_key, item = "", ""
        if queued is not None:
            kind, payload = queued
            queue_key = rc.nav_hints_key(call_id) if kind == "nav" else rc.OBSERVER_ACTIONS_KEY
            item = _ENCODE(payload)
        self._waiting.append(_Append(call_id, str(event["id"]), _ENCODE(event), queue_key, item,
                                     event.get("type") == "call.ended"))
        if len(self._waiting) + self._in_flight > WRITER_QUEUE:
            lost = self._waiting.popleft()
            self.dropped += 1
            _log.warning("shared_feed.dropped", call_id=lost.call_id, event_id=lost.event_id)
        self._wake.set()

    async def _write_forever(self) -> None:
        delay = RETRY_MIN_S
        failing = False
        last_pass = float("-inf")
        while True:
            await self._wake.wait()
            # the first event after a quiet spell goes at once; under load the
            # passes are spaced, so each carries more calls' events: a request
            # costs 0.25-0.7 ms of our CPU however few it carries (the client's
            # connection tasks wake for each), a few us per event more,
            # so at most 20 passes a second
            # bound the writer's requests to 1-2 % of a core
            if len(self._waiting) < BATCH_ENTRIES:      # a backlog goes as fast as Redis takes it
                await trio.sleep_until(last_pass + PASS_INTERVAL_S)
            self._wake = trio.Event()
            last_pass = trio.current_time()
            try:
                await self._write_batch()
            except RegistryDown as exc:
                if not failing:     # once per outage, not once per retry
                    _log.warning("shared_feed.write_failed", error=str(exc)[:80], waiting=len(self._waiting))
                failing = True
                await trio.sleep(delay)
                delay = min(RETRY_MAX_S, delay * 2)
                self._wake.set()
                continue
            if failing:
                _log.info("shared_feed.write_resumed", dropped=self.dropped)
            failing, delay = False, RETRY_MIN_S
            if self._waiting:           # published while the batch was written, or past its bound
                self._wake.set()

    async def _flush(self) -> None:
        """Write everything waiting, batch after batch (a stopping server)."""
        while self._waiting:
            await self._write_batch()

    async def _write_batch(self) -> None:
        """Write the oldest waiting events, every call's, in one script (one
        round trip however many calls published). A stale entry is dropped
        alone (logged), the others written. A batch whose request failed or
        was cancelled goes back to the head in order, and so do the entries
        from one Redis refused for another reason (a retry of one Redis
        applied is refused per entry as stale: its id is there already, so
        it never lands twice)."""
        if not self._waiting:
            return
        batch = self._next_batch()
        keys, args = self._batch_request(batch)
        self._in_flight = len(batch)
        try:
            statuses = await self._request(self._redis.eval(rc.FEED_APPEND_MANY, keys=keys, args=args))
        except BaseException:
            self._waiting.extendleft(reversed(batch))
            raise
        finally:
            self._in_flight = 0
        self._settle(batch, list(statuses))

    def _next_batch(self) -> list[_Append]:
        """The oldest waiting entries, at most ``BATCH_ENTRIES`` and (past the
        first) ``BATCH_BYTES`` of JSON."""
        batch = [self._waiting.popleft()]
        size = len(batch[0].event) + len(batch[0].item)
        while self._waiting and len(batch) < BATCH_ENTRIES:
            entry = self._waiting[0]
            size += len(entry.event) + len(entry.item)
            if size > BATCH_BYTES:
                break
            batch.append(self._waiting.popleft())
        return batch

    def _batch_request(self, batch: list[_Append]) -> tuple[list[str], list[str]]:
        keys: list[str] = []
        args = [str(self.max_len), str(self.max_items), str(self.retention_ms)]
        for entry in batch:
            stream = rc.feed_key(entry.call_id)
            keys += [stream, entry.queue_key or stream]
            args += [entry.event_id, entry.event, str(self._ttl_ms(entry)), entry.item]
        return keys, args

    def _settle(self, batch: list[_Append], statuses: list[Any]) -> None:
        """Log the stale entries; an entry Redis refused otherwise goes back to
        the head with every entry after it (not tried), and fails the pass."""
        for n, (entry, status) in enumerate(zip(batch, statuses)):
            if status == 0:
                # the stream holds this id or a later one: written already, or
                # another holder took the call over
                _log.warning("shared_feed.stale_append", call_id=entry.call_id, event_id=entry.event_id)
            elif status != 1:
                self._waiting.extendleft(reversed(batch[n:]))
                raise RegistryDown(str(status)[:80])
        if len(statuses) < len(batch):       # never from our script: treat the rest as not tried
            self._waiting.extendleft(reversed(batch[len(statuses):]))
            raise RegistryDown("short answer")

    def _ttl_ms(self, entry: _Append) -> int:
        return self.retention_ms if entry.ended else self.live_ttl_ms

    # --- any process's side: the stream ------------------------------------------

    async def call_known(self, call_id: str, after: str | None) -> bool:
        """The call is live on some process, or (a resume) its stream still
        holds events after ``after``."""
        if int(await self._request(self._redis.exists([rc.lease_key(call_id)]))):
            return True
        if after is None:
            return False
        newer = await self._request(self._redis.xrange(rc.feed_key(call_id), "(" + after, "+", count=1))
        return bool(newer)

    async def last_id(self, call_id: str) -> str:
        """The id of the stream's last entry ("0-0" when it has none)."""
        entries = await self._request(self._redis.xrevrange(rc.feed_key(call_id), "+", "-", count=1))
        return str(entries[0].identifier) if entries else "0-0"

    async def read(self, call_id: str, after: str, block_s: float) -> list[dict[str, Any]]:
        """The events after ``after``, oldest first, waiting up to ``block_s``
        for one; ``[]`` when none came."""
        key = rc.feed_key(call_id)
        answer = await self._request(self._blocking.xread({key: after}, count=READ_BATCH,
                                                       block=max(1, round(block_s * 1000))),
                                     timeout_s=block_s + OP_TIMEOUT_S)
        events = []
        for entry in (answer or {}).get(key, ()):
            event = _json_object(entry.field_values.get("e"))
            if event is not None:
                event["id"] = str(entry.identifier)
                events.append(event)
        return events

    async def call_gone(self, call_id: str) -> bool:
        """Neither a live lease nor a holder that never released it (a
        takeover would continue its feed): nothing will append any more."""
        live = int(await self._request(self._redis.exists([rc.lease_key(call_id)])))
        if live:
            return False
        return not await self._request(self._redis.hexists(rc.CALLS_KEY, call_id))

    def check_reader(self, call_id: str) -> None:
        """``StreamRefusal`` when one more remote stream of ``call_id`` would
        pass a cap (the route asks before it answers 200)."""
        if self._readers.get(call_id, 0) >= self.max_per_call:
            raise StreamRefusal(SubscribeRefusal.TOO_MANY_FOR_CALL)
        if sum(self._readers.values()) >= self.max_total:
            raise StreamRefusal(SubscribeRefusal.TOO_MANY)

    def open_reader(self, call_id: str) -> None:
        """Count one remote stream, from its first step to ``close_reader``
        (a response whose body never started holds no slot)."""
        self._readers[call_id] = self._readers.get(call_id, 0) + 1

    def close_reader(self, call_id: str) -> None:
        left = self._readers.get(call_id, 0) - 1
        if left > 0:
            self._readers[call_id] = left
        else:
            self._readers.pop(call_id, None)

    # --- any process's side: the polling queues and the count ----------------------

    async def _take(self, key: str) -> list[dict[str, Any]]:
        raw = await self._request(self._redis.eval(rc.QUEUE_TAKE, keys=[key], args=[str(self.retention_ms)]))
        return [item for item in map(_json_object, raw or ()) if item is not None]

    async def take_nav_hints(self, call_id: str) -> list[dict[str, Any]]:
        return await self._take(rc.nav_hints_key(call_id))

    async def take_observer_actions(self) -> list[dict[str, Any]]:
        return await self._take(rc.OBSERVER_ACTIONS_KEY)

    async def live_calls(self) -> int:
        """Calls holding a live lease now, on every process."""
        return int(await self._request(self._redis.eval(rc.LIVE_CALLS, keys=[rc.CALLS_KEY],
                                                        args=[rc.lease_key("")])))


async def _set_when_cancelled(event: trio.Event) -> None:
    try:
        await trio.sleep_forever()
    finally:
        event.set()


def _json_object(text: Any) -> dict[str, Any] | None:
    """``text`` as a JSON object; None for anything else (never written by
    us: skipped rather than failing a reader)."""
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None

