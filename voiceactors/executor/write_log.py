"""The durable record of tool writes, keyed by the model's tool call id.

``<state_dir>/tool-writes/<sha256(tool_call_id)>.json`` holds what a write
answered. ``apply_once`` checks for the record, applies and records under an
exclusive lock of that id alone (``tool-writes/<sha256>.lock``), so the same
id never applies twice: not on a retry, not on a reconnect, not after a
restart, not when two requests with the same id run at once (the second waits
for the lock, then finds the record). Writes with other ids never wait for
it, so one write stuck on a journal lock holds up nothing else. A write that
raises is not recorded: our one write (``ledger.close``) replaces its file
atomically or not at all, so retrying it is safe.

Everything here blocks; the executor calls it in a worker thread
(``storage.run_in_write_slot``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable

from voiceactors import clock, storage
from voiceactors.logs import get_logger

_log = get_logger(actor="tools")


def writes_dir(state_dir: Path) -> Path:
    return Path(state_dir) / "tool-writes"


def record_path(state_dir: Path, tool_call_id: str) -> Path:
    digest = hashlib.sha256(tool_call_id.encode("utf-8")).hexdigest()
    return writes_dir(state_dir) / f"{digest}.json"


def lock_path(state_dir: Path, tool_call_id: str) -> Path:
    """What ``storage.file_lock`` is given for this id (the lock file is this
    path plus ``.lock``)."""
    return record_path(state_dir, tool_call_id).with_suffix("")


def load(state_dir: Path, tool_call_id: str) -> dict[str, Any] | None:
    """The recorded answer for ``tool_call_id``, or None. A corrupt record is
    logged and read as missing (the write is idempotent at the ledger too)."""
    path = record_path(state_dir, tool_call_id)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        _log.warning("tool.write_record_unreadable", file=path.name)
        return None
    if not isinstance(data, dict) or not isinstance(data.get("output"), str):
        _log.warning("tool.write_record_unreadable", file=path.name)
        return None
    return data


def apply_once(state_dir: Path, tool_call_id: str,
               apply: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any], bool]:
    """Return ``(record, replayed)``. Under the id's lock: the existing record
    (``replayed=True``), else ``apply()``'s record, written durably
    (``storage.atomic_write``, mode 0600) before this returns. ``apply`` must
    return a JSON-serialisable dict with an ``output`` string; if it raises,
    nothing is recorded and the exception propagates.

    The id's lock is waited for without a bound: only a run of the same id
    holds it, and that run's own waits are bounded (the journal lock), so a
    duplicate learns the first run's real outcome instead of a "busy" that
    may be untrue."""
    storage.private_folder(writes_dir(state_dir))
    path = record_path(state_dir, tool_call_id)
    with storage.file_lock(lock_path(state_dir, tool_call_id)):
        storage.sweep_temp_files(path)
        existing = load(state_dir, tool_call_id)
        if existing is not None:
            return existing, True
        record = dict(apply())
        record.setdefault("tool_call_id", tool_call_id)
        record.setdefault("recorded_at", clock.now_utc().isoformat())
        storage.atomic_write(path, json.dumps(record, ensure_ascii=False, sort_keys=True))
        return record, False
