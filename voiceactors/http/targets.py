"""The path a request is routed by: one rule for every place that keys on it.

A request target comes in more spellings than its origin form
(``/api/voice/connect``): absolute form (``http://x/api/voice/connect``,
which every HTTP/1.1 server must accept), leading slashes doubled
(``//api/voice/connect``), percent-encoded letters (``/api/voice/%63onnect``).
Hypercorn hands the app the target cut at ``?`` and percent-decoded, but
otherwise as sent; Quart then routes by its own reading of that (the
path of an absolute-form target, leading slashes merged into one). A
guard that compares the scope's ``path`` itself sees another path than the
route that answers, and so a rate limit keyed on it was skipped by the
absolute form. So everything that keys on or matches a request's path (the
rate limits, the early 429 at the ASGI layer and at accept, the plain
connect answered below Quart and below hypercorn, the ``/mcp`` switch)
asks ``scope_path`` (from an ASGI scope) or ``target_path`` (from the raw
bytes of a request line, below hypercorn): the path Quart routes.
"""

from __future__ import annotations

from typing import Any, Mapping
from urllib.parse import unquote, urlparse


def routed_path(path: str) -> str:
    """The path Quart routes a request by, for an ASGI scope's ``path``:
    an absolute-form target's path part (``quart.asgi``, ``urlparse``), then
    one leading slash (werkzeug's ``Request.path``)."""
    if path.startswith("/") and not path.startswith("//"):
        return path                       # the origin form: as it is (no copy per request)
    if not path.startswith("/"):
        path = urlparse(path).path
    return "/" + path.lstrip("/")


def scope_path(scope: Mapping[str, Any]) -> str:
    """The routed path of an ASGI request scope."""
    return routed_path(str(scope.get("path") or ""))


def target_path(target: bytes) -> str | None:
    """The routed path of a raw request target, read as hypercorn reads it
    into the scope (cut at ``?``, ASCII, percent-decoded); None for a target
    hypercorn could not decode (it answers that one itself)."""
    try:
        path = target.partition(b"?")[0].decode("ascii")
    except UnicodeDecodeError:
        return None
    return routed_path(unquote(path))
