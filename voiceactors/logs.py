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

import logging
import re
import sys
from typing import Any, MutableMapping, TextIO, cast

import structlog

_SECRET_FIELDS = frozenset({
    "api_key", "apikey", "api_token", "token", "access_token", "refresh_token", "openai_api_key",
    "openai_api_key_env", "authorization", "proxy_authorization", "ephemeral_key", "client_secret",
    "secret", "password", "cookie", "set_cookie", "bearer",
})
_SECRET_SUFFIXES = ("_api_key", "_token", "_secret", "_password")
_SECRET_VALUE = re.compile(r"(sk-[A-Za-z0-9_\-]{6,}|ek_[A-Za-z0-9_\-]{4,}|Bearer\s+\S+)")
_extra_secrets: set[str] = set()


def register_secret(value: str | None) -> None:
    """Scrub this exact value from every later log line (e.g. a configured key)."""
    if value and len(value) >= 4:
        _extra_secrets.add(value)


def is_secret_field(name: Any) -> bool:
    """True when a field called ``name`` holds a secret (not merely names one)."""
    key = str(name).strip().lower().replace("-", "_")
    return key in _SECRET_FIELDS or key.endswith(_SECRET_SUFFIXES)


def _scrub_field(name: Any, value: Any) -> Any:
    if is_secret_field(name) and value is not None and not isinstance(value, bool):
        return "[redacted]"
    return scrub(value)


def scrub(value: Any) -> Any:
    if isinstance(value, str):
        for secret in _extra_secrets:
            if secret in value:
                value = value.replace(secret, "[redacted]")
        return _SECRET_VALUE.sub("[redacted]", value)
    if isinstance(value, dict):
        return {k: _scrub_field(k, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub(v) for v in value]
    return value


def _scrub_processor(_logger: Any, _name: str,
                     event_dict: MutableMapping[str, Any]) -> dict[str, Any]:
    scrubbed: dict[str, Any] = scrub(event_dict)
    return scrubbed


class _CurrentStderr:
    """``sys.stderr`` as it is at each write: a tool or test that swaps it
    (and closes its replacement) must not leave logging pointing at a closed file."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


_CURRENT_STDERR = _CurrentStderr()


def configure(fmt: str = "json", level: str = "info", stream: TextIO | None = None) -> None:
    """Configure structlog once per process. ``fmt`` is ``json`` or ``console``."""
    renderer: Any
    if fmt == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=False)
    else:
        renderer = structlog.processors.JSONRenderer(sort_keys=False, default=str)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            _scrub_processor,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        # _CurrentStderr is file-like only as far as print() needs (write, flush)
        logger_factory=structlog.PrintLoggerFactory(file=stream or cast(TextIO, _CURRENT_STDERR)),
        cache_logger_on_first_use=False,
    )


def get_logger(**bound: Any) -> Any:
    """A logger with ``bound`` fields on every line (e.g. ``actor="brain"``).

    It is a lazy proxy: each call uses the configuration current at that
    moment, so a module-level logger created at import, before ``configure``
    runs, still renders (and scrubs) as configured."""
    return structlog.get_logger(**bound)
