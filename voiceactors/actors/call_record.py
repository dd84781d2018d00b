"""The call record: what one CallActor run did, as JSON lines.

``<state_dir>/calls/<call_id>.jsonl``, written AS THE CALL GOES by a
background writer (``CallRecord.run``) with ``storage.append_lines``: the
``start`` line, each ``tool_started`` and each ``tool_call`` line are flushed
at once (a kill -9 must find them), the other lines ride along with the next
flush or within ``BATCH_S``. Lines added while a flush is in progress go
out together in the next one, so a busy call groups its fsyncs. Nothing is
written for a call whose sideband never connected (a bogus ``/connect``
leaves no file), unless the call id already has a record (a rejoin, or a
later actor that finds the call gone): then the run's block is its history.

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


def append_block(path: Path, lines: list[str]) -> None:
    """Append ``lines`` (one write, one fsync), starting on a fresh line."""
    if _ends_torn(path):
        lines = ["", *lines]   # append_lines turns "" into the missing "\n"
    storage.append_lines(path, lines)


class CallRecord:
    """The record of one actor run. ``add`` never blocks; ``run`` (a task of
    the actor) writes; ``close`` flushes the rest and stops ``run``.

    ``write_now``: write from the start (a rejoin: the file exists); otherwise
    nothing is written until ``opened()`` (the first connect)."""

    def __init__(self, call_id: str, state_dir: Path, *, started: float | None = None,
                 write_now: bool = False, **start_fields: Any) -> None:
        self.call_id = call_id
        self.path = record_path(state_dir, call_id)
        self.started = trio.current_time() if started is None else started
        self.lines: list[dict[str, Any]] = []      # every line of this run, in order
        self._flushed = 0                           # how many of ``lines`` are on disk
        self._open = write_now
        self._closing = False
        self._wake = trio.Event()
        self._urgent = trio.Event()
        self._done = trio.Event()
        self.flushes = 0
        self.failed: str | None = None
        self.lines.append({"kind": "start", "t": 0.0, "call_id": call_id,
                           "at": clock.now_utc().isoformat(timespec="seconds"), **start_fields})
        if write_now:
            self._signal(urgent=True)

    def add(self, kind: str, **fields: Any) -> None:
        self.lines.append({"kind": kind, "t": round(trio.current_time() - self.started, 3), **fields})
        if self._open:
            self._signal(urgent=kind in URGENT_KINDS)

    def opened(self) -> None:
        """The call connected: from now on the record is written."""
        if not self._open:
            self._open = True
            self._signal(urgent=True)

    def _signal(self, *, urgent: bool) -> None:
        self._wake.set()
        if urgent:
            self._urgent.set()

    def render(self, lines: list[dict[str, Any]]) -> list[str]:
        return [json.dumps(line, ensure_ascii=False, default=str) for line in lines]

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write lines as they come until ``close``. Each append runs in a
        worker thread and is not cancellable once started (a half-written
        block is worse than a late one); the caller bounds ``close``."""
        task_status.started()
        try:
            while True:
                await self._wake.wait()
                if not self._urgent.is_set() and not self._closing:
                    with trio.move_on_after(BATCH_S):
                        await self._urgent.wait()
                self._wake = trio.Event()
                self._urgent = trio.Event()
                ok = await self._flush()
                if self._closing and (not ok or not self._open or self._flushed == len(self.lines)):
                    return   # done, or the disk refuses: the caller logs ``failed``
        finally:
            self._done.set()

    async def _flush(self) -> bool:
        if not self._open or self._flushed == len(self.lines):
            return True
        batch = self.lines[self._flushed:]
        try:
            await storage.run_sync(append_block, self.path, self.render(batch), cancellable=False)
        except OSError as exc:
            self.failed = str(exc)   # the lines stay in memory; the next flush tries again
            return False
        self.failed = None
        self._flushed += len(batch)
        self.flushes += 1
        return True

    async def close(self) -> bool:
        """Flush everything and stop the writer; True when something was
        written (False: the call never connected, nothing on disk)."""
        self._closing = True
        # Shielded like any write of ours: the last flush (the ``end`` line)
        # is not cut short by the caller's deadline once it is under way.
        with trio.CancelScope(shield=True):
            if not self._open and await storage.run_sync(self.path.exists, cancellable=False):
                self._open = True   # never connected, but the id has a history: the run belongs in it
            self._signal(urgent=True)
            await self._done.wait()
            if self._open and self._flushed < len(self.lines) and self.failed is None:
                await self._flush()   # the writer was cancelled (the actor's own deadline)
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
