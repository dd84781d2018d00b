"""Which ``Host`` and ``Origin`` a request may carry (DNS rebinding, CSRF).

A page whose name the attacker rebinds to 127.0.0.1 is same-origin with this
server as far as the browser knows: it could mint keys, read the instruction
preview and drive calls. Its requests still carry the attacker's name in
``Host``, so a request whose ``Host`` is not one of the server's own names is
refused (421). A page on another origin (another port on 127.0.0.1, a file,
a sandboxed frame sending ``Origin: null``) is told apart by its ``Origin``,
which browsers send on every POST and every cross-origin request: any
``Origin`` other than the server's own is refused (403). That holds in browsers
without Fetch Metadata too.

The server's own names: ``localhost``, ``127.0.0.1``, ``[::1]``, the listen
address when it is a specific one (not ``0.0.0.0`` / ``::``), the address the
connection arrived at (an IP literal cannot be rebound), and the configured
``allowed_hosts``. A loopback or listen name must carry the port the
connection arrived on (no port means 80); where that port is unknown (the
test client has no socket) any port passes. A configured name may give a port
(``voice.example.org:8443``: only that one) or not (any port: a reverse proxy
may forward from its own).

The server's own origin is ``http://`` or ``https://`` followed by exactly the
request's (allowed) ``Host``.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from voiceactors.http.errors import HOST_NOT_ALLOWED, ORIGIN_NOT_ALLOWED
from voiceactors.settings import Settings

#: Paths served to anyone who can reach the socket, without the Host and
#: Origin checks: public static assets only (nothing that reads the journal
#: or spends the key).
PUBLIC_ASSET_PREFIXES: tuple[str, ...] = ("/static/",)

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::", "[::]"})
DEFAULT_HTTP_PORT = 80
ORIGIN_SCHEMES = ("http://", "https://")


def split_host(value: str) -> tuple[str, int | None] | None:
    """``"Name:port"`` as ``("name", port)``; ``"[::1]:80"`` keeps the brackets.
    None when it is not a well-formed host."""
    value = value.strip().lower()
    if not value or any(c in value for c in " /\\@?#\t"):
        return None
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[:end + 1], value[end + 1:]
    else:
        name, colon, port_text = value.partition(":")
        rest = colon + port_text
    if not name or name == "[]":
        return None
    if not rest:
        return name, None
    if not rest.startswith(":") or not rest[1:].isdigit() or not 0 < int(rest[1:]) < 65536:
        return None
    return name, int(rest[1:])


def _bracketed(host: str) -> str:
    host = host.strip().lower()
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


@dataclass(frozen=True)
class HostPolicy:
    """The names this server answers to, from its settings."""

    local_names: frozenset[str]                   # must carry the connection's port
    configured: frozenset[tuple[str, int | None]]  # (name, port or None for any)

    @classmethod
    def from_settings(cls, settings: Settings) -> "HostPolicy":
        local = set(LOOPBACK_NAMES)
        bind = _bracketed(settings.host)
        if bind not in WILDCARD_BINDS:
            local.add(bind)
        configured = set()
        for entry in settings.allowed_hosts:
            parsed = split_host(entry)
            if parsed is None:
                raise ValueError(f"allowed host is not a host name: {entry!r}")
            configured.add(parsed)
        return cls(frozenset(local), frozenset(configured))

    def allows(self, host_header: str | None, server: Any) -> bool:
        """``host_header`` names this server, for a connection that arrived at
        ``server`` (the ASGI ``(address, port)``, or None when unknown)."""
        parsed = split_host(host_header or "")
        if parsed is None:
            return False
        name, port = parsed
        if (name, None) in self.configured or (name, port) in self.configured:
            return True
        local_addresses, local_port = _server_address(server)
        if name not in self.local_names and name not in local_addresses:
            return False
        if local_port is None:
            return True
        return (port if port is not None else DEFAULT_HTTP_PORT) == local_port


def _server_address(server: Any) -> tuple[frozenset[str], int | None]:
    """The Host spellings of the address a connection arrived at (an
    IPv4-mapped IPv6 address also as plain IPv4), and its port."""
    if not (isinstance(server, (tuple, list)) and len(server) >= 2 and isinstance(server[1], int)):
        return frozenset(), None
    address = str(server[0])
    names = {_bracketed(address)}
    try:
        mapped = getattr(ipaddress.ip_address(address), "ipv4_mapped", None)
    except ValueError:
        mapped = None
    if mapped is not None:
        names.add(str(mapped))
    return frozenset(names), server[1]


def host_refusal(policy: HostPolicy, host: str | None, origin: str | None, server: Any) -> tuple[int, str] | None:
    """Why a request with these ``Host`` and ``Origin`` headers is refused
    (421 for a host not ours, 403 for a foreign origin), or None: the rule
    of every path that guards (``guards.own_host_and_origin``, the MCP
    endpoint)."""
    if not policy.allows(host, server):
        return 421, HOST_NOT_ALLOWED
    if origin is not None and not own_origin(origin, host or ""):
        return 403, ORIGIN_NOT_ALLOWED
    return None


def own_origin(origin: str, host_header: str) -> bool:
    """``origin`` is this server's own: a web scheme and exactly the request's host."""
    origin = origin.strip().lower()
    for scheme in ORIGIN_SCHEMES:
        if origin.startswith(scheme):
            return origin[len(scheme):] == host_header.strip().lower()
    return False


def is_public_asset(path: str) -> bool:
    return path.startswith(PUBLIC_ASSET_PREFIXES)
