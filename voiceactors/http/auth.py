"""Who may call ``/api/voice/*``: the bearer token, and the browser guard.

On loopback (the default, 127.0.0.1) the API is open unless a token is
configured. On any other address a token (``VOICEACTORS_API_TOKEN``) is
required: the server refuses to start without one (``refusal``), and every
``/api/voice/*`` request must carry ``Authorization: Bearer <token>``.
Tokens are compared in constant time.

The browser guard holds with or without a token. A web page the user visits
may send "simple" cross-site requests to a server on loopback without any
preflight (a ``text/plain`` POST, or one without a body); unguarded, any page
could mint sessions on the user's OpenAI account or force brain refreshes.
So a request a browser marks ``Sec-Fetch-Site: cross-site`` is refused (403),
and a POST body must be declared JSON (415): a cross-origin JSON POST needs a
CORS preflight, which this server never grants. A request it marks
``same-site`` (a page on another port of the same host) is refused too (403
``origin not allowed``): such a page's GETs carry no ``Origin`` and, on the
same site, the console's ``SameSite=Strict`` cookie, so without this it could
drain ``/api/voice/observer-actions`` or hold an event stream open. The
console's own requests are ``same-origin``; nothing of the API is meant for
another origin (no CORS is granted), so the rule holds for every
``/api/voice/*`` request, with a cookie, a token or neither (open loopback).

Guessing the token is throttled wherever a credential is checked: a request
that presents one (an ``Authorization`` header, the console's session
cookie) and is refused draws from the client's ``ratelimit.TokenFailures``
bucket, the sign-in's; a client over it is answered 429 before its
credential is compared (``check_credential``, for every route, ``/mcp`` and
the console's config too). A request that presents none guessed nothing
and draws nothing.

One path under the prefix is neither's: OpenAI's phone-call webhook
(``SIGNED_PATHS``, ``http/phone.py``). The service can send neither the
token nor a browser's headers; the webhook's signature (OpenAI's webhook
secret) is its authentication, checked by its route before any other work.

These rules are guards of ``guards.py`` (the browser guard, the token),
declared there once in the app's order.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Callable

from quart import Quart, current_app, request

from voiceactors.http import console_sessions
from voiceactors.http.errors import CROSS_SITE, NOT_JSON_CONTENT, ORIGIN_NOT_ALLOWED, UNAUTHORIZED
from voiceactors.http.ratelimit import TokenFailures, client_address
from voiceactors.settings import Settings

PROTECTED_PREFIX = "/api/voice/"
#: under the prefix, but authenticated by a signature of their own: no token, no browser guard
SIGNED_PATHS = frozenset({"/api/voice/phone/incoming"})
FAILURES = "voiceactors_token_failures"     # the app's TokenFailures, in app.extensions


class InsecureSettings(ValueError):
    """The settings would expose the API off loopback without a token."""


def refusal(settings: Settings) -> str | None:
    """Why the server must not start with ``settings``, or None."""
    if not settings.loopback and not settings.api_token:
        return (f"refusing to listen on {settings.host}: off loopback the API needs a bearer token; "
                "set VOICEACTORS_API_TOKEN (or listen on 127.0.0.1)")
    return None


def guarded(path: str) -> bool:
    """Whether the token and the browser guard apply to ``path``."""
    return path.startswith(PROTECTED_PREFIX) and path not in SIGNED_PATHS


def token_required(settings: Settings) -> bool:
    return bool(settings.api_token) or not settings.loopback


def authorized(settings: Settings, header: str | None) -> bool:
    """True when ``header`` (the Authorization value) carries the token."""
    if not settings.api_token:
        return settings.loopback
    scheme, _, presented = (header or "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(presented.strip().encode("utf-8"), settings.api_token.encode("utf-8"))


@dataclass(frozen=True)
class TokenCheck:
    """A request's credential checked: ``accepted``, or refused; ``locked_s``
    > 0 when its client is over the failure bucket (answer 429, that long)."""

    accepted: bool
    locked_s: float = 0.0


def check_credential(failures: TokenFailures, client: str, presented: bool, matches: Callable[[], bool]) -> TokenCheck:
    """The one rule of every credential check: nothing ``presented`` is
    refused and draws nothing (nothing was guessed); a client over its
    failure bucket is locked out before ``matches`` is asked (a right token
    too: a 200 would confirm a guess); a credential that does not match
    draws one token."""
    if not presented:
        return TokenCheck(False)
    locked = failures.locked_for(client)
    if locked > 0:
        return TokenCheck(False, locked)
    if matches():
        return TokenCheck(True)
    failures.refused(client)
    return TokenCheck(False)


def request_credential(settings: Settings) -> TokenCheck:
    """The current Quart request's bearer token or session cookie (either
    one stands in), checked by ``check_credential``."""
    header = request.headers.get("Authorization")
    cookie = request.cookies.get(console_sessions.COOKIE_NAME)
    failures: TokenFailures = current_app.extensions[FAILURES]
    return check_credential(failures, client_address(request.scope), header is not None or cookie is not None,
                            lambda: authorized(settings, header) or console_sessions.store().valid(cookie))


def foreign_fetch(fetch_site: str | None) -> str | None:
    """The 403 message for a request a browser marks as sent by a page of
    another origin (``Sec-Fetch-Site``): ``cross-site`` another site,
    ``same-site`` another origin of this site (another port on localhost,
    another subdomain), which ``SameSite=Strict`` still sends the console's
    cookie with and whose GETs carry no ``Origin``. None for what the
    console itself sends (``same-origin``), a person's own navigation
    (``none``) and no header at all (not a browser, or one without Fetch
    Metadata: ``hosts.py``'s ``Origin`` check stays the guard there). The
    rule of every path that guards."""
    site = (fetch_site or "").strip().lower()
    if site == "cross-site":
        return CROSS_SITE
    if site == "same-site":
        return ORIGIN_NOT_ALLOWED
    return None


def json_mimetype(mimetype: str) -> bool:
    """A lower-case media type (no parameters) that is JSON."""
    return mimetype == "application/json" or mimetype.endswith("+json")


def declared_json(content_type: str | None) -> bool:
    """A ``Content-Type`` value that declares JSON (its parameters aside)."""
    return json_mimetype((content_type or "").split(";", 1)[0].strip().lower())


def declared_json_or_empty(mimetype: str, transfer_encoding: str | None, content_length: int | None) -> bool:
    """A POST's body is declared JSON, or there is none: no media type, not
    chunked and no declared length (``guards.browser_guard``)."""
    if mimetype:
        return json_mimetype(mimetype)
    chunked = "chunked" in (transfer_encoding or "").lower()
    return not chunked and not content_length


def keep_failures(app: Quart, failures: TokenFailures) -> None:
    """``failures`` is the app's one bucket of refused credentials (``request_credential`` reads it)."""
    app.extensions[FAILURES] = failures
