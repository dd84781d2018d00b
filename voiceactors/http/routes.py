"""The ``/api/voice/*`` routes and ``/metrics``.

Routes only validate and message actors: each request that needs an actor
sends it a message with ``ask(..., timeout=...)`` and turns the reply (or its
absence) into one of the design's status codes. No route touches actor state.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar, cast

import trio
from openai.types.realtime import RealtimeSessionCreateRequestParam
from quart import Blueprint, Response, current_app, jsonify, request

from voiceactors import voice_config, metrics, safe_text
from voiceactors.messages import (AwaitReady, BrainState, CountCalls, GetBrain,
                                         GetDailyUsage, Message, RefreshBrain, Subscribe, TakeNavHints,
                                         TakeObserverActions, ask)
from voiceactors.cluster.redis_client import RegistryDown
from voiceactors.cluster.shared_feed import EVENT_ID_RE, StreamRefusal
from voiceactors.http import errors as E
from voiceactors.http import continuation, linked
from voiceactors.http import mcp_credentials
from voiceactors.http.errors import ApiError
from voiceactors.openai_clients import OpenAIClients
from voiceactors.realtime.session_settings import SessionSettings
from voiceactors.logs import get_logger
from voiceactors.runtime import Runtime
from voiceactors.settings import Settings
from voiceactors.tools.registry import REGISTRY, manifest
from voiceactors.agents import Agents, CallAgents

CALL_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
PREVIEW_CHARS = 200
QUICK_ASK_S = 5.0        # an actor answering a query (state, counts) replies at once
SSE_KEEPALIVE_S = 15.0   # a comment line this often keeps proxies (nginx: 60 s idle) from closing a quiet stream
FEED_RETRY_S = 1.0       # a remote stream asks Redis again this often while it does not answer

_log = get_logger(actor="http")

bp = Blueprint("voice", __name__, url_prefix="/api/voice")
metrics_bp = Blueprint("metrics", __name__)


@dataclass
class VoiceState:
    """What the routes share: the settings, the live runtime (None while not
    serving, or after the runtime failed), the shutdown flag streams watch,
    the runtime's failure (set once it crashed or could not start: it does
    not come back in this process, ``/status`` answers 503 and ``serve``
    stops and exits non-zero) and the shared OpenAI clients mints use."""

    settings: Settings
    runtime: Runtime | None = None
    stopping: trio.Event = field(default_factory=trio.Event)
    runtime_failed: trio.Event = field(default_factory=trio.Event)
    brain_backend: Any = None
    openai_clients: OpenAIClients | None = None
    # what a route keeps for the app's life, made at its first use (the phone webhook's memory and verifier)
    extras: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.openai_clients is None:
            self.openai_clients = OpenAIClients(self.settings.openai_clients, self.settings.mint_timeout_s)


def state() -> VoiceState:
    voice: VoiceState = current_app.extensions["voiceactors"]
    return voice


# --- validation --------------------------------------------------------------

async def _json_object(*, required: bool) -> dict[str, Any]:
    """The request body as a JSON object (``json_object``)."""
    return json_object(await request.get_data(cache=True), required=required)    # 413 past the body limit


def json_object(raw: str | bytes, *, required: bool) -> dict[str, Any]:
    """A request body as a JSON object. Empty is ``{}`` unless ``required``.

    Invalid JSON is "must be valid JSON" where a body is required (connect)
    and "must be a JSON object" where it is optional (session, refresh-brain),
    the only 400 the design lists for those endpoints."""
    if not raw.strip():
        if required:
            raise ApiError(400, E.INVALID_JSON)
        return {}
    try:
        value = safe_text.loads(raw)     # a lone surrogate's escape is U+FFFD
    except (ValueError, RecursionError):
        raise ApiError(400, E.INVALID_JSON if required else E.NOT_AN_OBJECT) from None
    if not isinstance(value, dict):
        raise ApiError(400, E.NOT_AN_OBJECT)
    return value


def call_id_of(value: Any) -> str:
    """A request's ``call_id``, stripped; the 400 naming what is wrong with it."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ApiError(400, E.CALL_ID_REQUIRED)
    if not isinstance(value, str) or not CALL_ID_RE.fullmatch(value.strip()):
        raise ApiError(400, E.CALL_ID_INVALID)
    return value.strip()


