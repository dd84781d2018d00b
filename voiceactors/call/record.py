"""The call record: what one CallActor run did, as JSON lines.

``<state_dir>/calls/<call_id>.jsonl``, written AS THE CALL GOES by ONE
background writer shared by every call of the process (``RecordWriter``, a
trio system task started with the first record of a run and retired once
every record has closed and every write is fsynced): the ``start`` line,
each ``tool_started``, each ``tool_call`` and the ``end`` line are written
at once (a kill -9 must find them), the other lines ride along with the
next write or within ``BATCH_S``. Each write pass takes every record with
lines waiting and appends them all in one worker thread, one ``write()``
per file, on a descriptor kept open per live record (at most
``MAX_OPEN_FILES``, least recently written closed first). Passes start at
least ``PASS_GAP_S`` (10 ms) apart, and at least ``LOADED_PASS_GAP_S`` (50
ms) after a pass that carried more than one record: so "at once" means the
next pass, at once after a quiet spell, else within 10 ms for a lone call
and within 50 ms under load (plus the pass's own time), and a burst of
calls, or a busy call, costs one thread hop per pass instead of one per
line. A closing record's last pass goes at once whatever the gap. Lines
added while a pass is in progress go out in the next one. Each line is
rendered once per write, by orjson (``render_line``).

Written means ``write()`` returned: the bytes are in the page cache, which
is all crash recovery needs against a process crash (kill -9, OOM kill).
Only a power loss or a kernel crash needs the fsync, and that is grouped:
each file written since its last fsync is fsynced ``fsync_s``
(``settings.call_record_fsync_s``, 1 s) after its first unsynced write (or
up to ``FSYNC_RIDE_ALONG_S`` sooner, riding along with another file's), all
files due in one worker-thread hop of their own (never in a call's path,
never holding up a write pass); a new file's folder is fsynced with it. A
record's ``close`` (the call's end) writes the rest, fsyncs the file and
closes it before it returns; the end of the trio run (shutdown) fsyncs
what is still unsynced. ``fsync_s=0`` is the old behaviour: every write
pass fsyncs each file before its lines count as written. So a power loss
can lose about the last ``fsync_s`` of a live call's lines, never a closed
call's; a kill -9 the lines not yet written: under load up to the last
``LOADED_PASS_GAP_S`` (50 ms) of urgent ones and ``BATCH_S`` of the others.
Nothing is written for a call whose sideband never connected (a bogus
``/connect`` leaves no file), unless the call id already has a record (a
rejoin, or a later actor that finds the call gone): then the run's block is
its history.

Every flush starts on a fresh line: if the file does not end in ``\\n`` (a
torn last line left by a crash), the block begins with one. ``read_record``
skips a torn line instead of failing.

A later actor for the same call id appends its own block, so a file is the
history of every run for that id; every block starts with a ``start`` line
and, unless the server died during it, ends with an ``end`` line. A block
without an ``end`` is a run that crashed: the next server rejoins the call
(``recovery.py``) and its block starts with ``"rejoined": true``.

Line kinds (``kind``, a ``RecordKind``: ``record_kind.py``), each with ``t``
(seconds since the actor started, trio clock):

* ``start`` — ``call_id``, ``at`` (UTC wall clock), ``rejoined`` (true when
  this run picks up a call live at a crash), ``recovered`` (tool call ids it
  answers for the crashed run).
* ``context`` — ``context``: the call's linked context (instruction, link,
  selection, and the call it continues with its account) as the run starts,
  when it has one (a rejoin carries it on).
* ``connect`` — ``reconnects`` (how many reconnects came before).
* ``reconnect`` — ``attempt``, ``delay_s``, ``close_code`` (None for a failed handshake).
* ``response`` — ``response_id``, ``status``, ``epoch``, ``origin``
  (``ours``|``model``), ``tool_calls`` (ids).
* ``response_create`` — ``event_id``, ``epoch``, ``for`` (response ids),
  ``result`` (``sent``|``rejected_active``|``lost``|``error:<code>``),
  ``response_id``, ``turnaround_ms``.
* ``tool_started`` — ``tool_call_id``, ``tool``, ``response_id``, ``epoch``,
  ``turn``, ``effect`` (``read``|``write``|None for an unknown tool) and, for
  reads only, ``arguments`` (so a read pending at a crash can be run again).
* ``tool_call`` — once per tool call, when it settles (its output confirmed
  or refused by the service) or at the end: ``tool_call_id``, ``tool``,
  ``response_id``, ``epoch``, ``turn``, ``duration_ms``, ``outcome``,
  ``output_bytes``, ``sends``, ``delivered`` (confirmed by the service),
  ``synthetic``, ``state``, ``overhead_ms``.
* ``selection`` — ``tool_call_id``, ``selection``, ``link``: a
  ``journal.select`` output chose what the call is about.
* ``hosted_tool`` — at an ``mcp_call`` item's ``response.output_item.done``
  (an OpenAI-hosted MCP tool the service ran; never answered by us):
  ``item_id``, ``response_id``, ``server`` (its ``server_label``), ``tool``,
  ``status`` (``completed``|``failed``), ``error`` (the item's error type, or None).
* ``transcript`` — ``role`` (``user``|``assistant``), ``item_id``, ``text``:
  one final utterance, as the service transcribed it; ``order`` (its place
  in the conversation: sort a run's transcripts by it for the spoken order,
  ``transcript_order.py``) and ``cut_short: true`` when its response had
  already ended cancelled.
* ``transcript_cut`` — ``item_id``: the reply of an earlier ``transcript``
  line was cut short (its response ended cancelled, e.g. a barge-in).
* ``usage`` — one per ``response.done`` that carries usage: ``response_id``,
  ``model``, ``tokens`` (by kind, ``usage.TOKEN_KINDS``), ``cost_usd`` (None:
  the model has no prices).
* ``audio_usage`` — a Live call's: a ``session.usage.updated`` whose
  cumulative seconds are above the highest so far: ``model`` (the Live
  model), ``seconds`` (the session's total), ``added_s`` (what it added),
  ``cost_usd`` (of those; None: no per-minute price).
* ``budget`` — the call's cost reached its budget: ``budget_usd``, ``cost_usd``.
* ``idle`` — the service's idle timeout fired (``input_audio_buffer.timeout_triggered``):
  ``timeouts`` (how many since the user last spoke) and ``then``: ``check_in``
  (the service's own response checks in) or ``goodbye`` (ours, then the call ends ``user_idle``).
* ``wrap_up`` — the call's time limit (``call_max_duration_s``) is
  ``call_wrap_up_s`` away: ``left_s``; the assistant is asked, at the next
  quiet moment, to say that the call ends soon (a ``response_create`` line follows).
* ``turn`` — a user turn whose reply was heard, once it is over (the user
  speaks again, or the call ends; ``t``: where its speech ended):
  ``turn``, ``first_audio_ms`` (to the reply's first sound) and, when a tool's
  output came first, ``answer_ms`` (to the first sound after it),
  ``tools_ms``, ``overhead_ms``, ``service_ms`` (``turn_latency.py``).
* ``usage_total`` — at the end (when any response carried usage): ``model``,
  ``responses``, ``tokens``, ``cost_usd``, ``budget_usd``; a Live call's
  (also when only audio was counted) ``audio_s``, the seconds of audio it counted.
* ``end`` — ``reason``, ``duration_s``, ``epoch``, ``reconnects``,
  ``tool_calls``, ``responses``, ``close_code``, ``feed_dropped``.

Never outputs, never keys; argument values only of reads, in ``tool_started``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import resource
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import orjson
import trio

from voiceactors import clock, safe_text, storage
from voiceactors.call.record_kind import URGENT_KINDS, RecordKind
from voiceactors.logs import get_logger

_log = get_logger(actor="call_record")

_SAFE_ID = re.compile(r"^[A-Za-z0-9_\-]{1,128}$")

#: Other lines wait at most this long for a flush.
BATCH_S = 1.0
#: At most this many record files are kept open (fewer under a low
#: ``RLIMIT_NOFILE``: an eighth of it). A record past it is fsynced by
#: reopening its file: at 256 that was every call past the 256th of a busy
#: process (4 % of a worker's CPU samples at 375 calls).
MAX_OPEN_FILES = 2048
#: Write passes start at least this far apart: urgent lines of many calls
#: ride in one worker-thread hop under load; a lone call's go out at once
#: (the first after a quiet spell) or at most this long after its last
#: pass, and so does a closing record's last pass (its close waits for it).
PASS_GAP_S = 0.01
#: ... and at least this far apart after a pass that carried more than one
#: record (under load): a thread hop costs the process ~75-130 us of CPU
#: (measured), so a burst's 100 hops a second became 20. An urgent
#: line of a loaded process is written at most this long (plus the pass's
#: own time) after it was added.
LOADED_PASS_GAP_S = 0.05
#: A grouped fsync pass also takes the files due within this long: one
#: worker-thread hop per burst of new calls instead of one per call.
FSYNC_RIDE_ALONG_S = 0.25
#: A grouped fsync pass with at least this many files due flushes each
#: folder's filesystem in one ``syncfs`` instead of an fsync per file (where
#: the platform has it, ``storage.syncfs``). Three syscalls a file each gave
#: the GIL to the worker thread and back: at 2,500 live calls 7,500 times a
#: second, and the trio thread waited on the GIL a seventh of its time.
#: Fewer files fsync one by one, which never waits on other writers' data.
SYNCFS_MIN_FILES = 16

#: A dataclass or a datetime is its ``str`` (json's ``default=str``), not
#: orjson's own rendering of it; each line ends in its newline.
_ORJSON_OPTIONS = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_APPEND_NEWLINE
#: The rare line orjson refuses (``render_line``): ASCII, so any str is encodable.
_FALLBACK_ENCODER = json.JSONEncoder(ensure_ascii=True, default=str)


def render_line(line: dict[str, Any]) -> bytes:
    """One line as its UTF-8 JSON text and a newline: compact, text
    unescaped, each value what ``json.dumps(line, ensure_ascii=False,
    default=str)`` gave (a dataclass, a datetime, a path: its ``str``; a
    NaN or an infinity, which JSON has no number for, is null). orjson
    renders it (~4 us for a round's nine lines, the json encoder ~35 us);
    what orjson refuses (an int past 64 bits, a key that
    is not a string, a lone surrogate, which UTF-8 has no bytes for) goes
    through the json encoder, escaped, instead of failing the record."""
    try:
        return orjson.dumps(line, default=str, option=_ORJSON_OPTIONS)
    except TypeError:             # orjson.JSONEncodeError
        return (_FALLBACK_ENCODER.encode(line) + "\n").encode("ascii")


def record_path(state_dir: Path, call_id: str) -> Path:
    """``<state_dir>/calls/<call_id>.jsonl``; an id that is not a plain token
    (it comes from the browser) is replaced by a readable, collision-free name."""
    if _SAFE_ID.match(call_id):
        name = call_id
    else:
        digest = hashlib.sha256(call_id.encode("utf-8", "replace")).hexdigest()[:16]
        name = re.sub(r"[^A-Za-z0-9_\-]", "_", call_id)[:64] + "-" + digest
    return Path(state_dir) / "calls" / f"{name}.jsonl"


def _ends_torn(path: Path) -> bool:
    """True when ``path`` exists, is not empty and does not end in a newline."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            if handle.tell() == 0:
                return False
            handle.seek(-1, os.SEEK_END)
            return handle.read(1) != b"\n"
    except FileNotFoundError:
        return False


def append_block(path: Path, lines: list[str], *, check_torn: bool = True) -> None:
    """Append ``lines`` (one write, one fsync), starting on a fresh line
    (``check_torn=False``: the caller knows the file ends in one: its own
    last append did)."""
    if check_torn and _ends_torn(path):
        lines = ["", *lines]   # append_lines turns "" into the missing "\n"
    storage.append_lines(path, lines)


@dataclass(slots=True)
class _Job:
    """One record's share of a write pass: built on the trio thread, done in
    the worker thread, read back on the trio thread."""

    record: CallRecord
    path: Path
    data: bytes
    count: int                 # lines in ``data``
    check_torn: bool           # the file may not end in "\n" (not our own last append)
    sync: bool                 # fsync before the record hears it is written
    final: bool                # the record's close: fsync and close the descriptor
    sync_dir: bool             # the file's name is not yet fsynced into its folder
    error: str | None = None   # the lines were not (all) written: they stay for the next pass
    sync_error: str | None = None   # written, but the fsync (or syncfs) failed: not known durable
    created: bool = False      # this pass created the file
    touched: bool = False      # a write was tried on an open descriptor (bytes may be unsynced)
    synced: bool = False       # the file (and, if it was new, its folder) is fsynced


def _max_open_files() -> int:
    """Descriptors kept open for live records: a small share of the limit,
    so records never starve the sockets of the calls they describe."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_OPEN_FILES
    return max(8, min(MAX_OPEN_FILES, soft // 8))


def _default_fsync_s() -> float:
    from voiceactors.settings import Settings   # the one declaration of the default
    return float(Settings.__dataclass_fields__["call_record_fsync_s"].metadata["default"])


class RecordWriter:
    """The one writer of every call record of a trio run (see the module
    docstring). ``want(record, urgent)`` asks for a record's waiting lines
    to be written: at once when urgent, else within ``BATCH_S``; ``passes``
    counts the write passes (thread hops), ``fsync_passes`` the grouped
    fsync passes. It lives while records do: once every record has closed,
    nothing waits and nothing is left to fsync, it retires, and the next
    record starts it again (so no task outlives the calls).

    ``fsync`` (``os.fsync`` unless given) is called with a descriptor for
    every fsync the writer makes, files and folders alike, and ``syncfs``
    (``storage.syncfs`` unless given; ``None``: never) with a folder's
    descriptor for a grouped pass of ``SYNCFS_MIN_FILES`` or more: seams for
    tests, which pass real functions that count. ``max_open`` bounds the
    descriptors kept open (least recently written closed first)."""

    def __init__(self, *, fsync: Callable[[int], None] = os.fsync,
                 syncfs: Callable[[int], None] | None = storage.syncfs,
                 max_open: int | None = None) -> None:
        self._fsync = fsync
        self._syncfs = syncfs
        self._max_open = _max_open_files() if max_open is None else max_open
        self._waiting: dict[CallRecord, float] = {}   # record -> when it is due (insertion order)
        self._wake = trio.Event()
        self._sleep_until = math.inf
        self._records = 0                               # records made and not yet closed
        self._running = False
        # the fsync schedule (trio thread): path -> when it is due; folders of new files
        self._unsynced: dict[Path, float] = {}
        self._unsynced_dirs: set[Path] = set()
        self._fsync_wake = trio.Event()
        self._fsync_sleep_until = math.inf
        self._fsyncing = False
        # descriptors per record, touched only by the write pass (one at a time)
        self._fds: OrderedDict[CallRecord, int] = OrderedDict()
        self._next_pass_at = -math.inf                  # last_gap_s after the last pass began
        self.last_gap_s = PASS_GAP_S                    # the gap the last pass set (PASS_GAP_S or LOADED_PASS_GAP_S)
        self.passes = 0
        self.fsync_passes = 0
        self.retired = trio.Event()                     # its task has ended (a writer runs once)

    @property
    def open_files(self) -> int:
        return len(self._fds)

    def join(self) -> None:
        self._records += 1
        if not self._running:
            self._running = True
            trio.lowlevel.spawn_system_task(self.run, name="call-record-writer")

    def leave(self) -> None:
        self._records -= 1
        if self._records <= 0:
            self._wake.set()           # maybe time to retire
            self._fsync_wake.set()     # nothing live: what is left is fsynced now

    def want(self, record: CallRecord, *, urgent: bool, at_once: bool = False) -> None:
        """``at_once``: a pass now, whatever ``PASS_GAP_S`` says (a close
        waits for it; a live call's lines do not wait for anything)."""
        if not at_once:
            # Most lines find their record already waiting, due no later
            # than they would make it: nothing to do (no clock read).
            waiting = self._waiting.get(record)
            if waiting is not None and (not urgent or waiting <= self._next_pass_at):
                return
        now = trio.current_time()
        if at_once or (urgent and self._next_pass_at <= now):
            due = -math.inf
        else:
            due = self._next_pass_at if urgent else now + BATCH_S
        self._waiting[record] = min(due, self._waiting.get(record, math.inf))
        if due < self._sleep_until:
            self._wake.set()

    async def run(self) -> None:
        try:
            while True:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._fsync_loop)
                    while await self._until_due():
                        await self._write_pass()
                    nursery.cancel_scope.cancel()   # idle by the check: no fsync under way
                if self._idle():                    # still, after the nursery's exit (a checkpoint)
                    self._running = False
                    if _WRITER.get(None) is self:
                        _WRITER.set(None)  # in the same step as the check: a new record starts a new writer
                    return
        finally:
            self._at_exit()
            self.retired.set()

    def lines_waiting(self) -> bool:
        """Whether some record has lines not yet handed to a write pass (a
        pass under way is a worker thread at work: ``storage.threads_at_work``)."""
        return bool(self._waiting)

    def _idle(self) -> bool:
        return (not self._waiting and self._records <= 0 and not self._fsyncing
                and not self._unsynced and not self._unsynced_dirs)

    # --- writes ---------------------------------------------------------------------

    async def _write_pass(self) -> None:
        waiting = list(self._waiting)    # every waiting record rides along: one hop for all
        self._waiting.clear()
        jobs = []
        for record in waiting:
            job = record._take()
            job.sync_dir = job.path.parent in self._unsynced_dirs
            jobs.append(job)
        # under load (more than one record in this pass) the next pass waits
        # longer: fewer thread hops, each carrying more calls' lines
        self.last_gap_s = PASS_GAP_S if len(jobs) <= 1 else LOADED_PASS_GAP_S
        self._next_pass_at = trio.current_time() + self.last_gap_s
        try:
            await storage.run_sync(self._write_jobs, jobs, cancellable=False)
        except Exception as exc:  # noqa: BLE001 - a system task must not die: every record hears of it
            for job in jobs:
                job.error = job.error or f"{type(exc).__name__}: {exc}"
        self.passes += 1
        now = trio.current_time()
        for job in jobs:
            self._schedule_fsync(job, now)
            job.record._written(job)

    def _schedule_fsync(self, job: _Job, now: float) -> None:
        if job.created:
            self._unsynced_dirs.add(job.path.parent)
        if job.synced:
            self._unsynced.pop(job.path, None)
            self._unsynced_dirs.discard(job.path.parent)
        elif job.touched:          # something may sit in the page cache only
            due = now + job.record.fsync_s
            if due < self._unsynced.get(job.path, math.inf):
                self._unsynced[job.path] = due
                if due < self._fsync_sleep_until:
                    self._fsync_wake.set()

    def _write_jobs(self, jobs: list[_Job]) -> None:
        """The worker thread's part of a pass: each job's block appended on
        the record's kept descriptor (opened when it has none), then the
        fsyncs the jobs ask for (every write of the pass is in the page
        cache before the first fsync starts). One file's failure is its own."""
        for job in jobs:
            if job.error is not None:
                continue                      # its lines could not be rendered
            try:
                self._append(job)
            except OSError as exc:
                job.error = str(exc)
                self._close_fd(job.record)    # reopened (and checked for a torn line) next time
        to_sync = [job for job in jobs if job.sync and job.touched and job.error is None]
        if self._by_filesystem(len(to_sync)):
            self._sync_jobs_by_filesystem(to_sync)     # many closes at once (a shutdown), or fsync_s=0
        else:
            for job in to_sync:
                try:
                    self._sync(job)
                except OSError as exc:
                    job.sync_error = str(exc)
        for job in jobs:
            if job.final:
                self._close_fd(job.record)

    def _append(self, job: _Job) -> None:
        if not job.data and not job.final:
            return
        data = job.data
        if job.check_torn and data and _ends_torn(job.path):
            data = b"\n" + data
        fd = self._fds.get(job.record)
        if fd is None:
            fd, job.created = storage.open_append(job.path)
            self._fds[job.record] = fd
            while len(self._fds) > self._max_open:    # the least recently written goes (its lines are written)
                self._close_fd(next(iter(self._fds)))
        else:
            self._fds.move_to_end(job.record)
        job.touched = True
        storage.write_all(fd, data)

    def _sync(self, job: _Job) -> None:
        fd = self._fds.get(job.record)
        if fd is None:                   # closed meanwhile for a later job's open: by its path
            self._fsync_by_path(job.path)
        else:
            self._fsync(fd)
        if job.created or job.sync_dir:
            self._fsync_folder(job.path.parent)
        job.synced = True

    def _close_fd(self, record: CallRecord) -> None:
        fd = self._fds.pop(record, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    # --- fsyncs ---------------------------------------------------------------------

    async def _fsync_loop(self) -> None:
        """Fsync each file written since its last fsync once it is due
        (``fsync_s`` after its first unsynced write), all due files in one
        worker-thread hop; everything at once when no record is live."""
        while True:
            now = trio.current_time()
            idle = self._records <= 0 and not self._waiting
            due = [path for path, at in self._unsynced.items() if idle or at <= now]
            if due and not idle:
                # Files due soon ride along in this hop (early is never less
                # safe): calls joining 10 ms apart were one hop each.
                soon = now + FSYNC_RIDE_ALONG_S
                due += [path for path, at in self._unsynced.items() if now < at <= soon]
            if due or (idle and self._unsynced_dirs):
                for path in due:
                    del self._unsynced[path]
                folders = {path.parent for path in due if path.parent in self._unsynced_dirs}
                if idle:
                    folders |= self._unsynced_dirs
                self._unsynced_dirs -= folders
                self._fsyncing = True
                try:
                    errors = await storage.run_sync(self._fsync_paths, due, sorted(folders), cancellable=False)
                except Exception as exc:  # noqa: BLE001 - a system task must not die
                    errors = [f"{type(exc).__name__}: {exc}"]
                finally:
                    self._fsyncing = False
                self.fsync_passes += 1
                for error in errors:
                    _log.error("call.record_fsync_failed", error=error)
                self._wake.set()               # the write loop may retire now
                continue
            self._fsync_sleep_until = min(self._unsynced.values(), default=math.inf)
            self._fsync_wake = trio.Event()
            with trio.move_on_at(self._fsync_sleep_until):
                await self._fsync_wake.wait()
            self._fsync_sleep_until = math.inf

    def _fsync_paths(self, paths: list[Path], folders: list[Path]) -> list[str]:
        """Fsync each file by its path (its own descriptor: the write pass
        owns the kept ones), then each folder; the errors, one per failure.
        Many files: one ``syncfs`` per folder instead (``SYNCFS_MIN_FILES``)."""
        if self._by_filesystem(len(paths)):
            by_folder = self._syncfs_folders([path.parent for path in paths] + folders)
            return [error for error in by_folder.values() if error is not None]
        errors = []
        for path in paths:
            try:
                self._fsync_by_path(path)
            except OSError as exc:
                errors.append(f"{path.name}: {exc}")
        for folder in folders:
            try:
                self._fsync_folder(folder)
            except OSError as exc:
                errors.append(f"{folder.name}/: {exc}")
        return errors

    def _by_filesystem(self, files: int) -> bool:
        """Whether ``files`` files are made durable by one ``syncfs`` per
        folder rather than an fsync each (``SYNCFS_MIN_FILES``)."""
        return self._syncfs is not None and files >= SYNCFS_MIN_FILES

    def _sync_jobs_by_filesystem(self, jobs: list[_Job]) -> None:
        """A write pass's fsyncs for many jobs: one ``syncfs`` per folder
        (with its name: a new file's entry is in the flush); a folder's
        failure is each of its jobs' error, as an fsync's is its file's."""
        errors = self._syncfs_folders([job.path.parent for job in jobs])
        for job in jobs:
            job.sync_error = errors[job.path.parent]
            job.synced = job.sync_error is None

    def _syncfs_folders(self, folders: list[Path]) -> dict[Path, str | None]:
        """One ``syncfs`` per distinct folder: it flushes every dirty file
        and folder of that filesystem, so what an fsync of each file there
        would make durable is, in one syscall. Each folder's error text, or
        None."""
        assert self._syncfs is not None
        errors: dict[Path, str | None] = {}
        for folder in sorted(set(folders)):
            try:
                self._call_on(folder, self._syncfs)
                errors[folder] = None
            except OSError as exc:
                errors[folder] = f"{folder.name}/ (syncfs): {exc}"
        return errors

    def _fsync_by_path(self, path: Path) -> None:
        self._call_on(path, self._fsync)

    @staticmethod
    def _call_on(path: Path, call: Callable[[int], None]) -> None:
        """``call`` on a descriptor of ``path`` of its own, closed after."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            call(fd)
        finally:
            os.close(fd)

    def _fsync_folder(self, folder: Path) -> None:
        self._fsync_by_path(folder)

    # --- lifetime -------------------------------------------------------------------

    async def _until_due(self) -> bool:
        """Wait until a record is due (True), or retire (False)."""
        while True:
            if self._idle():
                return False
            due = min(self._waiting.values(), default=math.inf)
            if due <= trio.current_time():
                return True
            self._sleep_until = due
            self._wake = trio.Event()
            with trio.move_on_at(due):
                await self._wake.wait()
            self._sleep_until = math.inf

    def _at_exit(self) -> None:
        """The run is ending (its system tasks cancelled) or the writer
        retired (then nothing is left): close every kept descriptor and,
        blocking as the last act of the run, fsync what is still unsynced."""
        self._running = False
        for record in list(self._fds):
            self._close_fd(record)
        paths, folders = list(self._unsynced), sorted(self._unsynced_dirs)
        self._unsynced.clear()
        self._unsynced_dirs.clear()
        for error in self._fsync_paths(paths, folders):
            _log.error("call.record_fsync_failed", error=error)


_WRITER: trio.lowlevel.RunVar[RecordWriter | None] = trio.lowlevel.RunVar("voiceactors_record_writer")


async def writer_retired(timeout_s: float) -> bool:
    """Wait, shielded and at most ``timeout_s``, for this run's record writer
    to retire once no record is live any more (its last fsyncs done): a
    stopping runtime leaves no writer task behind. False when it is still
    running (a record is live elsewhere in the run, or the bound passed)."""
    writer = _WRITER.get(None)
    if writer is None or not writer._running:
        return True
    if writer._records > 0:
        return False
    with trio.move_on_after(timeout_s, shield=True):
        await writer.retired.wait()
    return writer.retired.is_set()


def shared_writer() -> RecordWriter:
    """This trio run's record writer (its task starts with the first record
    that joins it, a system task: no call's nursery has to hold it; it
    retires when the last record has closed)."""
    writer = _WRITER.get(None)
    if writer is None:
        writer = RecordWriter()
        _WRITER.set(writer)
    return writer


class CallRecord:
    """The record of one actor run. ``add`` never blocks; the run's shared
    ``RecordWriter`` writes; ``close`` flushes the rest.

    ``write_now``: write from the start (a rejoin: the file exists); otherwise
    nothing is written until ``opened()`` (the first connect)."""

    def __init__(self, call_id: str, state_dir: Path, *, started: float | None = None,
                 write_now: bool = False, fsync_s: float | None = None,
                 writer: RecordWriter | None = None, **start_fields: object) -> None:
        self.call_id = call_id
        self.path = record_path(state_dir, call_id)
        self.started = trio.current_time() if started is None else started
        self.lines: list[dict[str, Any]] = []      # every line of this run, in order
        self._flushed = 0                           # how many of ``lines`` are on disk
        self._taken = 0                             # how many a pass under way is writing
        self._fresh_line = False                    # our own append ended the file with "\n"
        self._open = write_now
        self._closing = False                       # close() asked for the last pass
        self._final = False                         # the last pass is done: written, fsynced, fd closed
        self._final_taken = False                   # a pass took the last job (closing, the file to close)
        self._final_tried = False                   # that pass is over (``_final`` says whether it succeeded)
        #: how long a written line may wait for its fsync (``call_record_fsync_s``; 0: before it counts as written)
        self.fsync_s = _default_fsync_s() if fsync_s is None else fsync_s
        self._pass_done: trio.Event | None = None   # set by the next pass's end (made only when close waits)
        self._writer = shared_writer() if writer is None else writer
        self._writer.join()
        self._closed = False
        self.flushes = 0
        self.failed: str | None = None
        self.lines.append({"kind": RecordKind.START, "t": 0.0, "call_id": call_id,
                           "at": clock.now_utc().isoformat(timespec="seconds"), **start_fields})
        if write_now:
            self._writer.want(self, urgent=True)

    def add(self, kind: RecordKind, **fields: object) -> None:
        self.add_fields(kind, fields)

    def add_fields(self, kind: RecordKind, fields: dict[str, Any], *, t: float | None = None) -> None:
        """``add`` with the fields as a dict (copied into the line). ``kind``
        is a ``RecordKind`` (a member is its string: the same bytes;
        ``tests/test_record_kind.py`` checks every line a call writes is a
        member). The line's
        ``kind`` and ``t`` are the record's: a field naming either is a
        caller's bug (ValueError, nothing added; it used to replace them
        silently). ``t``: a moment already past, in seconds since the start
        (a line written at the end about something earlier); None: now."""
        if "kind" in fields or "t" in fields:
            raise ValueError(f"a {kind!r} record line's fields may not set "
                             f"{', '.join(name for name in ('kind', 't') if name in fields)}")
        at = round(trio.current_time() - self.started, 3) if t is None else t
        self.lines.append({"kind": kind, "t": at, **fields})
        if self._open:
            self._writer.want(self, urgent=kind in URGENT_KINDS)

    def opened(self) -> None:
        """The call connected: from now on the record is written."""
        if not self._open:
            self._open = True
            self._writer.want(self, urgent=True)

    def _take(self) -> _Job:
        """The writer takes the lines not yet on disk (rendered on the trio thread)."""
        batch = self.lines[self._flushed:] if self._open else []
        self._taken = len(batch)
        final = self._closing and self._open
        self._final_taken = self._final_taken or final
        error = None
        try:
            # rendered lines never hold a raw newline: each ends in its own one
            data = b"".join(map(render_line, batch))
        except Exception as exc:  # noqa: BLE001 - a line that cannot be rendered fails its record only
            data, error = b"", f"{type(exc).__name__}: {exc}"
        return _Job(self, self.path, data, len(batch), check_torn=not self._fresh_line,
                    sync=final or self.fsync_s <= 0, final=final, sync_dir=False, error=error)

    def _written(self, job: _Job) -> None:
        """A pass is done with this record's job. Lines whose write failed
        stay in memory for the next pass; lines written whose fsync failed
        are on file (written again they would be there twice): counted as
        written, ``failed`` says they are not known durable, and the writer
        fsyncs them again later."""
        self._taken = 0
        if job.error is not None:
            self.failed = job.error
            self._fresh_line = False  # a short write may have left a torn line
        else:
            self.failed = job.sync_error
            if job.count:
                self._flushed += job.count
                self._fresh_line = True
                self.flushes += 1
        self._final = self._final or (job.final and self.failed is None)
        self._final_tried = self._final_tried or job.final
        if self._pass_done is not None:
            self._pass_done.set()
            self._pass_done = None

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Kept for the actor's task layout: the writing is the shared
        writer's (``RecordWriter``), so this only reports started."""
        task_status.started()

    async def close(self) -> bool:
        """Flush everything and fsync it (whatever ``fsync_s``), close the
        file; True when something was written (False: the call never
        connected, nothing on disk). One write is tried here (whatever
        failed before); if it fails, ``failed`` tells the caller (and what
        did reach the file is still fsynced, in the background)."""
        # Shielded like any write of ours: the last flush (the ``end`` line)
        # is not cut short by the caller's deadline once it is under way.
        with trio.CancelScope(shield=True):
            # a stat of our own state directory: cheap enough for the trio thread (no hop)
            if not self._open and self.path.exists():
                self._open = True   # never connected, but the id has a history: the run belongs in it
            try:
                self._closing = True       # the last pass writes the rest, fsyncs and closes the file
                while self._open and not self._final:
                    # A pass that took the lines before ``_closing`` was not the last one:
                    # the last pass is still asked for. Once it is under way it is only
                    # waited for (asked again, a pass after it would write the lines twice).
                    if self._final_tried:
                        break              # the disk refused: the caller logs ``failed``
                    done = self._pass_done = self._pass_done or trio.Event()
                    if not self._final_taken:
                        self._writer.want(self, urgent=True, at_once=True)
                    await done.wait()
            finally:
                if not self._closed:
                    self._closed = True
                    self._writer.leave()
        return self._open


def read_record(path: Path) -> list[dict[str, Any]]:
    """The lines of a record file, every block in order. A line that does
    not parse as a JSON object (torn by a crash mid-append) is skipped."""
    return parse_record(Path(path).read_text(encoding="utf-8", errors="replace"))


def parse_record(text: str) -> list[dict[str, Any]]:
    """``read_record`` for a record's text already read. A lone surrogate's
    escape (``render_line``'s fallback wrote one for text that came in
    before ``safe_text``) reads as U+FFFD."""
    lines: list[dict[str, Any]] = []
    for raw in storage.jsonl_lines(text):
        if not raw.strip():
            continue
        try:
            line = safe_text.loads(raw)
        except ValueError:
            continue
        if isinstance(line, dict):
            lines.append(line)
    return lines


def last_block(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The lines of the last run (from its ``start``)."""
    starts = [i for i, line in enumerate(lines) if line.get("kind") == RecordKind.START]
    return lines[starts[-1]:] if starts else []
