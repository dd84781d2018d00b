"""BrainActor: readiness, single flight, staleness, failure, timeout, persistence.

The journal is real files written here. The backends are small in-process
implementations of the backend interface (``generate(snapshot, session_id)``)
where a test needs to count, gate or fail runs; the real backends are tested
in test_brain_backends.py.

The snapshot is read in a worker thread, and autojump_clock jumps to the next
deadline whenever trio waits on a thread; so a test that sleeps while a run is
in progress first waits for the backend to be entered (``backend.entered(n)``),
after which all waiting is on trio's clock and every time is exact.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
import trio

from clock_support import serving
from voiceactors import logs
from voiceactors.brain.actor import BrainActor
from voiceactors.messages import AwaitReady, BrainState, GetBrain, RefreshBrain, ask
from voiceactors.brain import BrainError, BrainTimeout
from voiceactors.brain.snapshot import ContextSnapshot
from voiceactors.brain.local import LocalBackend
from voiceactors.brain.session_file import load_session_id, save_session_id, session_path
from voiceactors.settings import Settings

# ask requires its deadline; these tests bound the wait themselves (autojump_clock
# or a cancel scope), and a finite ask deadline would race autojump during thread waits
UNBOUNDED = math.inf

SIX_HOURS = 6 * 3600.0


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    root = tmp_path / "journal"
    (root / "config").mkdir(parents=True)
    (root / "identity").mkdir()
    (root / "config" / "journal.json").write_text(json.dumps({
        "identity": {"name": "Ada Lovelace", "preferred": "Ada"},
        "agent": {"name": "nova"},
    }))
    (root / "identity" / "self.md").write_text("# self\n\nI am nova, Ada's journal companion.\n")
    return root


@pytest.fixture
def settings(journal: Path, tmp_path: Path) -> Settings:
    return Settings(journal=journal, state_dir=tmp_path / "state")


class CountingBackend:
    """Takes ``seconds`` of trio time per run and numbers its instructions."""

    name = "counting"

    def __init__(self, seconds: float = 5.0, session: str | None = None) -> None:
        self.seconds = seconds
        self.session = session
        self.calls: list[str | None] = []     # the session id each run was given
        self.fail_with: Exception | None = None
        self._entered: dict[int, trio.Event] = {}

    def _event(self, n: int) -> trio.Event:
        return self._entered.setdefault(n, trio.Event())

    async def entered(self, n: int) -> None:
        """Wait until run number ``n`` (1-based) has called the backend."""
        await self._event(n).wait()

    async def generate(self, snapshot: ContextSnapshot, session_id: str | None) -> tuple[str, str | None]:
        self.calls.append(session_id)
        self._event(len(self.calls)).set()
        await trio.sleep(self.seconds)
        if self.fail_with is not None:
            raise self.fail_with
        return f"{snapshot.agent_name} instruction {len(self.calls)}", self.session or session_id


class HangingBackend:
    name = "hanging"

    async def generate(self, snapshot: ContextSnapshot, session_id: str | None) -> tuple[str, str | None]:
        await trio.sleep_forever()
        raise AssertionError("unreachable")


async def _start(nursery: trio.Nursery, settings: Settings, backend: Any = None) -> BrainActor:
    actor = BrainActor(settings, backend)
    await nursery.start(actor.run)
    return actor


async def test_not_ready_until_started_then_ready(settings, autojump_clock):
    async with trio.open_nursery() as nursery:
        actor = await _start(nursery, settings, LocalBackend())
        state = await ask(actor.inbox, GetBrain, timeout=UNBOUNDED)
        assert state == BrainState(None, None, None, False, None) and not state.ready
        assert actor.runs == 0          # GetBrain without start starts nothing
        state = await ask(actor.inbox, AwaitReady, timeout=UNBOUNDED)
        assert state.ready and state.age_s == 0
        assert state.instruction.startswith("You are nova, the voice of Ada's journal")
        assert (await ask(actor.inbox, AwaitReady, timeout=UNBOUNDED)) == state   # ready: answered at once, no new run
        assert actor.runs == 1
        nursery.cancel_scope.cancel()


async def test_get_brain_start_queues_a_start_without_waiting(settings, autojump_clock):
    backend = CountingBackend(seconds=5)
    async with trio.open_nursery() as nursery:
        actor = await _start(nursery, settings, backend)
        t0 = trio.current_time()
        state = await ask(actor.inbox, lambda r: GetBrain(r, start=True), timeout=UNBOUNDED)
        assert trio.current_time() == t0           # answered at once
        assert state.instruction is None and state.refreshing
        state = await ask(actor.inbox, AwaitReady, timeout=UNBOUNDED)
        assert state.instruction == "nova instruction 1" and trio.current_time() - t0 == 5
        assert len(backend.calls) == 1
        nursery.cancel_scope.cancel()


async def test_single_flight_concurrent_requests_share_one_run(settings, autojump_clock):
    backend = CountingBackend(seconds=5)
    replies: list[Any] = []
    async with trio.open_nursery() as nursery:
        actor = await _start(nursery, settings, backend)

        async def one(make):
            replies.append(await ask(actor.inbox, make, timeout=UNBOUNDED))

        async with trio.open_nursery() as callers:
            for _ in range(20):
                callers.start_soon(one, RefreshBrain)
            for _ in range(5):
                callers.start_soon(one, AwaitReady)
                callers.start_soon(one, lambda r: GetBrain(r, start=True))
        assert len(backend.calls) == 1 and actor.runs == 1
        finished = [r for r in replies if r.instruction is not None]
        assert len(finished) == 25 and {r.instruction for r in finished} == {"nova instruction 1"}
        assert all(not r.refreshing for r in finished)
        nursery.cancel_scope.cancel()


async def test_refresh_arriving_during_a_run_joins_it(settings, autojump_clock):
    backend = CountingBackend(seconds=5)
    async with trio.open_nursery() as nursery:
        actor = await _start(nursery, settings, backend)
        results: list[Any] = []

        async def refresh():
            results.append((await ask(actor.inbox, RefreshBrain, timeout=UNBOUNDED), trio.current_time()))

        async with trio.open_nursery() as callers:
            callers.start_soon(refresh)
            await backend.entered(1)
            t0 = trio.current_time()
            await trio.sleep(3)
            assert (await ask(actor.inbox, GetBrain, timeout=UNBOUNDED)).refreshing
            await refresh()                             # arrives mid-run
        assert len(backend.calls) == 1
        assert [r.instruction for r, _ in results] == ["nova instruction 1"] * 2
        assert [t - t0 for _, t in results] == [5, 5]
        state = await ask(actor.inbox, RefreshBrain, timeout=UNBOUNDED)    # after the run: a new one
        assert state.instruction == "nova instruction 2" and len(backend.calls) == 2
        nursery.cancel_scope.cancel()


async def test_stale_instruction_refreshes_in_background(settings, autojump_clock):
    backend = CountingBackend(seconds=5)
    async with trio.open_nursery() as nursery:
        actor = await _start(nursery, settings, backend)
        await ask(actor.inbox, AwaitReady, timeout=UNBOUNDED)
        await trio.sleep(SIX_HOURS - 10)
        state = await ask(actor.inbox, lambda r: GetBrain(r, start=True), timeout=UNBOUNDED)
        assert not state.refreshing and len(backend.calls) == 1      # not stale yet: no run
        await trio.sleep(20)
        t0 = trio.current_time()
        state = await ask(actor.inbox, lambda r: GetBrain(r, start=True), timeout=UNBOUNDED)
        assert trio.current_time() == t0                              # old instruction at once
        assert state.instruction == "nova instruction 1" and state.age_s > SIX_HOURS and state.refreshing
        await backend.entered(2)
        await trio.sleep(5)
        state = await ask(actor.inbox, GetBrain, timeout=UNBOUNDED)
        assert state.instruction == "nova instruction 2" and state.age_s == 0 and not state.refreshing
        assert len(backend.calls) == 2
        nursery.cancel_scope.cancel()


async def test_failure_keeps_the_previous_instruction_and_is_logged(settings, autojump_clock):
    backend = CountingBackend(seconds=1)
    stream = io.StringIO()
    logs.configure("json", "info", stream=stream)
    try:
        async with trio.open_nursery() as nursery:
            actor = await _start(nursery, settings, backend)
            first = await ask(actor.inbox, AwaitReady, timeout=UNBOUNDED)
            backend.fail_with = BrainError("model said no to sk-secretsecret123")
            result = await ask(actor.inbox, RefreshBrain, timeout=UNBOUNDED)
            assert result is backend.fail_with
            state = await ask(actor.inbox, GetBrain, timeout=UNBOUNDED)
            assert state.instruction == first.instruction and state.refreshed_at == first.refreshed_at
            assert not state.refreshing
            nursery.cancel_scope.cancel()
    finally:
        logs.configure()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    failed = [line for line in lines if line.get("event") == "brain.refresh_failed"]
    assert len(failed) == 1
    assert failed[0]["actor"] == "brain" and failed[0]["outcome"] == "failed"
    assert failed[0]["backend"] == "counting" and failed[0]["duration_ms"] == 1000.0
    assert "sk-secretsecret123" not in stream.getvalue()


async def test_stale_refresh_failure_does_not_retry_at_once(settings, autojump_clock):
    backend = CountingBackend(seconds=1)
    async with trio.open_nursery() as nursery:
        actor = await _start(nursery, settings, backend)
        await ask(actor.inbox, AwaitReady, timeout=UNBOUNDED)
        backend.fail_with = BrainError("down")
        await trio.sleep(SIX_HOURS + 1)
        await ask(actor.inbox, lambda r: GetBrain(r, start=True), timeout=UNBOUNDED)
        await backend.entered(2)
        await trio.sleep(2)                                           # that refresh failed
        assert len(backend.calls) == 2
        state = await ask(actor.inbox, lambda r: GetBrain(r, start=True), timeout=UNBOUNDED)
        assert not state.refreshing and state.instruction == "nova instruction 1"
        await trio.sleep(60)
        assert (await ask(actor.inbox, lambda r: GetBrain(r, start=True), timeout=UNBOUNDED)).refreshing
        nursery.cancel_scope.cancel()


async def test_failed_start_leaves_await_ready_waiting_for_the_next_run(settings, autojump_clock):
    backend = CountingBackend(seconds=1)
    backend.fail_with = BrainError("not yet")
    async with trio.open_nursery() as nursery:
        actor = await _start(nursery, settings, backend)
        with pytest.raises(trio.TooSlowError):
            await ask(actor.inbox, AwaitReady, timeout=10)            # the caller's own deadline
        assert isinstance(await ask(actor.inbox, RefreshBrain, timeout=UNBOUNDED), BrainError)
        backend.fail_with = None
        state = await ask(actor.inbox, AwaitReady, timeout=UNBOUNDED)
        assert state.ready
        nursery.cancel_scope.cancel()


async def test_hanging_backend_times_out(settings, autojump_clock):
    settings = settings.replace(brain_timeout_s=30.0)
    async with trio.open_nursery() as nursery:
        actor = await _start(nursery, settings, HangingBackend())
        t0 = trio.current_time()
        result = await ask(actor.inbox, RefreshBrain, timeout=UNBOUNDED)
        assert isinstance(result, BrainTimeout) and trio.current_time() - t0 == 30
        state = await ask(actor.inbox, GetBrain, timeout=UNBOUNDED)
        assert state.instruction is None and not state.refreshing
        nursery.cancel_scope.cancel()


async def test_session_id_is_persisted_and_resumed(settings, journal, autojump_clock):
    backend = CountingBackend(seconds=1, session="sess-abc")
    async with trio.open_nursery() as nursery:
        actor = await _start(nursery, settings, backend)
        state = await ask(actor.inbox, AwaitReady, timeout=UNBOUNDED)
        assert state.session_id == "sess-abc" and backend.calls == [None]
        nursery.cancel_scope.cancel()
    assert session_path(journal).read_text() == "sess-abc\n"
    assert load_session_id(journal) == "sess-abc"

    again = CountingBackend(seconds=1)              # restart on the same journal
    async with trio.open_nursery() as nursery:
        actor = await _start(nursery, settings, again)
        assert (await ask(actor.inbox, GetBrain, timeout=UNBOUNDED)).session_id == "sess-abc"
        await ask(actor.inbox, RefreshBrain, timeout=UNBOUNDED)
        assert again.calls == ["sess-abc"]
        nursery.cancel_scope.cancel()


def test_session_file_rejects_odd_ids(journal):
    with pytest.raises(ValueError):
        save_session_id(journal, "--dangerous flag")
    session_path(journal).parent.mkdir(parents=True, exist_ok=True)
    session_path(journal).write_text("not a token at all\n")
    assert load_session_id(journal) is None
    assert load_session_id(journal / "missing") is None


async def test_backend_chosen_by_config_at_start(settings, journal, autojump_clock):
    async with trio.open_nursery() as nursery:
        actor = await _start(nursery, settings)
        assert actor.backend.name == "local"
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("pause", [0, 1])
async def test_cancelled_actor_closes_pending_replies(settings, autojump_clock, pause):
    async with trio.open_nursery() as outer:
        inner = trio.CancelScope()
        actor = BrainActor(settings, HangingBackend())

        async def host(task_status=trio.TASK_STATUS_IGNORED):
            with inner:
                await actor.run(task_status=task_status)

        await outer.start(host)
        send, receive = trio.open_memory_channel[Any](1)
        await actor.inbox.send(RefreshBrain(send))
        await trio.sleep(pause)          # 0: message still unread; 1: the run is in progress
        inner.cancel()
        with pytest.raises(trio.EndOfChannel):
            await receive.receive()
    with pytest.raises(trio.BrokenResourceError):
        await ask(actor.inbox, GetBrain, timeout=UNBOUNDED)


# --- midnight (issue 11, item 11): an instruction made for another day is stale


class DayBackend:
    """Says which day its snapshot was for, as the real prompt does."""

    name = "day"

    def __init__(self) -> None:
        self.days: list[str] = []

    async def generate(self, snapshot: ContextSnapshot, session_id: str | None) -> tuple[str, str | None]:
        self.days.append(snapshot.day.isoformat())
        await trio.sleep(1)
        return f"Today is {snapshot.day.isoformat()}.", session_id


async def _session_instruction(actor: BrainActor) -> BrainState:
    """What ``POST /session`` does: GetBrain(start=True), then AwaitReady when not ready."""
    state = await ask(actor.inbox, lambda r: GetBrain(r, start=True), timeout=UNBOUNDED)
    if not state.ready:
        state = await ask(actor.inbox, AwaitReady, timeout=UNBOUNDED)
    return state


async def test_after_midnight_a_session_never_gets_yesterdays_instruction(settings, pin_today, autojump_clock):
    backend = DayBackend()
    pin_today("2026-03-27")
    async with trio.open_nursery() as nursery:
        actor = await _start(nursery, settings, backend)
        assert (await _session_instruction(actor)).instruction == "Today is 2026-03-27."
        await trio.sleep(30)                     # minutes before midnight: still fresh
        assert (await _session_instruction(actor)).instruction == "Today is 2026-03-27."
        pin_today("2026-03-28")                  # midnight passes, far under brain_max_age_s
        state = await ask(actor.inbox, GetBrain, timeout=UNBOUNDED)
        assert not state.ready                   # yesterday's instruction is not offered
        assert (await _session_instruction(actor)).instruction == "Today is 2026-03-28."
        assert backend.days == ["2026-03-27", "2026-03-28"]
        nursery.cancel_scope.cancel()


async def test_status_after_midnight_is_not_ready_until_the_new_days_run(settings, pin_today, autojump_clock):
    backend = DayBackend()
    pin_today("2026-03-27")
    async with trio.open_nursery() as nursery:
        actor = await _start(nursery, settings, backend)
        await ask(actor.inbox, AwaitReady, timeout=UNBOUNDED)
        pin_today("2026-03-28")
        assert not (await ask(actor.inbox, GetBrain, timeout=UNBOUNDED)).ready     # /status: brain_ready false
        assert backend.days == ["2026-03-27"]                   # a plain GetBrain starts nothing
        state = await ask(actor.inbox, lambda r: GetBrain(r, start=True), timeout=UNBOUNDED)
        assert not state.ready and state.refreshing             # the new day's run is queued
        state = await ask(actor.inbox, AwaitReady, timeout=UNBOUNDED)
        assert state.instruction == "Today is 2026-03-28." and backend.days == ["2026-03-27", "2026-03-28"]
        nursery.cancel_scope.cancel()


async def test_session_minted_after_midnight_says_the_new_day(tmp_path, pin_today):
    """Through the real route and the simulator's mint endpoint: the session
    minted after midnight carries today's "Today is ...", not yesterday's."""
    from voiceactors.brain.snapshot import spoken_day
    from voiceactors.http import create_app
    from voiceactors.journal.sample import write_sample_journal
    from voiceactors.simulator import Simulator
    import datetime as dt

    key = "sk-test-brain-midnight-0123"
    journal = write_sample_journal(tmp_path / "journal", days=3, today=dt.date(2026, 3, 27))
    sim = Simulator(None, api_key=key)
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.serve, 0)
        settings = Settings(journal=journal, state_dir=tmp_path / "state", openai_api_key_env=key,
                            openai_base_url=sim.base_url)
        app = create_app(settings)
        pin_today("2026-03-27")
        async with serving(app) as test_app:
            client = test_app.test_client()
            assert (await client.post("/api/voice/session")).status_code == 200
            first = sim.client_secret_requests[-1]["body"]["session"]["instructions"]
            pin_today("2026-03-28")                  # midnight; the instruction is minutes old
            assert (await client.post("/api/voice/session")).status_code == 200
            second = sim.client_secret_requests[-1]["body"]["session"]["instructions"]
        nursery.cancel_scope.cancel()
    assert f"Today is {spoken_day(dt.date(2026, 3, 27))}." in first
    assert f"Today is {spoken_day(dt.date(2026, 3, 28))}." in second
