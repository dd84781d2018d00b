"""Every guard a request meets, declared once, in the order it meets them.

A guard reads a request (``Inbound``: its method, routed path, headers,
cookies and ASGI scope) and either lets it through or raises the
``ApiError`` that answers it. ``declared`` builds the app's one ordered list;
two ways apply it, never a copy of a rule:

* Quart's request hook (``install``) for every request Quart serves, over
  ``QuartInbound`` (Quart's own request);
* the connect handler (``connect.py``) for every ``/api/voice/connect``,
  answered at the ASGI layer, over ``ScopeInbound`` (the ASGI scope, read
  once: the connect's CPU stays low).

Both views read a header as Quart does (the first of its name,
latin-1), a cookie, the body's declared length and its media type with
werkzeug's own functions, so a guard decides the same either way.

The order: the body limit (a declared oversize body is refused before a
byte of it is read), the ``Host`` and ``Origin`` check (``hosts.py``: a
rebound page learns nothing, not even 401), the browser guard and the
token (``auth.py``), the rate limit last (``ratelimit.py``: it takes a
token, so only a request every other guard let through draws one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

from quart import Quart, g, request
from werkzeug.http import parse_cookie, parse_options_header
from werkzeug.sansio.utils import get_content_length

from voiceactors.http import auth, console_sessions, hosts
from voiceactors.http.errors import NOT_JSON_CONTENT, TOO_LARGE, UNAUTHORIZED, ApiError
from voiceactors.http.ratelimit import (LOGIN_PATH, RateLimiter, TokenFailures, bucket_key, client_address,
                                        refuse_after)
from voiceactors.http.targets import scope_path
from voiceactors.settings import Settings


class Inbound(Protocol):
    """What a guard reads of a request, and the one thing it leaves on it
    (the sign-in's reserved failure token, settled after the answer)."""

    @property
    def method(self) -> str: ...

    @property
    def path(self) -> str: ...

    @property
    def scope(self) -> Mapping[str, Any]: ...

    @property
    def content_length(self) -> int | None: ...

    @property
    def mimetype(self) -> str: ...

    def header(self, name: str) -> str | None:
        """The first ``name`` header's value (``name`` lower-case), or None."""

    def cookie(self, name: str) -> str | None: ...

    def reserve_login(self, client: str) -> None:
        """A sign-in reserved a token of ``client``'s failure bucket (given back unless refused)."""


Guard = Callable[[Inbound], None]


@dataclass
class ScopeInbound:
    """An ASGI request scope as a guard reads it (the headers read once)."""

    scope: Mapping[str, Any]
    _headers: dict[str, str] = field(init=False)
    _mimetype: str | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        headers: dict[str, str] = {}
        cookies: list[str] = []
        for raw_name, raw_value in self.scope.get("headers", ()):
            name = bytes(raw_name).decode("latin-1").lower()
            value = bytes(raw_value).decode("latin-1")
            headers.setdefault(name, value)          # Quart's ``headers.get``: the first of its name
            if name == "cookie":
                cookies.append(value)
        if len(cookies) > 1:                         # werkzeug joins them (``Request.cookies``)
            headers["cookie"] = ";".join(cookies)
        self._headers = headers

    @property
    def method(self) -> str:
        return str(self.scope.get("method", ""))

    @property
    def path(self) -> str:
        return scope_path(self.scope)

    @property
    def content_length(self) -> int | None:
        return get_content_length(self._headers.get("content-length"), self._headers.get("transfer-encoding"))

    @property
    def mimetype(self) -> str:
        if self._mimetype is None:
            self._mimetype = _mimetype(self._headers.get("content-type", ""))
        return self._mimetype

    def header(self, name: str) -> str | None:
        return self._headers.get(name)

    def cookie(self, name: str) -> str | None:
        raw = self._headers.get("cookie")
        return None if raw is None else parse_cookie(raw).get(name)

    def reserve_login(self, client: str) -> None:
        raise AssertionError("a sign-in is Quart's: only /api/voice/connect is served from a scope")


def _mimetype(content_type: str) -> str:
    """What werkzeug's ``Request.mimetype`` gives for a ``Content-Type`` value."""
    if not content_type:
        return ""
    if content_type == "application/json":           # the usual one, without werkzeug's parser
        return content_type
    return parse_options_header(content_type)[0].lower()


class QuartInbound:
    """Quart's current request as a guard reads it."""

    @property
    def method(self) -> str:
        return request.method

    @property
    def path(self) -> str:
        return request.path

    @property
    def scope(self) -> Mapping[str, Any]:
        return request.scope

    @property
    def content_length(self) -> int | None:
        return request.content_length

    @property
    def mimetype(self) -> str:
        return request.mimetype

    def header(self, name: str) -> str | None:
        return request.headers.get(name)

    def cookie(self, name: str) -> str | None:
        return request.cookies.get(name)

    def reserve_login(self, client: str) -> None:
        g.login_reserved = client


# --- the guards ---------------------------------------------------------------

def body_limit(settings: Settings) -> Guard:
    """413 for a declared body past ``body_limit``, before a byte of it is
    read (a body without ``Content-Length`` is bounded while it is read)."""
    limit = settings.body_limit

    def guard(inbound: Inbound) -> None:
        length = inbound.content_length
        if length is not None and length > limit:
            raise ApiError(413, TOO_LARGE)
    return guard


def own_host_and_origin(settings: Settings) -> Guard:
    """421 / 403 for a ``Host`` or ``Origin`` not the server's own (``hosts.py``), public assets aside."""
    policy = hosts.HostPolicy.from_settings(settings)

    def guard(inbound: Inbound) -> None:
        if hosts.is_public_asset(inbound.path):
            return
        refused = hosts.host_refusal(policy, inbound.header("host"), inbound.header("origin"),
                                     inbound.scope.get("server"))
        if refused is not None:
            raise ApiError(*refused)
    return guard


def browser_guard(inbound: Inbound) -> None:
    """403 for a page of another origin, 415 for a POST body not declared JSON (``auth.py``)."""
    if not auth.guarded(inbound.path):
        return
    foreign = auth.foreign_fetch(inbound.header("sec-fetch-site"))
    if foreign is not None:
        raise ApiError(403, foreign)
    if inbound.method == "POST" and not auth.declared_json_or_empty(
            inbound.mimetype, inbound.header("transfer-encoding"), inbound.content_length):
        raise ApiError(415, NOT_JSON_CONTENT)


def require_token(settings: Settings, failures: TokenFailures, sessions: Callable[[], console_sessions.SessionStore]
                  ) -> Guard:
    """401 without the bearer token or the console's cookie, 429 for a
    client locked out by its refused ones (``auth.py``); the console's
    sign-in paths are reachable without either."""

    def guard(inbound: Inbound) -> None:
        path = inbound.path
        if not auth.guarded(path) or console_sessions.is_public(path):
            return
        header = inbound.header("authorization")
        cookie = inbound.cookie(console_sessions.COOKIE_NAME)
        check = auth.check_credential(failures, client_address(inbound.scope),
                                      header is not None or cookie is not None,
                                      lambda: auth.authorized(settings, header) or sessions().valid(cookie))
        refuse_after(check.locked_s)
        if not check.accepted:
            raise ApiError(401, UNAUTHORIZED, {"WWW-Authenticate": "Bearer"})
    return guard


def rate_limit(limiter: RateLimiter, failures: TokenFailures) -> Guard:
    """429 for a costly POST past its client's bucket (``ratelimit.py``);
    a sign-in also reserves a token of the client's failure bucket."""

    def guard(inbound: Inbound) -> None:
        key = bucket_key(inbound.scope)
        if key is None:
            return
        _path, client = key
        refuse_after(limiter.take(key))
        if inbound.path == LOGIN_PATH and failures.enabled:
            refuse_after(failures.reserve(client))
            inbound.reserve_login(client)          # kept only if the token is refused
    return guard


def declared(settings: Settings, failures: TokenFailures, limiter: RateLimiter,
             sessions: Callable[[], console_sessions.SessionStore]) -> tuple[Guard, ...]:
    """The app's guards, in order (the token's only when one is required)."""
    token = (require_token(settings, failures, sessions),) if auth.token_required(settings) else ()
    return (body_limit(settings), own_host_and_origin(settings), browser_guard, *token, rate_limit(limiter, failures))


def check(guards: tuple[Guard, ...], inbound: Inbound) -> None:
    """Every guard in order; the first refusal raises its ``ApiError``."""
    for guard in guards:
        guard(inbound)


def install(app: Quart, guards: tuple[Guard, ...]) -> None:
    """Apply ``guards`` to every request Quart serves (after ``_begin``
    has named it), and give a sign-in's reserved token back unless it was
    refused."""
    failures: TokenFailures = app.extensions[auth.FAILURES]
    inbound = QuartInbound()

    @app.before_request
    async def _guards() -> None:
        check(guards, inbound)

    @app.after_request
    async def _settle_login(response: object) -> object:
        client = getattr(g, "login_reserved", None)
        if client is not None and getattr(response, "status_code", None) != 401:
            failures.give_back(client)
        return response
