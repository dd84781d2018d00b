"""The attach sideband of a Live session: its URL and the opener of its websocket.

``wss://…/v1/live/sessions/{session_id}/attach`` under the REST base URL
(``OPENAI_BASE_URL``; the simulator's in tests), opened with the API key as
a Realtime call's sideband is (``realtime/sideband.py``: the same handshake,
bounds and failures, told as the call transport seam's by
``call/websocket_transport.py``). The connection carries Live's frames:
``transport.py`` puts the translator on it.
"""

from __future__ import annotations

from urllib.parse import quote

from voiceactors.call.transport import OpenTransport
from voiceactors.call.websocket_transport import sideband_opener
from voiceactors.realtime.sideband import websocket_url

__all__ = ["attach_opener", "attach_url"]


def attach_url(base_url: str, session_id: str) -> str:
    """The attach sideband's URL of ``session_id`` under the REST ``base_url``.

    >>> attach_url("https://api.openai.com/v1", "live_1")
    'wss://api.openai.com/v1/live/sessions/live_1/attach'
    """
    return websocket_url(base_url, f"/live/sessions/{quote(session_id, safe='')}/attach")


def attach_opener(base_url: str, session_id: str, *, connect_timeout: float) -> OpenTransport:
    """The opener of ``session_id``'s attach websocket: each attempt a new
    one with that attempt's API key (Live's frames, untranslated)."""
    return sideband_opener(base_url, session_id, connect_timeout=connect_timeout, url_of=attach_url)
