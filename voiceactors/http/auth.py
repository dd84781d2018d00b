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
CORS preflight, which this server never grants.
"""

from __future__ import annotations

import hmac

from quart import Quart, request

from voiceactors.http import console_sessions
from voiceactors.http.errors import CROSS_SITE, NOT_JSON_CONTENT, UNAUTHORIZED, ApiError
from voiceactors.settings import Settings

PROTECTED_PREFIX = "/api/voice/"


class InsecureSettings(ValueError):
    """The settings would expose the API off loopback without a token."""


def refusal(settings: Settings) -> str | None:
    """Why the server must not start with ``settings``, or None."""
    if not settings.loopback and not settings.api_token:
        return (f"refusing to listen on {settings.host}: off loopback the API needs a bearer token; "
                "set VOICEACTORS_API_TOKEN (or listen on 127.0.0.1)")
    return None


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


def cross_site(fetch_site: str | None) -> bool:
    """A ``Sec-Fetch-Site`` value a browser sends with a cross-site request
    (the browser guard refuses it; the rule of every path that guards)."""
    return (fetch_site or "").strip().lower() == "cross-site"


def json_mimetype(mimetype: str) -> bool:
    """A lower-case media type (no parameters) that is JSON."""
    return mimetype == "application/json" or mimetype.endswith("+json")


def declared_json(content_type: str | None) -> bool:
    """A ``Content-Type`` value that declares JSON (its parameters aside)."""
    return json_mimetype((content_type or "").split(";", 1)[0].strip().lower())


def _declared_json_or_empty() -> bool:
    mimetype = request.mimetype
    if mimetype:
        return json_mimetype(mimetype)
    chunked = "chunked" in request.headers.get("Transfer-Encoding", "").lower()
    return not chunked and not request.content_length


def install(app: Quart, settings: Settings) -> None:
    """Guard every ``/api/voice/*`` request before routing: the browser guard
    always, the token when one is required (unknown paths under the prefix
    answer 401, not 404)."""

    @app.before_request
    async def _browser_guard() -> None:
        if not request.path.startswith(PROTECTED_PREFIX):
            return
        if cross_site(request.headers.get("Sec-Fetch-Site")):
            raise ApiError(403, CROSS_SITE)
        if request.method == "POST" and not _declared_json_or_empty():
            raise ApiError(415, NOT_JSON_CONTENT)

    if not token_required(settings):
        return

    @app.before_request
    async def _require_token() -> None:
        # The console's session cookie (console_sessions) stands in for the
        # token, and its sign-in paths are reachable without either.
        if request.path.startswith(PROTECTED_PREFIX) and not console_sessions.is_public(request.path) and not (
                authorized(settings, request.headers.get("Authorization")) or console_sessions.has_valid_cookie()):
            raise ApiError(401, UNAUTHORIZED, {"WWW-Authenticate": "Bearer"})
