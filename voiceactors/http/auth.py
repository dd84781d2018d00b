"""Bearer-token access to ``/api/voice/*``.

On loopback (the default, 127.0.0.1) the API is open unless a token is
configured. On any other address a token (``VOICEACTORS_API_TOKEN``) is
required: the server refuses to start without one (``refusal``), and every
``/api/voice/*`` request must carry ``Authorization: Bearer <token>``.
Tokens are compared in constant time.
"""

from __future__ import annotations

import hmac

from quart import Quart, request

from voiceactors.http.errors import UNAUTHORIZED, ApiError
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


def install(app: Quart, settings: Settings) -> None:
    """Check the token before every ``/api/voice/*`` request (also before
    routing, so unknown paths under the prefix answer 401, not 404)."""
    if not token_required(settings):
        return

    @app.before_request
    async def _require_token() -> None:
        if request.path.startswith(PROTECTED_PREFIX) and not authorized(
                settings, request.headers.get("Authorization")):
            raise ApiError(401, UNAUTHORIZED, {"WWW-Authenticate": "Bearer"})
