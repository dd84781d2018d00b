"""The one seam for "today".

Durations and deadlines come from trio's clock (``trio.current_time``), so tests
run on ``autojump_clock``. The calendar date comes from here alone, so a journal
can be replayed as of a fixed day with ``VOICEACTORS_TODAY=YYYY-MM-DD`` or
``--today``.
"""

from __future__ import annotations

import datetime as _dt
import functools
import os

_ENV = "VOICEACTORS_TODAY"
_pinned: _dt.date | None = None


def parse_day(text: str) -> _dt.date:
    """Parse ``YYYY-MM-DD`` (or ``YYYYMMDD``) strictly; ValueError otherwise."""
    text = text.strip()
    for fmt in ("%Y-%m-%d", "%Y%m%d"):
        try:
            day = _dt.datetime.strptime(text, fmt).date()
        except ValueError:
            continue
        if day.strftime(fmt) == text:
            return day
    raise ValueError(f"not a day: {text!r}")


def pin(day: _dt.date | str | None) -> None:
    """Pin today to ``day`` for this process (None unpins)."""
    global _pinned
    _pinned = parse_day(day) if isinstance(day, str) else day


def check_env() -> None:
    """ValueError when ``VOICEACTORS_TODAY`` is set but is not a day: the
    server must refuse to start, not start with a brain that never gets ready."""
    env = os.environ.get(_ENV, "").strip()
    if env:
        try:
            parse_day(env)
        except ValueError as error:
            raise ValueError(f"{_ENV}: {error} (use YYYY-MM-DD)") from None


@functools.lru_cache(maxsize=16)
def _env_day(text: str) -> _dt.date:
    """``parse_day`` of the variable's text, once per text: ``today()`` runs
    on the trio thread a few times a tool round, and ``strptime`` each time
    was 2 % of a busy server's trio thread. A bad
    text raises each time (lru_cache keeps no exception)."""
    return parse_day(text)


def today() -> _dt.date:
    """Today: the pinned day, else ``VOICEACTORS_TODAY`` (read at each call,
    so a change applies at once), else the local date."""
    if _pinned is not None:
        return _pinned
    env = os.environ.get(_ENV, "").strip()
    if env:
        return _env_day(env)
    return _dt.date.today()


def now_utc() -> _dt.datetime:
    """Wall-clock UTC time, for timestamps written into records only."""
    return _dt.datetime.now(_dt.timezone.utc)


def journal_now() -> _dt.datetime:
    """The moment a journal edit is stamped with (UTC): now, moved to the
    pinned day when today is pinned (the time of day the wall clock's), so
    a commitment closed "today" on a journal pinned to an older day closes
    on that day, not on the machine's date."""
    now = now_utc()
    pinned = _pinned
    env = os.environ.get(_ENV, "").strip()
    if pinned is None and env:
        pinned = _env_day(env)
    return now if pinned is None else now.replace(year=pinned.year, month=pinned.month, day=pinned.day)
