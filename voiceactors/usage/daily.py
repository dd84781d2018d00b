"""DailyUsage: what the server's calls cost today, and the daily budget.

Owned by the CallSupervisor, like its ``FeedHub``: each CallActor adds its
responses' costs with ``add`` (synchronous, on the trio thread, so no lock);
routes learn the state by asking the supervisor (``GetDailyUsage``). The day
is the clock seam's (``clock.today()``): a new day starts from zero.

The total survives a restart: ``<state_dir>/usage/daily.json``
(``{"day": "YYYY-MM-DD", "cost_usd": ...}``) is loaded at start-up and
rewritten atomically (``storage.atomic_write``) by the supervisor's writer
task, at most once per ``WRITE_EVERY_S`` while costs come in, and once more
when the supervisor stops. A file of another day, or one that does not
parse, counts as zero (the latter is logged).

With ``--redis`` the runtime sets ``cluster`` (``usage/cluster_total.py``):
``state()`` then reports the cluster's total for the day, this process's own
spend plus what the others had spent at Redis's last answer, so the budget
caps the cluster, not each process. ``add`` stays synchronous: the
cluster's figure is synced by its own task, never on a call's path.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

import trio

from voiceactors import clock, storage
from voiceactors.logs import get_logger

WRITE_EVERY_S = 1.0
#: The final write's bound when the supervisor stops.
FINAL_WRITE_S = 2.0

_log = get_logger(actor="supervisor")


def daily_path(state_dir: Path) -> Path:
    return Path(state_dir) / "usage" / "daily.json"


@dataclass(frozen=True)
class DailyState:
    """The day's cost (US dollars) against its budget (0: none)."""

    day: str
    cost_usd: float
    budget_usd: float

    @property
    def spent(self) -> bool:
        return self.budget_usd > 0 and self.cost_usd >= self.budget_usd


class ClusterTotal(Protocol):
    def total_usd(self, day: str, own_usd: float) -> float:
        """The cluster's spend on ``day``, given this process's own."""
        ...


class DailyUsage:
    def __init__(self, state_dir: Path, budget_usd: float, *, today: Callable[[], dt.date] = clock.today) -> None:
        self.state_dir = Path(state_dir)
        self.path = daily_path(state_dir)
        self.budget_usd = budget_usd
        self._today = today
        self.day = today().isoformat()
        self.cost_usd = 0.0
        self._dirty = trio.Event()
        self.writes = 0
        self.loaded = False             # the file was read: the own total is the day's (the cluster sync waits for it)
        self.cluster: ClusterTotal | None = None

    def load(self) -> None:
        """Read today's total from the file (blocking: run it in a thread)."""
        try:
            self._load()
        finally:
            self.loaded = True

    def _load(self) -> None:
        try:
            data: Any = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as error:
            _log.warning("supervisor.daily_usage_unreadable", file=str(self.path), error=type(error).__name__)
            return
        cost = data.get("cost_usd") if isinstance(data, dict) else None
        if not isinstance(data, dict) or not isinstance(cost, (int, float)) or isinstance(cost, bool) \
                or not math.isfinite(cost) or cost < 0:
            _log.warning("supervisor.daily_usage_unreadable", file=str(self.path), error="not a daily total")
            return
        if data.get("day") == self._today().isoformat():
            self.day, self.cost_usd = data["day"], float(cost)

    def _roll(self) -> None:
        day = self._today().isoformat()
        if day != self.day:
            self.day, self.cost_usd = day, 0.0

    def add(self, cost_usd: float) -> None:
        """A response's cost (never blocks)."""
        self._roll()
        self.cost_usd += max(0.0, cost_usd)
        self._dirty.set()

    def own(self) -> tuple[str, float]:
        """This process's own spend today: (day, US dollars)."""
        self._roll()
        return self.day, self.cost_usd

    def state(self) -> DailyState:
        self._roll()
        cost = self.cost_usd if self.cluster is None else self.cluster.total_usd(self.day, self.cost_usd)
        return DailyState(self.day, round(cost, 6), self.budget_usd)

    def _render(self) -> str:
        return json.dumps({"day": self.day, "cost_usd": round(self.cost_usd, 9)}) + "\n"

    async def _write(self) -> None:
        self._dirty = trio.Event()
        data = self._render()
        try:
            await storage.run_sync(storage.atomic_write, self.path, data, cancellable=False)
            self.writes += 1
        except OSError as error:
            self._dirty.set()     # try again with the next write
            _log.error("supervisor.daily_usage_write_failed", file=str(self.path), error=type(error).__name__)

    async def run_writer(self) -> None:
        """Write the total when it changed, at most once per ``WRITE_EVERY_S``."""
        while True:
            await self._dirty.wait()
            with trio.CancelScope(shield=True):   # a write under way is finished
                await self._write()
            await trio.sleep(WRITE_EVERY_S)

    async def final_write(self) -> None:
        """The last write when the supervisor stops (bounded, shielded)."""
        if not self._dirty.is_set():
            return
        with trio.move_on_after(FINAL_WRITE_S, shield=True):
            await self._write()
