"""Structured logging: one JSON object per line, secrets scrubbed.

Every actor binds its identity (``actor``, ``call_id``, ...) with
``get_logger(actor="call", call_id=...)``. A processor replaces any value that
looks like a key (``sk-...``, ``ek_...``, bearer tokens) and any field whose
name marks it as secret, so a careless call site cannot leak one.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Any, TextIO

import structlog

_SECRET_FIELD = re.compile(r"(api_key|apikey|secret|token|password|authorization|ephemeral_key)", re.I)
_SECRET_VALUE = re.compile(r"(sk-[A-Za-z0-9_\-]{6,}|ek_[A-Za-z0-9_\-]{4,}|Bearer\s+\S+)")
_extra_secrets: set[str] = set()


def register_secret(value: str | None) -> None:
    """Scrub this exact value from every later log line (e.g. a configured key)."""
    if value and len(value) >= 4:
        _extra_secrets.add(value)


def scrub(value: Any) -> Any:
    if isinstance(value, str):
        for secret in _extra_secrets:
            if secret in value:
                value = value.replace(secret, "[redacted]")
        return _SECRET_VALUE.sub("[redacted]", value)
    if isinstance(value, dict):
        return {k: ("[redacted]" if _SECRET_FIELD.search(str(k)) else scrub(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub(v) for v in value]
    return value


def _scrub_processor(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    return scrub(event_dict)


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
        logger_factory=structlog.PrintLoggerFactory(file=stream or _CURRENT_STDERR),
        cache_logger_on_first_use=False,
    )


def get_logger(**bound: Any) -> Any:
    """A logger with ``bound`` fields on every line (e.g. ``actor="brain"``).

    It is a lazy proxy: each call uses the configuration current at that
    moment, so a module-level logger created at import, before ``configure``
    runs, still renders (and scrubs) as configured."""
    return structlog.get_logger(**bound)
