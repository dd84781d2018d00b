"""``POST /api/voice/live``: a browser's call on OpenAI's Live API (docs/live.md).

The page posts its WebRTC offer (``{"sdp": "v=0…", "context"?, "continues"?,
"greeting"?}``); with the guards every ``/api/voice`` route has (the token,
the browser guard, the rate limit: ``guards.py``) and the checks of
``/session`` in the same order (the body's fields, the key, the day's
budget, the linked context, the continued call, the brain's instruction),
the server creates the Live session with the OpenAI key
(``live.create``: the instruction, the delegation to a Responses model with
the journal's tools and the MCP sources', ``live/session.py``), hands it to
the supervisor as a call of kind ``live`` (its sideband attached at once:
``call/arrival.py``), and answers the SDP answer and the session id. No key
of any kind reaches the browser. A session the supervisor cannot take (at
capacity, the registry down) is hung up before the refusal is answered.
"""

from __future__ import annotations

from typing import Any, cast

import trio
from openai.types.live import MediaSessionConfigParam
from quart import jsonify

from voiceactors import voice_config
from voiceactors.call.call_context import LinkedContext
from voiceactors.http import continuation, linked, mcp_credentials
from voiceactors.http import errors as E
from voiceactors.http.connect import supervisor_answer
from voiceactors.http.errors import ApiError
from voiceactors.http.routes import (
    VoiceState, _json_object, _runtime, bp, openai_key, read_config, ready_instruction, refuse_when_budget_spent,
    state,
)
from voiceactors.live.session import live_session, session_config
from voiceactors.logs import get_logger
from voiceactors.messages import ConnectOutcome
from voiceactors.tool_effect import WRITE
from voiceactors.tools.registry import lookup, manifest

__all__ = ["create_live_call"]

_log = get_logger(actor="http")

#: Longest SDP offer taken (a browser's is a few kilobytes; the body limit bounds it too).
SDP_MAX = 32 * 1024

#: The supervisor's refusals, as the route answers them.
_REFUSALS = {ConnectOutcome.AT_CAPACITY: (503, E.AT_CAPACITY), ConnectOutcome.REGISTRY_DOWN: (503, E.REGISTRY_DOWN)}


def body_sdp(body: dict[str, Any]) -> str:
    """The body's SDP offer; the 400 naming what is wrong with it."""
    sdp = body.get("sdp")
    if sdp is None or sdp == "":
        raise ApiError(400, E.SDP_REQUIRED)
    if not isinstance(sdp, str) or not sdp.startswith("v=") or len(sdp) > SDP_MAX:
        raise ApiError(400, E.SDP_INVALID)
    return sdp


def _is_write(tool: str) -> bool:
    spec = lookup(tool)
    return spec is not None and spec.effect == WRITE


@bp.post("/live")
async def create_live_call() -> Any:
    voice = state()
    settings = voice.settings
    body = await _json_object(required=True)
    offer = body_sdp(body)
    requested, continues, greeting = linked.body_context(body), continuation.body_continues(body), \
        linked.body_greeting(body)
    earlier = await continuation.ended_call(continues, settings)
    key = openai_key(settings)
    runtime = _runtime()
    await refuse_when_budget_spent(runtime)
    link = await linked.verified(requested, settings)
    continued = await continuation.continuation(continues, earlier, runtime)
    base = await ready_instruction(settings, runtime)
    instruction = linked.instruction(base, link, continued)
    sources = await mcp_credentials.source_tools(runtime, settings.tool_name_style)
    model, delegate_model = read_config(voice_config.live_models, settings)
    session, names = session_config(model, delegate_model, instruction, manifest(settings.tool_name_style) + sources)
    session_id, answer = await _create(voice, key, session, offer)
    context = LinkedContext(base, link, greeting, continuation=continued,
                            live=live_session(names, instruction, _is_write, delegate_model, model))
    try:
        refused = await supervisor_answer(runtime, settings.connect_timeout_s, session_id, context)
    except ApiError:
        await _hang_up(voice, key, session_id)      # no actor will serve it: not left running
        raise
    if refused != ConnectOutcome.CONNECTED:
        _log.error("http.live_not_joined", session_id=session_id, reply=str(refused)[:64])
        await _hang_up(voice, key, session_id)
        status, message = _REFUSALS.get(refused, (500, E.RUNTIME_UNAVAILABLE))
        raise ApiError(status, message)
    return jsonify({"sdp": answer, "session_id": session_id, **linked.context_view(link),
                    **continuation.continuation_view(continued)})


async def _create(voice: VoiceState, key: str, session: dict[str, Any], offer: str) -> tuple[str, str]:
    """``live.create`` with the OpenAI key: (the session id, the SDP answer).
    Any failure is the same 500, its detail logged."""
    settings = voice.settings
    started = trio.current_time()
    try:
        assert voice.openai_clients is not None   # VoiceState.__post_init__ sets it
        with trio.fail_after(settings.mint_timeout_s + 1.0):
            async with voice.openai_clients.use(key, settings.openai_base_url) as client:
                created = await client.live.create(session=cast(MediaSessionConfigParam, session),
                                                   transport={"type": "webrtc", "sdp": offer})
        session_id, answer = created.session.id, created.transport.sdp
        if not isinstance(session_id, str) or not session_id.isascii() or not session_id:
            raise ValueError("live session id is not ASCII text")
    except Exception as error:  # noqa: BLE001 - every OpenAI failure is the same 500
        _log.error("http.live_create_failed", error_type=type(error).__name__,
                   status=getattr(error, "status_code", None), detail=str(error)[:300],
                   duration_ms=round((trio.current_time() - started) * 1000, 1))
        raise ApiError(500, E.SESSION_UNAVAILABLE) from None
    _log.info("http.live_created", session_id=session_id, model=session["model"],
              duration_ms=round((trio.current_time() - started) * 1000, 1))
    return session_id, answer


async def _hang_up(voice: VoiceState, key: str, session_id: str) -> None:
    """``live.sessions.hangup``: a session no actor serves here is not left running."""
    settings = voice.settings
    assert voice.openai_clients is not None
    try:
        with trio.fail_after(settings.mint_timeout_s + 1.0):
            async with voice.openai_clients.use(key, settings.openai_base_url) as client:
                await client.live.sessions.hangup(session_id)
    except Exception as error:  # noqa: BLE001 - the service ends an unattached session by itself too
        _log.error("http.live_hangup_failed", session_id=session_id, error_type=type(error).__name__)
