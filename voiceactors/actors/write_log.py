"""The durable record of tool writes, keyed by the model's tool call id.

``<state_dir>/tool-writes/<sha256(tool_call_id)>.json`` holds what a write
answered. ``apply_once`` checks for the record, applies and records under one
exclusive lock (``tool-writes/writes.lock``), so the same id never applies
twice: not on a retry, not on a reconnect, not after a restart, not when two
requests with the same id run at once (the second waits for the lock, then
finds the record). A write that raises is not recorded: our one write
(``ledger.close``) replaces its file atomically or not at all, so retrying it
is safe.

Everything here blocks; the executor calls it through ``storage.run_sync``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable

from voiceactors import clock, storage
from voiceactors.logs import get_logger

_log = get_logger(actor="tools", surface="write_log")


def writes_dir(state_dir: Path) -> Path:
    return Path(state_dir) / "tool-writes"


def record_path(state_dir: Path, tool_call_id: str) -> Path:
    digest = hashlib.sha256(tool_call_id.encode("utf-8")).hexdigest()
    return writes_dir(state_dir) / f"{digest}.json"


def load(state_dir: Path, tool_call_id: str) -> dict[str, Any] | None:
    """The recorded answer for ``tool_call_id``, or None. A corrupt record is
    logged and read as missing (the write is idempotent at the ledger too)."""
    path = record_path(state_dir, tool_call_id)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        _log.warning("write_record_unreadable", file=path.name)
        return None
    if not isinstance(data, dict) or not isinstance(data.get("output"), str):
        _log.warning("write_record_unreadable", file=path.name)
        return None
    return data


def apply_once(state_dir: Path, tool_call_id: str,
               apply: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any], bool]:
    """Return ``(record, replayed)``. Under the lock: the existing record
    (``replayed=True``), else ``apply()``'s record, written durably
    (``storage.atomic_write``) before this returns. ``apply`` must return a
    JSON-serialisable dict with an ``output`` string; if it raises, nothing
    is recorded and the exception propagates."""
    folder = writes_dir(state_dir)
    folder.mkdir(parents=True, exist_ok=True)
    with storage.file_lock(folder / "writes"):
        existing = load(state_dir, tool_call_id)
        if existing is not None:
            return existing, True
        record = dict(apply())
        record.setdefault("tool_call_id", tool_call_id)
        record.setdefault("recorded_at", clock.now_utc().isoformat())
        storage.atomic_write(record_path(state_dir, tool_call_id),
                             json.dumps(record, ensure_ascii=False, sort_keys=True))
        return record, False