def read_config(read: Any, settings: Settings) -> Any:
    """A journal-config value (kept in memory by ``config``, re-read on
    change: no worker thread); an unreadable config (EMFILE, EACCES, EIO) is
    503 "could not read configuration", never "not configured"."""
    try:
        return read(settings)
    except voice_config.ConfigUnreadable as error:
        _log.error("http.config_unreadable", error=str(error)[:200])
        raise ApiError(503, E.CONFIG_UNREADABLE) from None


def openai_key(settings: Settings) -> str:
    """The OpenAI key; 503 when none is configured or the config cannot be read."""
    key: str | None = read_config(voice_config.openai_api_key, settings)
    if not key:
        raise ApiError(503, E.KEY_NOT_CONFIGURED)
    return key


def _runtime() -> Runtime:
    runtime = state().runtime
    if runtime is None:
        raise ApiError(500, E.RUNTIME_UNAVAILABLE)
    return runtime


async def ask_actor(inbox: trio.MemorySendChannel[Message],
               make: Callable[[trio.MemorySendChannel[Any]], Message], timeout: float) -> Any:
    """``ask`` where a gone or stuck actor is "voice runtime unavailable"."""
    try:
        return await ask(inbox, make, timeout=timeout)
    except (trio.BrokenResourceError, trio.ClosedResourceError, trio.EndOfChannel):
        _log.error("http.actor_gone")
        raise ApiError(500, E.RUNTIME_UNAVAILABLE) from None


def _age_seconds(brain: BrainState) -> int | None:
    if brain.refreshed_at is None or brain.age_s is None or not math.isfinite(brain.age_s):
        return None
    return max(0, int(brain.age_s))


# --- POST /api/voice/session --------------------------------------------------

async def ready_instruction(settings: Settings, runtime: Runtime) -> str:
    """The current instruction. A stale one is used as is (``GetBrain(start=True)``
    queues the refresh); none at all waits up to ``brain_ready_wait_s``."""
    try:
        brain: BrainState = await ask_actor(runtime.brain, lambda r: GetBrain(r, start=True), QUICK_ASK_S)
        if not brain.ready:
            brain = await ask_actor(runtime.brain, AwaitReady, settings.brain_ready_wait_s)
    except trio.TooSlowError:
        raise ApiError(503, E.BRAIN_NOT_READY) from None
    if not brain.ready:
        raise ApiError(503, E.BRAIN_NOT_READY)
    assert brain.instruction is not None   # ready means an instruction
    return brain.instruction


def call_agents(settings: Settings, source_tools: list[dict[str, Any]] | None = None) -> CallAgents:
    """The call's agents (``voice.agents``, else the shipped set) with the
    session's full tool list (ours, then the MCP sources'), the first in
    charge; 503 when the config cannot be read."""
    agents: Agents = read_config(lambda s: voice_config.agents(s, REGISTRY), settings)
    style = settings.tool_name_style
    return CallAgents.made(agents, manifest(style), REGISTRY, style, source_tools or ())


def session_config(settings: Settings, model: str, instruction: str,
                   source_tools: list[dict[str, Any]] | None = None,
                   chosen: SessionSettings = SessionSettings(), agents: CallAgents | None = None) -> dict[str, Any]:
    """The ``session`` of the client-secret request; ``source_tools``: the
    MCP sources' tools, after ours (``http/mcp_credentials.py``); ``chosen``:
    the journal's session settings, only those set (none: no field added);
    ``agents``: the call's agents, whose first's tools and instruction the
    session starts with (docs/agents.md; None: every tool, the instruction as it is)."""
    tools = manifest(settings.tool_name_style) + list(source_tools or ())
    if agents is not None:
        first = agents.session(agents.in_charge, instruction)
        instruction, tools = first["instructions"], first["tools"]
    return {
        "type": "realtime",
        "model": model,
        "instructions": instruction,
        "tools": tools,
        "tool_choice": "auto",
        "output_modalities": ["audio"],
        **chosen.session_fields(),
    }


