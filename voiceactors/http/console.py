"""The voice console: the pages a person opens, their assets, and the small
JSON API they use besides ``/api/voice/*`` (config, sign-in, call history).

Pages (``/``, ``/calls``, ``/calls/<call_id>``) are static shells: every datum
they show comes from ``/api/voice/*`` behind the usual token check (or the
console's session cookie). Assets live in the ``voiceactors.console`` package
under ``/static/``. Every page carries a strict Content-Security-Policy: no
inline script or style, and ``connect-src`` names only our origin and the
configured Realtime origin (the simulator's in ``--demo``, OpenAI's otherwise).
"""

from __future__ import annotations

import functools
import mimetypes
import re
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

from quart import Blueprint, Response, jsonify, request

from voiceactors import notices
from voiceactors.http import auth, console_sessions, history, timeline_svg
from voiceactors.http import errors as E
from voiceactors.http.errors import ApiError
from voiceactors.http.routes import CALL_ID_RE, _json_object, state
from voiceactors.logs import get_logger
from voiceactors.storage import run_sync

ASSET_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*\.(?:html|js|css|png|svg)$")
PAGE_NAMES = {"console": "index.html", "calls": "calls.html", "call": "call.html"}
RECORD_UNREADABLE = "call record unreadable"
LIMIT_INVALID = "limit must be an integer from 1 to 200"
TOKEN_REQUIRED = "token is required"
NOT_FOUND = "not found"

_log = get_logger(actor="http")

console_bp = Blueprint("console", __name__)


# --- headers ---------------------------------------------------------------------

def realtime_origin(base_url: str) -> str | None:
    """``scheme://host[:port]`` of the Realtime base URL, or None if it is not http(s)."""
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return None
    return f"{parts.scheme}://{parts.netloc}"


def content_security_policy(base_url: str) -> str:
    connect = "'self'"
    origin = realtime_origin(base_url)
    if origin:
        connect += f" {origin}"
    return ("default-src 'none'; script-src 'self'; style-src 'self'; "
            f"connect-src {connect}; media-src 'self' blob:; img-src 'self' data:; "
            "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")


def _hardened(response: Response, csp: str) -> Response:
    response.headers["Content-Security-Policy"] = csp
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


@functools.lru_cache(maxsize=32)
def _asset_bytes(name: str) -> bytes | None:
    """An asset's bytes, read once (they are package data: a few KiB that never
    change while serving, so the event loop reads no file after the first time)."""
    if not ASSET_NAME_RE.fullmatch(name):
        return None
    item = resources.files("voiceactors.console").joinpath(name)
    return item.read_bytes() if item.is_file() else None


def _page(name: str) -> Response:
    body = _asset_bytes(PAGE_NAMES[name])
    if body is None:      # a broken install, not a user error
        raise ApiError(500, E.INTERNAL)
    response = Response(body, status=200, content_type="text/html; charset=utf-8")
    response.headers["Cache-Control"] = "no-cache"
    return _hardened(response, content_security_policy(state().settings.openai_base_url))


# --- pages and assets -----------------------------------------------------------------

@console_bp.get("/")
async def console_page() -> Any:
    return _page("console")


@console_bp.get("/calls")
async def calls_page() -> Any:
    return _page("calls")


@console_bp.get("/calls/<call_id>")
async def call_page(call_id: str) -> Any:
    if not CALL_ID_RE.fullmatch(call_id):
        raise ApiError(404, NOT_FOUND)
    return _page("call")


@console_bp.get("/static/<name>")
async def asset(name: str) -> Any:
    body = _asset_bytes(name)
    if body is None or name.endswith(".html"):
        raise ApiError(404, NOT_FOUND)
    content_type = mimetypes.guess_type(name)[0] or "application/octet-stream"
    if content_type.startswith("text/") or content_type.endswith("javascript"):
        content_type += "; charset=utf-8"
    response = Response(body, status=200, content_type=content_type)
    response.headers["Cache-Control"] = "no-cache"
    return _hardened(response, "default-src 'none'")


# --- console config and sign-in ---------------------------------------------------------

@console_bp.get("/api/voice/console-config")
async def console_config() -> Any:
    settings = state().settings
    required = auth.token_required(settings)
    signed_in = not required or auth.authorized(settings, request.headers.get("Authorization")) \
        or console_sessions.has_valid_cookie()
    # what the first screen should say before Start (no key, an empty journal):
    # only to a page that may use the API
    said = await run_sync(notices.startup_notices, settings) if signed_in else []
    return jsonify({"realtime_base_url": settings.openai_base_url.rstrip("/"), "token_required": required,
                    "signed_in": bool(signed_in), "demo": settings.demo,
                    "notices": [notice.value for notice in said]})


@console_bp.post("/api/voice/login")
async def login() -> Any:
    settings = state().settings
    body = await _json_object(required=True)
    token = body.get("token")
    if not isinstance(token, str) or not token:
        raise ApiError(400, TOKEN_REQUIRED)
    if not settings.api_token:
        # nothing to sign in to: the API is open on loopback without a token
        return jsonify({"signed_in": True, "token_required": False})
    if not console_sessions.token_matches(settings.api_token, token):
        _log.warning("http.console_login_refused")
        raise ApiError(401, E.UNAUTHORIZED)
    response = jsonify({"signed_in": True, "token_required": True})
    console_sessions.set_cookie(response, console_sessions.store().create())
    _log.info("http.console_login")
    return response


@console_bp.post("/api/voice/logout")
async def logout() -> Any:
    await _json_object(required=False)
    console_sessions.store().revoke(request.cookies.get(console_sessions.COOKIE_NAME))
    response = jsonify({"signed_in": False})
    console_sessions.clear_cookie(response)
    return response


# --- call history -------------------------------------------------------------------------

def _limit() -> int:
    raw = request.args.get("limit")
    if raw is None:
        return history.DEFAULT_LIST
    if not raw.isdigit() or not 1 <= int(raw) <= history.MAX_LIST:
        raise ApiError(400, LIMIT_INVALID)
    return int(raw)


@console_bp.get("/api/voice/calls")
async def list_calls() -> Any:
    limit = _limit()
    calls = await run_sync(history.list_calls, history.history_root(state().settings), limit)
    return jsonify({"calls": calls})


async def _detail(call_id: str) -> dict[str, Any]:
    if not CALL_ID_RE.fullmatch(call_id):
        raise ApiError(400, E.CALL_ID_INVALID)
    try:
        return await run_sync(history.call_detail, history.history_root(state().settings), call_id)
    except FileNotFoundError:
        raise ApiError(404, E.CALL_NOT_FOUND) from None
    except (history.RecordUnreadable, OSError) as error:
        _log.error("http.call_record_unreadable", call_id=call_id, error_type=type(error).__name__)
        raise ApiError(500, RECORD_UNREADABLE) from None


@console_bp.get("/api/voice/calls/<call_id>")
async def call_detail(call_id: str) -> Any:
    return jsonify(await _detail(call_id))


@console_bp.get("/api/voice/calls/<call_id>/timeline.svg")
async def call_timeline(call_id: str) -> Any:
    detail = await _detail(call_id)
    response = Response(timeline_svg.render(detail["lines"]), status=200, content_type="image/svg+xml; charset=utf-8")
    return _hardened(response, "default-src 'none'")
