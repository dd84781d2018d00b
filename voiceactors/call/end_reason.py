"""Why a call ended: one ``StrEnum`` the protocol, the refusals table and the
actor share (a module of its own so ``refusals.py`` can name the ends it
decides without importing the protocol)."""

from __future__ import annotations

from enum import StrEnum


class EndReason(StrEnum):
    """Why a call ended (the ``end`` line of the call record, ``call.ended``)."""

    CLOSED = "closed_by_service"          # clean close 1000/1001
    GONE = "call_gone"                    # 404/410 at the handshake
    IDLE = "idle_timeout"                 # no server event for call_idle_timeout_s (the sideband went quiet)
    USER_IDLE = "user_idle"               # the user stayed silent through two of the service's idle timeouts
    MAX = "max_duration"
    EXHAUSTED = "reconnect_exhausted"
    NO_KEY = "no_api_key"
    CONFIG_UNREADABLE = "config_unreadable"   # the journal config could not be read at any attempt
    UNAUTHORIZED = "unauthorized"         # 401/403 at the handshake, or an invalid_api_key error
    QUOTA = "insufficient_quota"          # the service's insufficient_quota error
    SESSION_EXPIRED = "session_expired"   # the service's session_expired error (its 60-minute cap)
    SHUTDOWN = "shutdown"                 # the actor was cancelled (server stopping)
    BUDGET = "budget_spent"               # the call's cost reached call_budget_usd (meter.py)
    AUTH_EXPIRED = "auth_expired"         # an MCP source refused the call's own token (docs/mcp.md)
    PIN_REFUSED = "pin_refused"           # a phone call's PIN was keyed wrong too many times (docs/phone.md)
    ERROR = "error"                       # a bug: logged with its traceback
