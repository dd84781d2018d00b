"""How a call arrives: what the server is given to serve a call, apart from
how it carries the call's events.

A call arrives one of three ways. A browser's ``POST /api/voice/connect``
(decided in ``http/``: its guards, the token, the rate limit) names a
Realtime call the browser opened itself, and the supervisor starts its actor
(``call/supervisor.py``), which reaches the call over the sideband
websocket. A phone call is accepted by OpenAI's signed webhook
(``http/phone.py``: ``calls.accept``) and handed to the supervisor the same
way, its ``LinkedContext`` carrying the caller (``PhoneCall``); it is
joined over the same sideband. A rejoin after a crash and a takeover from
another process are the same call arriving again, over the same sideband
(the call's context, kept in its record and the cluster's mirror, says
which kind it is).

A Live session the server created for a browser (``http/live.py``:
``live.create``) is handed over the same way, its context carrying what the
session was created with (``LiveSession``), and joined over the session's
attach sideband, its events translated (``voiceactors/live/``). A new kind
of call is a new ``ArrivalKind`` and a function here that makes its
``CallArrival``: the call's id and the opener of its transport
(``transport.py``; a new transport only where its protocol differs),
entered in ``ARRIVALS``. The supervisor asks ``arrive`` for every call it
starts and hands the opener to the call's shell (``call/actor.py``), which
does not change: it takes the opener (``CallActor(..., open_transport=...)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Callable
from urllib.parse import quote

from voiceactors.call.call_context import LinkedContext, LiveSession
from voiceactors.call.transport import OpenTransport
from voiceactors.call.websocket_transport import sideband_opener
from voiceactors.live.attach import attach_opener
from voiceactors.live.session import translator_for
from voiceactors.live.transport import live_transport
from voiceactors.settings import Settings

__all__ = ["ARRIVALS", "ArrivalKind", "CallArrival", "arrive", "browser_connect"]


class ArrivalKind(StrEnum):
    """Where a call came from."""

    BROWSER = "browser"     # a browser's /api/voice/connect, over the Realtime sideband
    PHONE = "phone"         # a SIP call accepted by the phone webhook (http/phone.py), over the same sideband
    LIVE = "live"           # a Live session the server created (http/live.py), over its attach sideband


@dataclass(frozen=True, slots=True)
class CallArrival:
    """A call to serve: its id, where it came from, and how each connect
    attempt opens its transport."""

    kind: ArrivalKind
    call_id: str
    open_transport: OpenTransport
    # the REST path (under the base URL) that hangs the call up
    hangup_path: str = ""

    @property
    def service_acknowledges(self) -> bool:
        """Whether the service speaks its own acknowledgement of slow work
        (Live's automatic one, asked at each delegation): the call's
        slow-tool acknowledgement (``tool_ack_after_s``, docs/calls.md § Slow
        tools) is then off, or the user would hear two."""
        return self.kind is ArrivalKind.LIVE

    def __post_init__(self) -> None:
        if not self.hangup_path:
            object.__setattr__(self, "hangup_path", f"/realtime/calls/{quote(self.call_id, safe='')}/hangup")


def browser_connect(base_url: str, call_id: str, *, connect_timeout: float) -> CallArrival:
    """A browser's connect: the call's sideband websocket under the REST
    ``base_url`` (``OPENAI_BASE_URL``; the simulator's in tests)."""
    return CallArrival(ArrivalKind.BROWSER, call_id,
                       sideband_opener(base_url, call_id, connect_timeout=connect_timeout))


def _browser(settings: Settings, call_id: str, _context: LinkedContext | None) -> CallArrival:
    return browser_connect(settings.openai_base_url, call_id, connect_timeout=settings.connect_timeout_s)


def _phone(settings: Settings, call_id: str, _context: LinkedContext | None) -> CallArrival:
    """A phone call: the webhook accepted it (``calls.accept``) before the
    supervisor was asked; from then on the service serves it over the same
    sideband as a browser's call (joined with the call's id)."""
    return CallArrival(ArrivalKind.PHONE, call_id,
                       sideband_opener(settings.openai_base_url, call_id, connect_timeout=settings.connect_timeout_s))


def _live(settings: Settings, call_id: str, context: LinkedContext | None) -> CallArrival:
    """A Live session (``docs/live.md``): the server created it
    (``http/live.py``) before the supervisor was asked; the call is served
    over its attach sideband, the Live events translated to and from the
    call's (``live/transport.py``) with what the context keeps of the session
    (the function names it declared, its instructions), also at a rejoin.
    Hung up through ``live.sessions.hangup``."""
    live = context.live if context is not None and context.live is not None else LiveSession({})
    opener = live_transport(attach_opener(settings.openai_base_url, call_id, connect_timeout=settings.connect_timeout_s),
                            lambda: translator_for(live))
    return CallArrival(ArrivalKind.LIVE, call_id, opener, f"/live/sessions/{quote(call_id, safe='')}/hangup")


#: how each kind of call arrives, from the server's settings, the call's id and its context
ARRIVALS: dict[ArrivalKind, Callable[[Settings, str, LinkedContext | None], CallArrival]] = {
    ArrivalKind.BROWSER: _browser,
    ArrivalKind.PHONE: _phone,
    ArrivalKind.LIVE: _live,
}


def arrive(kind: ArrivalKind, settings: Settings, call_id: str, context: LinkedContext | None = None) -> CallArrival:
    """The ``CallArrival`` of a call of ``kind``: what the supervisor hands
    the call's shell. Every kind has its entry in ``ARRIVALS`` (a test checks)."""
    return ARRIVALS[kind](settings, call_id, context)
