"""``voiceactors fuzz`` (voiceactors/fuzz/, docs/testing.md § Fuzzing a
capture): schedules drawn from a seed, the corpus of captures fuzzed for a
bounded number of runs, a bug planted in a copy of the protocol found,
shrunk and replayed from its seed, and a server killed mid-write then
restarted on its files."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from voiceactors.call import recovery
from voiceactors.call.protocol import CallProtocol
from voiceactors.call.record_kind import RecordKind
from voiceactors.call.state import ToolCallState
from voiceactors import replay
from voiceactors.fuzz import invariants
from voiceactors.fuzz.command import fuzz
from voiceactors.fuzz.runs import load_script, run_schedule
from voiceactors.fuzz.schedule import Change, Perturbation, Schedule

REPLAYS = Path(__file__).parent / "replays"
CORPUS = sorted(REPLAYS.glob("*.jsonl"))
#: Runs per capture in the suite (a longer run: docs/testing.md).
SUITE_RUNS = 3


def test_a_seed_draws_the_same_schedule_every_time_and_another_seed_another():
    script = load_script(REPLAYS / "parallel_batch.jsonl")
    drawn = [Schedule.draw(script, seed) for seed in range(20)]
    assert drawn == [Schedule.draw(script, seed) for seed in range(20)]
    assert len({s.changes for s in drawn}) > 10
    assert all(1 <= len(s.changes) <= 4 for s in drawn)


def test_a_barge_in_cuts_the_response_under_way_and_drops_its_later_events():
    script = load_script(REPLAYS / "parallel_batch.jsonl")
    created = next(i for i, step in enumerate(script.steps) if (step.event or {}).get("type") == "response.created")
    rid = script.steps[created].event["response"]["id"]
    changed = Schedule(0, (Perturbation(Change.BARGE_IN, created + 2),)).apply(script)
    types = [(step.event or {}).get("type") for step in changed.steps]
    cut = types.index("input_audio_buffer.speech_started", created)
    done = changed.steps[cut + 1].event
    assert done["type"] == "response.done" and done["response"]["id"] == rid
    assert done["response"]["status"] == "cancelled"
    later = [step.event for step in changed.steps[cut + 2:] if step.kind == "send"]
    assert not [e for e in later if e.get("response_id") == rid or (e.get("response") or {}).get("id") == rid]
    assert changed.steps[-1].kind == "close"


def test_a_drop_and_a_late_transcript_keep_the_close_last():
    script = load_script(REPLAYS / "barge_in.jsonl")
    transcripts = [i for i, s in enumerate(script.steps)
                   if (s.event or {}).get("type") == "conversation.item.input_audio_transcription.completed"]
    changes = (Perturbation(Change.DROP, transcripts[0]), Perturbation(Change.LATE_TRANSCRIPT, transcripts[-1], 50))
    changed = Schedule(0, changes).apply(script)
    kinds = [step.kind for step in changed.steps]
    assert kinds.count("drop") == kinds.count("drop") and "drop" in kinds and kinds[-1] == "close"
    assert len([s for s in changed.steps if s.kind == "send"]) == len([s for s in script.steps if s.kind == "send"])


@pytest.mark.parametrize("capture", CORPUS, ids=lambda path: path.stem)
def test_every_capture_of_the_corpus_keeps_the_invariants_under_fuzzing(capture):
    out = io.StringIO()
    assert fuzz(capture, runs=SUITE_RUNS, seed=20261206, jobs=1, journal=None, today=None, out=out) == 0, \
        out.getvalue()


class ResendsAnsweredOutputs(CallProtocol):
    """A copy of the protocol with a bug planted: on every connection an
    output the service already confirmed is made ready again, so a reconnect
    sends it a second time."""

    def _on_connected(self) -> None:
        for call in self.calls.values():
            if call.state == ToolCallState.CONFIRMED and call.output is not None:
                call.state = ToolCallState.READY
        super()._on_connected()


def test_the_fuzzer_finds_a_planted_bug_shrinks_it_and_replays_it_from_its_seed(monkeypatch):
    monkeypatch.setattr("voiceactors.call.actor.CallProtocol", ResendsAnsweredOutputs)
    capture = REPLAYS / "parallel_batch.jsonl"
    out = io.StringIO()
    assert fuzz(capture, runs=40, seed=1, jobs=1, journal=None, today=None, out=out) == 1
    report = out.getvalue()
    assert "duplicate_tool_call_output" in report, report
    assert "the sideband drops before step" in report, report
    replay_line = next(line for line in report.splitlines() if "replay it:" in line)
    args = replay_line.split("voiceactors fuzz ", 1)[1].split()
    seed, keep = int(args[args.index("--seed") + 1]), args[args.index("--keep") + 1]
    # the minimal schedule's drop alone breaks the call; the run of that seed with it fails again
    again = io.StringIO()
    assert fuzz(capture, runs=1, seed=seed, jobs=1, journal=None, today=None,
                keep=tuple(int(i) for i in keep.split(",")), out=again) == 1
    assert "duplicate_tool_call_output" in again.getvalue()
    # the replay's command names the same changes of the seed's schedule, not indices into the kept ones
    assert f"--seed {seed} --runs 1 --keep {keep}" in again.getvalue(), again.getvalue()
    monkeypatch.undo()
    fixed = io.StringIO()
    assert fuzz(capture, runs=1, seed=seed, jobs=1, journal=None, today=None,
                keep=tuple(int(i) for i in keep.split(",")), out=fixed) == 0, fixed.getvalue()


def test_the_command_gives_the_same_runs_for_the_same_seed_in_parallel_processes(tmp_path):
    def runs() -> list[str]:
        done = subprocess.run([sys.executable, "-m", "voiceactors.cli", "fuzz", str(REPLAYS / "drop.jsonl"),
                               "--runs", "2", "--seed", "7", "--jobs", "2"],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return sorted(line for line in done.stdout.splitlines() if line.startswith("  seed "))

    first = runs()
    assert first == runs() and len(first) == 2


def test_a_capture_that_cannot_be_read_is_exit_2(tmp_path):
    missing = subprocess.run([sys.executable, "-m", "voiceactors.cli", "fuzz", str(tmp_path / "none.jsonl")],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "voiceactors fuzz:" in missing.stderr


def test_a_thread_an_earlier_run_left_behind_does_not_stop_the_clock():
    """A worker thread abandoned by an earlier trio run in the same process
    holds its token of ``storage``'s limiters for as long as it works; a
    fuzz run counting it as its own never jumped its clock (it hung)."""
    import trio

    from voiceactors import storage

    left_behind = object()

    async def leave_a_thread_behind() -> None:
        storage.limiter().acquire_on_behalf_of_nowait(left_behind)

    trio.run(leave_a_thread_behind)
    try:
        out = io.StringIO()
        assert fuzz(REPLAYS / "drop.jsonl", runs=1, seed=3, jobs=1, journal=None, today=None, out=out) == 0, \
            out.getvalue()
    finally:
        trio.run(_release, left_behind)


async def _release(borrower: object) -> None:
    from voiceactors import storage

    storage.limiter().release_on_behalf_of(borrower)


# --- a kill mid-write --------------------------------------------------------------------------------

WRITE = REPLAYS / "write.jsonl"
DAY = "2026-03-27"


def test_a_kill_is_drawn_only_while_a_write_is_under_way():
    """The kill's places: after the model asks for ``commitments.complete``
    until our ``response.create`` that follows its turn up; a capture
    without a write has none."""
    script = load_script(WRITE)
    [asked] = [i for i, s in enumerate(script.steps) if (s.event or {}).get("name") == "commitments.complete"
               and s.event["type"] == "response.function_call_arguments.done"]
    [create] = [i for i, s in enumerate(script.steps) if s.kind == "await_create"]
    kills = {c.at for seed in range(200) for c in Schedule.draw(script, seed).changes if c.change is Change.KILL}
    assert kills and min(kills) == asked + 1 and max(kills) == create
    reads_only = load_script(REPLAYS / "parallel_batch.jsonl")
    assert not any(c.change is Change.KILL for seed in range(200) for c in Schedule.draw(reads_only, seed).changes)
    changed = Schedule(0, (Perturbation(Change.KILL, create),)).apply(script)
    kinds = [step.kind for step in changed.steps]
    assert kinds[kinds.index("kill") + 1] == "connect" and kinds[-1] == "close"


@pytest.fixture
def sample_journal(tmp_path: Path) -> Path:
    import datetime as dt

    from voiceactors.journal.sample import write_sample_journal

    return write_sample_journal(tmp_path / "journal", days=3, today=dt.date(2026, 3, 27), seed=0)


@pytest.mark.parametrize("before", ["await_output", "await_create"])
def test_a_server_killed_mid_write_is_followed_by_one_that_answers_each_call_once(before, sample_journal):
    """Killed before the write's output is taken (the write applied, not
    yet answered) or before our ``response.create`` (both answered): the
    next server, on the dead one's files, rejoins and keeps every invariant."""
    script = load_script(WRITE)
    at = next(i for i, s in enumerate(script.steps) if s.kind == before)
    assert run_schedule(script, Schedule(0, (Perturbation(Change.KILL, at),)), sample_journal, DAY) == ()