async def mint_client_secret(settings: Settings, clients: OpenAIClients, key: str, session: dict[str, Any]) -> str:
    """POST ``/realtime/client_secrets`` with the shared client for ``key``;
    the secret's value. Raises on any failure (HTTP error, timeout, a
    response without a value, or with one that is not ASCII: a credential
    is never text to repair, and a lone surrogate in it could not be sent)."""
    with trio.fail_after(settings.mint_timeout_s + 1.0):
        async with clients.use(key, settings.openai_base_url) as client:
            # session_config builds the SDK's realtime session shape as a plain dict
            secret = await client.realtime.client_secrets.create(
                session=cast(RealtimeSessionCreateRequestParam, session))
    value = getattr(secret, "value", None)
    if not isinstance(value, str) or not value:
        raise ValueError("client secret response has no value")
    if not value.isascii():
        raise ValueError("client secret value is not ASCII")
    return value


async def refuse_when_budget_spent(runtime: Runtime) -> None:
    """503 once the day's calls cost ``daily_budget_usd`` (until the clock seam's next day)."""
    if runtime.settings.daily_budget_usd <= 0:
        return
    try:
        daily = await ask_actor(runtime.calls, GetDailyUsage, QUICK_ASK_S)
    except trio.TooSlowError:
        raise ApiError(500, E.RUNTIME_UNAVAILABLE) from None
    if daily.spent:
        raise ApiError(503, E.BUDGET_SPENT)


@bp.post("/session")
async def create_session() -> Any:
    voice = state()
    settings = voice.settings
    body = await _json_object(required=False)
    requested, continues = linked.body_context(body), continuation.body_continues(body)
    earlier = await continuation.ended_call(continues, settings)
    key = openai_key(settings)
    await refuse_when_budget_spent(_runtime())
    link = await linked.verified(requested, settings)
    continued = await continuation.continuation(continues, earlier, _runtime())
    instruction = linked.instruction(await ready_instruction(settings, _runtime()), link, continued)
    sources = await mcp_credentials.source_tools(_runtime(), settings.tool_name_style)
    model = read_config(voice_config.voice_model, settings)
    chosen: SessionSettings = read_config(voice_config.session_settings, settings)
    agents = call_agents(settings, sources)
    started = trio.current_time()
    try:
        assert voice.openai_clients is not None   # VoiceState.__post_init__ sets it
        value = await mint_client_secret(settings, voice.openai_clients, key,
                                         session_config(settings, model, instruction, sources, chosen, agents))
    except Exception as error:  # noqa: BLE001 - every OpenAI failure is the same 500
        _log.error("http.session_mint_failed", error_type=type(error).__name__,
                   status=getattr(error, "status_code", None), detail=str(error)[:300],
                   duration_ms=round((trio.current_time() - started) * 1000, 1))
        raise ApiError(500, E.SESSION_UNAVAILABLE) from None
    _log.info("http.session_minted", model=model, duration_ms=round((trio.current_time() - started) * 1000, 1))
    return jsonify({"ephemeral_key": value, **linked.context_view(link), **continuation.continuation_view(continued)})


# --- POST /api/voice/connect --------------------------------------------------
# Answered at the ASGI layer, every request to it, by ``connect.py``.


# --- POST /api/voice/refresh-brain -------------------------------------------

@bp.post("/refresh-brain")
async def refresh_brain() -> Any:
    settings = state().settings
    await _json_object(required=False)
    runtime = _runtime()
    try:
        result = await ask_actor(runtime.brain, RefreshBrain, settings.brain_refresh_wait_s)
    except trio.TooSlowError:
        return jsonify({"status": "refreshing"}), 202
    if isinstance(result, BaseException) or not isinstance(result, BrainState) or not result.ready:
        _log.error("http.brain_refresh_failed", error_type=type(result).__name__)
        raise ApiError(500, E.REFRESH_FAILED)
    return jsonify({
        "status": "refreshed",
        "instruction_preview": result.instruction[:PREVIEW_CHARS],
        "brain_ready": True,
        "brain_age_seconds": _age_seconds(result) or 0,
    })


# --- GET /api/voice/status ----------------------------------------------------

