"""The call record's fsyncs, grouped on a schedule (issue 14), on real files.

A line counts as written once its ``write()`` returned (page cache: what a
kill -9 leaves for crash recovery); each file is fsynced at most once per
``fsync_s`` in the background, and always at the record's close and at the
run's end. ``fsync_s=0`` keeps the fsync before the line counts as written.

The writer's ``fsync`` seam gets a real function that records, for every
fsync it is asked for, the file the descriptor names (``/proc/self/fd``) and
its size then. It does not fsync: a real fsync takes real time, while
``autojump_clock`` moves virtual time on as fast as it can meanwhile, so the
schedule's counts would depend on the disk.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import trio
from calls_support import rig, steady
from structlog.testing import capture_logs

from voiceactors.call.record import CallRecord, RecordWriter, read_record, record_path
from voiceactors.call.recovery import find_crashed


class FsyncLog:
    """An fsync stand-in that remembers what it was asked to sync: ``(path, size)`` per call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self._lock = threading.Lock()     # the write and the fsync passes run in different threads

    def __call__(self, fd: int) -> None:
        target = os.readlink(f"/proc/self/fd/{fd}")
        size = os.fstat(fd).st_size
        with self._lock:
            self.calls.append((target, size))

    def of(self, path: Path) -> list[int]:
        """The sizes ``path`` had at each of its fsyncs."""
        with self._lock:
            return [size for target, size in self.calls if target == str(path)]


