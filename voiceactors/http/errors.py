"""JSON error shapes. Every error the HTTP layer returns is ``{"error": "<message>"}``.

The messages the design fixes (section 10) are constants here so routes and
tests share one spelling. Diagnostic detail never goes into a response: it is
logged, and the client gets the generic message.
"""

from __future__ import annotations

import json
from typing import Any

from quart import Quart, jsonify, request
from werkzeug.exceptions import HTTPException

from voiceactors.logs import get_logger

INVALID_JSON = "request body must be valid JSON"
NOT_AN_OBJECT = "request body must be a JSON object"
CALL_ID_REQUIRED = "call_id is required"
CALL_ID_INVALID = "call_id is invalid"
KEY_NOT_CONFIGURED = "voice unavailable — openai key not configured"
BRAIN_NOT_READY = "voice unavailable — brain not ready"
BUDGET_SPENT = "voice unavailable — budget spent"
SESSION_UNAVAILABLE = "voice session unavailable"
RUNTIME_UNAVAILABLE = "voice runtime unavailable"
RUNTIME_FAILED = "voice unavailable — runtime failed"
AT_CAPACITY = "voice at capacity"
REGISTRY_DOWN = "voice unavailable — call registry unreachable"
FEED_UNREACHABLE = "voice unavailable — shared feed unreachable"
LAST_EVENT_ID_INVALID = "Last-Event-ID is invalid"
REFRESH_FAILED = "brain refresh failed"
CALL_NOT_FOUND = "call not found"
UNAUTHORIZED = "unauthorized"
TOO_LARGE = "request body too large"
NOT_JSON_CONTENT = "content type must be application/json"
CROSS_SITE = "cross-site request refused"
HOST_NOT_ALLOWED = "host not allowed"
ORIGIN_NOT_ALLOWED = "origin not allowed"
RATE_LIMITED = "too many requests"
CONFIG_UNREADABLE = "voice unavailable — could not read configuration"
BUSY = "server busy"
INTERNAL = "internal error"
CONTINUES_INVALID = "continues is invalid"
CONTINUES_UNKNOWN = "continues names no recorded call"
CONTINUES_NOT_AT_LIMIT = "continues names a call that did not end at its time limit"
SDP_REQUIRED = "sdp is required"
SDP_INVALID = "sdp must be an SDP offer (text starting with v=)"
CREDENTIALS_INVALID = "credentials must be an object of source name to token"
CREDENTIALS_UNKNOWN_SOURCE = "credentials name an unknown mcp source"
PHONE_UNAVAILABLE = "phone unavailable — webhook secret not configured"
PHONE_SECRET_INVALID = "phone unavailable — webhook secret invalid"
PHONE_MEMORY_UNAVAILABLE = "phone unavailable — could not remember the delivery"
PHONE_ANSWER_FAILED = "phone call could not be answered"
WEBHOOK_UNSIGNED = "webhook unsigned — webhook-id, webhook-timestamp and webhook-signature are required"
WEBHOOK_STALE = "webhook timestamp outside the 5-minute tolerance"
WEBHOOK_FORGED = "webhook signature does not match"
WEBHOOK_MALFORMED = "malformed webhook"
NO_OAUTH = ("this server has no OAuth: send its API token (VOICEACTORS_API_TOKEN) "
            "as the header Authorization: Bearer <token>")

# Where an MCP client looks for OAuth after a 401 on /mcp: the protected
# resource's and the authorization server's metadata (RFC 9728, RFC 8414,
# OpenID discovery) and, when it finds none, registration at the origin's
# /register. MCP Inspector 2.x starts that search on any 401 or 403 whatever
# the WWW-Authenticate header says, and shows the /register answer's body in
# its error; so these answer 404 (nothing is there) with NO_OAUTH, which names
# the token.
_OAUTH_DISCOVERY_PREFIXES = ("/.well-known/oauth-", "/.well-known/openid-configuration")
_OAUTH_REGISTRATION_PATH = "/register"

# werkzeug's titles ("Not Found") lower-cased, for the statuses we expect to see.
_STATUS_MESSAGES = {
    400: "bad request",
    401: UNAUTHORIZED,
    404: "not found",
    405: "method not allowed",
    408: "request timeout",
    413: TOO_LARGE,
    415: "unsupported media type",
    421: HOST_NOT_ALLOWED,
    429: RATE_LIMITED,
    500: INTERNAL,
    503: "service unavailable",
}

_log = get_logger(actor="http")


class ApiError(Exception):
    """Raised by a route to answer ``status`` with ``{"error": message}``."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def not_found_message(path: str) -> str:
    """The 404 message for ``path``: NO_OAUTH where an MCP client looks for OAuth."""
    if path == _OAUTH_REGISTRATION_PATH or path.startswith(_OAUTH_DISCOVERY_PREFIXES):
        return NO_OAUTH
    return _STATUS_MESSAGES[404]


def status_message(status: int, name: str | None = None) -> str:
    """The message of a status werkzeug raised (``name``: its title, for a status not listed)."""
    return _STATUS_MESSAGES.get(status) or (name or "error").lower()


def json_body(value: Any) -> bytes:
    """What Quart's ``jsonify`` writes for ``value`` here (compact, not
    ASCII-escaped, keys in order, a newline): answers given outside Quart
    (``connect.py``) are the same bytes."""
    return (json.dumps(value, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> Any:
    response = jsonify({"error": message})
    response.status_code = status
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


#: Answers given before the request body is read (the guards in app.py,
#: hosts.py, auth.py and ratelimit.py): the rest of that body is still on the
#: wire, so the connection cannot carry another request.
REFUSED_UNREAD = frozenset({401, 403, 413, 415, 421, 429})


def _closing(response: Any) -> Any:
    if response.status_code in REFUSED_UNREAD:
        response.headers["Connection"] = "close"
    return response


def install(app: Quart) -> None:
    """Register the handlers that turn every error into the JSON shape."""

    @app.errorhandler(ApiError)
    async def _api_error(error: ApiError) -> Any:
        return _closing(error_response(error.status, error.message, error.headers))

    @app.errorhandler(HTTPException)
    async def _http_error(error: HTTPException) -> Any:
        status = error.code or 500
        message = not_found_message(request.path) if status == 404 else status_message(status, error.name)
        response = error_response(status, message)
        allowed = getattr(error, "valid_methods", None)
        if status == 405 and allowed:
            response.headers["Allow"] = ", ".join(sorted(allowed))
        return _closing(response)

    @app.errorhandler(Exception)
    async def _unexpected(error: Exception) -> Any:
        # The detail stays in the log; the client learns only that it failed.
        _log.error("http.unhandled_error", error_type=type(error).__name__, exc_info=error)
        return error_response(500, INTERNAL)
