"""The ``continues`` field of ``POST /api/voice/session`` and ``/connect``
(docs/api.md § Continuing a call): the call it names checked against its
record, and the account of it the new call's instruction carries (the
brain's summary, else the last turns: ``call/continuation.py``). The routes
call these and stay small.

Every refusal is a 400 and comes before the OpenAI key's 503, as a
``context`` of the wrong shape does: ``body_continues`` checks the shape,
``ended_call`` the record (a worker thread, only when ``continues`` is given).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from voiceactors import storage
from voiceactors.call.continuation import (Continuation, SummarySource, bounded, continuable, last_turns,
                                           transcript_text, valid_call_id)
from voiceactors.http import errors as E
from voiceactors.http import history
from voiceactors.http.errors import ApiError
from voiceactors.logs import get_logger
from voiceactors.messages import SummariseCall, ask
from voiceactors.runtime import Runtime

#: How much longer than the brain's own bound the route waits for its answer.
ANSWER_SLACK_S = 1.0

_log = get_logger(actor="http")


def body_continues(body: dict[str, Any]) -> str | None:
    """The body's ``continues`` (a call id, trimmed); None when absent or null."""
    value = body.get("continues")
    if value is None:
        return None
    call_id = valid_call_id(value)
    if call_id is None:
        raise ApiError(400, E.CONTINUES_INVALID)
    return call_id


def _ended_lines(state_dir: Path, call_id: str) -> tuple[list[dict[str, Any]], Any]:
    """The call's record lines and how it ended (blocking)."""
    lines = history.call_lines(state_dir, call_id)
    return lines, history.summarize(call_id, lines)["ended"]


async def ended_call(call_id: str | None, settings: Any) -> list[dict[str, Any]] | None:
    """The transcript (spoken order) of the call ``continues`` names, or
    None without one. A 400 when it has no readable record, or did not end
    at the time limit (``continuation.CONTINUABLE``)."""
    if call_id is None:
        return None
    try:
        lines, ended = await storage.run_sync(_ended_lines, history.history_root(settings), call_id)
    except (OSError, history.RecordUnreadable):
        raise ApiError(400, E.CONTINUES_UNKNOWN) from None
    if not continuable(ended):
        raise ApiError(400, E.CONTINUES_NOT_AT_LIMIT)
    return history.spoken_transcript(lines)


async def continuation(call_id: str | None, transcript: list[dict[str, Any]] | None,
                       runtime: Runtime) -> Continuation | None:
    """What the new call carries of the earlier one: the brain's summary
    (asked once per call, within ``continue_summary_timeout_s``), else its
    last turns word for word."""
    if call_id is None or transcript is None:
        return None
    settings = runtime.settings
    summary: str | None = None
    try:
        summary = await ask(runtime.brain, lambda r: SummariseCall(r, call_id, transcript_text(transcript)),
                            timeout=settings.continue_summary_timeout_s + ANSWER_SLACK_S)
    except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError, trio.EndOfChannel):
        summary = None
    account = bounded(summary) if summary else ""
    if account:
        return Continuation(call_id, account, SummarySource.BRAIN)
    _log.info("http.continuation_last_turns", call_id=call_id)
    return Continuation(call_id, last_turns(transcript), SummarySource.LAST_TURNS)


def continuation_view(found: Continuation | None) -> dict[str, Any]:
    """The answer's fields (only when ``continues`` was given)."""
    return {} if found is None else {"continues": found.call_id, "summary_from": str(found.source)}
