"""The call record: what one CallActor run did, as JSON lines.

``<state_dir>/calls/<call_id>.jsonl``, written AS THE CALL GOES by ONE
background writer shared by every call of the process (``RecordWriter``, a
trio system task started with the first record of a run and retired once
every record has closed) with ``storage.append_lines``: the ``start`` line,
each ``tool_started`` and each ``tool_call`` line are flushed at once (a kill -9 must find them), the other
lines ride along with the next flush or within ``BATCH_S``. Each pass of the
writer takes every record with lines waiting and writes them all in one
worker thread (one append and one fsync per file), so a burst of calls, or a
busy call, groups its fsyncs and costs the trio thread one thread hop per
pass instead of one per flush of each call. Lines added while a pass is in
progress go out in the next one. Nothing is written for a call whose
sideband never connected (a bogus ``/connect`` leaves no file), unless the
call id already has a record (a rejoin, or a later actor that finds the call
gone): then the run's block is its history.

Every flush starts on a fresh line: if the file does not end in ``\\n`` (a
torn last line left by a crash), the block begins with one. ``read_record``
skips a torn line instead of failing.

A later actor for the same call id appends its own block, so a file is the
history of every run for that id; every block starts with a ``start`` line
and, unless the server died during it, ends with an ``end`` line. A block
without an ``end`` is a run that crashed: the next server rejoins the call
(``recovery.py``) and its block starts with ``"rejoined": true``.

Line kinds (``kind``), each with ``t`` (seconds since the actor started, trio
clock):

* ``start`` — ``call_id``, ``at`` (UTC wall clock), ``rejoined`` (true when
  this run picks up a call live at a crash), ``recovered`` (tool call ids it
  answers for the crashed run).
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
* ``budget`` — the call's cost reached its budget: ``budget_usd``, ``cost_usd``.
* ``usage_total`` — at the end (when any response carried usage): ``model``,
  ``responses``, ``tokens``, ``cost_usd``, ``budget_usd``.
* ``end`` — ``reason``, ``duration_s``, ``epoch``, ``reconnects``,
  ``tool_calls``, ``responses``, ``close_code``, ``feed_dropped``.

Never outputs, never keys; argument values only of reads, in ``tool_started``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import trio

from voiceactors import clock, storage

_SAFE_ID = re.compile(r"^[A-Za-z0-9_\-]{1,128}$")

#: Kinds flushed at once (the ones a restart needs).
URGENT_KINDS = frozenset({"start", "tool_started", "tool_call", "end"})
#: Other lines wait at most this long for a flush.
BATCH_S = 1.0


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


def _append_all(blocks: list[tuple[Path, list[str], bool]]) -> list[str | None]:
    """Each block appended to its file (in a worker thread); per block None
    or the error that kept it off the disk (one file's failure is its own)."""
    errors: list[str | None] = []
    for path, lines, check_torn in blocks:
        try:
            append_block(path, lines, check_torn=check_torn)
            errors.append(None)
        except OSError as exc:
            errors.append(str(exc))
    return errors


class RecordWriter:
    """The one writer of every call record of a trio run (see the module
    docstring). ``want(record, urgent)`` asks for a record's waiting lines
    to be written: at once when urgent, else within ``BATCH_S``; ``passes``
    counts the thread hops. It lives while records do: once every record
    has closed and nothing waits, it retires, and the next record starts a
    new one (so no task outlives the calls)."""

    def __init__(self) -> None:
        self._waiting: dict[CallRecord, float] = {}   # record -> when it is due (insertion order)
        self._wake = trio.Event()
        self._sleep_until = math.inf
        self._records = 0                               # records made and not yet closed
        self.passes = 0

    def join(self) -> None:
        self._records += 1

    def leave(self) -> None:
        self._records -= 1
        if self._records <= 0:
            self._wake.set()           # maybe time to retire

    def want(self, record: CallRecord, *, urgent: bool) -> None:
        due = -math.inf if urgent else trio.current_time() + BATCH_S
        self._waiting[record] = min(due, self._waiting.get(record, math.inf))
        if due < self._sleep_until:
            self._wake.set()

    async def run(self) -> None:
        while await self._until_due():
            waiting = list(self._waiting)    # every waiting record rides along: one hop for all
            self._waiting.clear()
            batch, blocks = [], []
            for record in waiting:
                try:
                    blocks.append(record._take())
                    batch.append(record)
                except Exception as exc:  # noqa: BLE001 - a line that cannot be rendered fails its record only
                    record._written(0, f"{type(exc).__name__}: {exc}")
            try:
                errors = await storage.run_sync(_append_all, blocks, cancellable=False)
            except Exception as exc:  # noqa: BLE001 - a system task must not die: every record hears of it
                errors = [f"{type(exc).__name__}: {exc}"] * len(batch)
            self.passes += 1
            for record, (_path, lines, _check), error in zip(batch, blocks, errors):
                record._written(len(lines), error)

    async def _until_due(self) -> bool:
        """Wait until a record is due (True), or retire (False)."""
        while True:
            if not self._waiting and self._records <= 0:
                if _WRITER.get(None) is self:
                    _WRITER.set(None)  # in the same step as the check: a new record starts a new writer
                return False
            due = min(self._waiting.values(), default=math.inf)
            if due <= trio.current_time():
                return True
            self._sleep_until = due
            self._wake = trio.Event()
            with trio.move_on_at(due):
                await self._wake.wait()
            self._sleep_until = math.inf


_WRITER: trio.lowlevel.RunVar[RecordWriter | None] = trio.lowlevel.RunVar("voiceactors_record_writer")


def shared_writer() -> RecordWriter:
    """This trio run's record writer, started on first use (a system task:
    no call's nursery has to hold it; it retires when the last record has
    closed)."""
    writer = _WRITER.get(None)
    if writer is None:
        writer = RecordWriter()
        _WRITER.set(writer)
        trio.lowlevel.spawn_system_task(writer.run, name="call-record-writer")
    return writer


class CallRecord:
    """The record of one actor run. ``add`` never blocks; the run's shared
    ``RecordWriter`` writes; ``close`` flushes the rest.

    ``write_now``: write from the start (a rejoin: the file exists); otherwise
    nothing is written until ``opened()`` (the first connect)."""

    def __init__(self, call_id: str, state_dir: Path, *, started: float | None = None,
                 write_now: bool = False, **start_fields: Any) -> None:
        self.call_id = call_id
        self.path = record_path(state_dir, call_id)
        self.started = trio.current_time() if started is None else started
        self.lines: list[dict[str, Any]] = []      # every line of this run, in order
        self._flushed = 0                           # how many of ``lines`` are on disk
        self._taken = 0                             # how many a pass under way is writing
        self._fresh_line = False                    # our own append ended the file with "\n"
        self._open = write_now
        self._pass_done = trio.Event()
        self._writer = shared_writer()
        self._writer.join()
        self._closed = False
        self.flushes = 0
        self.failed: str | None = None
        self.lines.append({"kind": "start", "t": 0.0, "call_id": call_id,
                           "at": clock.now_utc().isoformat(timespec="seconds"), **start_fields})
        if write_now:
            self._writer.want(self, urgent=True)

    def add(self, kind: str, **fields: Any) -> None:
        self.lines.append({"kind": kind, "t": round(trio.current_time() - self.started, 3), **fields})
        if self._open:
            self._writer.want(self, urgent=kind in URGENT_KINDS)

    def opened(self) -> None:
        """The call connected: from now on the record is written."""
        if not self._open:
            self._open = True
            self._writer.want(self, urgent=True)

    def render(self, lines: list[dict[str, Any]]) -> list[str]:
        return [json.dumps(line, ensure_ascii=False, default=str) for line in lines]

    def _take(self) -> tuple[Path, list[str], bool]:
        """The writer takes the lines not yet on disk (rendered on the trio thread)."""
        batch = self.lines[self._flushed:] if self._open else []
        self._taken = len(batch)
        return self.path, self.render(batch), not self._fresh_line

    def _written(self, count: int, error: str | None) -> None:
        self._taken = 0
        if error is not None:
            self.failed = error       # the lines stay in memory; the next flush tries again
        elif count:
            self.failed = None
            self._flushed += count
            self._fresh_line = True
            self.flushes += 1
        self._pass_done.set()
        self._pass_done = trio.Event()

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Kept for the actor's task layout: the writing is the shared
        writer's (``RecordWriter``), so this only reports started."""
        task_status.started()

    async def close(self) -> bool:
        """Flush everything; True when something was written (False: the
        call never connected, nothing on disk). One write is tried here
        (whatever failed before); if it fails, ``failed`` tells the caller."""
        # Shielded like any write of ours: the last flush (the ``end`` line)
        # is not cut short by the caller's deadline once it is under way.
        with trio.CancelScope(shield=True):
            # a stat of our own state directory: cheap enough for the trio thread (no hop)
            if not self._open and self.path.exists():
                self._open = True   # never connected, but the id has a history: the run belongs in it
            try:
                tried = False
                while self._open and self._flushed < len(self.lines):
                    if tried and self.failed is not None:
                        break              # the disk refuses: the caller logs ``failed``
                    tried = True
                    done = self._pass_done
                    self._writer.want(self, urgent=True)
                    await done.wait()
            finally:
                if not self._closed:
                    self._closed = True
                    self._writer.leave()
        return self._open


def read_record(path: Path) -> list[dict[str, Any]]:
    """The lines of a record file, every block in order. A line that does
    not parse as a JSON object (torn by a crash mid-append) is skipped."""
    lines: list[dict[str, Any]] = []
    for raw in storage.jsonl_lines(Path(path).read_text(encoding="utf-8", errors="replace")):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if isinstance(line, dict):
            lines.append(line)
    return lines


def last_block(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The lines of the last run (from its ``start``)."""
    starts = [i for i, line in enumerate(lines) if line.get("kind") == "start"]
    return lines[starts[-1]:] if starts else []
