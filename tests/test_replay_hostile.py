"""``voiceactors replay`` against what it must not harm or trust (issue 34):
the journal given with ``--journal`` is never written, a capture that is
not one (a 100 MB line, ``/dev/zero``, a FIFO) is refused at once with one
line, and a replay that is killed leaves nothing the next one does not
remove. Real children for the exit statuses and the signals; real files."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from child_support import die_with_parent
from test_reliability_faults import open_item
from voiceactors.journal.sample import write_sample_journal

ROOT = Path(__file__).resolve().parents[1]
REPLAYS = Path(__file__).parent / "replays"
DAY = dt.date(2026, 3, 27)
VOICEACTORS = [sys.executable, "-m", "voiceactors.cli"]


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    return write_sample_journal(tmp_path / "journal", days=3, today=DAY, seed=0)


def tree_digest(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (files by content, folders and links by kind)."""
    found = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if path.is_symlink():
            found[name] = "link:" + os.readlink(path)
        elif path.is_dir():
            found[name] = "folder"
        else:
            found[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


#: The address space a replay child may use: a reader that takes a hostile
#: capture whole fails here instead of taking the machine's memory.
CHILD_MEMORY = 3 * 1024 ** 3


def bounded_child() -> Callable[[], None]:
    """The children's ``preexec_fn``: die with the test, and within ``CHILD_MEMORY``."""
    die = die_with_parent()     # looked up here, in the parent, as it must be

    def preexec() -> None:
        if die is not None:
            die()
        resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))

    return preexec


def replay(*argv: str, tmp: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(VOICEACTORS + ["replay", *argv], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**os.environ, "TMPDIR": str(tmp)}, preexec_fn=bounded_child())


def replay_folders(tmp: Path) -> list[Path]:
    return sorted(tmp.glob("voiceactors-replay-*"))


# --- the journal ---------------------------------------------------------------

def test_a_replay_never_writes_the_journal_it_is_given(tmp_path, journal):
    item = open_item(journal)
    scenario = tmp_path / "close.json"
    scenario.write_text(json.dumps({"steps": [
        {"user_turn": {"text": "Mark that one done.", "duration_ms": 100}},
        {"response": {"tool_calls": [{"name": "commitments.complete", "call_id": "call_w",
                                      "arguments": {"commitment_id": item.id, "resolution": "done"}}]}},
        {"wait_outputs": {}},
        {"response": {"text": "Done."}},
        {"close": 1000},
    ]}))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    before = tree_digest(journal)
    capture = tmp_path / "close.jsonl"
    made = replay(str(capture), "--capture", str(scenario), "--journal", str(journal), "--today", DAY.isoformat(),
                  "--update", tmp=tmp)
    assert made.returncode == 0, made.stderr
    assert tree_digest(journal) == before           # the capture's run closed the item in its copy
    # the write did happen, in the copy: the tool answered as for an item it closed
    (output,) = json.loads((tmp_path / "close.expected.json").read_text())["sent"]["outputs"]["call_w"]["outputs"]
    assert item.id in output and "error" not in json.loads(output), output
    again = replay(str(capture), "--journal", str(journal), tmp=tmp)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "what we sent matches the recording" in again.stdout
    assert tree_digest(journal) == before
    assert replay_folders(tmp) == []


# --- hostile captures ----------------------------------------------------------

def hostile_capture(kind: str, tmp_path: Path) -> Path:
    if kind == "fifo":
        path = tmp_path / "fifo.jsonl"
        os.mkfifo(path)
        return path
    if kind == "device":
        return Path("/dev/zero")
    path = tmp_path / "long_line.jsonl"
    with open(path, "wb") as handle:        # a capture head, then one event of 100 MB
        handle.write(json.dumps({"kind": "capture", "version": 1, "call_id": "rtc_long"}).encode() + b"\n")
        handle.write(b'{"kind": "event", "t": 0.1, "event": {"type": "response.output_text.delta", "delta": "')
        chunk = b"a" * (1024 * 1024)
        for _ in range(100):
            handle.write(chunk)
        handle.write(b'"}}\n')
    return path


@pytest.mark.parametrize("kind,message", [("long_line", "line 2 is longer than"),
                                          ("device", "not a regular file (a character device)"),
                                          ("fifo", "not a regular file (a FIFO)")])
def test_a_hostile_capture_is_refused_at_once_with_one_line(kind, message, tmp_path, journal):
    capture = hostile_capture(kind, tmp_path)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    started = time.monotonic()
    try:
        done = replay(str(capture), "--update", "--expect", str(tmp_path / "out.expected.json"),
                      "--journal", str(journal), tmp=tmp, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the replay of a {kind} capture still ran after 60 s")
    took = time.monotonic() - started
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.startswith("voiceactors replay: ") and message in done.stderr, done.stderr
    assert took < 30, took
    assert not (tmp_path / "out.expected.json").exists()


# --- killed replays -----------------------------------------------------------

def start_slow_replay(tmp: Path, journal: Path) -> subprocess.Popen[str]:
    """A replay whose recorded gaps are stretched: it runs for a while."""
    return subprocess.Popen(VOICEACTORS + ["replay", str(REPLAYS / "parallel_batch.jsonl"), "--journal", str(journal),
                                           "--speed", "0.01"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "TMPDIR": str(tmp)}, preexec_fn=bounded_child())


def wait_for_folder(tmp: Path, child: subprocess.Popen[str]) -> Path:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        folders = [f for f in replay_folders(tmp) if (f / "state").exists()]
        if folders:
            return folders[0]
        assert child.poll() is None, child.stderr.read() if child.stderr else ""
        time.sleep(0.05)
    raise AssertionError("the replay made no folder within 60 s")


def test_a_killed_replays_folder_is_removed_by_the_next_run(tmp_path, journal):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    child = start_slow_replay(tmp, journal)
    try:
        folder = wait_for_folder(tmp, child)
        assert folder.name.startswith(f"voiceactors-replay-{child.pid}-")
        child.kill()
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert folder.exists()                        # SIGKILL: nothing could remove it then
    other = tmp / "voiceactors-replay-notours"    # not a replay folder's name: left alone
    other.mkdir()
    done = replay(str(tmp_path / "none.jsonl"), tmp=tmp)   # any run, even one refused for usage
    assert done.returncode == 2
    assert not folder.exists() and other.exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_replay_removes_its_folder_at_once(sig, tmp_path, journal):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    child = start_slow_replay(tmp, journal)
    try:
        folder = wait_for_folder(tmp, child)
        child.send_signal(sig)
        assert child.wait(timeout=30) == 128 + sig, child.stderr.read() if child.stderr else ""
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert not folder.exists()
    assert replay_folders(tmp) == []
