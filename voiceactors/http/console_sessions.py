"""Browser sign-in: the session cookie that stands in for the bearer token.

``EventSource`` cannot send an ``Authorization`` header, so where a token is
required the console signs in once: ``POST /api/voice/login`` with the token
sets a cookie holding a random session id. The id is kept here (in memory,
hashed) with an expiry; the cookie is ``HttpOnly`` (no script reads it),
``SameSite=Strict`` (no cross-site request carries it) and ``Secure`` over
https. The token itself is never stored in the browser, a URL or a log.

The store belongs to one app (``app.extensions``); a restart signs everyone
out, which is the safe direction.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field
from typing import Any

import trio
from quart import Response, current_app, request

from voiceactors.settings import default

COOKIE_NAME = "voiceactors_session"
SESSION_TTL_S: float = default("console_session_ttl_s")   # without an app's settings; served apps use theirs
MAX_SESSIONS = 64                 # oldest signed-in browser is signed out past this
_EXTENSION = "voiceactors.console_sessions"

#: ``/api/voice/*`` paths a browser reaches before it has signed in.
PUBLIC_PATHS = frozenset({"/api/voice/console-config", "/api/voice/login", "/api/voice/logout"})


def _digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode("utf-8", "replace")).hexdigest()


@dataclass
class SessionStore:
    """Hashed session ids and when each expires (trio clock)."""

    ttl_s: float = SESSION_TTL_S
    max_sessions: int = MAX_SESSIONS
    _expiry: dict[str, float] = field(default_factory=dict)

    def create(self) -> str:
        """A new session id (the cookie's value); only its hash is kept."""
        self._prune()
        while len(self._expiry) >= self.max_sessions:
            self._expiry.pop(min(self._expiry, key=self._expiry.__getitem__))
        session_id = secrets.token_urlsafe(32)
        self._expiry[_digest(session_id)] = trio.current_time() + self.ttl_s
        return session_id

    def valid(self, session_id: str | None) -> bool:
        if not session_id:
            return False
        expires = self._expiry.get(_digest(session_id))
        return expires is not None and expires > trio.current_time()

    def revoke(self, session_id: str | None) -> None:
        if session_id:
            self._expiry.pop(_digest(session_id), None)

    def _prune(self) -> None:
        now = trio.current_time()
        for key in [key for key, expires in self._expiry.items() if expires <= now]:
            del self._expiry[key]

    def __len__(self) -> int:
        self._prune()
        return len(self._expiry)


def store() -> SessionStore:
    return store_of(current_app)


def store_of(app: Any) -> SessionStore:
    """``app``'s signed-in sessions (outside a request too: the connect's guards, ``guards.py``)."""
    store: SessionStore = app.extensions.setdefault(_EXTENSION, SessionStore(ttl_s=_ttl_s(app)))
    return store


def _ttl_s(app: Any) -> float:
    voice = app.extensions.get("voiceactors")
    return voice.settings.console_session_ttl_s if voice is not None else SESSION_TTL_S


def token_matches(token: str, presented: object) -> bool:
    return isinstance(presented, str) and hmac.compare_digest(presented.encode("utf-8"), token.encode("utf-8"))


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS


def set_cookie(response: Response, session_id: str) -> None:
    response.set_cookie(COOKIE_NAME, session_id, max_age=int(store().ttl_s), path="/",
                        httponly=True, samesite="Strict", secure=request.scheme == "https")


def clear_cookie(response: Response) -> None:
    response.delete_cookie(COOKIE_NAME, path="/", httponly=True, samesite="Strict",
                           secure=request.scheme == "https")
