"""The voice configuration: the journal's ``voice`` block first, then env.

Read at call time, never cached: an edit of ``config/journal.json`` (a new key,
another model) takes effect on the next request without a restart. A missing
OpenAI key is not an error here; callers that need one answer 503. A config
file that exists but cannot be read (EMFILE, EACCES, EIO) is not "missing":
``ConfigUnreadable`` is raised, so no caller mistakes an I/O error for an
unset key.

Journal keys (``config/journal.json``)::

    "voice": {"openai_api_key": null, "model": "gpt-realtime",
              "brain_model": "haiku", "brain": "local",
              "mcp_sources": [{"name": "crm", "url": "http://host/mcp", "token_env": "CRM_TOKEN"}]}

These functions do blocking file reads (one small JSON file); async callers
that care may wrap them in ``voiceactors.storage.run_sync``.
"""

from __future__ import annotations

from typing import Any

from voiceactors.journal.config import config_path
from voiceactors.journal.paths import read_json
from voiceactors.logs import get_logger, register_secret
from voiceactors.settings import Settings

DEFAULT_VOICE_MODEL = "gpt-realtime"
DEFAULT_BRAIN_MODEL = "haiku"
DEFAULT_BRAIN_BACKEND = "local"
BRAIN_BACKENDS = ("local", "claude", "openai")

_log = get_logger(actor="config")


class ConfigUnreadable(OSError):
    """``config/journal.json`` exists but could not be read."""


def _load(settings: Settings) -> dict[str, Any]:
    """The parsed journal config: ``{}`` when missing, corrupt or not an
    object (corrupt is logged by the journal's reader); ConfigUnreadable
    when reading it failed."""
    path = config_path(settings.journal)
    try:
        data = read_json(path, raise_unreadable=True)
    except OSError as error:
        raise ConfigUnreadable(f"could not read {path.name}: {error.strerror or type(error).__name__}") from error
    return data if isinstance(data, dict) else {}


def _voice(settings: Settings) -> dict[str, Any]:
    block = _load(settings).get("voice")
    return block if isinstance(block, dict) else {}


def _text(value: Any) -> str | None:
    """``value`` stripped, or None when it is not a non-blank string."""
    if isinstance(value, str) and value.strip():
        return value.strip()
    return None


def openai_api_key(settings: Settings) -> str | None:
    """The OpenAI key: journal ``voice.openai_api_key`` when non-blank, else
    ``OPENAI_API_KEY`` (``settings.openai_api_key_env``), else None.

    Raises ConfigUnreadable when the config exists but cannot be read: an
    I/O error is not an unset key. The key found is registered with the log
    scrubber so it can never appear in a log line, whatever a call site does."""
    key = _text(_voice(settings).get("openai_api_key")) or _text(settings.openai_api_key_env)
    register_secret(key)
    return key


def voice_model(settings: Settings) -> str:
    """The Realtime model: ``voice.model``, default ``gpt-realtime``.
    Raises ConfigUnreadable when the config exists but cannot be read."""
    return _text(_voice(settings).get("model")) or DEFAULT_VOICE_MODEL


def _voice_or_empty(settings: Settings, asking: str) -> dict[str, Any]:
    """The voice block for the brain's choices, which have safe defaults: an
    unreadable config is logged and the defaults are used (the instruction
    still gets built); only the key and the voice model refuse instead."""
    try:
        return _voice(settings)
    except ConfigUnreadable as error:
        _log.warning("config.journal_config_unreadable", asking=asking, error=str(error)[:200])
        return {}


def brain_model(settings: Settings, default: str = DEFAULT_BRAIN_MODEL) -> str:
    """The brain's model: ``voice.brain_model``, else ``default`` (``haiku``,
    the Claude CLI's alias; the OpenAI text backend passes its own default)."""
    return _text(_voice_or_empty(settings, "brain_model").get("brain_model")) or default


def brain_backend(settings: Settings) -> str:
    """The brain backend: ``voice.brain`` (``local`` | ``claude`` | ``openai``),
    default ``local``. An unknown value falls back to ``local``: a typo must
    not leave the voice without an instruction."""
    value = (_text(_voice_or_empty(settings, "brain").get("brain")) or DEFAULT_BRAIN_BACKEND).lower()
    if value not in BRAIN_BACKENDS:
        _log.warning("config.unknown_brain_backend", value=value[:32], using=DEFAULT_BRAIN_BACKEND)
        return DEFAULT_BRAIN_BACKEND
    return value


def mcp_sources_block(settings: Settings) -> Any:
    """The journal's raw ``voice.mcp_sources`` (None when absent); checked by
    ``tools.mcp_sources.parse_sources``. Raises ConfigUnreadable like the rest."""
    return _voice(settings).get("mcp_sources")
