"""The request id of an HTTP request: the client's ``X-Request-Id`` when it
is a sane token, else a fresh one. Every response carries it back in the
same header and its ``http.request`` line names it (Quart's request hook in
``app.py`` and the connect's handler in ``connect.py``)."""

from __future__ import annotations

import re
import uuid

HEADER = "X-Request-Id"
_SANE = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


def request_id_for(given: str) -> str:
    """``given`` (the header's value, "" when absent) when it is sane, else a new id."""
    return given if _SANE.fullmatch(given) else uuid.uuid4().hex
