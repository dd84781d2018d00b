"""The app's requests in flight: the one count every way in shares.

A request is counted while it is served, whichever way it came in: Quart's
(``asgi.ClosingHTTPConnection``), the MCP endpoint's (``asgi.PathSwitch``)
or a connect served below hypercorn (``connect.FirstReadConnect``: through
``ClosingHTTPConnection``, as hypercorn's would be). Past
``max_requests_in_flight`` (0: no cap) a new one is refused. The count is
the app's attributes (``VoiceApp.requests_in_flight``), changed only on the
trio thread, so no lock.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator


def full(app: Any) -> bool:
    """Whether ``app`` has ``max_requests_in_flight`` requests in flight already."""
    cap = getattr(app, "max_requests_in_flight", 0)
    return bool(cap) and getattr(app, "requests_in_flight", 0) >= cap


@contextlib.contextmanager
def counted(app: Any) -> Iterator[None]:
    """Count one request in flight for the block."""
    app.requests_in_flight = getattr(app, "requests_in_flight", 0) + 1
    try:
        yield
    finally:
        app.requests_in_flight -= 1
