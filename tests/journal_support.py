"""Test helpers for a journal's own files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from voiceactors.journal.config import config_path


def set_voice(journal: Path, voice: dict[str, Any]) -> None:
    """``voice`` as the journal's voice block (the rest of its config kept)."""
    path = config_path(journal)
    data = json.loads(path.read_text()) if path.exists() else {}
    data["voice"] = voice
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
