"""The voice configuration: the journal's ``voice`` block first, then env.

Kept in memory and re-read on change: every lookup stats
``config/journal.json`` and parses it again only when its stamp
(``st_mtime_ns``, ``st_size``, ``st_ino``) differs from the one it was read
at, so an edit (a new key, another model) takes effect on the next request
without a restart, and a lookup that finds the file unchanged costs one
``stat`` — cheap enough for the trio thread, so no route or actor needs a
worker thread for the key. A file changed within ``RACY_S`` of being read
is read again at the next lookup (a file-system timestamp tick can hide an
edit of the same size; git's "racily clean" rule). A missing OpenAI key is
not an error here; callers that need one answer 503. A config file that
exists but cannot be read (EMFILE, EACCES, EIO) is not "missing":
``ConfigUnreadable`` is raised, so no caller mistakes an I/O error for an
unset key (a cached block stays good while the file is unchanged: a stat
needs no descriptor).

Journal keys (``config/journal.json``)::

    "voice": {"openai_api_key": null, "model": "gpt-realtime", "service": "realtime",
              "live_model": "gpt-live-1", "live_delegate_model": "gpt-5-mini",
              "reasoning_effort": "low", "parallel_tool_calls": true, "idle_timeout_ms": 30000,
              "brain_model": "haiku", "brain": "local",
              "mcp_sources": [{"name": "crm", "url": "http://host/mcp", "token_env": "CRM_TOKEN"}],
              "webhook_secret": "whsec_…",
              "phone": {"allowed_callers": ["+15551234567"], "pin": "2468", "transfer_to": "tel:+15557654321"},
              "agents": [{"name": "assistant", "description": "…", "tools": ["journal.search"]}]}

These functions may read one small JSON file (when it changed); they are
called on the trio thread. A journal on a file system whose ``stat`` can hang
(a dead network mount) would hold the trio thread: keep the journal local.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from typing import Any, Collection

from voiceactors.journal.config import config_path
from voiceactors.journal.paths import read_json
from voiceactors.logs import get_logger, register_secret
from voiceactors.mcp.client.sources import SourceConfigError, parse_sources
from voiceactors import agents as agent_config, phone_policy
from voiceactors.agents import Agents
from voiceactors.phone_policy import PhoneSettings
from voiceactors.realtime import session_settings as session_keys
from voiceactors.realtime.session_settings import SessionSettings
from voiceactors.settings import InvalidSettings, Settings

DEFAULT_VOICE_MODEL = "gpt-realtime"
#: The voice services a browser's call may use (docs/live.md), the default first.
VOICE_SERVICES = ("realtime", "live")
DEFAULT_LIVE_MODEL = "gpt-live-1"
DEFAULT_LIVE_DELEGATE_MODEL = "gpt-5-mini"
DEFAULT_BRAIN_MODEL = "haiku"
DEFAULT_BRAIN_BACKEND = "local"
BRAIN_BACKENDS = ("local", "claude", "openai")

_log = get_logger(actor="config")

#: A file whose mtime is this close to the moment it was read may change again
#: within the same timestamp tick, unseen by its stamp: it is not trusted.
RACY_S = 2.0

Stamp = tuple[int, int, int]     # (st_mtime_ns, st_size, st_ino)
_cache: dict[str, tuple[Stamp, dict[str, Any]]] = {}   # config path -> (stamp, voice block)
_cache_lock = threading.Lock()
_CACHE_MAX = 64                  # journals a process reads (tests use many)


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


def _stamp(path: str) -> Stamp | None:
    """The file's stamp; None when it does not exist. ConfigUnreadable when
    even the stat fails (EACCES on a folder, EIO)."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as error:
        raise ConfigUnreadable(f"could not read {os.path.basename(path)}: "
                               f"{error.strerror or type(error).__name__}") from error
    return (st.st_mtime_ns, st.st_size, st.st_ino)


@functools.lru_cache(maxsize=_CACHE_MAX)
def _config_file(journal: Any) -> str:
    """The config file's path as a string, built once per journal: building
    it with ``pathlib`` was two thirds of a lookup, and a connect does three."""
    return str(config_path(journal))


def _voice(settings: Settings) -> dict[str, Any]:
    """The ``voice`` block (the same dict while the file is unchanged: read-only)."""
    path = _config_file(settings.journal)
    stamp = _stamp(path)
    if stamp is None:
        return {}
    with _cache_lock:
        hit = _cache.get(path)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    block = _load(settings).get("voice")
    voice = block if isinstance(block, dict) else {}
    racy = time.time_ns() - stamp[0] < RACY_S * 1e9
    with _cache_lock:
        if racy:
            _cache.pop(path, None)
        else:
            if len(_cache) >= _CACHE_MAX:
                _cache.pop(next(iter(_cache)))
            _cache[path] = (stamp, voice)
    return voice


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


def webhook_secret(settings: Settings) -> str | None:
    """The secret OpenAI signs phone-call webhooks with: journal
    ``voice.webhook_secret`` when non-blank, else ``OPENAI_WEBHOOK_SECRET``
    (``settings.openai_webhook_secret_env``), else None (the phone is off).
    Registered with the log scrubber, as the key is. Raises ConfigUnreadable
    like the key."""
    secret = _text(_voice(settings).get("webhook_secret")) or _text(settings.openai_webhook_secret_env)
    register_secret(secret)
    return secret


