"""The daily budget across the cluster (``--redis``): one total per day for
every process on one Redis, so ``daily_budget_usd`` caps the cluster.

Each process keeps its own day's total as before (``DailyUsage``, its
``usage/daily.json``). One task here sends that total to Redis every
``SYNC_EVERY_S`` and reads the others' in the same step
(``redis_client.USAGE_SYNC``): the key ``usage:<day>`` is a hash of
``source -> micro-dollars``, one field per process. ``DailyUsage.state()``
(the 503 for new sessions, ``/status``) then answers this process's own
spend plus the others' as Redis last gave them. A call never waits for
Redis: its costs go to ``DailyUsage.add`` as without Redis.

Why a field per process holding its absolute total, not ``INCRBY`` of the
new costs: setting a total is idempotent, so a sync whose answer was lost
and is sent again never counts a cost twice; and after a Redis restart
that lost the key every live process puts its whole day back with its next
sync, not just what it spent since. Why integer micro-dollars: a total is
rounded once (not each cost), compared and summed exactly in Redis's Lua
(whose numbers are doubles, exact for integers up to 2^53: nine billion
dollars).

The source is ``<state_dir>/usage/source_id``, made at the first start with
``--redis`` and kept, so a restarted process (whose file carries its total
over) writes its old field again instead of adding a second one. Redis
only raises a field, so a restart whose file missed the last second's
costs does not lower what Redis had.

The combination: the cluster's total is this process's field (the larger
of its own total and what Redis holds for it) plus the other fields' sum,
and the others' sum never goes down within a day as this process sees it
(a cost once spent stays spent). After a Redis restart without its data
each process keeps the others' sum it had seen while the live processes
refill the key; a process started after the restart knows only what the
live ones put back (a dead process's day returns with it). Redis down: the
same, the others' sum as Redis last answered today (none: this process's
own total alone), logged once per change; nothing stops for it.
"""

from __future__ import annotations

import secrets
import socket
from pathlib import Path
from typing import Any
import trio

from voiceactors import storage
from voiceactors.usage.daily import DailyUsage
from voiceactors.cluster import redis_client as rc
from voiceactors.cluster.redis_client import RegistryDown
from voiceactors.logs import get_logger

__all__ = ["DailyTotal", "load_source_id", "source_path"]

SYNC_EVERY_S = 1.0
OP_TIMEOUT_S = 2.0
FINAL_SYNC_S = 2.0           # a stopping server still sends its last costs
MICROS = 1_000_000

_log = get_logger(actor="daily_total")


def source_path(state_dir: Path) -> Path:
    return Path(state_dir) / "usage" / "source_id"


def load_source_id(state_dir: Path) -> str:
    """This state folder's source name, made (atomically) when absent or
    unusable (blocking: run it in a thread)."""
    path = source_path(state_dir)
    try:
        found = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        found = ""
    if found and len(found) <= 200 and found.isprintable():
        return found
    made = f"{socket.gethostname()}/{secrets.token_hex(8)}"
    try:
        storage.atomic_write(path, made + "\n")
    except OSError as error:    # it still names this run; a restart would add a second field
        _log.warning("daily_total.source_unsaved", file=str(path), error=type(error).__name__)
    return made


class DailyTotal:
    """The sync task and the cluster's figure that ``usage.state()`` reads
    (set as ``usage.cluster``). The URL is never logged."""

    def __init__(self, url: str, usage: DailyUsage, *, every_s: float = SYNC_EVERY_S,
                 source: str | None = None) -> None:
        self.usage = usage
        self.every_s = every_s
        self.source = source or ""      # read or made at start when not given
        self._url = url
        self._redis = rc.client(url)
        self._day = ""
        self._mine_micros = 0           # this source's field as Redis last had it, for ``_day``
        self._others_micros = 0         # the other fields' sum, the most seen for ``_day``
        self._reach = rc.Reachability()
        self.syncs = 0
        usage.cluster = self

    def total_usd(self, day: str, own_usd: float) -> float:
        if day != self._day:
            return own_usd              # nothing from Redis for this day yet
        return max(own_usd, self._mine_micros / MICROS) + self._others_micros / MICROS

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if not self.source:
            self.source = await storage.run_sync(load_source_id, self.usage.state_dir, cancellable=False)
        try:
            async with self._redis:
                task_status.started()
                while True:
                    await self.sync()
                    await trio.sleep(self.every_s)
        finally:
            # a client of its own: the cancellation that stops this task has
            # also stopped the pool's connections
            with trio.move_on_after(FINAL_SYNC_S, shield=True):
                async with rc.client(self._url) as last:
                    await self.sync(last)

    async def sync(self, redis: Any = None) -> None:
        """Send this process's total, take the others' (one round trip).
        Nothing before ``DailyUsage.load`` has run: the own total is not the
        day's yet."""
        if not self.usage.loaded:
            return
        day, own_usd = self.usage.own()
        request = rc.eval_script(redis or self._redis, rc.USAGE_SYNC, [rc.usage_key(day)],
                                 [self.source, round(own_usd * MICROS), rc.USAGE_TTL_S])
        try:
            mine, others = await rc.bounded(request, OP_TIMEOUT_S)
        except RegistryDown as exc:
            if self._reach.failed():
                _log.warning("daily_total.unreachable", error=str(exc) or exc.error_name,
                             own_cost_usd=round(own_usd, 6), others_cost_usd=self._others_usd(day))
            return
        if self._reach.answered():
            _log.info("daily_total.reachable")
        self._take(day, int(mine), int(others))

    @property
    def reachable(self) -> bool | None:
        """Whether Redis answered the last sync (None: none sent yet)."""
        return self._reach.reachable

    def _take(self, day: str, mine: int, others: int) -> None:
        if day != self._day:
            self._day, self._mine_micros, self._others_micros = day, 0, 0
        self._mine_micros = max(self._mine_micros, mine)
        self._others_micros = max(self._others_micros, others)
        self.syncs += 1

    def _others_usd(self, day: str) -> float:
        return self._others_micros / MICROS if day == self._day else 0.0
