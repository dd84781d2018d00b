"""Structured logging: one JSON object per line, secrets scrubbed.

Every logger is bound once, with one attribute: ``get_logger(actor="brain")``;
everything else goes on the line. Event names are dotted lowercase
``<area>.<event>`` with snake_case parts (``tool.run``, ``http.request``;
``tests/test_log_names.py`` checks both). A processor replaces any value that
looks like a key (``sk-...``, ``ek_...``, bearer tokens), every configured
secret registered with ``register_secret``, and the value of any field that
holds a secret (``api_token``, ``openai_api_key``, ``authorization``,
``ephemeral_key``, ``client_secret``, ... — by exact name or a ``_token`` /
``_secret`` / ``_api_key`` / ``_password`` suffix), so a careless call site
cannot leak one. A field that only mentions the word (``token_required``,
``input_tokens``) or holds a flag (``api_token: true``) is printed.
"""

from __future__ import annotations

import datetime
import json
import logging
import re
import sys
import time
from typing import Any, MutableMapping, TextIO, cast

import structlog
from structlog.typing import FilteringBoundLogger

from voiceactors import tracing
from voiceactors.settings import default

_SECRET_FIELDS = frozenset({
    "api_key", "apikey", "api_token", "token", "access_token", "refresh_token", "openai_api_key",
    "openai_api_key_env", "openai_webhook_secret_env", "authorization", "proxy_authorization", "ephemeral_key", "client_secret",
    "secret", "password", "cookie", "set_cookie", "bearer",
})
_SECRET_SUFFIXES = ("_api_key", "_token", "_secret", "_password")
_SECRET_VALUE = re.compile(r"(sk-[A-Za-z0-9_\-]{6,}|ek_[A-Za-z0-9_\-]{4,}|whsec_[A-Za-z0-9+/=]{4,}|Bearer\s+\S+)")
_extra_secrets: set[str] = set()
_FIELD_VERDICTS: dict[str, bool] = {}   # field name -> is_secret_field, for the names code logs
_FIELD_VERDICTS_MAX = 4096               # nested dicts may carry arbitrary keys: bound the cache


#: Strings ``_scrub_text`` left as they were, remembered (a line's values
#: repeat: the event, the actor, the level, a tool's name, a call's id): one
#: set look-up instead of the secrets' loop and the prefix tests. Swapped for
#: a new set when a secret is registered (after it is added, so a line that
#: sees the new set scrubs with the new secret); emptied when full.
_CLEAN_TEXT: set[str] = set()
_CLEAN_TEXT_MAX = 4096


def register_secret(value: str | None) -> None:
    """Scrub this exact value from every later log line (e.g. a configured key)."""
    global _CLEAN_TEXT
    if value and len(value) >= 4:
        _extra_secrets.add(value)
        _CLEAN_TEXT = set()     # what was clean may hold this one


def is_secret_field(name: object) -> bool:
    """True when a field called ``name`` holds a secret (not merely names one)."""
    key = str(name).strip().lower().replace("-", "_")
    return key in _SECRET_FIELDS or key.endswith(_SECRET_SUFFIXES)


def _secret_field(name: object) -> bool:
    """``is_secret_field``, remembered per name (a line's field names repeat)."""
    verdict = _FIELD_VERDICTS.get(name) if type(name) is str else None
    if verdict is None:
        verdict = is_secret_field(name)
        if type(name) is str and len(_FIELD_VERDICTS) < _FIELD_VERDICTS_MAX:
            _FIELD_VERDICTS[name] = verdict
    return verdict


def _scrub_field(name: object, value: object) -> Any:
    if value is not None and not isinstance(value, bool) and _secret_field(name):
        return "[redacted]"
    return scrub(value)


def _scrub_text(value: str) -> str:
    for secret in _extra_secrets:
        if secret in value:
            value = value.replace(secret, "[redacted]")
    if "sk-" in value or "ek_" in value or "whsec_" in value or "Bearer" in value:   # each pattern holds one of these
        value = _SECRET_VALUE.sub("[redacted]", value)
    return value


_PLAIN = frozenset({int, float, bool, type(None)})


