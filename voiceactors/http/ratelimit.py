"""Per-client rate limits on the POSTs that cost something.

Each mint spends the OpenAI account, each connect starts a call and each brain
refresh may run the brain (a Claude run). A token bucket per (route, client
address) lets ``burst`` requests through at once and refills at ``per_s``;
a request finding its bucket empty is refused with 429 and ``Retry-After``
(whole seconds until a token is back). Time is trio's clock, so tests run on
``autojump_clock``. The table of buckets is bounded: past ``max_clients``
the least recently used bucket is dropped (it would have refilled anyway
long before an attacker cycling addresses comes back).

Sign-in (``POST /api/voice/login``) is one of these POSTs, and guessing the
token costs more: each sign-in from a client also reserves a token of a
stricter bucket of its own (``LOGIN_FAILURE_BURST`` at once, one back every
``1 / LOGIN_FAILURE_PER_S`` seconds), and only a refused token (401) keeps
it; any other answer gives it back. So a person who mistypes gets a few
tries, then waits a minute per try, while a browser signing in with the
right token is never slowed down. The reservation is taken before the
token is compared, so parallel guesses cannot overdraw the bucket. Both
buckets are off when ``rate_limit_per_s`` is 0.

That stricter bucket is the app's one ``TokenFailures``: every refused
credential draws from it, not only the sign-in's — a wrong bearer token or
session cookie on any route, ``/mcp`` included (``auth.py``), so the same
token cannot be guessed on a route that costs nothing instead. A client
over it is refused 429 before its credential is compared.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Mapping

import trio
from quart import Quart

from voiceactors.http.errors import RATE_LIMITED, ApiError
from voiceactors.http.targets import scope_path
from voiceactors.settings import Settings

LOGIN_PATH = "/api/voice/login"
RATE_LIMITED_POSTS = frozenset({"/api/voice/session", "/api/voice/live", "/api/voice/connect", "/api/voice/refresh-brain",
                                LOGIN_PATH})
LOGIN_FAILURE_BURST = 5            # wrong tokens a client may try at once
LOGIN_FAILURE_PER_S = 1 / 60       # then one more try a minute


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

    def wait_for(self, key: object) -> float:
        """The seconds until ``key`` may take a token (0.0: now); takes nothing
        and changes nothing, so a refusal can be decided before the app runs."""
        if not self.enabled:
            return 0.0
        bucket = self._buckets.get(key)
        if bucket is None:
            return 0.0
        tokens = min(float(self.burst), bucket.tokens + (trio.current_time() - bucket.at) * self.per_s)
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.per_s

    def give_back(self, key: object) -> None:
        """Return a token ``take`` took for ``key`` (up to the burst)."""
        bucket = self._buckets.get(key)
        if bucket is not None:
            bucket.tokens = min(float(self.burst), bucket.tokens + 1.0)


class TokenFailures:
    """The per-client bucket every refused credential draws from (one per
    app): ``LOGIN_FAILURE_BURST`` refusals at once, then one every
    ``1 / LOGIN_FAILURE_PER_S`` seconds. Keyed by the client address
    (``client_address``: a trusted proxy's forwarded client), so one
    client's guesses never lock another out. Off with the rate limits."""

    def __init__(self, settings: Settings) -> None:
        self._bucket = RateLimiter(LOGIN_FAILURE_BURST, LOGIN_FAILURE_PER_S if settings.rate_limit_per_s > 0 else 0.0,
                                   settings.rate_limit_clients)

    @property
    def enabled(self) -> bool:
        return self._bucket.enabled

    def locked_for(self, client: str) -> float:
        """The seconds until ``client`` may present a credential again (0.0: now); takes nothing."""
        return self._bucket.wait_for(client)

    def refused(self, client: str) -> None:
        """A credential of ``client``'s was refused: it draws one token."""
        self._bucket.take(client)

    def reserve(self, client: str) -> float:
        """Take a token before a comparison that awaits (the sign-in reads
        its body first): 0.0 when taken, else the wait (nothing taken)."""
        return self._bucket.take(client)

    def give_back(self, client: str) -> None:
        """The reserved comparison succeeded: its token comes back."""
        self._bucket.give_back(client)


def client_address(scope: Mapping[str, Any]) -> str:
    client = scope.get("client")
    if isinstance(client, (tuple, list)) and client:
        return str(client[0])
    return "<local>"


def bucket_key(scope: Mapping[str, Any]) -> tuple[str, str] | None:
    """The bucket a request draws from — ``(path, client address)`` for a
    rate-limited POST, None for every other request. One rule for the app's
    guard (``guards.rate_limit``) and the early refusals (asgi.py); the path is the
    one Quart routes (``targets.py``: an absolute-form or doubled-slash
    target draws from the same bucket as the origin form)."""
    if scope.get("method") != "POST":
        return None
    path = scope_path(scope)
    if path not in RATE_LIMITED_POSTS:
        return None
    return path, client_address(scope)


def install(app: Quart, settings: Settings) -> RateLimiter:
    """The app's limiter of the costly POSTs per client (``guards.rate_limit``
    takes from it, the early 429s in ``asgi.py`` read it)."""
    limiter = RateLimiter(settings.rate_limit_burst, settings.rate_limit_per_s, settings.rate_limit_clients)
    app.extensions["voiceactors_rate_limiter"] = limiter
    return limiter


def retry_after(wait: float) -> str:
    """The ``Retry-After`` value for a wait in seconds (whole seconds, at least 1)."""
    return str(max(1, math.ceil(wait)))


def refuse_after(wait: float) -> None:
    """Raise the 429 ``ApiError`` for a client that must wait ``wait`` seconds (none when 0)."""
    if wait > 0:
        raise ApiError(429, RATE_LIMITED, {"Retry-After": retry_after(wait)})
