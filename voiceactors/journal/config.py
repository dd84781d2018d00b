"""The journal's own configuration and identity files.

``config/journal.json`` holds ``identity{...}``, ``agent{name, ...}`` and an
optional ``voice{...}`` block; ``identity/*.md`` are free-text identity notes.
Everything is read at call time (no cache) so an edit shows up on the next
request. Reading never creates anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from voiceactors import safe_text
from voiceactors.journal.paths import read_json
from voiceactors.logs import get_logger

DEFAULT_AGENT_NAME = "sol"
_log = get_logger(actor="journal")


def config_path(root: Path) -> Path:
    return Path(root) / "config" / "journal.json"


def load_config(root: Path) -> dict[str, Any]:
    """The parsed ``config/journal.json``; ``{}`` when it is missing, corrupt
    or not a JSON object (the last two are logged)."""
    path = config_path(root)
    data = read_json(path)
    if data is None:
        if not path.exists():
            _log.debug("journal.config_missing", file=str(path))
        return {}
    if not isinstance(data, dict):
        _log.warning("journal.config_not_object", file=str(path))
        return {}
    return data


def _block(root: Path, name: str) -> dict[str, Any]:
    block = load_config(root).get(name)
    return block if isinstance(block, dict) else {}


def agent_name(root: Path) -> str:
    """``agent.name`` from the config, else ``"sol"``."""
    name = _block(root, "agent").get("name")
    return name.strip() if isinstance(name, str) and name.strip() else DEFAULT_AGENT_NAME


def identity(root: Path) -> dict[str, Any]:
    """The config's ``identity`` block (``{}`` when absent)."""
    return _block(root, "identity")


def voice_block(root: Path) -> dict[str, Any]:
    """The config's ``voice`` block (``{}`` when absent). It may hold a key:
    callers must never log its values."""
    return _block(root, "voice")


def identity_files(root: Path) -> dict[str, str]:
    """``identity/*.md`` as ``{stem: text}`` (e.g. ``{"self": "..."}``), sorted
    by name. Unreadable files are skipped."""
    folder = Path(root) / "identity"
    if not folder.is_dir():
        return {}
    out: dict[str, str] = {}
    for path in sorted(folder.glob("*.md")):
        if not path.is_file():
            continue
        try:
            # the name goes into the brain's prompt: its undecodable bytes as U+FFFD (safe_text)
            out[safe_text.clean_str(path.stem)] = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            _log.warning("journal.identity_file_unreadable", file=str(path), error=type(exc).__name__)
    return out