async def _status_fields(settings: Settings) -> dict[str, Any]:
    fields: dict[str, Any] = {"brain_ready": False, "brain_age_seconds": None,
                              "openai_configured": False, "active_sessions": 0,
                              "daily_cost_usd": None, "daily_budget_usd": settings.daily_budget_usd or None,
                              "budget_spent": False, "phone_configured": False}
    # Each field on its own: one failing lookup must not blank the others.
    try:
        fields["openai_configured"] = bool(voice_config.openai_api_key(settings))
    except Exception as error:  # noqa: BLE001
        _log.error("http.status_key_lookup_failed", error_type=type(error).__name__)
    try:    # whether phone calls can come in (docs/phone.md): a webhook secret is configured
        fields["phone_configured"] = bool(voice_config.webhook_secret(settings))
    except Exception as error:  # noqa: BLE001
        _log.error("http.status_key_lookup_failed", error_type=type(error).__name__)
    runtime = state().runtime
    if runtime is None:
        _log.warning("http.status_without_runtime")
        return fields
    try:
        brain = await ask(runtime.brain, GetBrain, timeout=QUICK_ASK_S)
        fields["brain_ready"] = brain.ready
        fields["brain_age_seconds"] = _age_seconds(brain) if brain.ready else None
    except Exception as error:  # noqa: BLE001
        _log.error("http.status_brain_failed", error_type=type(error).__name__)
    try:
        fields["active_sessions"] = int(await ask(runtime.calls, CountCalls, timeout=QUICK_ASK_S))
    except Exception as error:  # noqa: BLE001
        _log.error("http.status_calls_failed", error_type=type(error).__name__)
    registry = runtime.actors.get("registry")
    health = registry.health() if registry is not None else None
    if health is not None:      # only with --redis: the single-process shape is unchanged
        fields["cluster"] = {**health, "active_sessions_here": fields["active_sessions"]}
        fields["active_sessions"] = await _cluster_sessions(runtime, fields["active_sessions"])
    try:
        daily = await ask(runtime.calls, GetDailyUsage, timeout=QUICK_ASK_S)
        fields.update(daily_cost_usd=daily.cost_usd, budget_spent=daily.spent)
    except Exception as error:  # noqa: BLE001
        _log.error("http.status_usage_failed", error_type=type(error).__name__)
    return fields


async def _cluster_sessions(runtime: Runtime, here: int) -> int:
    """Live calls on every process (live leases); this process's own count
    when Redis does not answer (``cluster.reachable`` is false then)."""
    shared = runtime.actors.get("feed")
    if shared is None:
        return here
    try:
        return int(await shared.live_calls())
    except RegistryDown:
        return here


@bp.get("/status")
async def status() -> Any:
    if state().runtime_failed.is_set():
        # a health check must see a failed process as failed (the fields would say "no calls")
        raise ApiError(503, E.RUNTIME_FAILED)
    return jsonify(await _status_fields(state().settings))


# --- client feed --------------------------------------------------------------

def _query_call_id() -> str:
    return call_id_of(request.args.get("call_id"))


T = TypeVar("T")
_NOTHING = object()


async def _unless_stopping(stopping: trio.Event, work: Callable[[], Awaitable[T]],
                           wait_s: float = math.inf) -> tuple[bool, T | None]:
    """``(True, value)`` when ``work()`` finishes first; ``(False, None)``
    after ``wait_s`` or as soon as the server begins to stop (``work`` is
    cancelled then). An exception of ``work`` is raised as it is, not
    wrapped in a group."""
    done: list[T] = []
    failed: list[Exception] = []
    async with trio.open_nursery() as race:
        race.cancel_scope.deadline = trio.current_time() + wait_s

        async def run() -> None:
            try:
                done.append(await work())
            except Exception as exc:   # handed to the caller below, unwrapped
                failed.append(exc)
            race.cancel_scope.cancel()

        async def stop() -> None:
            await stopping.wait()
            race.cancel_scope.cancel()

        race.start_soon(run)
        race.start_soon(stop)
    if failed:
        raise failed[0]
    return (True, done[0]) if done else (False, None)


async def _next_event(feed: Any, stopping: trio.Event, wait_s: float) -> Any:
    """The feed's next event; ``_NOTHING`` after ``wait_s`` without one or
    when the server begins to stop; None when the feed has ended. Wakes on
    the event itself, never on a poll: an idle stream costs nothing until
    its keepalive is due."""

    async def receive() -> Any:
        try:
            return await feed.receive()
        except (trio.EndOfChannel, trio.BrokenResourceError, trio.ClosedResourceError):
            return None

    received, event = await _unless_stopping(stopping, receive, wait_s)
    return event if received else _NOTHING


def _sse_event(event: dict[str, Any]) -> bytes:
    """One event's lines; with ``--redis`` its ``id`` is the SSE id too."""
    data = f"data: {json.dumps(event, ensure_ascii=False, default=str)}\n\n"
    event_id = event.get("id")
    return (f"id: {event_id}\n{data}" if event_id is not None else data).encode("utf-8")