def scrub(value: Any) -> Any:
    kind = type(value)
    if kind in _PLAIN:          # the most common field values: nothing to hide
        return value
    if kind is str or isinstance(value, str):
        return _scrub_text(value)
    if isinstance(value, dict):
        return {k: _scrub_field(k, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub(v) for v in value]
    return value


def _scrub_processor(_logger: Any, _name: str,
                     event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """``scrub`` of the line's own fields, in place and inlined: it runs for
    every line, so the common cases (a number, a flag, a plain string under
    a harmless name) cost a dict lookup and a type test each, a string seen
    clean before one set look-up more (``_CLEAN_TEXT``)."""
    verdicts, clean = _FIELD_VERDICTS, _CLEAN_TEXT
    for name, value in event_dict.items():
        kind = type(value)
        secret = verdicts.get(name)
        if secret is None:
            secret = _secret_field(name)
        if secret and value is not None and kind is not bool:
            event_dict[name] = "[redacted]"
        elif kind in _PLAIN:
            continue
        elif kind is str:
            if value in clean:
                continue
            scrubbed = _scrub_text(value)
            if scrubbed is not value:
                event_dict[name] = scrubbed
            elif name != "timestamp":      # a new one every line: not worth keeping
                if len(clean) >= _CLEAN_TEXT_MAX:
                    # emptied, not replaced: a new set made here could overwrite the one
                    # register_secret just put in place, and keep a string checked before
                    # its secret was known
                    clean.clear()
                clean.add(value)
        else:
            event_dict[name] = scrub(value)
    return event_dict


class _CurrentStderr:
    """``sys.stderr`` as it is at each write: a tool or test that swaps it
    (and closes its replacement) must not leave logging pointing at a closed file."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


_CURRENT_STDERR = _CurrentStderr()
# One encoder for every line: ``json.dumps(..., default=str)`` builds a new one per call.
_ENCODER = json.JSONEncoder(default=str)


def _serialize(obj: Any, **_ignored: Any) -> str:
    return _ENCODER.encode(obj)


_SECOND_STAMP: tuple[int, str] = (-1, "")   # (a whole second, its date and time of day), swapped whole


def _iso_utc(ns: int) -> str:
    """``ns`` (nanoseconds since the epoch) as structlog's
    ``TimeStamper(fmt="iso", utc=True)`` writes that instant
    (``datetime.isoformat`` with ``Z``: microseconds, none when zero): the
    date and time of day formatted once per second, not per line."""
    global _SECOND_STAMP
    second, rest = divmod(ns, 1_000_000_000)
    cached = _SECOND_STAMP      # one tuple: a line of another thread never sees half of it
    if cached[0] != second:
        day = datetime.datetime.fromtimestamp(second, datetime.timezone.utc).replace(tzinfo=None)
        cached = _SECOND_STAMP = (second, day.isoformat())
    micro = rest // 1000
    return f"{cached[1]}.{micro:06d}Z" if micro else f"{cached[1]}Z"


def _timestamp(_logger: Any, _name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    event["timestamp"] = _iso_utc(time.time_ns())
    return event


_PROCESS_FIELDS: dict[str, Any] = {}    # on every line of this process (a worker's ``worker`` index)


def set_process_fields(**fields: Any) -> None:
    """Fields every later line of this process carries (``worker=2`` in a
    ``serve --workers`` worker): one dict, not a context variable, so lines
    from threads and every trio task carry them too."""
    _PROCESS_FIELDS.update(fields)


def _process_fields(_logger: Any, _name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key, value in _PROCESS_FIELDS.items():
        event.setdefault(key, value)
    return event


def configure(fmt: str = default("log_format"), level: str = default("log_level"),
              stream: TextIO | None = None) -> None:
    """Configure structlog once per process. ``fmt`` is ``json`` or ``console``.

    Cheap by construction (a log line is on every connect's and tool round's path): the
    level is filtered by the bound logger's class, so a dropped ``debug``
    line runs no processor; the scrubber skips numbers and flags and tests
    strings for a key's prefix before the pattern; the timestamp's date and
    time of day are formatted once a second (``_iso_utc``); one JSON encoder
    renders every line; each line is one ``write`` (``WriteLogger``: text and
    newline together) and one flush."""
    renderer: Any
    if fmt == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=False)
    else:
        renderer = structlog.processors.JSONRenderer(serializer=_serialize)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            tracing.add_trace_ids,      # a line under a span (tracing on): its trace_id and span_id
            _process_fields,
            structlog.processors.add_log_level,
            _timestamp,
            structlog.processors.format_exc_info,
            _scrub_processor,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        # _CurrentStderr is file-like only as far as a write logger needs (write, flush)
        logger_factory=structlog.WriteLoggerFactory(file=stream or cast(TextIO, _CURRENT_STDERR)),
        cache_logger_on_first_use=False,
    )


class _LevelMethod:
    """``logger.info`` etc. of an ``ActorLogger``: the built logger's method."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, owner: "ActorLogger | None", _kind: Any = None) -> Any:
        if owner is None:
            return self
        return getattr(owner._current(), self.name)


class ActorLogger:
    """A logger bound once (``get_logger``), built on first use and kept.

    structlog's own lazy proxy builds a new bound logger at every call (about
    3 µs, even for a dropped ``debug`` line); structlog's
    ``cache_logger_on_first_use`` keeps the first one forever, so a later
    ``configure`` (or ``structlog.testing.capture_logs``) would never reach a
    module-level logger. This keeps the built logger until the configured
    processors change (both of those install a new list), then builds anew."""

    __slots__ = ("_bound", "_logger", "_processors")

    def __init__(self, bound: dict[str, Any]) -> None:
        self._bound = bound
        self._logger: Any = None
        self._processors: Any = None

    def _current(self) -> Any:
        processors = structlog.get_config()["processors"]
        logger = self._logger
        if logger is None or processors is not self._processors:
            logger = structlog.get_logger().bind(**self._bound)
            self._logger, self._processors = logger, processors
        return logger

    def bind(self, **values: object) -> FilteringBoundLogger:
        # structlog's wrapper class: make_filtering_bound_logger's (configure), also by default
        bound: FilteringBoundLogger = self._current().bind(**values)
        return bound

    # the level methods: each a descriptor handing out the built logger's own
    # method, so a call's fields are packed once (a dropped ``debug`` costs
    # what structlog's own no-op costs, plus this lookup)
    debug = _LevelMethod("debug")
    info = _LevelMethod("info")
    warning = _LevelMethod("warning")
    error = _LevelMethod("error")
    exception = _LevelMethod("exception")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._current(), name)


def get_logger(**bound: Any) -> Any:
    """A logger with ``bound`` fields on every line (e.g. ``actor="brain"``).

    Lazy (an ``ActorLogger``): built at first use with the configuration of
    that moment and rebuilt when the configuration changes, so a module-level
    logger created at import, before ``configure`` runs, still renders (and
    scrubs) as configured."""
    return ActorLogger(bound)
