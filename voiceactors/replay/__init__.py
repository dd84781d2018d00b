"""``voiceactors replay``: a captured call, played against the current server.

``voiceactors replay FILE`` reads a capture (``call/event_capture.py``,
setting ``record_events``), starts the Realtime simulator playing it
(``simulator/capture_player.py``: our events drive the replay) and this version's
runtime (executor, supervisor, call actor) on a journal, connects the call
with the journal's agents as a browser's connect does, lets the call run
to its end, and compares what we sent — normalised — with the capture's
*expectation* ``FILE`` with ``.expected.json`` for ``.jsonl``. It prints
every difference (each output by tool call id and tool, with a diff of its
content; the ``response.create``s and what answered them; protocol errors
our events caused; other client events; stalls) and exits 0 only when there
is none; 1 when something differs; 2 for a capture or expectation it cannot
read (or none yet: ``--update`` writes it).

``--update`` writes the expectation from this run (review it: it is what
the suite will hold the server to), with the capture's ``conditions`` (a
slow MCP tool source and the settings that make it heard:
``replay/conditions.py``). ``--capture SCENARIO`` first makes FILE: it runs
a simulator scenario against the server with ``record_events`` on and
copies the call's capture there (then ``--update`` applies as given).

The journal: ``--journal DIR``, else a sample journal (``journal sample``:
14 days, seed 0) for the day ``--today`` (default: the expectation's
``today``, else today), so a replay is reproducible. Each run (the capture
of ``--capture``, the replay) works on its own copy of it: the capture's
write tools change the copy, never DIR.

Everything a replay writes (its state dir, its copies of the journal) is in
one private temporary folder, ``voiceactors-replay-<pid>-*``, removed at its
end, at once on SIGINT or SIGTERM too; a replay killed outright (SIGKILL)
leaves its folder to the next replay, which removes every such folder of a
process that is gone (``sweep_stale_folders``).

A capture is read bounded (``event_capture.read_capture``): a file that is
not a regular one (a FIFO, a device) or is larger than a capture can be is
refused with one line and exit 2.

This module is plumbing like ``demo.py`` (it may import the simulator; the
server never imports it).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import trio
import trio.testing

from voiceactors import clock, logs, storage
from voiceactors.call.call_context import LinkedContext
from voiceactors.call.event_capture import capture_path, read_capture
from voiceactors.http.routes import call_agents
from voiceactors.call.record import PASS_GAP_S, read_record, record_path, shared_writer
from voiceactors.messages import Connect, CountCalls, ask
from voiceactors.brain import make_backend
from voiceactors.journal.days import RECORDING_SUFFIXES
from voiceactors.runtime import open_runtime
from voiceactors.settings import Settings
from voiceactors.simulator import Simulator
from voiceactors.simulator.scenario import Scenario, as_scenario
from voiceactors.simulator.capture_player import ReplayDriver, ReplayScript
from voiceactors.replay.conditions import Conditions, start_tool_source, settings_of

__all__ = ["EXPECTATION_VERSION", "Conditions", "Played", "capture_scenario", "cli_replay", "compare",
           "expectation_path", "journal_for_runs", "load_conditions", "play_script", "replay_capture",
           "replay_folder", "sweep_stale_folders"]

EXPECTATION_VERSION = 1
REPLAY_KEY = "sk-replay-voiceactors-simulator"
#: The instruction a replayed call's agents add their parts to (no brain runs in a replay).
REPLAY_INSTRUCTION = "You are the voice of this journal."
CALL_DEADLINE_S = 300.0
#: How long (real seconds) every other task must have waited before a
#: ``kill`` step kills: less than a fuzz run's clock waits before it jumps
#: (``fuzz.clock.IDLE_S``), so the kill comes first.
KILL_QUIET_S = 0.001
#: The normalised fields compared, in the order differences are reported.
COMPARED = ("outputs", "unechoed_outputs", "response_creates", "protocol_errors", "other_client_events",
            "stalls", "truncated")
DIFF_LINES = 40
#: An expectation is a small JSON file; a reader takes at most this much of one.
MAX_EXPECTATION_BYTES = 64 * 1024 * 1024
#: ``<tmp>/voiceactors-replay-<pid>-<random>``: one replay's folder, named by
#: the process that made it (``replay_folder``, ``sweep_stale_folders``).
FOLDER_PREFIX = "voiceactors-replay-"
_FOLDER_RE = re.compile(re.escape(FOLDER_PREFIX) + r"(\d+)-[A-Za-z0-9_]+")


def load_conditions(capture: Path) -> Conditions:
    """The conditions the expectation of ``capture`` keeps (none: the defaults)."""
    expected = expectation_path(capture)
    if not expected.exists():
        return Conditions()
    return Conditions.from_obj(load_expectation(expected).get("conditions"), str(expected))


def expectation_path(capture: Path) -> Path:
    name = capture.name[:-len(".jsonl")] if capture.name.endswith(".jsonl") else capture.name
    return capture.with_name(name + ".expected.json")


def _settings(journal: Path, state_dir: Path, base_url: str, conditions: Conditions, source_url: str,
              **changes: Any) -> Settings:
    # The defaults, not the environment: a replay is the same wherever it
    # runs. No acknowledgement of a slow tool call unless the capture's
    # conditions ask for one (their slow tools' pace is the run's clock):
    # otherwise whether one is due depends on how fast this machine runs the
    # tool (a search's first index build), not on the call.
    return Settings(journal=journal, state_dir=state_dir, openai_base_url=base_url,
                    openai_api_key_env=REPLAY_KEY, **{**settings_of(conditions, source_url), **changes})


async def _serve_one_call(settings: Settings, sim: Simulator, call_id: str, *, connect: bool = True,
                         mcp_env: dict[str, str] | None = None) -> None:
    """Start the runtime, connect ``call_id`` (``connect``; else the runtime
    rejoins it at start-up, as after a crash), wait until the simulator has
    ended it and the actor has written its record. ``mcp_env``: the MCP
    sources' tokens (a capture's tool source)."""
    sim_call = sim.calls[call_id]
    # the sideband never asks the brain; the local one keeps a journal's claude
    # or openai backend from running (or writing its session file) for a replay
    async with open_runtime(settings, brain_backend=make_backend(settings, "local"), mcp_env=mcp_env or {}) as rt:
        if connect:
            # the call's tools as the browser's connect would find them: the MCP source's listed
            await rt.actors["mcp"].wait_discovered()
            # the journal's agents, as a browser's connect gives every call (docs/agents.md)
            context = LinkedContext(REPLAY_INSTRUCTION, None, agents=call_agents(settings))
            await ask(rt.calls, lambda reply: Connect(call_id, reply, context), timeout=10)
        with trio.move_on_after(CALL_DEADLINE_S):
            await sim_call.wait_until(lambda c: c.closed and c.connection is None)
        with trio.move_on_after(settings.close_deadline_s + 5):
            while await ask(rt.calls, CountCalls, timeout=5):
                await trio.sleep(0.05)


async def _serve_through_kills(settings: Settings, sim: Simulator, call_id: str, driver: ReplayDriver,
                               folder: Path, mcp_env: dict[str, str]) -> int:
    """Serve the call until it ends, through the script's ``kill`` steps (a
    fuzz run's): there the serving runtime dies as a SIGKILLed process does.
    The kill comes once every task waits, no worker thread of this replay
    works (``KILL_QUIET_S``: before a fuzz run's clock would jump) and the
    call record has no line waiting for its writer, so a run kills at the
    same point each time. (A kill while lines wait loses them: the record's
    documented window, ``call/record.py``; the fuzzer checks recovery from
    what the writer wrote.) What the state folder and journal hold then is
    kept, the runtime is abandoned (what it does after dies with its
    files), and a fresh runtime starts on the kept files, rejoining the call
    as crash recovery does. Returns how many kills there were."""
    baseline = storage.threads_at_work()
    kills = 0
    while True:
        kept: list[Path] = []
        with trio.CancelScope() as life:
            async def kill() -> None:
                await _quiet(baseline)
                kept.append(_keep_files(settings, folder / f"killed-{kills + 1}"))
                life.cancel()
            driver.on_kill = kill
            await _serve_one_call(settings, sim, call_id, connect=kills == 0, mcp_env=mcp_env)
        if not kept:
            return kills
        kills += 1
        _restore_files(settings, kept[0])


async def _quiet(baseline: int) -> None:
    """Until every other task waits, no worker thread beyond ``baseline``
    works and no record line waits for the writer (its pass is due on the
    clock: sleeping lets the clock move there)."""
    writer = shared_writer()
    while True:
        await trio.testing.wait_all_tasks_blocked(KILL_QUIET_S)
        if storage.threads_at_work() > baseline:
            continue
        if not writer.lines_waiting():
            return
        await trio.sleep(PASS_GAP_S)


def _keep_files(settings: Settings, to: Path) -> Path:
    """A copy of what a killed server leaves on disk: its state folder and
    its journal as they are now (blocking: no task or thread of the run
    moves meanwhile)."""
    for source, name in ((settings.state_dir, "state"), (settings.journal, "journal")):
        if source.exists():
            shutil.copytree(source, to / name, symlinks=True)
    return to


def _restore_files(settings: Settings, kept: Path) -> None:
    """The kept files back in their places, for the next server to start on."""
    for target, name in ((settings.state_dir, "state"), (settings.journal, "journal")):
        shutil.rmtree(target, ignore_errors=True)
        if (kept / name).exists():
            os.replace(kept / name, target)


# --- the folders --------------------------------------------------------------

def _process_gone(pid: int) -> bool:
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:       # alive, another user's
        return False
    return False


def sweep_stale_folders(root: Path | None = None) -> list[str]:
    """Remove the replay folders (``voiceactors-replay-<pid>-*`` in ``root``,
    the temporary folder by default) of processes that are gone: a replay
    killed outright (SIGKILL) could not remove its own. Only folders of
    ours (our uid, not a link) are touched. Returns the names removed."""
    root = Path(root) if root is not None else Path(tempfile.gettempdir())
    removed: list[str] = []
    try:
        with os.scandir(root) as entries:
            candidates = [(entry.name, entry.path) for entry in entries if _FOLDER_RE.fullmatch(entry.name)]
    except OSError:
        return removed
    for name, path in candidates:
        match = _FOLDER_RE.fullmatch(name)
        assert match is not None
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or not _process_gone(int(match[1])):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(name)
    return removed


@contextlib.contextmanager
def replay_folder() -> Iterator[Path]:
    """A private temporary folder (0700) for one replay, named with this
    process's id; removed when the block ends. Stale folders of replays that
    were killed are swept first."""
    sweep_stale_folders()
    folder = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _copy_journal_file(source: str, target: str) -> str:
    """One file of a journal's copy: its bytes, but a recording's (audio,
    screen video: gigabytes in a real journal) only its name, an empty file,
    since no surface reads more of one than its name."""
    if Path(source).suffix.lower() in RECORDING_SUFFIXES:
        Path(target).touch()
        return target
    return str(shutil.copy2(source, target))


def _journal_copy(journal: Path, folder: Path) -> Path:
    """A copy of ``journal`` in ``folder`` for one run's tools: what a
    capture's write tools do (a ``ledger_close``, a lock file) lands in the
    copy; the journal given is only read. Links are copied as what they
    point to, so no write through the copy reaches the original; recordings
    as empty files of their names (``_copy_journal_file``)."""
    copy = folder / "journal"
    try:
        shutil.copytree(journal, copy, symlinks=False, ignore_dangling_symlinks=True,
                        copy_function=_copy_journal_file)
    except shutil.Error as error:
        failed = error.args[0] if error.args and isinstance(error.args[0], list) else []
        raise ValueError(f"{journal}: the journal could not be copied for the replay "
                         f"({len(failed)} file(s) unreadable)") from None
    return copy


# --- the runs -------------------------------------------------------------------

@dataclass(frozen=True)
class Played:
    """A script played against the runtime: what we sent, normalised
    (``ReplayDriver.result``), the driver that played it and the call's
    record lines."""

    result: dict[str, Any]
    driver: ReplayDriver
    record: list[dict[str, Any]]
    kills: int = 0          # the servers killed on the way (a fuzz run's ``kill``)


async def replay_capture(capture: Path, journal: Path, *, speed: float = 1.0, max_gap_s: float = 2.0,
                         timeout_s: float = 10.0, block: int = -1,
                         blocks: list[list[dict[str, Any]]] | None = None,
                         conditions: Conditions = Conditions()) -> dict[str, Any]:
    """Replay one block of ``capture`` (the last: the latest actor run)
    against this version's runtime on a copy of ``journal``, in the
    capture's ``conditions``; returns what we sent, normalised
    (``ReplayDriver.result``). ``blocks``: the capture already read. Raises
    ValueError for a file that is not a capture."""
    blocks = read_capture(capture) if blocks is None else blocks
    script = ReplayScript.from_block(blocks[block])
    played = await play_script(script, journal, speed=speed, max_gap_s=max_gap_s, timeout_s=timeout_s,
                               conditions=conditions)
    return played.result


async def play_script(script: ReplayScript, journal: Path, *, speed: float = 1.0, max_gap_s: float = 2.0,
                      timeout_s: float = 10.0, conditions: Conditions = Conditions(), **changes: Any) -> Played:
    """Play ``script`` (a capture block's steps, perhaps changed: ``voiceactors
    fuzz``) against this version's runtime on a copy of ``journal``, in the
    capture's ``conditions``; ``changes``: settings other than those."""
    driver = ReplayDriver(script, speed=speed, max_gap_s=max_gap_s, timeout_s=timeout_s)
    sim = Simulator(None, api_key=None, validate_sent=False)   # recorded events go out as recorded
    with replay_folder() as folder:
        copy = await storage.run_sync(_journal_copy, journal, folder, cancellable=False)   # never under an rmtree
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            source_url, mcp_env = await start_tool_source(nursery, conditions, sim)
            sim.add_call(script.call_id).replay = driver
            settings = _settings(copy, folder / "state", sim.base_url, conditions, source_url, **changes)
            kills = await _serve_through_kills(settings, sim, script.call_id, driver, folder, mcp_env)
            nursery.cancel_scope.cancel()
        path = record_path(folder / "state", script.call_id)
        record = read_record(path) if path.exists() else []
    result = driver.result()
    if not driver.finished.is_set():
        result["stalls"].append(f"the replay did not finish within {CALL_DEADLINE_S:g} s")
    return Played(result, driver, record, kills)


def _capture_call_id(scenario_name: str) -> str:
    return "rtc_capture_" + "".join(ch if ch.isalnum() else "_" for ch in Path(scenario_name).stem)


def scenario_conditions(scenario: Any) -> tuple[Scenario, Conditions]:
    """A scenario (a shipped name, a file, an object) as the simulator loads
    it, and its conditions (its ``conditions``, which only ``--capture``
    reads). Raises ValueError (``ScenarioError``) for one it cannot load."""
    loaded = as_scenario(scenario)
    return loaded, Conditions.from_obj(loaded.conditions, f"scenario {loaded.name!r}: conditions")


async def capture_scenario(scenario: Any, out: Path, journal: Path, call_id: str | None = None,
                           conditions: Conditions = Conditions()) -> Path:
    """Run ``scenario`` on the simulator against the server, on a copy of
    ``journal``, in ``conditions``, with ``record_events`` on; copy the
    call's capture to ``out``."""
    call_id = call_id or _capture_call_id(scenario if isinstance(scenario, str) else "inline")
    sim = Simulator(scenario, api_key=None)
    with replay_folder() as folder:
        copy = await storage.run_sync(_journal_copy, journal, folder, cancellable=False)   # never under an rmtree
        state = folder / "state"
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            source_url, mcp_env = await start_tool_source(nursery, conditions, sim)
            sim.add_call(call_id)
            settings = _settings(copy, state, sim.base_url, conditions, source_url, record_events=True)
            await _serve_one_call(settings, sim, call_id, mcp_env=mcp_env)
            nursery.cancel_scope.cancel()
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(capture_path(state, call_id), out)
    return out


# --- the expectation ------------------------------------------------------------

def _pretty(output: str) -> list[str]:
    try:
        return json.dumps(json.loads(output), indent=1, sort_keys=True, ensure_ascii=False).splitlines()
    except ValueError:
        return output.splitlines() or [""]


def _output_differences(expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    found = []
    for call_id in sorted(set(expected) | set(actual)):
        want, got = expected.get(call_id), actual.get(call_id)
        tool = (want or got or {}).get("tool") or "?"
        if got is None:
            found.append(f"output for tool call {call_id} ({tool}): the recording has one, we sent none")
        elif want is None:
            found.append(f"output for tool call {call_id} ({tool}): we sent one, the recording has none")
        elif want != got:
            lines = [f"output for tool call {call_id} ({tool}) differs:"]
            a, b = want.get("outputs", []), got.get("outputs", [])
            if len(a) != len(b):
                lines.append(f"  {len(a)} output(s) recorded, {len(b)} sent")
            for old, new in zip(a, b):
                diff = list(difflib.unified_diff(_pretty(old), _pretty(new), "recorded", "sent", lineterm="", n=1))
                lines.extend("  " + line for line in diff[:DIFF_LINES])
                if len(diff) > DIFF_LINES:
                    lines.append(f"  … {len(diff) - DIFF_LINES} more diff lines")
            found.append("\n".join(lines))
    return found


def compare(expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    """Every difference between an expectation's ``sent`` and a replay's result."""
    found = _output_differences(expected.get("outputs", {}), actual.get("outputs", {}))
    for key in COMPARED[1:]:
        if expected.get(key) != actual.get(key):
            found.append(f"{key.replace('_', ' ')}: recorded {json.dumps(expected.get(key))}, "
                         f"sent {json.dumps(actual.get(key))}")
    return found


def load_expectation(path: Path) -> dict[str, Any]:
    with storage.open_regular(path) as handle:    # a FIFO or a device refused before it is read
        raw = handle.read(MAX_EXPECTATION_BYTES + 1)
    if len(raw) > MAX_EXPECTATION_BYTES:
        raise ValueError(f"{path}: larger than an expectation can be ({MAX_EXPECTATION_BYTES // (1024 * 1024)} MiB)")
    try:
        data = json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise ValueError(f"{path}: nested too deeply to read") from None
    if not isinstance(data, dict) or data.get("version") != EXPECTATION_VERSION or not isinstance(data.get("sent"), dict):
        raise ValueError(f"{path}: not a replay expectation (version {EXPECTATION_VERSION})")
    return data


def write_expectation(path: Path, actual: dict[str, Any], today: str, conditions: Conditions = Conditions()) -> None:
    body: dict[str, Any] = {"version": EXPECTATION_VERSION, "today": today}
    if conditions.to_obj() is not None:
        body["conditions"] = conditions.to_obj()
    body["sent"] = actual
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(body, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)   # atomic: a reader sees the old or the new expectation


# --- the command ---------------------------------------------------------------

@contextlib.contextmanager
def journal_for_runs(given: str | None, today: str) -> Iterator[Path]:
    """The journal the runs copy: ``--journal``'s, else a sample one."""
    if given:
        yield Path(given)
        return
    from voiceactors.journal.sample import write_sample_journal

    with replay_folder() as folder:
        yield write_sample_journal(folder / "sample", days=14, today=clock.parse_day(today), seed=0)


def run(args: argparse.Namespace, out: Any = None) -> int:
    out = out or sys.stdout
    sweep_stale_folders()       # whatever this run does: a killed replay's folder goes with the next one
    capture = Path(args.file)
    if not args.capture and not capture.exists():    # the file named first is the one to complain about
        print(f"voiceactors replay: no capture at {capture} (a server writes them to <state_dir>/captures/ "
              "with --record-events; --capture SCENARIO makes one)", file=sys.stderr)
        return 2
    expect = Path(args.expect) if args.expect else expectation_path(capture)
    expected: dict[str, Any] | None = None
    if expect.exists():
        try:
            expected = load_expectation(expect)
        except (OSError, ValueError) as error:
            if not args.update:
                print(f"voiceactors replay: {error}", file=sys.stderr)
                return 2
    elif not args.update and not args.capture:
        print(f"voiceactors replay: no expectation at {expect}: run with --update to write one", file=sys.stderr)
        return 2
    # an update keeps the expectation's day unless told otherwise
    today = args.today or (expected or {}).get("today") or clock.today().isoformat()
    clock.pin(today)
    try:
        with journal_for_runs(args.journal, today) as journal:
            try:
                # a capture is made in its scenario's conditions, a replay in the expectation's
                conditions = Conditions.from_obj((expected or {}).get("conditions"), str(expect))
                if args.capture:
                    scenario, conditions = scenario_conditions(args.capture)
                    trio.run(lambda: capture_scenario(scenario, capture, journal, conditions=conditions,
                                                      call_id=_capture_call_id(args.capture)))
                    print(f"captured scenario {args.capture} into {capture}", file=out)
                blocks = read_capture(capture)      # before anything starts: a hostile file is refused at once
                actual = trio.run(lambda: replay_capture(capture, journal, speed=args.speed, timeout_s=args.timeout,
                                                         blocks=blocks, conditions=conditions))
            except (OSError, ValueError) as error:
                print(f"voiceactors replay: {error}", file=sys.stderr)
                return 2
    finally:
        clock.pin(None)
    if args.update or expected is None:
        write_expectation(expect, actual, today, conditions)
        answered = sum(1 for create in actual["response_creates"] if "answered_by" in create)
        print(f"wrote the expectation {expect} ({len(actual['outputs'])} tool outputs, "
              f"{answered} response.create answered)", file=out)
        return 0
    differences = compare(expected["sent"], actual)
    if not differences:
        print(f"OK — {capture.name}: what we sent matches the recording "
              f"({len(actual['outputs'])} tool outputs, {len(actual['response_creates'])} response.create)", file=out)
        return 0
    print(f"DIFFERS — {capture.name}: {len(differences)} difference(s) from the recording", file=out)
    for difference in differences:
        print(f"- {difference}", file=out)
    return 1


@contextlib.contextmanager
def _terminate_as_interrupt(received: list[int]) -> Iterator[None]:
    """SIGTERM handled as SIGINT is (a ``KeyboardInterrupt``; inside a trio
    run, trio's own SIGINT handler delivers it where that is safe), so either
    unwinds the replay and its folder is removed at once; each SIGTERM noted
    in ``received``."""
    def on_terminate(signum: int, frame: Any) -> None:
        received.append(signum)
        interrupt = signal.getsignal(signal.SIGINT)
        if callable(interrupt):
            interrupt(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt     # SIGINT ignored (a background job): SIGTERM still stops the replay

    previous = signal.signal(signal.SIGTERM, on_terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupted(error: BaseException) -> bool:
    """Whether ``error`` is a ``KeyboardInterrupt``, alone or in a group."""
    if isinstance(error, BaseExceptionGroup):
        return error.split(KeyboardInterrupt)[0] is not None
    return isinstance(error, KeyboardInterrupt)


def cli_replay(args: argparse.Namespace) -> int:
    """``voiceactors replay``: the report on stdout; only warnings and worse
    are logged (stderr), the call's own lines would drown it."""
    logs.configure("console", "warning")
    received: list[int] = []
    with _terminate_as_interrupt(received):
        try:
            return run(args)
        except BaseException as error:     # trio hands it on in an exception group
            if not _interrupted(error):
                raise
            stopped_by = signal.Signals(received[0] if received else signal.SIGINT)
            print(f"voiceactors replay: stopped by {stopped_by.name}", file=sys.stderr)
            return 128 + int(stopped_by)      # as a shell reports a process a signal ended
