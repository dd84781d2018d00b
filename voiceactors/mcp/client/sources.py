"""MCP tool sources: their configuration and the names their tools get.

A source is an MCP server reached over Streamable HTTP with a bearer token::

    "mcp_sources": [{"name": "crm", "url": "http://127.0.0.1:9000/mcp", "token_env": "CRM_TOKEN",
                     "timeout_s": 10}]

in the journal's ``voice`` block, or the same JSON list as the
``mcp_sources`` setting (``VOICEACTORS_MCP_SOURCES``), which wins when set.
The token itself never sits in the journal file: ``token_env`` names the
environment variable that holds it. ``timeout_s`` is optional (the
``mcp_timeout_s`` setting otherwise).

Names: a source's name is a slug without ``.`` or ``_`` (``[a-z][a-z0-9-]*``,
at most 32 characters), so ``<source>.<tool>`` and its underscore spelling
``<source>_<tool>`` always say which source a tool belongs to; the names of
the journal's own tool families (``journal``, ``entities``, ...) are taken.
Everything here is pure and synchronous, and imports nothing of the package
(``settings`` checks a source list with it).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping
from urllib.parse import urlsplit

from voiceactors.agents import HANDOFF_FAMILY

SOURCE_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
SOURCE_KEYS = frozenset({"name", "url", "token_env", "timeout_s"})
MAX_SOURCES = 16
TOKEN_MAX = 4096
#: The tool name an MCP server may use (the MCP spec's own rule).
MCP_TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
#: The longest function name the Realtime session accepts.
FUNCTION_NAME_MAX = 64


class SourceConfigError(ValueError):
    """The ``mcp_sources`` list cannot be used; the message says why."""


@dataclass(frozen=True)
class McpSource:
    name: str
    url: str
    token_env: str
    timeout_s: float | None = None     # None: the ``mcp_timeout_s`` setting

    def timeout(self, default_s: float) -> float:
        return self.timeout_s if self.timeout_s is not None else default_s


#: The families of the journal's own tools (``journal`` of ``journal.get_day``): names no source may
#: take. Declared here, below the settings that check a source list, rather than read from the tool
#: registry above them; the registry refuses a tool whose family is missing (``tools.registry``).
JOURNAL_TOOL_FAMILIES = frozenset({"journal", "entities", "commitments", "calendar", "briefing", "observer"})


def _source(index: int, item: Any) -> McpSource:
    where = f"mcp_sources[{index}]"
    if not isinstance(item, dict):
        raise SourceConfigError(f"{where} must be an object with name, url and token_env")
    unknown = sorted(set(item) - SOURCE_KEYS)
    if unknown:
        raise SourceConfigError(f"{where} has unknown keys: {', '.join(map(str, unknown))} "
                                f"(allowed: name, url, token_env, timeout_s)")
    name = item.get("name")
    if not isinstance(name, str) or not SOURCE_NAME_RE.fullmatch(name):
        raise SourceConfigError(f"{where}.name must be a slug: a lowercase letter, then lowercase letters, "
                                f"digits or '-', at most 32 characters (no '.' or '_'), not {name!r}")
    url = item.get("url")
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise SourceConfigError(f"{where}.url ({name}) must be an http:// or https:// URL, not {url!r}")
    if parts.username or parts.password:
        raise SourceConfigError(f"{where}.url ({name}) must not carry credentials; use token_env")
    token_env = item.get("token_env")
    if not isinstance(token_env, str) or not ENV_NAME_RE.fullmatch(token_env):
        raise SourceConfigError(f"{where}.token_env ({name}) must be an environment variable name "
                                f"(letters, digits, '_'), not {token_env!r}")
    timeout = item.get("timeout_s")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not 0 < timeout <= 300):
        raise SourceConfigError(f"{where}.timeout_s ({name}) must be a number of seconds in (0, 300], "
                                f"not {timeout!r}")
    assert isinstance(url, str)
    return McpSource(name, url, token_env, float(timeout) if timeout is not None else None)


def parse_sources(value: Any) -> tuple[McpSource, ...]:
    """The sources of ``value`` (a list, a JSON text of one, or None/empty for
    none); SourceConfigError naming the first problem. Names must be unique
    and not a journal tool family."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return ()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise SourceConfigError("mcp_sources must be a JSON list of sources") from None
    if not isinstance(value, list):
        raise SourceConfigError("mcp_sources must be a list of sources")
    if len(value) > MAX_SOURCES:
        raise SourceConfigError(f"mcp_sources lists {len(value)} sources; at most {MAX_SOURCES}")
    sources = tuple(_source(i, item) for i, item in enumerate(value))
    seen: set[str] = set()
    taken = JOURNAL_TOOL_FAMILIES | {HANDOFF_FAMILY}      # the handoff tools' family too (agents.py)
    for source in sources:
        if source.name in taken:
            raise SourceConfigError(
                f"mcp source name {source.name!r} clashes with the journal's own tools ({source.name}.*); "
                f"taken names: {', '.join(sorted(taken))}")
        if source.name in seen:
            raise SourceConfigError(f"mcp source name {source.name!r} is used twice")
        seen.add(source.name)
    return sources


def settings_problem(value: Any) -> str | None:
    """The ``mcp_sources`` setting's check (``Settings.problems``)."""
    try:
        parse_sources(value)
    except SourceConfigError as error:
        return str(error)
    return None


def spelled(source: str, tool: str, style: str) -> str:
    """A source tool's manifest name: ``<source>.<tool>`` (dotted) or with
    every ``.`` as ``_`` (underscore)."""
    dotted = f"{source}.{tool}"
    return dotted if style == "dotted" else dotted.replace(".", "_")


def source_of(name: str) -> str | None:
    """The source part of a spelled name (before the first ``.`` or ``_``;
    source names hold neither), or None."""
    match = re.match(r"^([a-z][a-z0-9-]{0,31})[._]", name) if isinstance(name, str) else None
    return match.group(1) if match else None


def token_of(source: McpSource, env: Mapping[str, str]) -> str | None:
    """The configured token of ``source`` from ``env``, None when unset or blank."""
    token = env.get(source.token_env, "").strip()
    return token or None
