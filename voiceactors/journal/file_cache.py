"""Values derived from journal files, cached by each file's stat.

A ``StatCache`` keeps, per path, what was derived from the file together
with the file's stamp ``(st_mtime_ns, st_size)`` taken *before* it was read:
a later change shows as a new stamp and the value is derived again. Only a
change that keeps both the mtime and the size (within one file-system
timestamp tick) goes unseen; readers that must bound that say how (the
ledger re-checks every ``CACHE_TTL_S``).

Thread-safe: the journal surfaces run in worker threads. ``load`` runs
outside the lock, so two threads may derive the same file at once; the
last one stored wins, and both values are right for their stamp.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable, Generic, Iterable, TypeVar

T = TypeVar("T")

Stamp = tuple[int, int]          # (st_mtime_ns, st_size)


def stamp_of(st: os.stat_result) -> Stamp:
    return (st.st_mtime_ns, st.st_size)


def file_stamp(path: Path | str) -> Stamp | None:
    """The stamp of the file at ``path``; None when it does not exist."""
    try:
        return stamp_of(os.stat(path))
    except FileNotFoundError:
        return None


class StatCache(Generic[T]):
    """path -> (stamp, value), in insertion order (``keep_only`` reorders)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[Stamp, T]] = {}

    def get(self, path: str, stamp: Stamp, load: Callable[[], T]) -> T:
        """The value for ``path`` at ``stamp``: the cached one when the stamp
        matches, else ``load()`` (stored under ``stamp``)."""
        with self._lock:
            hit = self._entries.get(path)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        value = load()
        self.put(path, stamp, value)
        return value

    def entry(self, path: str) -> tuple[Stamp, T] | None:
        with self._lock:
            return self._entries.get(path)

    def put(self, path: str, stamp: Stamp, value: T) -> None:
        """Store ``value`` (a path already cached keeps its place in the order)."""
        with self._lock:
            self._entries[path] = (stamp, value)

    def pop(self, path: str) -> None:
        with self._lock:
            self._entries.pop(path, None)

    def keep_only(self, paths: Iterable[str]) -> None:
        """Drop every path not in ``paths``; the rest take the order of ``paths``."""
        with self._lock:
            self._entries = {p: self._entries[p] for p in paths if p in self._entries}

    def values(self) -> list[T]:
        with self._lock:
            return [value for _stamp, value in self._entries.values()]
