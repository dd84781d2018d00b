"""The brain's session id on disk: ``<journal>/health/voice-brain-session``.

One line, the id of the backend session to resume (the Claude CLI's
``session_id``). Written atomically (``voiceactors.storage.atomic_write``), so
a crash leaves the old id or the new one, never half of one. These are the
only voice-owned writes into the journal (``health/voice-brain-session*``).

Blocking; async callers use ``voiceactors.storage.run_sync``.
"""

from __future__ import annotations

import re
from pathlib import Path

from voiceactors import tracing
from voiceactors.storage import atomic_write

FILE_NAME = "voice-brain-session"
# A session id is opaque, but it is passed back as one argv element: accept
# only a plain token so a tampered file cannot smuggle anything odd in.
_ID_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,200}$")


def session_path(journal: Path) -> Path:
    return Path(journal) / "health" / FILE_NAME


def valid_session_id(value: object) -> bool:
    return isinstance(value, str) and bool(_ID_RE.fullmatch(value))


def load_session_id(journal: Path) -> str | None:
    """The saved id, or None when there is none (or it is unreadable/invalid)."""
    try:
        text = session_path(journal).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if valid_session_id(text) else None


def save_session_id(journal: Path, session_id: str) -> None:
    """Replace the saved id (creates ``health/`` when needed). ValueError for
    an id that is not a plain token."""
    if not valid_session_id(session_id):
        raise ValueError("invalid session id")
    with tracing.span("journal.write", file=FILE_NAME):     # the one journal write besides the ledger's
        atomic_write(session_path(journal), session_id + "\n")