def phone_settings(settings: Settings) -> PhoneSettings:
    """``voice.phone`` (``phone_policy.parse``): each bad value logged
    (``config.voice_setting_invalid``) and left out, so a typo in a number
    allows nobody rather than somebody (``serve`` refuses to start with
    one: ``check_phone_settings``). Raises ConfigUnreadable like the key."""
    phone, problems = phone_policy.parse(_voice(settings).get("phone"))
    for problem in problems:
        _log.error("config.voice_setting_invalid", error=problem[:300])
    return phone


def check_phone_settings(settings: Settings) -> None:
    """InvalidSettings naming each bad ``voice.phone`` value: the server
    refuses to start (an unreadable config is left to the requests)."""
    try:
        problems = phone_policy.parse(_voice(settings).get("phone"))[1]
    except ConfigUnreadable:
        return
    if problems:
        raise InvalidSettings("invalid settings: " + "; ".join(problems))


def voice_model(settings: Settings) -> str:
    """The Realtime model: ``voice.model``, default ``gpt-realtime``.
    Raises ConfigUnreadable when the config exists but cannot be read."""
    return _text(_voice(settings).get("model")) or DEFAULT_VOICE_MODEL


def voice_service(settings: Settings) -> str:
    """The service the console starts a call on: ``voice.service``,
    ``realtime`` (the default) or ``live`` (docs/live.md). Another value is
    logged and read as ``realtime``. Raises ConfigUnreadable like the key."""
    value = (_text(_voice(settings).get("service")) or VOICE_SERVICES[0]).lower()
    if value not in VOICE_SERVICES:
        _log.warning("config.unknown_voice_service", value=value[:32], using=VOICE_SERVICES[0])
        return VOICE_SERVICES[0]
    return value


def live_models(settings: Settings) -> tuple[str, str]:
    """A Live session's models: ``voice.live_model`` (default ``gpt-live-1``)
    and the Responses model it delegates to, ``voice.live_delegate_model``
    (default ``gpt-5-mini``). Raises ConfigUnreadable like the key."""
    voice = _voice(settings)
    return (_text(voice.get("live_model")) or DEFAULT_LIVE_MODEL,
            _text(voice.get("live_delegate_model")) or DEFAULT_LIVE_DELEGATE_MODEL)


def session_settings(settings: Settings) -> SessionSettings:
    """The session settings of ``voice`` (``realtime/session_settings.py``);
    each bad value is logged (``config.voice_setting_invalid``) and left
    unset, so the call keeps the service's default for it (``serve``
    refuses to start with one: ``check_session_settings``). Raises
    ConfigUnreadable when the config exists but cannot be read."""
    chosen, problems = session_keys.parse(_voice(settings))
    for problem in problems:
        _log.error("config.voice_setting_invalid", error=problem[:300])
    return chosen


def check_session_settings(settings: Settings) -> None:
    """InvalidSettings naming each bad session setting of ``voice``: the
    server refuses to start. A config that cannot be read now is left for
    the requests that read it to report."""
    try:
        problems = session_keys.parse(_voice(settings))[1]
    except ConfigUnreadable:
        return
    if problems:
        raise InvalidSettings("invalid settings: " + "; ".join(problems))


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


def _source_names(voice: dict[str, Any]) -> list[str]:
    """The names of the configured MCP sources (none when the list is bad: ``serve`` refuses it anyway)."""
    try:
        return [source.name for source in parse_sources(voice.get("mcp_sources"))]
    except SourceConfigError:
        return []


def agents(settings: Settings, journal_tools: Collection[str]) -> Agents:
    """The call's agents: ``voice.agents`` (``agents.parse``; ``journal_tools``:
    the registry's dotted names), else the shipped set. Each bad entry is
    logged (``config.voice_setting_invalid``) and left out (``serve`` refuses
    to start with one: ``check_agents``). Raises ConfigUnreadable like the key."""
    voice = _voice(settings)
    chosen, problems = agent_config.parse(voice.get("agents"), journal_tools=journal_tools,
                                          sources=_source_names(voice))
    for problem in problems:
        _log.error("config.voice_setting_invalid", error=problem[:300])
    return chosen


def check_agents(settings: Settings, journal_tools: Collection[str]) -> None:
    """InvalidSettings naming each bad entry of ``voice.agents``: the server
    refuses to start (an unreadable config is left to the requests)."""
    try:
        voice = _voice(settings)
    except ConfigUnreadable:
        return
    problems = agent_config.parse(voice.get("agents"), journal_tools=journal_tools,
                                  sources=_source_names(voice))[1]
    if problems:
        raise InvalidSettings("invalid settings: " + "; ".join(problems))


def mcp_sources_block(settings: Settings) -> Any:
    """The journal's raw ``voice.mcp_sources`` (None when absent); checked by
    ``mcp.client.sources.parse_sources``. Raises ConfigUnreadable like the rest."""
    return _voice(settings).get("mcp_sources")
