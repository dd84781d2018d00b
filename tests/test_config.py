"""voiceactors.config: the journal's voice block first, then env, then defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from voiceactors import config, logs
from voiceactors.settings import Settings


def _journal(tmp_path: Path, voice: object = None, raw: str | None = None) -> Path:
    root = tmp_path / "journal"
    (root / "config").mkdir(parents=True)
    data = {"agent": {"name": "sol"}}
    if voice is not None:
        data["voice"] = voice
    (root / "config" / "journal.json").write_text(raw if raw is not None else json.dumps(data))
    return root


def _settings(root: Path, env_key: str | None = None) -> Settings:
    return Settings.from_env({"OPENAI_API_KEY": env_key or ""}, journal=root, state_dir=root.parent / "state")


def test_journal_key_beats_env(tmp_path):
    root = _journal(tmp_path, {"openai_api_key": "sk-journal-key-123"})
    assert config.openai_api_key(_settings(root, "sk-env-key-456")) == "sk-journal-key-123"


@pytest.mark.parametrize("blank", ["", "   ", None, 42])
def test_blank_journal_key_falls_back_to_env(tmp_path, blank):
    root = _journal(tmp_path, {"openai_api_key": blank})
    assert config.openai_api_key(_settings(root, "sk-env-key-456")) == "sk-env-key-456"


def test_missing_key_is_none(tmp_path):
    assert config.openai_api_key(_settings(_journal(tmp_path, {}))) is None
    assert config.openai_api_key(_settings(_journal(tmp_path / "b"))) is None


def test_key_read_at_call_time(tmp_path):
    root = _journal(tmp_path, {})
    settings = _settings(root)
    assert config.openai_api_key(settings) is None
    (root / "config" / "journal.json").write_text(json.dumps({"voice": {"openai_api_key": "sk-later-key-789"}}))
    assert config.openai_api_key(settings) == "sk-later-key-789"


def test_key_is_registered_with_the_log_scrubber(tmp_path):
    root = _journal(tmp_path, {"openai_api_key": "plainkey-without-prefix"})
    config.openai_api_key(_settings(root))
    assert logs.scrub("key=plainkey-without-prefix") == "key=[redacted]"


def test_defaults(tmp_path):
    settings = _settings(_journal(tmp_path))
    assert config.voice_model(settings) == "gpt-realtime"
    assert config.brain_model(settings) == "haiku"
    assert config.brain_model(settings, default="gpt-5-mini") == "gpt-5-mini"
    assert config.brain_backend(settings) == "local"


def test_defaults_without_any_config(tmp_path):
    settings = _settings(tmp_path / "no-journal-here")
    assert config.openai_api_key(settings) is None
    assert config.voice_model(settings) == "gpt-realtime"
    assert config.brain_backend(settings) == "local"


def test_corrupt_config_means_defaults(tmp_path):
    settings = _settings(_journal(tmp_path, raw="{not json"), "sk-env-key-456")
    assert config.voice_model(settings) == "gpt-realtime"
    assert config.openai_api_key(settings) == "sk-env-key-456"


def test_journal_values(tmp_path):
    root = _journal(tmp_path, {"model": "gpt-realtime-mini", "brain_model": "sonnet", "brain": " Claude "})
    settings = _settings(root)
    assert config.voice_model(settings) == "gpt-realtime-mini"
    assert config.brain_model(settings) == "sonnet"
    assert config.brain_backend(settings) == "claude"


def test_unknown_backend_falls_back_to_local(tmp_path):
    assert config.brain_backend(_settings(_journal(tmp_path, {"brain": "gpt-9"}))) == "local"


def test_voice_block_not_an_object(tmp_path):
    settings = _settings(_journal(tmp_path, ["openai_api_key"]), "sk-env-key-456")
    assert config.openai_api_key(settings) == "sk-env-key-456"
    assert config.brain_model(settings) == "haiku"


def test_an_unreadable_config_is_not_a_missing_one(tmp_path):
    root = tmp_path / "journal"
    (root / "config" / "journal.json").mkdir(parents=True)      # exists, cannot be read as a file
    with pytest.raises(config.ConfigUnreadable, match="could not read journal.json"):
        config.openai_api_key(_settings(root, "sk-env-key-456"))
    assert config.brain_backend(_settings(root)) == "local"     # the brain's choices use defaults


def test_a_config_folder_that_is_a_file_means_no_config(tmp_path):
    root = tmp_path / "journal"
    root.mkdir()
    (root / "config").write_text("not a folder")                 # journal.json cannot exist under it
    assert config.openai_api_key(_settings(root, "sk-env-key-456")) == "sk-env-key-456"
