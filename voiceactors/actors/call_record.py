"""The call record: what one CallActor run did, as JSON lines.

Written once, when the actor ends, to ``<state_dir>/calls/<call_id>.jsonl``
with ``storage.append_lines`` (the block appended, one fsync). A later actor
for the same call id appends its own block, so a file is the history of every
run for that id; every block starts with a ``start`` line and ends with an
``end`` line.

Line kinds (``kind``), each with ``t`` (seconds since the actor started, trio
clock):

* ``start`` — ``call_id``, ``at`` (UTC wall clock).
* ``connect`` — ``attempt`` (1 = first connect after a success or the start).
* ``reconnect`` — ``attempt``, ``delay_s``, ``close_code`` (None for a failed handshake).
* ``response`` — ``response_id``, ``status``, ``epoch``, ``origin``
  (``ours``|``model``), ``tool_calls`` (ids), ``follow_up``.
* ``response_create`` — ``event_id``, ``epoch``, ``for`` (response ids),
  ``result`` (``sent``|``rejected_active``|``lost``).
* ``tool_call`` — ``tool_call_id``, ``tool``, ``response_id``, ``epoch``,
  ``turn``, ``duration_ms``, ``outcome``, ``output_bytes``, ``sends``,
  ``delivered`` (confirmed by the service), ``synthetic``.
* ``end`` — ``reason``, ``duration_s``, ``epoch``, ``reconnects``,
  ``tool_calls``, ``responses``, ``feed_dropped``.

Never argument values, never outputs, never keys.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from voiceactors import clock, storage

_SAFE_ID = re.compile(r"^[A-Za-z0-9_\-]{1,128}$")


def record_path(state_dir: Path, call_id: str) -> Path:
    """``<state_dir>/calls/<call_id>.jsonl``; an id that is not a plain token
    (it comes from the browser) is replaced by a readable, collision-free name."""
    if _SAFE_ID.match(call_id):
        name = call_id
    else:
        digest = hashlib.sha256(call_id.encode("utf-8", "replace")).hexdigest()[:16]
        name = re.sub(r"[^A-Za-z0-9_\-]", "_", call_id)[:64] + "-" + digest
    return Path(state_dir) / "calls" / f"{name}.jsonl"


@dataclass
class CallRecord:
    """Lines collected in memory during a call, written once at the end."""

    call_id: str
    started: float = field(default_factory=trio.current_time)
    lines: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.lines.append({"kind": "start", "t": 0.0, "call_id": self.call_id,
                           "at": clock.now_utc().isoformat(timespec="seconds")})

    def add(self, kind: str, **fields: Any) -> None:
        self.lines.append({"kind": kind, "t": round(trio.current_time() - self.started, 3), **fields})

    def render(self) -> list[str]:
        return [json.dumps(line, ensure_ascii=False, sort_keys=False, default=str) for line in self.lines]

    async def write(self, state_dir: Path) -> Path:
        """Append every line to the record file in one write and one fsync.
        Not cancellable once started (a half-written record is worse than a
        late one); the caller bounds it."""
        path = record_path(state_dir, self.call_id)
        await storage.run_sync(storage.append_lines, path, self.render(), cancellable=False)
        return path


def read_record(path: Path) -> list[dict[str, Any]]:
    """The lines of a record file (tests and tooling)."""
    return [json.loads(line) for line in storage.jsonl_lines(Path(path).read_text(encoding="utf-8")) if line.strip()]