async def _sse(feed: Any, stopping: trio.Event, call_id: str) -> AsyncIterator[bytes]:
    """Server-Sent Events from a feed channel until the call's feed ends or
    the server begins to stop. A comment line keeps idle connections open.
    (No cancel scope is held across a ``yield``: the waits live in
    ``_next_event``.)"""
    last_sent = trio.current_time()
    async with feed:
        yield b": connected\n\n"
        while not stopping.is_set():
            due = last_sent + SSE_KEEPALIVE_S - trio.current_time()
            event = await _next_event(feed, stopping, max(0.0, due))
            if event is None:
                break
            if event is not _NOTHING:
                yield _sse_event(event)
                last_sent = trio.current_time()
            elif not stopping.is_set() and trio.current_time() - last_sent >= SSE_KEEPALIVE_S:
                yield b": keepalive\n\n"
                last_sent = trio.current_time()
    _log.info("http.feed_stream_closed", call_id=call_id)


def _shared_feed() -> Any:
    """The shared feed (``cluster.shared_feed.SharedFeed``) with ``--redis``, else None."""
    runtime = state().runtime
    return runtime.actors.get("feed") if runtime is not None else None


#: each number of a Redis stream id is an unsigned 64-bit one: a larger one
#: passes the pattern but Redis refuses it (which read as "unreachable"), and
#: so does a resume after the largest id of all (nothing can follow it)
STREAM_ID_PART_MAX = 2**64 - 1


def resumable_event_id(value: str) -> bool:
    """``value`` is an event id a stream can be read after (``Last-Event-ID``)."""
    if not EVENT_ID_RE.fullmatch(value):
        return False
    parts = [int(part) for part in value.split("-")]
    return all(part <= STREAM_ID_PART_MAX for part in parts) and parts != [STREAM_ID_PART_MAX] * 2


def _last_event_id() -> str | None:
    value = request.headers.get("Last-Event-ID")
    if value is None or not value.strip():
        return None
    value = value.strip()
    if not resumable_event_id(value):
        raise ApiError(400, E.LAST_EVENT_ID_INVALID)
    return value


def _stream_response(body: AsyncIterator[bytes]) -> Any:
    response = Response(body, status=200, mimetype="text/event-stream")
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Accel-Buffering"] = "no"
    response.timeout = None   # a stream lives as long as the call
    return response


@bp.get("/events")
async def events() -> Any:
    call_id = _query_call_id()
    voice = state()
    runtime = _runtime()
    shared = _shared_feed()
    after = _last_event_id() if shared is not None else None   # one process: no resume, as before
    try:
        feed = await ask_actor(runtime.calls, lambda r: Subscribe(call_id, r), QUICK_ASK_S)
    except trio.TooSlowError:
        raise ApiError(500, E.RUNTIME_UNAVAILABLE) from None
    if isinstance(feed, str):   # a subscriber cap (feed.TOO_MANY_FOR_CALL / TOO_MANY)
        raise ApiError(503, feed)
    if feed is not None and after is None:      # held here: from memory, the same ids as the stream's
        return _stream_response(_sse(feed, voice.stopping, call_id))
    if shared is None:
        raise ApiError(404, E.CALL_NOT_FOUND)
    return await _remote_events(shared, call_id, after, feed, voice.stopping)


async def _remote_events(shared: Any, call_id: str, after: str | None, local: Any, stopping: trio.Event) -> Any:
    """The call's Redis stream: a call held by another process, or a resume
    (``Last-Event-ID``) on any. A resume on the holder while Redis does not
    answer falls back to its memory, from now."""
    try:
        known = await shared.call_known(call_id, after)
        start = after if after is not None else await shared.last_id(call_id)
    except RegistryDown:
        if local is not None:
            _log.warning("http.feed_resume_from_memory", call_id=call_id)
            return _stream_response(_sse(local, stopping, call_id))
        raise ApiError(503, E.FEED_UNREACHABLE) from None
    if local is not None:
        local.close()           # the stream path serves this client
        known = True
    if not known:
        raise ApiError(404, E.CALL_NOT_FOUND)
    try:
        shared.check_reader(call_id)
    except StreamRefusal as refusal:
        raise ApiError(503, str(refusal)) from None
    return _stream_response(_remote_sse(shared, call_id, start, stopping))


