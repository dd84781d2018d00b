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
from pathlib import Path
from typing import Any, Callable, TypeVar
from urllib.parse import urlsplit

import trio
from quart import Blueprint, Response, current_app, jsonify, request
from quart.json.provider import DefaultJSONProvider

from voiceactors import notices, voice_config
from voiceactors.http import auth, console_sessions, history, timeline_svg
from voiceactors.http import errors as E
from voiceactors.http.errors import ApiError
from voiceactors.http.ratelimit import refuse_after
from voiceactors.http.routes import CALL_ID_RE, _json_object, state
from voiceactors.logs import get_logger
from voiceactors.settings import Settings
from voiceactors.storage import run_sync

ASSET_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*\.(?:html|js|css|png|svg)$")
PAGE_NAMES = {"console": "index.html", "calls": "calls.html", "call": "call.html"}
RECORD_UNREADABLE = "call record unreadable"
LIMIT_INVALID = "limit must be an integer from 1 to 200"
TOKEN_REQUIRED = "token is required"
NOT_FOUND = "not found"

_log = get_logger(actor="http")

T = TypeVar("T")

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
    signed_in = not required
    if required:         # this answer tells a right token from a wrong one: the same check as every route's
        check = auth.request_credential(settings)
        refuse_after(check.locked_s)
        signed_in = check.accepted
    # what the first screen should say before Start (no key, an empty journal):
    # only to a page that may use the API
    said = await run_sync(notices.startup_notices, settings) if signed_in else []
    response = jsonify({"realtime_base_url": settings.openai_base_url.rstrip("/"), "token_required": required,
                        "signed_in": bool(signed_in), "demo": settings.demo,
                        "notices": [notice.value for notice in said],
                        # the voice services a call may use, and the one the page starts on (docs/live.md)
                        "services": list(voice_config.VOICE_SERVICES), "service": _preferred_service(settings)})
    if not signed_in and request.cookies.get(console_sessions.COOKIE_NAME) is not None:
        # a session the server no longer knows (a restart, an expiry): the browser drops it now,
        # so each page load before signing in again does not draw from the failure bucket
        console_sessions.clear_cookie(response)
    return response


def _preferred_service(settings: Settings) -> str:
    """``voice.service``; ``realtime`` when the journal config cannot be read (the page still opens)."""
    try:
        return voice_config.voice_service(settings)
    except voice_config.ConfigUnreadable:
        return voice_config.VOICE_SERVICES[0]


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


#: Worker threads reading call records for the history at once. Each may
#: read up to ``history.MAX_RECORD_BYTES`` a record (``MAX_LIST`` records for
#: a list): on ``storage.limiter()``'s slots, a few such requests took every
#: slot the tool calls' reads use, and a read waited for them.
RECORD_READERS = 2
_record_readers: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("voiceactors_record_readers")


async def _read_records(make: Callable[..., T], *args: Any) -> T:
    """``make(*args)`` in a worker thread of the history's own, at most
    ``RECORD_READERS`` at once (the others wait their turn, not the tools)."""
    try:
        readers = _record_readers.get()
    except LookupError:
        readers = trio.CapacityLimiter(RECORD_READERS)
        _record_readers.set(readers)
    return await trio.to_thread.run_sync(make, *args, limiter=readers, abandon_on_cancel=True)


@console_bp.get("/api/voice/calls")
async def list_calls() -> Any:
    limit = _limit()
    calls = await _read_records(history.list_calls, history.history_root(state().settings), limit)
    return jsonify({"calls": calls})


async def _from_record(call_id: str, make: Callable[[Path, str], T]) -> T:
    """``make(state folder, call_id)`` in a worker thread: reading a record,
    summarising it, drawing it and encoding the answer are work in
    proportion to the record (up to ``history.MAX_RECORD_BYTES``), which on
    the trio thread held up every other request meanwhile."""
    if not CALL_ID_RE.fullmatch(call_id):
        raise ApiError(400, E.CALL_ID_INVALID)
    try:
        return await _read_records(make, history.history_root(state().settings), call_id)
    except FileNotFoundError:
        raise ApiError(404, E.CALL_NOT_FOUND) from None
    except (history.RecordUnreadable, OSError) as error:
        _log.error("http.call_record_unreadable", call_id=call_id, error_type=type(error).__name__)
        raise ApiError(500, RECORD_UNREADABLE) from None


@console_bp.get("/api/voice/calls/<call_id>")
async def call_detail(call_id: str) -> Any:
    provider = current_app.json     # jsonify's encoding, run in the worker thread with the rest
    assert isinstance(provider, DefaultJSONProvider), provider   # quart's (app.py sets its options)
    body = await _from_record(call_id, lambda root, cid: provider.dumps(
        history.call_detail(root, cid), separators=(",", ":")) + "\n")
    return current_app.response_class(body, mimetype=provider.mimetype)


@console_bp.get("/api/voice/calls/<call_id>/timeline.svg")
async def call_timeline(call_id: str) -> Any:
    svg = await _from_record(call_id, lambda root, cid: timeline_svg.render(history.call_lines(root, cid)))
    response = Response(svg, status=200, content_type="image/svg+xml; charset=utf-8")
    return _hardened(response, "default-src 'none'")