class EverythingPending:
    """A copy of crash recovery's rule with a bug planted: every tool call
    the dead server started counts as pending, answered or not, so the next
    server answers a settled call again."""

    @staticmethod
    def pending_calls(block):
        settled_lines = [line for line in block if line.get("kind") != RecordKind.TOOL_CALL]
        return REAL_PENDING_CALLS(settled_lines)


REAL_PENDING_CALLS = recovery.pending_calls


def test_the_fuzzer_finds_a_recovery_that_answers_a_settled_call_again(monkeypatch):
    monkeypatch.setattr(recovery, "pending_calls", EverythingPending.pending_calls)
    out = io.StringIO()
    # seed 4's schedule holds a kill after the calls settled (any seed would do; this one finds it at once)
    assert fuzz(WRITE, runs=10, seed=4, jobs=1, journal=None, today=None, out=out) == 1
    report = out.getvalue()
    assert "duplicate_tool_call_output" in report, report
    minimal = report.split("the fewest of its changes", 1)[1]
    assert "our server is killed before step" in minimal, report


def test_a_call_answered_without_running_survives_a_kill_before_its_output_is_confirmed():
    """Found by this fuzzer (seed 17 of write.jsonl): a tool call answered
    without being run (cancelled: its response spanned a reconnect and the
    user's turn) had no record line until the service confirmed its output,
    so a kill in between left it unanswered after the restart. It now has
    its ``tool_started`` line before its output goes."""
    out = io.StringIO()
    assert fuzz(WRITE, runs=1, seed=17, jobs=1, journal=None, today=None, keep=(2, 3), out=out) == 0, \
        out.getvalue()


