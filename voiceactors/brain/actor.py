"""BrainActor: owns the voice's instruction and keeps it fresh.

State: the instruction, when it was made (``trio.current_time()``), the day
it was made for (``clock.today()`` when its run began), the backend session id (persisted in ``<journal>/health/voice-brain-session`` and
resumed on start) and whether a backend run is in progress.

Messages (``voiceactors.messages``):

* ``GetBrain(reply, start=False)`` — the ``BrainState`` at once. With
  ``start=True`` it first queues a run when there is no instruction, or when
  the instruction is older than ``settings.brain_max_age_s`` (a non-blocking
  staleness refresh: the reply carries the old instruction).
* ``AwaitReady(reply)`` — starts a run if there is no instruction and replies
  once one exists.

An instruction made for a day that is no longer ``clock.today()`` (midnight
passed) says "today" about yesterday: it is never handed out. ``state()``
reports it as no instruction, so ``GetBrain(start=True)`` queues a run and
``POST /session`` waits for it (``AwaitReady``) instead of minting with
yesterday's day. (The check happens when the state is asked for, not on a
timer: a periodic timer would be a deadline for ``autojump_clock`` to jump
to whenever a test waits on a worker thread.) It never times out by itself: the caller bounds the wait
  (``ask(..., timeout=...)``); a failed run leaves it waiting for the next.
* ``RefreshBrain(reply)`` — forces a run and replies with its new
  ``BrainState``, or with the exception instance when it failed.
* ``SummariseCall(reply, call_id, transcript)`` — the backend's summary of
  an ended call, for the call that continues it, or None (``call_summary.py``:
  once per call id, bounded by ``settings.continue_summary_timeout_s``; it
  runs beside instruction runs, not in their single flight).

Single flight: at most one backend run at a time, and every request that
arrives while one is in progress joins it and gets its result. A run gathers
the context snapshot (worker thread) and calls the backend, which is bounded
by ``settings.brain_timeout_s``; on timeout the backend is cancelled (the
Claude CLI process is killed). A failure leaves the previous
instruction in place and is logged.

Across processes (``--redis``, ``flight``: ``cluster/brain_flight.py``): a run
first asks the cluster, so one process at a time runs its backend and the
others adopt its result (``brain.adopted``, no backend run); every
``FOLLOW_S`` the actor also adopts a newer version made elsewhere, so every
process's calls get the same instruction. Redis not answering: the run is
this process's own, as without Redis.

Cancellation: cancelling ``run`` cancels a run in progress (the session file
write is shielded) and closes every pending reply channel, so waiting
callers see ``EndOfChannel`` rather than hang.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

import trio

from voiceactors import clock, voice_config, metrics, safe_text
from voiceactors.messages import AwaitReady, BrainMessage, BrainState, GetBrain, RefreshBrain, SummariseCall
from voiceactors.brain import BrainError, BrainTimeout, make_backend
from voiceactors.brain.call_summary import CallSummaries
from voiceactors.brain.snapshot import gather
from voiceactors.brain.session_file import load_session_id, save_session_id
from voiceactors.cluster.brain_flight import BrainFlight, Obtained, Shared, snapshot_digest
from voiceactors.cluster.redis_client import RegistryDown
from voiceactors.logs import get_logger
from voiceactors.settings import Settings
from voiceactors.storage import run_sync

INBOX_SIZE = 64
# After a failed run, automatic staleness refreshes wait this long before the
# next try (the old instruction still serves); explicit refreshes never wait.
STALE_RETRY_AFTER_S = 60.0
# With a cluster brain: how often the actor looks for a newer version made elsewhere.
FOLLOW_S = 1.0


def _reply(channel: trio.MemorySendChannel[Any], value: Any) -> None:
    """Answer once and close; a caller that gave up is not an error."""
    try:
        channel.send_nowait(value)
    except (trio.BrokenResourceError, trio.ClosedResourceError, trio.WouldBlock):
        pass
    channel.close()


def _gone(channel: trio.MemorySendChannel[Any]) -> bool:
    return channel.statistics().open_receive_channels == 0


class BrainActor:
    def __init__(self, settings: Settings, backend: Any = None, flight: BrainFlight | None = None) -> None:
        self.settings = settings
        self.backend = backend            # None: chosen by voice_config.brain_backend when run starts
        self._flight = flight             # the cluster brain (--redis), else None
        self.version: int | None = None   # the cluster's version of the instruction held
        self.inbox, self._receive = trio.open_memory_channel[BrainMessage](INBOX_SIZE)
        self.instruction: str | None = None
        self.refreshed_at: float | None = None
        self.day: _dt.date | None = None  # the clock.today() the instruction was made for
        self.session_id: str | None = None
        self.runs = 0                     # backend runs started (for status and tests)
        self._running = False
        self._failed_at: float | None = None
        self._run_day: _dt.date | None = None
        self._obtained: Obtained | None = None     # the last run's answer from the cluster
        self._ready_waiters: list[trio.MemorySendChannel[Any]] = []
        self._refresh_waiters: list[trio.MemorySendChannel[Any]] = []
        self._summaries = CallSummaries(settings.continue_summary_timeout_s)
        self._nursery: trio.Nursery | None = None
        self._log = get_logger(actor="brain")

    # --- state ------------------------------------------------------------------
    def state(self) -> BrainState:
        age = None if self.refreshed_at is None else max(0.0, trio.current_time() - self.refreshed_at)
        return BrainState(self._current(), self.refreshed_at, age, self._running, self.session_id)

    def _current(self) -> str | None:
        """The instruction, unless it was made for another day than today."""
        if self.instruction is None or self._day_changed():
            return None
        return self.instruction

    def _day_changed(self) -> bool:
        if self.day is None:
            return False
        try:
            return self.day != clock.today()
        except ValueError:  # an invalid VOICEACTORS_TODAY: nothing to compare with
            return False

    def _stale(self) -> bool:
        if self.refreshed_at is None:
            return True
        now = trio.current_time()
        if now - self.refreshed_at <= self.settings.brain_max_age_s:
            return False
        return self._failed_at is None or now - self._failed_at >= STALE_RETRY_AFTER_S

    # --- the actor loop ---------------------------------------------------------
    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve the inbox until cancelled."""
        if self.backend is None:
            self.backend = make_backend(self.settings, await run_sync(voice_config.brain_backend, self.settings))
        self.session_id = await run_sync(load_session_id, self.settings.journal)
        metrics.set_brain_refreshed_at(None)
        self._log.info("brain.started", backend=self._backend_name(), resumed=self.session_id is not None)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if self._flight is not None:
                    await nursery.start(self._flight.run)
                    nursery.start_soon(self._follow_cluster, self._flight)
                task_status.started()
                async with self._receive:
                    async for message in self._receive:
                        self._handle(message)
                nursery.cancel_scope.cancel()   # inbox closed: nobody can ask any more
        finally:
            self._nursery = None
            self._close_pending()

    def _close_pending(self) -> None:
        """Close every reply channel still owed an answer, including those of
        messages never read, and the inbox: callers then see EndOfChannel or
        BrokenResourceError instead of waiting for a dead actor."""
        pending = self._ready_waiters + self._refresh_waiters
        self._ready_waiters, self._refresh_waiters = [], []
        while True:
            try:
                message = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            reply = getattr(message, "reply", None)
            if reply is not None:
                pending.append(reply)
        self._receive.close()
        self._summaries.close()
        for channel in pending:
            channel.close()

    def _handle(self, message: BrainMessage) -> None:
        if isinstance(message, GetBrain):
            if message.start and self.instruction is not None and self._day_changed():
                self._ensure_run("new_day")
            elif message.start and (self.instruction is None or self._stale()):
                self._ensure_run("start" if self.instruction is None else "stale")
            _reply(message.reply, self.state())
        elif isinstance(message, AwaitReady):
            if self._current():
                _reply(message.reply, self.state())
                return
            self._ready_waiters = [c for c in self._ready_waiters if not _gone(c)]
            self._ready_waiters.append(message.reply)
            self._ensure_run("start")
        elif isinstance(message, RefreshBrain):
            self._refresh_waiters.append(message.reply)
            self._ensure_run("refresh")
        elif isinstance(message, SummariseCall):
            if self._nursery is None:
                _reply(message.reply, None)
            else:
                self._summaries.ask(message, self.backend, self._nursery)
        else:
            self._log.warning("brain.unknown_message", kind=type(message).__name__)

    def _ensure_run(self, reason: str) -> None:
        """Start a backend run unless one is in progress (then callers join it)."""
        if self._running or self._nursery is None:
            return
        self._running = True
        self.runs += 1
        self._nursery.start_soon(self._run, reason)

    def _backend_name(self) -> str:
        return str(getattr(self.backend, "name", type(self.backend).__name__))

    # --- one backend run --------------------------------------------------------
    async def _generate(self, reason: str = "start") -> tuple[str, str | None]:
        timeout = self.settings.brain_timeout_s
        # The snapshot is local file reads (abandoned on cancel); the deadline
        # bounds the backend, the part that waits on a model or a process.
        day = clock.today()
        snapshot = await run_sync(gather, self.settings.journal, day)

        async def backend_run() -> tuple[str, str | None]:
            try:
                with trio.fail_after(timeout):
                    instruction, session_id = await self.backend.generate(snapshot, self.session_id)
            except trio.TooSlowError:
                raise BrainTimeout(f"brain backend timed out after {timeout:g}s") from None
            if not isinstance(instruction, str) or not instruction.strip():
                raise BrainError("brain backend returned an empty instruction")
            # every backend's answer comes in here: it goes to the service, Redis, the records
            return safe_text.clean_str(instruction.strip()), session_id

        if self._flight is None:
            result = await backend_run()
        else:
            self._obtained = await self._flight.obtain(
                snapshot_digest(snapshot), day, refresh=reason == "refresh",
                max_age_s=self.settings.brain_max_age_s, generate=backend_run)
            result = self._obtained.instruction, self._obtained.session_id
        self._run_day = day
        return result

    async def _follow_cluster(self, flight: BrainFlight) -> None:
        """Adopt a newer version another process made (between runs)."""
        while True:
            await trio.sleep(FOLLOW_S)
            try:
                shared = await flight.current()
            except RegistryDown:
                continue
            if (shared is not None and not self._running and (self.version is None or shared.version > self.version)
                    and shared.day == clock.today()):
                self._adopt(shared, "cluster")

    def _adopt(self, shared: Shared, reason: str) -> None:
        self.instruction, self.day, self.version = shared.instruction, shared.day, shared.version
        self.refreshed_at = trio.current_time() - shared.age_s
        self._failed_at = None
        self._log.info("brain.adopted", reason=reason, version=shared.version, age_s=round(shared.age_s, 3),
                       chars=len(shared.instruction))
        metrics.set_brain_refreshed_at(self.refreshed_at)     # no backend run here: not counted as one

    async def _run(self, reason: str) -> None:
        started = trio.current_time()
        try:
            try:
                self._obtained = None
                instruction, session_id = await self._generate(reason)
            except Exception as exc:  # any backend failure keeps the old instruction
                self._failed(exc, reason, started)
                return
            await self._succeeded(instruction, session_id, reason, started)
        finally:
            self._running = False

    def _failed(self, exc: Exception, reason: str, started: float) -> None:
        self._running = False
        self._failed_at = trio.current_time()
        outcome = "timeout" if isinstance(exc, BrainTimeout) else "failed"
        self._log.warning("brain.refresh_failed", outcome=outcome, backend=self._backend_name(), reason=reason,
                          duration_ms=round((self._failed_at - started) * 1000, 1),
                          error=f"{type(exc).__name__}: {str(exc)[:200]}")
        metrics.brain_refreshed(outcome, self.refreshed_at)
        waiters, self._refresh_waiters = self._refresh_waiters, []
        for channel in waiters:
            _reply(channel, exc)

    async def _succeeded(self, instruction: str, session_id: str | None, reason: str, started: float) -> None:
        obtained = self._obtained
        if obtained is not None and not obtained.ran:    # another process's run: no backend run here
            assert self._run_day is not None
            self._adopt(Shared(instruction, obtained.version or 0, "", self._run_day, obtained.age_s), reason)
        else:
            self.instruction = instruction
            self.day = self._run_day
            self.refreshed_at = trio.current_time()
            self._failed_at = None
            if obtained is not None:
                self.version = obtained.version
            if session_id and session_id != self.session_id:
                self.session_id = session_id
                await self._persist(session_id)
            self._log.info("brain.refreshed", outcome="ok", backend=self._backend_name(), reason=reason,
                           duration_ms=round((trio.current_time() - started) * 1000, 1), chars=len(instruction),
                           **({"version": self.version} if obtained is not None else {}))
            metrics.brain_refreshed("ok", self.refreshed_at)
        self._running = False
        state = self.state()
        waiters = self._ready_waiters + self._refresh_waiters
        self._ready_waiters, self._refresh_waiters = [], []
        for channel in waiters:
            _reply(channel, state)

    async def _persist(self, session_id: str) -> None:
        # Shielded: a shutdown in the middle must not lose the session we
        # just paid for (atomic_write keeps the file whole either way).
        with trio.CancelScope(shield=True):
            try:
                await run_sync(save_session_id, self.settings.journal, session_id, cancellable=False)
            except (OSError, ValueError) as exc:
                self._log.warning("brain.session_not_saved", error=type(exc).__name__)