async def _next_entries(shared: Any, call_id: str, after: str, stopping: trio.Event) -> list[dict[str, Any]] | None:
    """The stream's next events after ``after`` (``[]`` after a keepalive
    period without one); None when the server begins to stop; raises
    ``RegistryDown``."""
    read, entries = await _unless_stopping(stopping, lambda: shared.read(call_id, after, SSE_KEEPALIVE_S))
    return entries if read else None


async def _pause(stopping: trio.Event, seconds: float) -> None:
    with trio.move_on_after(seconds):
        await stopping.wait()


async def _remote_sse(shared: Any, call_id: str, after: str, stopping: trio.Event) -> AsyncIterator[bytes]:
    """Server-Sent Events from the call's Redis stream, from ``after``, until
    ``call.ended``, the server stops, or the call is gone without one. While
    Redis does not answer the client gets one ``feed.interrupted`` and the
    stream stays open; ``feed.resumed`` when it answers again, then what it
    missed. (No cancel scope is held across a ``yield``.)"""
    last, down = after, False
    shared.open_reader(call_id)
    try:
        yield b": connected\n\n"
        while not stopping.is_set():
            try:
                events = await _next_entries(shared, call_id, last, stopping)
            except RegistryDown:
                if not down:
                    down = True
                    _log.warning("http.feed_interrupted", call_id=call_id)
                    yield _sse_event({"call_id": call_id, "type": "feed.interrupted"})
                await _pause(stopping, FEED_RETRY_S)
                continue
            if events is None:
                break
            if down:
                down = False
                _log.info("http.feed_resumed", call_id=call_id)
                yield _sse_event({"call_id": call_id, "type": "feed.resumed"})
            if not events:
                yield b": keepalive\n\n"
                if await _gone_quietly(shared, call_id):
                    break
                continue
            for event in events:
                yield _sse_event(event)
                last = event["id"]
                if event.get("type") == "call.ended":
                    return
    finally:
        shared.close_reader(call_id)
        _log.info("http.feed_stream_closed", call_id=call_id, remote=True)


async def _gone_quietly(shared: Any, call_id: str) -> bool:
    try:
        return bool(await shared.call_gone(call_id))
    except RegistryDown:
        return False


@bp.get("/nav-hints")
async def nav_hints() -> Any:
    call_id = _query_call_id()
    shared = _shared_feed()
    if shared is not None:      # the shared queue: taken once, whichever process holds the call
        try:
            hints = await shared.take_nav_hints(call_id)
        except RegistryDown:
            raise ApiError(503, E.FEED_UNREACHABLE) from None
        return jsonify({"hints": hints, "consumed": True})
    try:
        hints = await ask_actor(_runtime().calls, lambda r: TakeNavHints(call_id, r), QUICK_ASK_S)
    except trio.TooSlowError:
        raise ApiError(500, E.RUNTIME_UNAVAILABLE) from None
    return jsonify({"hints": list(hints), "consumed": True})


@bp.get("/observer-actions")
async def observer_actions() -> Any:
    shared = _shared_feed()
    if shared is not None:
        try:
            actions = await shared.take_observer_actions()
        except RegistryDown:
            raise ApiError(503, E.FEED_UNREACHABLE) from None
        return jsonify({"actions": actions, "consumed": True})
    try:
        actions = await ask_actor(_runtime().calls, TakeObserverActions, QUICK_ASK_S)
    except trio.TooSlowError:
        raise ApiError(500, E.RUNTIME_UNAVAILABLE) from None
    return jsonify({"actions": list(actions), "consumed": True})


# --- documents ------------------------------------------------------------------

def openapi_document() -> dict[str, Any]:
    text = resources.files("voiceactors.http").joinpath("openapi.json").read_text(encoding="utf-8")
    document: dict[str, Any] = json.loads(text)
    return document


def openapi_path(rule: str) -> str:
    """A routing rule in the OpenAPI spelling: ``/calls/<call_id>`` -> ``/calls/{call_id}``."""
    return re.sub(r"<(?:[a-z_]+:)?([A-Za-z_][A-Za-z0-9_]*)>", r"{\1}", rule)


@bp.get("/openapi.json")
async def openapi() -> Any:
    return jsonify(openapi_document())


@metrics_bp.get("/metrics")
async def prometheus() -> Any:
    body, content_type = metrics.render()
    return Response(body, status=200, content_type=content_type)