# --- slow tools ------------------------------------------------------------------------------------

SLOW = REPLAYS / "slow_tools.jsonl"


def test_a_slow_tools_capture_replays_its_tool_source_paced_on_the_runs_clock():
    """``slow_tools.jsonl`` keeps its conditions in its expectation (the
    simulator's MCP tool source, the acknowledgement on); every run of it
    has them: the slow call is acknowledged, its progress spoken, its
    answer delivered, each a response.create the replay waits for."""
    conditions = replay.load_conditions(SLOW)
    assert conditions.tool_source == "crm" and [t.name for t in conditions.slow_tools] == ["history"]
    assert dict(conditions.settings)["tool_ack_after_s"] > 0
    script = load_script(SLOW)
    assert [s.kind for s in script.steps].count("await_create") == 3      # acknowledgement, progress, delivery


def test_the_delivery_of_an_acknowledged_call_after_the_users_turn_is_no_stale_follow_up():
    """Found on the slow-tools capture (seed 23): a barge-in while the
    acknowledgement spoke, then the slow answer's delivery, which goes
    after the user's turn by design (docs/calls.md § Slow tools), was taken
    for a follow-up of a turn the user had left."""
    out = io.StringIO()
    assert fuzz(SLOW, runs=1, seed=23, jobs=1, journal=None, today=None, keep=(2,), out=out) == 0, out.getvalue()


def _followed_up(*extra: dict) -> list[str]:
    """The stale-follow-up invariant on a record: response r1 of turn 0,
    then a response.create of turn 1 that follows it up."""
    record = [{"kind": RecordKind.RESPONSE, "response_id": "r1", "epoch": 0},
              {"kind": RecordKind.RESPONSE_CREATE, "result": "sent", "event_id": "evt_2", "for": ["r1"], "epoch": 1},
              *extra]
    return invariants._no_stale_follow_up(replay.Played({}, None, record))   # type: ignore[arg-type]


def test_only_the_delivery_the_record_names_escapes_the_stale_follow_up_check():
    assert _followed_up() == ["response.create evt_2 followed up response r1 of an older turn"]
    assert _followed_up({"kind": RecordKind.SLOW_DELIVERY, "response_id": "r1", "event_id": "evt_2"}) == []
    # another create's delivery, or another batch's, does not excuse this one
    assert _followed_up({"kind": RecordKind.SLOW_DELIVERY, "response_id": "r1", "event_id": "evt_9"})
    assert _followed_up({"kind": RecordKind.SLOW_DELIVERY, "response_id": "r0", "event_id": "evt_2"})
