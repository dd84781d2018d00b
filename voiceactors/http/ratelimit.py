"""Per-client rate limits on the POSTs that cost something.

Each mint spends the OpenAI account, each connect starts a call and each brain
refresh may run the brain (a Claude run). A token bucket per (route, client
address) lets ``burst`` requests through at once and refills at ``per_s``;
a request finding its bucket empty is refused with 429 and ``Retry-After``
(whole seconds until a token is back). Time is trio's clock, so tests run on
``autojump_clock``. The table of buckets is bounded: past ``max_clients``
the least recently used bucket is dropped (it would have refilled anyway
long before an attacker cycling addresses comes back).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Mapping

import trio
from quart import Quart, request

from voiceactors.http.errors import RATE_LIMITED, ApiError
from voiceactors.settings import Settings

RATE_LIMITED_POSTS = frozenset({"/api/voice/session", "/api/voice/connect", "/api/voice/refresh-brain"})


@dataclass
class _Bucket:
    tokens: float
    at: float


class RateLimiter:
    """Token buckets keyed by any hashable; ``take`` answers the wait (0: allowed)."""

    def __init__(self, burst: int, per_s: float, max_clients: int) -> None:
        self.burst = max(1, burst)
        self.per_s = per_s
        self.max_clients = max(1, max_clients)
        self._buckets: OrderedDict[object, _Bucket] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.per_s > 0

    def take(self, key: object) -> float:
        """Take one token for ``key``: 0.0 when allowed, else the seconds until
        one is back (nothing is taken)."""
        if not self.enabled:
            return 0.0
        now = trio.current_time()
        bucket = self._buckets.pop(key, None) or _Bucket(float(self.burst), now)
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.at) * self.per_s)
        bucket.at = now
        self._buckets[key] = bucket            # most recently used last
        while len(self._buckets) > self.max_clients:
            self._buckets.popitem(last=False)
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / self.per_s


def client_address(scope: Mapping[str, Any]) -> str:
    client = scope.get("client")
    if isinstance(client, (tuple, list)) and client:
        return str(client[0])
    return "<local>"


def install(app: Quart, settings: Settings) -> RateLimiter:
    """Limit the costly POSTs per client (after the host, browser and token guards)."""
    limiter = RateLimiter(settings.rate_limit_burst, settings.rate_limit_per_s, settings.rate_limit_clients)

    @app.before_request
    async def _rate_limit() -> None:
        if request.method != "POST" or request.path not in RATE_LIMITED_POSTS:
            return
        wait = limiter.take((request.path, client_address(request.scope)))
        if wait > 0:
            raise ApiError(429, RATE_LIMITED, {"Retry-After": str(max(1, math.ceil(wait)))})

    return limiter
