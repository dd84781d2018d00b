"""voiceactors.voice_config: the journal's voice block first, then env, then defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clock_support import serving
from voiceactors import voice_config, logs
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
    assert voice_config.openai_api_key(_settings(root, "sk-env-key-456")) == "sk-journal-key-123"


@pytest.mark.parametrize("blank", ["", "   ", None, 42])
def test_blank_journal_key_falls_back_to_env(tmp_path, blank):
    root = _journal(tmp_path, {"openai_api_key": blank})
    assert voice_config.openai_api_key(_settings(root, "sk-env-key-456")) == "sk-env-key-456"


def test_missing_key_is_none(tmp_path):
    assert voice_config.openai_api_key(_settings(_journal(tmp_path, {}))) is None
    assert voice_config.openai_api_key(_settings(_journal(tmp_path / "b"))) is None


def test_key_read_at_call_time(tmp_path):
    root = _journal(tmp_path, {})
    settings = _settings(root)
    assert voice_config.openai_api_key(settings) is None
    (root / "config" / "journal.json").write_text(json.dumps({"voice": {"openai_api_key": "sk-later-key-789"}}))
    assert voice_config.openai_api_key(settings) == "sk-later-key-789"


def test_key_is_registered_with_the_log_scrubber(tmp_path):
    root = _journal(tmp_path, {"openai_api_key": "plainkey-without-prefix"})
    voice_config.openai_api_key(_settings(root))
    assert logs.scrub("key=plainkey-without-prefix") == "key=[redacted]"


def test_defaults(tmp_path):
    settings = _settings(_journal(tmp_path))
    assert voice_config.voice_model(settings) == "gpt-realtime"
    assert voice_config.brain_model(settings) == "haiku"
    assert voice_config.brain_model(settings, default="gpt-5-mini") == "gpt-5-mini"
    assert voice_config.brain_backend(settings) == "local"


def test_defaults_without_any_config(tmp_path):
    settings = _settings(tmp_path / "no-journal-here")
    assert voice_config.openai_api_key(settings) is None
    assert voice_config.voice_model(settings) == "gpt-realtime"
    assert voice_config.brain_backend(settings) == "local"


def test_corrupt_config_means_defaults(tmp_path):
    settings = _settings(_journal(tmp_path, raw="{not json"), "sk-env-key-456")
    assert voice_config.voice_model(settings) == "gpt-realtime"
    assert voice_config.openai_api_key(settings) == "sk-env-key-456"


def test_journal_values(tmp_path):
    root = _journal(tmp_path, {"model": "gpt-realtime-mini", "brain_model": "sonnet", "brain": " Claude "})
    settings = _settings(root)
    assert voice_config.voice_model(settings) == "gpt-realtime-mini"
    assert voice_config.brain_model(settings) == "sonnet"
    assert voice_config.brain_backend(settings) == "claude"


def test_unknown_backend_falls_back_to_local(tmp_path):
    assert voice_config.brain_backend(_settings(_journal(tmp_path, {"brain": "gpt-9"}))) == "local"


def test_voice_block_not_an_object(tmp_path):
    settings = _settings(_journal(tmp_path, ["openai_api_key"]), "sk-env-key-456")
    assert voice_config.openai_api_key(settings) == "sk-env-key-456"
    assert voice_config.brain_model(settings) == "haiku"


def test_an_unreadable_config_is_not_a_missing_one(tmp_path):
    root = tmp_path / "journal"
    (root / "config" / "journal.json").mkdir(parents=True)      # exists, cannot be read as a file
    with pytest.raises(voice_config.ConfigUnreadable, match="could not read journal.json"):
        voice_config.openai_api_key(_settings(root, "sk-env-key-456"))
    assert voice_config.brain_backend(_settings(root)) == "local"     # the brain's choices use defaults


def test_a_config_folder_that_is_a_file_means_no_config(tmp_path):
    root = tmp_path / "journal"
    root.mkdir()
    (root / "config").write_text("not a folder")                 # journal.json cannot exist under it
    assert voice_config.openai_api_key(_settings(root, "sk-env-key-456")) == "sk-env-key-456"


# --- kept in memory, re-read on change (issue 14: no worker thread for the key) ------------

def _rewrite_in_place(path: Path, text: str, mtime_ns: int) -> None:
    """New content of the same size, same inode, and the old mtime put back:
    the one change a stat stamp cannot see."""
    with open(path, "r+", encoding="utf-8") as handle:
        handle.write(text)
    import os
    os.utime(path, ns=(mtime_ns, mtime_ns))


def test_an_unchanged_file_is_not_read_again(tmp_path):
    import os
    import time
    root = _journal(tmp_path, {"openai_api_key": "sk-cached-key-AAAA"})
    path = root / "config" / "journal.json"
    old = time.time_ns() - 3600 * 10**9            # an hour ago: past the racy window
    os.utime(path, ns=(old, old))
    settings = _settings(root)
    assert voice_config.openai_api_key(settings) == "sk-cached-key-AAAA"
    _rewrite_in_place(path, path.read_text().replace("AAAA", "BBBB"), old)
    assert voice_config.openai_api_key(settings) == "sk-cached-key-AAAA"   # the stamp says unchanged: not read
    os.utime(path, ns=(old + 1, old + 1))                             # any change of the stamp
    assert voice_config.openai_api_key(settings) == "sk-cached-key-BBBB"


def test_a_file_changed_moments_ago_is_read_again_even_with_the_same_stamp(tmp_path):
    import os
    import time
    root = _journal(tmp_path, {"openai_api_key": "sk-racy-key-AAAA"})
    path = root / "config" / "journal.json"
    now = time.time_ns()                           # within RACY_S: a same-tick edit could hide
    os.utime(path, ns=(now, now))
    settings = _settings(root)
    assert voice_config.openai_api_key(settings) == "sk-racy-key-AAAA"
    _rewrite_in_place(path, path.read_text().replace("AAAA", "BBBB"), now)
    assert voice_config.openai_api_key(settings) == "sk-racy-key-BBBB"


def test_a_config_that_goes_away_or_turns_unreadable_is_seen_at_once(tmp_path):
    import os
    import time
    root = _journal(tmp_path, {"openai_api_key": "sk-gone-key-AAAA"})
    path = root / "config" / "journal.json"
    old = time.time_ns() - 3600 * 10**9
    os.utime(path, ns=(old, old))
    settings = _settings(root, "sk-env-key-456")
    assert voice_config.openai_api_key(settings) == "sk-gone-key-AAAA"
    path.unlink()
    assert voice_config.openai_api_key(settings) == "sk-env-key-456"
    path.mkdir()                                   # exists, cannot be read as a file: EISDIR
    with pytest.raises(voice_config.ConfigUnreadable):
        voice_config.openai_api_key(settings)


async def test_routes_read_the_key_without_a_worker_thread(tmp_path):
    # Every worker-thread slot taken (a hung disk under the reads): the key
    # lookups of /status and /connect still answer at once.
    import trio
    from voiceactors import storage
    from voiceactors.http import create_app

    root = _journal(tmp_path, {})
    app = create_app(_settings(root).replace(rate_limit_per_s=0))
    async with serving(app) as test_app:
        client = test_app.test_client()
        limiter = storage.limiter()      # process-wide: earlier tests' abandoned threads may hold some
        holders: list[object] = []
        while limiter.available_tokens > 0:
            holders.append(object())
            limiter.acquire_on_behalf_of_nowait(holders[-1])
        try:
            with trio.fail_after(5):
                status = await client.get("/api/voice/status")
                connect = await client.post("/api/voice/connect", json={"call_id": "rtc_no_key"})
        finally:
            for holder in holders:
                limiter.release_on_behalf_of(holder)
    assert status.status_code == 200 and (await status.get_json())["openai_configured"] is False
    assert connect.status_code == 503
    assert await connect.get_json() == {"error": "voice unavailable — openai key not configured"}
