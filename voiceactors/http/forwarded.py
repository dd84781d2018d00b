"""The client behind a trusted reverse proxy: its address and scheme.

Behind a reverse proxy (a TLS-terminating load balancer) every request
arrives from the proxy's address over plain http: the rate limits would put
every client in the proxy's one bucket, and the console's cookie would not
be ``Secure`` although the browser spoke https. The setting
``trusted_proxies`` names the proxies (addresses or CIDR networks). For a
request whose peer is one of them, ``ForwardedScope`` puts the forwarded
client in the ASGI scope before anything reads it (the rate limits, ``/mcp``
and Quart's ``request.scheme`` all read the scope):

- the client is the rightmost ``X-Forwarded-For`` hop that is not itself a
  trusted proxy (each proxy appends the address it was reached from, so
  everything left of that hop is what the client chose to send); all hops
  trusted: the leftmost; no header: the peer itself;
- the scheme is the rightmost ``X-Forwarded-Proto`` value (the one the
  nearest proxy wrote), when it is ``http`` or ``https``.

From any other peer the headers are ignored: anyone can send them. With no
trusted proxy (the default) the app is not wrapped at all.

Why not hypercorn's ``ProxyFixMiddleware``: it trusts a fixed number of hops
from *every* peer (a client reaching the server directly could name its own
address), and it replaces ``Host`` with ``X-Forwarded-Host``, which the Host
guard (``hosts.py``) decides on.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Iterable

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
SCHEMES = frozenset({"http", "https"})
MAX_HOP_CHARS = 64          # a hop that is not an address is kept as the client's name, this long at most


def parse_address(text: str) -> IPAddress | None:
    """An address as a peer or a forwarded hop gives it: bare, ``v4:port``,
    ``[v6]`` or ``[v6]:port``; an IPv4-mapped IPv6 address as its IPv4."""
    text = text.strip()
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped if mapped is not None else address


class TrustedProxies:
    """The networks whose requests' forwarded headers are believed."""

    def __init__(self, entries: Iterable[str]) -> None:
        self._networks = tuple(ipaddress.ip_network(entry.strip(), strict=False) for entry in entries)

    def __bool__(self) -> bool:
        return bool(self._networks)

    def trusts(self, address: str) -> bool:
        parsed = parse_address(address)
        return parsed is not None and any(parsed in network for network in self._networks)

    def client(self, peer: str, forwarded_for: list[str]) -> str:
        """The client of a request from ``peer`` (trusted) with these
        ``X-Forwarded-For`` hops, leftmost first."""
        for hop in reversed(forwarded_for):
            if not self.trusts(hop):
                parsed = parse_address(hop)
                return str(parsed) if parsed is not None else hop[:MAX_HOP_CHARS]
        return str(parse_address(forwarded_for[0]) or peer) if forwarded_for else peer


def _header_values(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> list[str]:
    """Every comma-separated value of header ``name``, in order (repeated headers joined)."""
    values: list[str] = []
    for key, value in headers:
        if key.lower() == name:
            values.extend(part.strip() for part in value.decode("latin-1").split(",") if part.strip())
    return values


def forwarded_scope(proxies: TrustedProxies, scope: dict[str, Any]) -> dict[str, Any]:
    """``scope`` with the forwarded client and scheme when its peer is a
    trusted proxy; else ``scope`` itself."""
    client = scope.get("client")
    peer = str(client[0]) if isinstance(client, (tuple, list)) and client else None
    if peer is None or not proxies.trusts(peer):
        return scope
    headers = scope.get("headers") or ()
    changed = dict(scope)
    hops = _header_values(headers, b"x-forwarded-for")
    if hops:
        changed["client"] = (proxies.client(peer, hops), 0)
    protos = _header_values(headers, b"x-forwarded-proto")
    if protos and protos[-1].lower() in SCHEMES:
        changed["scheme"] = protos[-1].lower()
    return changed


class ForwardedScope:
    """ASGI middleware: the app sees a trusted proxy's client as the request's own."""

    def __init__(self, app: Any, proxies: TrustedProxies) -> None:
        self.app, self.proxies = app, proxies

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") == "http":         # the server serves no websockets
            scope = forwarded_scope(self.proxies, scope)
        await self.app(scope, receive, send)
