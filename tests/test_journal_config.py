"""Journal config and identity files."""

from __future__ import annotations

import json
from pathlib import Path

from structlog.testing import capture_logs

from voiceactors.journal import config


def write_config(root: Path, data) -> None:
    (root / "config").mkdir(parents=True, exist_ok=True)
    text = data if isinstance(data, str) else json.dumps(data)
    (root / "config" / "journal.json").write_text(text)


def test_fixture_config(fixture_journal):
    cfg = config.load_config(fixture_journal)
    assert cfg["agent"]["name"] == "sol"
    assert config.agent_name(fixture_journal) == "sol"
    assert config.identity(fixture_journal)["name"] == "Test User"
    assert config.identity(fixture_journal)["timezone"] == "America/Denver"
    assert config.voice_block(fixture_journal) == {}
    files = config.identity_files(fixture_journal)
    assert {"self", "partner", "agency", "awareness", "digest", "health", "briefing"} == set(files)
    assert all(isinstance(v, str) for v in files.values())


def test_missing_config_is_empty(tmp_path):
    assert config.load_config(tmp_path) == {}
    assert config.agent_name(tmp_path) == "sol"
    assert config.identity(tmp_path) == {}
    assert config.identity_files(tmp_path) == {}
    assert list(tmp_path.iterdir()) == []


def test_corrupt_config_is_empty_and_logged(tmp_path):
    write_config(tmp_path, "{ not json")
    with capture_logs() as logs:
        assert config.load_config(tmp_path) == {}
    assert any(e["event"] == "journal.json_corrupt" and e["log_level"] == "warning" for e in logs)
    write_config(tmp_path, "[1, 2]")
    with capture_logs() as logs:
        assert config.load_config(tmp_path) == {}
    assert any(e["event"] == "journal.config_not_object" for e in logs)
    assert config.agent_name(tmp_path) == "sol"


def test_agent_name_and_blocks(tmp_path):
    write_config(tmp_path, {"agent": {"name": "  Juniper "}, "identity": {"name": "Ada"},
                            "voice": {"model": "gpt-realtime"}})
    assert config.agent_name(tmp_path) == "Juniper"
    assert config.identity(tmp_path) == {"name": "Ada"}
    assert config.voice_block(tmp_path) == {"model": "gpt-realtime"}
    write_config(tmp_path, {"agent": {"name": ""}, "identity": "oops", "voice": None})
    assert config.agent_name(tmp_path) == "sol"
    assert config.identity(tmp_path) == {} and config.voice_block(tmp_path) == {}


def test_identity_files_only_markdown(tmp_path):
    (tmp_path / "identity").mkdir()
    (tmp_path / "identity" / "self.md").write_text("I am Ada.")
    (tmp_path / "identity" / "notes.txt").write_text("ignored")
    (tmp_path / "identity" / "folder.md").mkdir()
    assert config.identity_files(tmp_path) == {"self": "I am Ada."}