def _open_fds_under(folder: Path, *, appending_only: bool = False) -> int:
    """Descriptors of this process on files under ``folder`` (``appending_only``:
    the writer's kept ``O_APPEND`` ones, not an fsync pass's short-lived own)."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith(str(folder) + "/"):
                continue
            if appending_only:
                flags = Path(f"/proc/self/fdinfo/{name}").read_text().split("flags:")[1].split()[0]
                if not int(flags, 8) & os.O_APPEND:
                    continue
        except (OSError, IndexError):
            continue
        count += 1
    return count


async def _until(predicate, real_s: float = 20.0) -> None:
    """Poll in small virtual steps, bounded in real time: autojump_clock
    moves on while a worker thread writes, so virtual time is no bound."""
    give_up = time.monotonic() + real_s
    while not predicate():
        if time.monotonic() > give_up:
            raise AssertionError("condition not reached")
        await trio.sleep(0.01)


async def test_a_line_reported_written_is_in_the_file_before_any_fsync(tmp_path, autojump_clock):
    fsyncs = FsyncLog()
    writer = RecordWriter(fsync=fsyncs)
    record = CallRecord("rtc_cache", tmp_path, fsync_s=3600, writer=writer)
    record.opened()
    record.add("tool_started", tool_call_id="call_1", tool="briefing.get", response_id="resp_1",
               epoch=1, turn=1, effect="read", arguments="{}")
    await _until(lambda: record.flushes >= 1 and record._flushed == len(record.lines))
    assert fsyncs.of(record.path) == []                  # not fsynced (its schedule is an hour away)
    # what crash recovery reads after a kill -9: the page cache has the lines
    crashed = find_crashed(tmp_path, max_age_s=60, limit=10)
    assert [c.call_id for c in crashed] == ["rtc_cache"]
    assert [p.tool_call_id for p in crashed[0].pending] == ["call_1"]
    record.add("end", reason="closed_by_service")
    assert await record.close() is True
    size = record.path.stat().st_size
    assert max(fsyncs.of(record.path)) == size       # the close fsynced everything it wrote
    assert any(target == str(record.path.parent) for target, _ in fsyncs.calls)   # and the new name's folder
    assert _open_fds_under(tmp_path, appending_only=True) == 0   # and closed the file


async def test_fsyncs_are_grouped_at_most_once_per_fsync_s_while_the_call_lives(tmp_path, autojump_clock):
    fsyncs = FsyncLog()
    writer = RecordWriter(fsync=fsyncs)
    record = CallRecord("rtc_busy", tmp_path, fsync_s=1.0, writer=writer)
    record.opened()
    start = trio.current_time()
    for i in range(300):                                 # a busy call: 300 urgent lines, each written
        record.add("tool_call", tool_call_id=f"call_{i}")
        await _until(lambda: record._flushed == len(record.lines))   # >= one 0.01 s poll each
    elapsed = trio.current_time() - start
    during = fsyncs.of(record.path)
    assert record.flushes == 300 and elapsed >= 2.9
    # the schedule ran while the call lived (not only at its close), at most once per fsync_s
    # of trio time, and fewer times than the flushes (with fsync_s=0 it is once per flush).
    # No tighter ratio: autojump_clock runs on while a write waits in its worker thread, so
    # a loaded machine stretches `elapsed` (113 s for these 300 flushes in one CI run)
    assert 1 <= len(during) <= elapsed / 1.0 + 1
    assert len(during) < record.flushes
    assert during == sorted(during)                      # each one later in the file
    record.add("end", reason="closed_by_service")
    assert await record.close() is True
    assert max(fsyncs.of(record.path)) == record.path.stat().st_size
    assert len(read_record(record.path)) == record.flushes + 1


async def test_fsync_s_zero_fsyncs_every_flush_before_it_counts_as_written(tmp_path, autojump_clock):
    fsyncs = FsyncLog()
    writer = RecordWriter(fsync=fsyncs)
    record = CallRecord("rtc_strict", tmp_path, fsync_s=0, writer=writer)
    record.opened()
    for i in range(5):
        record.add("tool_started", tool_call_id=f"call_{i}")
        await _until(lambda: record._flushed == len(record.lines))
        # reported written only once fsynced: the last fsync saw the whole file
        assert max(fsyncs.of(record.path)) == record.path.stat().st_size
    assert len(fsyncs.of(record.path)) == record.flushes
    record.add("end", reason="closed_by_service")
    assert await record.close() is True


def test_the_end_of_the_run_fsyncs_and_closes_what_is_left(tmp_path):
    """A record never closed (its run ends under it: the process's last act):
    the writer's exit fsyncs its file and closes it."""
    fsyncs = FsyncLog()

    async def main() -> Path:
        writer = RecordWriter(fsync=fsyncs)
        record = CallRecord("rtc_left", tmp_path, fsync_s=3600, writer=writer)
        record.opened()
        record.add("tool_started", tool_call_id="call_1")
        await _until(lambda: record._flushed == len(record.lines))
        assert fsyncs.of(record.path) == [] and _open_fds_under(tmp_path, appending_only=True) == 1
        return record.path      # main returns: trio cancels the writer's system task

    path = trio.run(main)
    assert fsyncs.of(path) == [path.stat().st_size]
    assert _open_fds_under(tmp_path) == 0


async def test_many_records_keep_at_most_max_open_files_open(tmp_path, autojump_clock):
    fsyncs = FsyncLog()
    writer = RecordWriter(fsync=fsyncs, max_open=2)
    records = [CallRecord(f"rtc_fd_{n}", tmp_path, fsync_s=1.0, writer=writer) for n in range(5)]
    for record in records:
        record.opened()
    for i in range(3):
        for record in records:
            record.add("tool_call", tool_call_id=f"call_{i}")
        await _until(lambda: all(r._flushed == len(r.lines) for r in records))
        assert writer.open_files <= 2 and _open_fds_under(tmp_path, appending_only=True) <= 2
    # past fsync_s: every file is fsynced, the ones whose descriptor was closed by their path
    await _until(lambda: all(fsyncs.of(r.path)[-1:] == [r.path.stat().st_size] for r in records))
    for record in records:
        record.add("end", reason="closed_by_service")
        assert await record.close() is True
        assert [x["kind"] for x in read_record(record.path)] == ["start", "tool_call", "tool_call", "tool_call", "end"]
    assert _open_fds_under(tmp_path, appending_only=True) == 0


async def test_a_write_error_on_an_open_file_is_reported_and_the_close_returns(tmp_path, autojump_clock):
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full (a device whose every write fails with ENOSPC)")
    fsyncs = FsyncLog()
    writer = RecordWriter(fsync=fsyncs)
    full = CallRecord("rtc_full", tmp_path, fsync_s=1.0, writer=writer)
    fine = CallRecord("rtc_fine", tmp_path, fsync_s=1.0, writer=writer)
    full.path.parent.mkdir(parents=True, exist_ok=True)
    full.path.symlink_to("/dev/full")                    # opens fine; every write: ENOSPC
    for record in (full, fine):
        record.opened()
        record.add("tool_started", tool_call_id="call_1")
    await _until(lambda: full.failed is not None and fine.flushes == 1)
    assert "No space left on device" in full.failed
    assert full._flushed == 0 and len(full.lines) == 2   # the lines stay in memory for the next try
    for record in (full, fine):
        record.add("end", reason="closed_by_service")
    assert await full.close() is True and full.failed is not None   # told, never hung
    assert await fine.close() is True and fine.failed is None
    assert [x["kind"] for x in read_record(fine.path)] == ["start", "tool_started", "end"]
    assert _open_fds_under(tmp_path, appending_only=True) == 0


WRITER_CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    import trio
    from voiceactors.call.record import CallRecord, RecordWriter

    async def main():
        fsyncs = []
        writer = RecordWriter(fsync=fsyncs.append)      # an fsync that never reaches the disk
        record = CallRecord("rtc_killed", Path(sys.argv[1]), fsync_s=3600, writer=writer)
        record.opened()
        record.add("tool_started", tool_call_id="call_w", tool="commitments.complete",
                   response_id="resp_1", epoch=1, turn=1, effect="write")
        while record._flushed < len(record.lines):
            await trio.sleep(0.01)
        print("written", len(fsyncs), flush=True)
        await trio.sleep(3600)

    trio.run(main)
""")


def test_kill_9_after_a_line_was_reported_written_leaves_it_for_recovery(tmp_path):
    """A real process, killed once its record reported the line written and
    before any fsync: the next process's recovery finds the pending call."""
    child = subprocess.Popen([sys.executable, "-c", WRITER_CHILD, str(tmp_path)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().split() == ["written", "0"]   # no fsync was made
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
    crashed = find_crashed(tmp_path, max_age_s=60, limit=10)
    assert [(c.call_id, [p.tool_call_id for p in c.pending]) for c in crashed] == [("rtc_killed", ["call_w"])]
    assert [x["kind"] for x in read_record(record_path(tmp_path, "rtc_killed"))] == ["start", "tool_started"]


async def test_a_call_whose_record_cannot_be_written_still_runs_and_says_so(tmp_path, autojump_clock):
    """Through the CallActor (the simulator, the sideband in memory): the record's file
    refuses every write (ENOSPC); the call's tools are answered as usual, the
    actor logs ``call.record_failed`` at the end, and the setting reaches the
    record."""
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full (a device whose every write fails with ENOSPC)")
    async with rig(tmp_path, call_record_fsync_s=0.25) as r:
        path = record_path(r.settings.state_dir, "rtc_nospace")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to("/dev/full")
        with capture_logs() as logs:
            actor, sc = await r.run_call("rtc_nospace", steady("parallel_tools"))
    assert actor.record is not None and actor.record.fsync_s == 0.25
    assert len(sc.tool_calls) == 3 and all(len(sc.outputs[c]) == 1 for c in sc.tool_calls)
    failed = [line for line in logs if line["event"] == "call.record_failed"]
    assert len(failed) == 1 and "No space left on device" in failed[0]["error"]


async def test_calls_joining_apart_share_fsync_passes_and_none_waits_past_fsync_s(tmp_path, autojump_clock):
    """Records opened 10 ms apart (a burst of joins) are fsynced in a few
    grouped passes, not one worker-thread hop each: a file due within
    ``FSYNC_RIDE_ALONG_S`` rides along with the pass of one due now (early
    is never less safe); every file is still fsynced, and closed at the end."""
    from voiceactors.call.record import FSYNC_RIDE_ALONG_S

    fsyncs = FsyncLog()
    writer = RecordWriter(fsync=fsyncs, syncfs=None)    # the files one by one, to count each one's fsync
    records = []
    written_at = []
    for n in range(20):
        record = CallRecord(f"rtc_join_{n}", tmp_path, fsync_s=1.0, writer=writer)
        record.opened()
        records.append(record)
        await _until(lambda: record._flushed == len(record.lines))
        written_at.append(trio.current_time())
        await trio.sleep(0.01)
    await _until(lambda: all(fsyncs.of(r.path) for r in records))
    # The span is trio time, which autojump_clock runs on while a write waits in
    # its worker thread: on a loaded machine the first writes may lie far apart.
    span = written_at[-1] - written_at[0]
    assert writer.fsync_passes <= span / FSYNC_RIDE_ALONG_S + 2, (writer.fsync_passes, span)   # was one per record
    for record in records:
        record.add("end", reason="closed_by_service")
        assert await record.close() is True
    assert _open_fds_under(tmp_path, appending_only=True) == 0


async def test_writer_retired_waits_for_the_shared_writer_once_no_record_is_live(tmp_path):
    """A stopping runtime waits for this (``runtime.open_runtime``): the
    writer's last fsyncs run in a worker thread after the last close, so a
    stop that did not wait left its task behind (seen in the e2e test's
    "no task left" check on a loaded CI run)."""
    from voiceactors.call.record import shared_writer, writer_retired

    live = CallRecord("rtc_live", tmp_path)
    live.opened()
    other = CallRecord("rtc_other", tmp_path)
    other.opened()
    writer = shared_writer()
    other.add("end", reason="closed_by_service")
    assert await other.close() is True
    with trio.fail_after(1):
        assert await writer_retired(30) is False     # a record is still live: no wait at all
    assert not writer.retired.is_set()
    live.add("end", reason="closed_by_service")
    assert await live.close() is True
    assert await writer_retired(30) is True
    assert writer.retired.is_set()
    assert await writer_retired(30) is True          # nothing running: at once


class SyncfsLog:
    """A ``syncfs`` stand-in: the folder each call's descriptor names, or a
    failure to raise instead (``error``)."""

    def __init__(self, error: OSError | None = None) -> None:
        self.folders: list[str] = []
        self.error = error
        self._lock = threading.Lock()

    def __call__(self, fd: int) -> None:
        with self._lock:
            self.folders.append(os.readlink(f"/proc/self/fd/{fd}"))
        if self.error is not None:
            raise self.error


def _all_synced(writer: RecordWriter) -> bool:
    """No file or folder left to fsync and no pass under way (a pass takes
    its files off the schedule before its worker thread runs)."""
    return (writer.fsync_passes >= 1 and not writer._fsyncing
            and not writer._unsynced and not writer._unsynced_dirs)


async def _open_with_a_line_each(tmp_path: Path, writer: RecordWriter, count: int) -> list[CallRecord]:
    records = [CallRecord(f"rtc_many_{n}", tmp_path, fsync_s=1.0, writer=writer) for n in range(count)]
    for record in records:
        record.opened()
        record.add("tool_started", tool_call_id="call_1")
    await _until(lambda: all(r._flushed == len(r.lines) for r in records))
    return records


async def test_a_pass_with_many_files_due_flushes_their_folder_in_one_syncfs(tmp_path, autojump_clock):
    """At thousands of live calls an fsync per file meant three syscalls a
    file, each handing the GIL to the worker thread and back (benchmarks
    § 43): a pass of ``SYNCFS_MIN_FILES`` or more makes one ``syncfs`` for
    the records' folder instead, and no per-file fsync."""
    from voiceactors.call.record import SYNCFS_MIN_FILES

    fsyncs, syncfs = FsyncLog(), SyncfsLog()
    writer = RecordWriter(fsync=fsyncs, syncfs=syncfs)
    records = await _open_with_a_line_each(tmp_path, writer, 2 * SYNCFS_MIN_FILES)
    folder = str(records[0].path.parent)
    await _until(lambda: _all_synced(writer))
    assert syncfs.folders and set(syncfs.folders) == {folder}
    assert len(syncfs.folders) == writer.fsync_passes            # one syscall a pass, for all its files
    assert all(fsyncs.of(r.path) == [] for r in records)         # none fsynced one by one
    for record in records:
        record.add("end", reason="closed_by_service")
        assert await record.close() is True
        # a close still fsyncs its own file: the end is durable when close returns
        assert fsyncs.of(record.path)[-1] == record.path.stat().st_size
    assert _open_fds_under(tmp_path, appending_only=True) == 0


async def test_a_pass_with_few_files_due_fsyncs_each_of_them(tmp_path, autojump_clock):
    """Below ``SYNCFS_MIN_FILES`` a filesystem-wide flush would wait on other
    writers' data for nothing: each file is fsynced by itself."""
    from voiceactors.call.record import SYNCFS_MIN_FILES

    fsyncs, syncfs = FsyncLog(), SyncfsLog()
    writer = RecordWriter(fsync=fsyncs, syncfs=syncfs)
    records = await _open_with_a_line_each(tmp_path, writer, SYNCFS_MIN_FILES - 1)
    await _until(lambda: _all_synced(writer))
    assert syncfs.folders == []
    assert all(fsyncs.of(r.path) == [r.path.stat().st_size] for r in records)
    for record in records:
        record.add("end", reason="closed_by_service")
        assert await record.close() is True


async def test_a_failed_syncfs_is_logged_and_the_records_go_on(tmp_path, autojump_clock):
    from voiceactors.call.record import SYNCFS_MIN_FILES

    writer = RecordWriter(fsync=FsyncLog(), syncfs=SyncfsLog(OSError(5, "Input/output error")))
    with capture_logs() as logs:
        records = await _open_with_a_line_each(tmp_path, writer, SYNCFS_MIN_FILES)
        await _until(lambda: _all_synced(writer))
    failed = [line for line in logs if line["event"] == "call.record_fsync_failed"]
    assert failed and "(syncfs): [Errno 5] Input/output error" in failed[0]["error"]
    for record in records:
        record.add("end", reason="closed_by_service")
        assert await record.close() is True and record.failed is None
        assert [x["kind"] for x in read_record(record.path)] == ["start", "tool_started", "end"]


async def test_the_default_writer_syncs_many_files_with_the_real_syncfs(tmp_path, autojump_clock):
    """No stand-in: the platform's ``syncfs`` (``storage.syncfs``) on real files."""
    from voiceactors import storage
    from voiceactors.call.record import SYNCFS_MIN_FILES

    if storage.syncfs is None:
        pytest.skip("this platform has no syncfs(2): the writer fsyncs file by file")
    writer = RecordWriter()
    with capture_logs() as logs:
        records = await _open_with_a_line_each(tmp_path, writer, SYNCFS_MIN_FILES)
        await _until(lambda: _all_synced(writer))
    assert writer.fsync_passes >= 1
    assert not [line for line in logs if line["event"] == "call.record_fsync_failed"]
    for record in records:
        record.add("end", reason="closed_by_service")
        assert await record.close() is True and record.failed is None


def test_syncfs_refuses_a_descriptor_that_is_not_open(tmp_path):
    from voiceactors import storage

    if storage.syncfs is None:
        pytest.skip("this platform has no syncfs(2)")
    fd = os.open(tmp_path, os.O_RDONLY)
    os.close(fd)
    with pytest.raises(OSError) as raised:
        storage.syncfs(fd)
    assert raised.value.errno == 9          # EBADF: the C call's errno, not a silent success


async def test_many_records_closing_in_one_pass_are_made_durable_by_one_syncfs(tmp_path, autojump_clock):
    """A shutdown closes every live record at once: their last pass has as
    many files to make durable before the closes return, and does it with
    one ``syncfs`` of their folder, not an fsync each."""
    from voiceactors.call.record import SYNCFS_MIN_FILES

    fsyncs, syncfs = FsyncLog(), SyncfsLog()
    writer = RecordWriter(fsync=fsyncs, syncfs=syncfs)
    records = [CallRecord(f"rtc_bye_{n}", tmp_path, fsync_s=3600, writer=writer) for n in range(4 * SYNCFS_MIN_FILES)]
    for record in records:
        record.opened()
        record.add("tool_started", tool_call_id="call_1")
    await _until(lambda: all(r._flushed == len(r.lines) for r in records))
    assert syncfs.folders == [] and fsyncs.calls == []     # an hour's fsync_s: nothing synced yet
    results = []

    async def close(record: CallRecord) -> None:
        record.add("end", reason="closed_by_service")
        results.append(await record.close())

    async with trio.open_nursery() as nursery:
        for record in records:
            nursery.start_soon(close, record)
    assert results == [True] * len(records) and all(r.failed is None for r in records)
    # The first close's pass may go before the other closes have asked (trio
    # orders a batch's tasks as it likes), the rest wait for the next one:
    # so at most two passes, and one of them has at least SYNCFS_MIN_FILES.
    assert set(syncfs.folders) == {str(tmp_path / "calls")} and len(syncfs.folders) <= 2
    one_by_one = [r for r in records if fsyncs.of(r.path)]
    assert len(one_by_one) < SYNCFS_MIN_FILES                # the others were in a syncfs
    assert all(fsyncs.of(r.path) == [r.path.stat().st_size] for r in one_by_one)
    assert all([x["kind"] for x in read_record(r.path)] == ["start", "tool_started", "end"] for r in records)
    assert _open_fds_under(tmp_path, appending_only=True) == 0


async def test_a_failed_syncfs_of_closing_records_is_each_closes_failure(tmp_path, autojump_clock):
    from voiceactors.call.record import SYNCFS_MIN_FILES

    writer = RecordWriter(fsync=FsyncLog(), syncfs=SyncfsLog(OSError(5, "Input/output error")))
    records = [CallRecord(f"rtc_eio_{n}", tmp_path, fsync_s=3600, writer=writer) for n in range(4 * SYNCFS_MIN_FILES)]
    for record in records:
        record.opened()
        record.add("end", reason="closed_by_service")
    async with trio.open_nursery() as nursery:
        for record in records:
            nursery.start_soon(record.close)
    # told, never hung: written to the page cache, but not known durable (a
    # first pass of fewer than SYNCFS_MIN_FILES fsynced its files one by one)
    failed = [r for r in records if r.failed is not None]
    assert len(failed) > len(records) - SYNCFS_MIN_FILES
    assert all("(syncfs): [Errno 5] Input/output error" in r.failed for r in failed)
    assert all([x["kind"] for x in read_record(r.path)] == ["start", "end"] for r in records)
    assert _open_fds_under(tmp_path, appending_only=True) == 0


class FsyncHeldThenFailing:
    """An fsync that holds its first call on a file until ``release`` and
    fails every later one on a file (a folder's always succeeds)."""

    def __init__(self) -> None:
        self.held = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def __call__(self, fd: int) -> None:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return
        self.calls += 1
        if self.calls == 1:
            self.held.set()
            self.release.wait(20)
            return
        raise OSError(5, "Input/output error")


async def test_a_close_during_a_pass_writes_its_lines_once_even_when_the_last_fsync_fails(tmp_path, autojump_clock):
    """The close asks for the last pass while an earlier pass holds the
    record; the last pass's fsync fails. Its lines are on file: no pass after
    it writes them again, and the close leaves no descriptor open."""
    fsync = FsyncHeldThenFailing()
    writer = RecordWriter(fsync=fsync, syncfs=None)
    record = CallRecord("rtc_twice", tmp_path, fsync_s=0, writer=writer)
    record.opened()
    record.add("tool_started", tool_call_id="call_1")
    await _until(fsync.held.is_set)               # the first pass is in its fsync
    record.add("end", reason="closed_by_service")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(record.close)
        await trio.sleep(0.05)
        fsync.release.set()
    assert record.failed is not None and "Input/output error" in record.failed
    assert _open_fds_under(tmp_path, appending_only=True) == 0
    await _until(writer.retired.is_set)          # every pass the writer was to make is made
    assert [x["kind"] for x in read_record(record.path)] == ["start", "tool_started", "end"]
    assert _open_fds_under(tmp_path, appending_only=True) == 0
