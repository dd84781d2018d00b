"""The linked-context fields of ``POST /api/voice/session`` and ``/connect``
(docs/api.md § Linked context): ``context`` checked and verified within
``settings.context_timeout_s``, and ``greeting``. The routes call these and
stay small."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from voiceactors.call.continuation import Continuation, with_continuation
from voiceactors.linked_context import references as context
from voiceactors.linked_context.resolve import resolve
from voiceactors.http.errors import ApiError
from voiceactors.settings import Settings

GREETING_INVALID = 'greeting must be "first"'


def body_context(body: dict[str, Any]) -> tuple[str, str] | None:
    """The body's ``context`` as ``(kind, id)``; None when absent or null. A
    context of the wrong shape (or with unknown fields) is a 400 naming the
    reason."""
    raw = body.get("context")
    if raw is None:
        return None
    try:
        return context.parse(raw)
    except context.ContextError as error:
        raise ApiError(400, str(error)) from None


async def verified(requested: tuple[str, str] | None, settings: Settings) -> context.Resolution | None:
    """The requested context verified against the journal within
    ``settings.context_timeout_s``. One the journal does not confirm
    (unknown, ambiguous, unreadable, too slow) is an ``Unverified``, never an
    error: the call goes on as a generic conversation."""
    if requested is None:
        return None
    kind, ident = requested
    return await resolve(Path(settings.journal), kind, ident, settings.context_timeout_s)


def instruction(base: str, link: context.Resolution | None, continued: Continuation | None = None) -> str:
    """A session's instruction: the brain's, plus the context section (the
    link is the first selection when verified), plus the section about the
    call it continues (``continues``)."""
    if link is not None:
        base = context.compose(base, link, link if isinstance(link, context.Reference) else None)
    return with_continuation(base, continued)


def body_greeting(body: dict[str, Any]) -> bool:
    """``{"greeting": "first"}``: the assistant speaks first. Absent or null: no."""
    value = body.get("greeting")
    if value is None:
        return False
    if value != "first":
        raise ApiError(400, GREETING_INVALID)
    return True


def context_view(link: context.Resolution | None) -> dict[str, Any]:
    """The answer's ``context`` field (only when a context was given)."""
    return {} if link is None else {"context": link.view()}
