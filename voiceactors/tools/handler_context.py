"""What a tool handler may touch: the journal, the state dir, and "today"."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from voiceactors import clock, storage

if TYPE_CHECKING:   # only for the annotation
    from voiceactors.settings import Settings


@dataclass(frozen=True)
class ToolContext:
    """Passed to every handler. ``today`` is the one date seam (tests pin it
    through ``voiceactors.clock``); handlers never call ``date.today()``."""

    journal: Path
    state_dir: Path
    today: Callable[[], _dt.date] = field(default=clock.today)
    # how long a write waits for a journal file's lock before failing
    journal_lock_timeout_s: float = storage.DEFAULT_LOCK_TIMEOUT_S
    # how stale our search index may get before a search starts a refresh (None: search's own default)
    search_refresh_interval_s: float | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> "ToolContext":
        return cls(journal=Path(settings.journal), state_dir=Path(settings.state_dir),
                   journal_lock_timeout_s=settings.journal_lock_timeout_s,
                   search_refresh_interval_s=settings.search_refresh_interval_s)
