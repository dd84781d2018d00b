"""``POST /api/voice/phone/incoming``: OpenAI's phone-call webhook.

A call to the project's SIP address makes the service post a signed
``realtime.call.incoming`` event here. In this order, each step before any
of the next's work:

1. **The secret**: ``voice.webhook_secret`` or ``OPENAI_WEBHOOK_SECRET``
   (``voice_config.webhook_secret``); without one, 503 ``phone unavailable —
   webhook secret not configured``.
2. **The signature**, through the SDK (``webhooks.verify_signature``: the
   standard-webhooks scheme, ``webhook-id``, ``webhook-timestamp`` within 5
   minutes either way, ``webhook-signature`` an HMAC over id, timestamp and
   body). An unsigned, forged, stale or altered delivery is 400, each with
   its own message, and nothing else happens. This path has no bearer token
   and no browser guard (``auth.SIGNED_PATHS``): the service can send
   neither, the signature is its authentication.
3. **The event**: a body that is not a ``realtime.call.incoming`` event as
   the SDK's model has it is 400 ``malformed webhook``; another event type
   (a project's webhook may carry several) is 200 ``ignored``.
4. **Once**: the delivery's ``webhook-id`` is remembered for twice the
   tolerance (``Deliveries``: a file under the state folder, written
   atomically before the call is answered; with ``--redis``, a ``SET NX``
   with that expiry, so the same delivery to two workers acts once). A
   delivery seen before is 200 ``duplicate``: a service retrying a
   delivery it saw no answer to gets one and nothing happens again. A
   delivery whose answer failed (the service unreachable) is forgotten, so
   the service's retry can act.
5. **The caller** (``phone_policy``): ``P-Asserted-Identity`` else ``From``;
   a withheld number is rejected with SIP 433 (Anonymity Disallowed), a
   number that is not one of ``voice.phone.allowed_callers`` with SIP 403
   (Forbidden), through the service (``calls.reject``): no sideband, the
   caller never hears the journal.
6. **Accept and join**: the brain's instruction, the tool manifest and the
   phone's audio settings in the accept (``calls.accept``), then the call is
   handed to the supervisor as a browser's connect is, marked as a phone
   call (``call_context.PhoneCall``): it greets first. A call the server
   cannot take (no instruction yet, the day's budget spent, at capacity, a
   configured PIN that is not one) is rejected with SIP 480 (Temporarily
   Unavailable).

Every answer to a verified delivery is 200 with ``{"status": …}``
(``accepted``, ``rejected``, ``duplicate``, ``ignored``): the webhook was
handled, whatever became of the call; only a failure to reach the service
(or to remember the delivery) is an error, so that the service retries.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import time
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from pathlib import Path
from typing import Any, Mapping, cast

import openai
import pydantic
import trio
from openai.types.realtime import RealtimeAudioConfigParam, RealtimeToolsConfigParam
from openai.types.webhooks.realtime_call_incoming_webhook_event import RealtimeCallIncomingWebhookEvent
from quart import jsonify, request

from voiceactors import phone_policy, storage, voice_config
from voiceactors.call.call_context import LinkedContext, PhoneCall
from voiceactors.call.phone_line import transfer_tool
from voiceactors.cluster.redis_client import RegistryDown
from voiceactors.http import errors as E
from voiceactors.http import mcp_credentials
from voiceactors.http.errors import ApiError
from voiceactors.http.connect import supervisor_answer
from voiceactors.http.routes import (QUICK_ASK_S, VoiceState, ask_actor, bp, call_agents, call_id_of, openai_key,
                                     read_config,
                                     ready_instruction, refuse_when_budget_spent, session_config, state)
from voiceactors.logs import get_logger
from voiceactors.messages import ConnectOutcome, CountCalls
from voiceactors.phone_policy import Caller, CallerVerdict, PhoneSettings
from voiceactors.realtime.session_settings import SessionSettings
from voiceactors.runtime import Runtime
from voiceactors.settings import Settings

PHONE_PATH = "/api/voice/phone/incoming"
#: the SDK's tolerance (``verify_signature``'s default): a delivery's timestamp within this of now, either way
TOLERANCE_S = 300
#: a delivery verifies for at most 2 × the tolerance after we first see it (its timestamp up to
#: 5 minutes ahead, then 5 minutes old): remembered that long, it can never act twice
REMEMBER_S = 2 * TOLERANCE_S
#: the deliveries remembered at most (each verified, so sent by the service: a bound, not a defence)
REMEMBER_MAX = 10_000
INCOMING = "realtime.call.incoming"
#: the phone's audio settings in the accept: a handset's microphone is near the mouth
PHONE_AUDIO: RealtimeAudioConfigParam = {"input": {"noise_reduction": {"type": "near_field"}}}

_log = get_logger(actor="phone")


class SipStatus(IntEnum):
    """What the service answers a refused INVITE with (the caller's network plays its announcement)."""

    FORBIDDEN = 403                  # a number not among the owner's
    TEMPORARILY_UNAVAILABLE = 480    # the server cannot take a call now
    ANONYMITY_DISALLOWED = 433       # no number to check (RFC 5079)


class Handled(StrEnum):
    """The webhook's answer to a verified delivery (``{"status": …}``)."""

    ACCEPTED = "accepted"
    REJECTED = "rejected"
    DUPLICATE = "duplicate"
    IGNORED = "ignored"


_REFUSED_STATUS = {CallerVerdict.UNKNOWN: SipStatus.FORBIDDEN, CallerVerdict.WITHHELD: SipStatus.ANONYMITY_DISALLOWED}


# --- the signature ---------------------------------------------------------------

def _secret_problem(secret: str) -> bool:
    """A ``whsec_`` secret that does not decode to bytes (the SDK would raise, as for a server fault)."""
    if not secret.startswith("whsec_"):
        return False
    try:
        return not base64.b64decode(secret[6:], validate=True)
    except (binascii.Error, ValueError):
        return True


def _verifier(voice: VoiceState) -> Any:
    """The SDK's webhook resource, from a client of its own: verifying sends
    nothing, so it needs no OpenAI key (built once per app: a client costs ~46 ms)."""
    client = voice.extras.get("webhook_client")
    if client is None:
        client = voice.extras["webhook_client"] = openai.AsyncOpenAI(
            api_key="webhook-verification", base_url=voice.settings.openai_base_url, max_retries=0)
    return client.webhooks


def verify(voice: VoiceState, raw: bytes, headers: Mapping[str, str], secret: str) -> str:
    """The delivery's ``webhook-id`` once its signature holds; ``ApiError``
    400 naming what is wrong otherwise (the SDK's verification decides)."""
    names = ("webhook-id", "webhook-timestamp", "webhook-signature")
    if any(not headers.get(name, "").strip() for name in names):
        raise ApiError(400, E.WEBHOOK_UNSIGNED)
    try:
        _verifier(voice).verify_signature(raw, dict(headers), secret=secret, tolerance=TOLERANCE_S)
    except openai.InvalidWebhookSignatureError as error:
        stale = "timestamp" in str(error).lower()
        _log.warning("phone.webhook_refused", why="stale" if stale else "signature")
        raise ApiError(400, E.WEBHOOK_STALE if stale else E.WEBHOOK_FORGED) from None
    except UnicodeDecodeError:      # the SDK checks the body is UTF-8 while it signs it
        _log.warning("phone.webhook_refused", why="not_utf8")
        raise ApiError(400, E.WEBHOOK_MALFORMED) from None
    return headers["webhook-id"].strip()


def incoming_event(raw: bytes) -> RealtimeCallIncomingWebhookEvent | None:
    """The verified body as the SDK's ``realtime.call.incoming`` event; None
    for another event type; 400 ``malformed webhook`` for anything else."""
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("type"), str):
        raise ApiError(400, E.WEBHOOK_MALFORMED)
    if body["type"] != INCOMING:
        return None
    try:
        event = RealtimeCallIncomingWebhookEvent.model_validate(body)
    except pydantic.ValidationError:
        raise ApiError(400, E.WEBHOOK_MALFORMED) from None
    try:
        call_id_of(event.data.call_id)
    except ApiError:
        raise ApiError(400, E.WEBHOOK_MALFORMED) from None
    return event


# --- once --------------------------------------------------------------------------

def deliveries_path(state_dir: Path) -> Path:
    return state_dir / "phone" / "deliveries.json"


class Deliveries:
    """The webhook ids handled in the last ``REMEMBER_S``, in memory and in
    a file under the state folder (written whole, atomically, before the
    delivery's call is answered: a restart remembers them). A claim is taken
    in the caller's step, so two deliveries of one id at once give one
    claim; the file is read once, at the first claim."""

    def __init__(self, state_dir: Path) -> None:
        self.path = deliveries_path(state_dir)
        self._until: dict[str, float] = {}      # webhook id -> wall-clock time it is forgotten
        self._loaded = False
        self._write_lock = trio.Lock()

    async def _load(self) -> None:
        if self._loaded:
            return
        try:
            raw = await storage.run_sync(self.path.read_bytes)
        except FileNotFoundError:
            raw = b"{}"
        except OSError as error:        # nothing is claimed: the delivery is answered 503, the service retries
            _log.error("phone.deliveries_unreadable", error=type(error).__name__)
            raise
        try:
            kept = json.loads(raw)
        except ValueError:
            # written atomically by us, so only damage from outside: refusing every call
            # for good would be worse than a replay window lost once
            _log.error("phone.deliveries_unreadable", error="not_json")
            kept = {}
        if not self._loaded:
            for webhook_id, until in (kept.items() if isinstance(kept, dict) else ()):
                if isinstance(webhook_id, str) and isinstance(until, (int, float)):
                    self._until.setdefault(webhook_id, float(until))
            self._loaded = True

    def _forget_old(self, now: float) -> None:
        for webhook_id in [w for w, until in self._until.items() if until <= now]:
            del self._until[webhook_id]
        while len(self._until) > REMEMBER_MAX:
            del self._until[next(iter(self._until))]

    async def claim(self, webhook_id: str) -> bool:
        """True for the first delivery of ``webhook_id`` (now remembered on
        disk), False for one seen before. OSError when the file cannot be
        read or written (nothing claimed then)."""
        await self._load()
        now = time.time()
        self._forget_old(now)
        if webhook_id in self._until:
            return False
        self._until[webhook_id] = now + REMEMBER_S
        try:
            await self._write()
        except OSError:
            self._until.pop(webhook_id, None)
            raise
        return True

    async def forget(self, webhook_id: str) -> None:
        """The delivery's answer failed: the service's retry may act."""
        self._until.pop(webhook_id, None)
        try:
            await self._write()
        except OSError as error:
            _log.error("phone.deliveries_write_failed", error=type(error).__name__)

    async def _write(self) -> None:
        async with self._write_lock:     # the latest memory, whole, each time
            data = json.dumps(self._until, separators=(",", ":"))
            await storage.run_sync(storage.atomic_write, self.path, data)


def delivery_key(webhook_id: str) -> str:
    """The Redis key of a delivery (hashed: an id is the service's text, any length)."""
    return "webhook:" + hashlib.sha256(webhook_id.encode("utf-8")).hexdigest()


async def _claim(voice: VoiceState, runtime: Runtime, webhook_id: str) -> bool:
    registry = runtime.actors.get("registry")
    if registry is not None and registry.shared:
        try:
            first: bool = await registry.claim_once(delivery_key(webhook_id), REMEMBER_S)
        except RegistryDown:
            raise ApiError(503, E.REGISTRY_DOWN) from None
        return first
    try:
        return await _deliveries(voice).claim(webhook_id)
    except OSError:
        raise ApiError(503, E.PHONE_MEMORY_UNAVAILABLE) from None


async def _forget(voice: VoiceState, runtime: Runtime, webhook_id: str) -> None:
    registry = runtime.actors.get("registry")
    if registry is not None and registry.shared:
        try:
            await registry.unclaim(delivery_key(webhook_id))
        except RegistryDown:
            _log.error("phone.delivery_not_forgotten", why="registry_down")
        return
    await _deliveries(voice).forget(webhook_id)


def _deliveries(voice: VoiceState) -> Deliveries:
    found = voice.extras.get("deliveries")
    if found is None:
        found = voice.extras["deliveries"] = Deliveries(voice.settings.state_dir)
    return cast(Deliveries, found)


# --- the call -------------------------------------------------------------------

@dataclass(frozen=True)
class Incoming:
    """A verified ``realtime.call.incoming``: the call and who places it."""

    call_id: str
    caller: Caller
    media: str | None

    @classmethod
    def of(cls, event: RealtimeCallIncomingWebhookEvent) -> Incoming:
        headers = [(header.name, header.value) for header in event.data.sip_headers]
        return cls(event.data.call_id, phone_policy.caller_of(headers), event.data.sip_media_security)


async def _reject(voice: VoiceState, key: str, call_id: str, status: SipStatus) -> None:
    settings = voice.settings
    assert voice.openai_clients is not None
    with trio.fail_after(settings.mint_timeout_s + 1.0):
        async with voice.openai_clients.use(key, settings.openai_base_url) as client:
            await client.realtime.calls.reject(call_id, status_code=int(status))


async def _accept(voice: VoiceState, key: str, call_id: str, session: dict[str, Any]) -> None:
    settings = voice.settings
    assert voice.openai_clients is not None
    fields = {name: value for name, value in session.items() if name != "type"}
    fields["tools"] = cast(RealtimeToolsConfigParam, fields.get("tools", []))
    with trio.fail_after(settings.mint_timeout_s + 1.0):
        async with voice.openai_clients.use(key, settings.openai_base_url) as client:
            await client.realtime.calls.accept(call_id, type="realtime", **fields)


async def _instruction_if_available(runtime: Runtime, settings: Settings, phone: PhoneSettings) -> str | ApiError:
    """The instruction a call starts with, or why the server cannot take a
    call now (the session route's refusals: the day's budget spent, no
    instruction after ``brain_ready_wait_s``; a configured PIN that is not
    one; ``max_calls`` live calls here)."""
    if phone.pin_invalid:
        return ApiError(503, "voice.phone.pin invalid")
    try:
        await refuse_when_budget_spent(runtime)
        instruction = await ready_instruction(settings, runtime)
        live = await ask_actor(runtime.calls, CountCalls, QUICK_ASK_S)
    except ApiError as refusal:
        return refusal
    except trio.TooSlowError:
        return ApiError(500, E.RUNTIME_UNAVAILABLE)
    if int(live) >= settings.max_calls:
        return ApiError(503, E.AT_CAPACITY)
    return instruction


async def _answer(voice: VoiceState, runtime: Runtime, incoming: Incoming) -> Handled:
    """Reject or accept the call (the service's REST), then start its actor."""
    settings = voice.settings
    key = openai_key(settings)
    phone = read_config(voice_config.phone_settings, settings)
    verdict = incoming.caller.verdict(phone)
    log = _log.bind(call_id=incoming.call_id, caller=incoming.caller.masked, header=incoming.caller.header)
    if verdict != CallerVerdict.ALLOWED:
        await _reject(voice, key, incoming.call_id, _REFUSED_STATUS[verdict])
        log.warning("phone.call_refused", verdict=str(verdict), sip_status=int(_REFUSED_STATUS[verdict]))
        return Handled.REJECTED
    instruction = await _instruction_if_available(runtime, settings, phone)
    if isinstance(instruction, ApiError):
        await _reject(voice, key, incoming.call_id, SipStatus.TEMPORARILY_UNAVAILABLE)
        log.warning("phone.call_refused", verdict="unavailable", why=instruction.message,
                    sip_status=int(SipStatus.TEMPORARILY_UNAVAILABLE))
        return Handled.REJECTED
    sources = await mcp_credentials.source_tools(runtime, settings.tool_name_style)
    model = read_config(voice_config.voice_model, settings)
    chosen: SessionSettings = read_config(voice_config.session_settings, settings)
    if phone.transfer_to is not None:       # the model may hand the caller to a person (phone_line.py)
        sources = [*sources, transfer_tool(settings.tool_name_style)]
    agents = call_agents(settings, sources)
    session = session_config(settings, model, instruction, sources, chosen, agents)
    session["audio"] = PHONE_AUDIO
    await _accept(voice, key, incoming.call_id, session)
    linked = LinkedContext(instruction, None, greeting=True, session=chosen, agents=agents,
                           phone=PhoneCall(incoming.caller.masked or "", incoming.caller.header, pin=phone.pin,
                                           transfer_to=phone.transfer_to))
    try:
        answer = await supervisor_answer(runtime, settings.connect_timeout_s, incoming.call_id, linked)
    except ApiError as refusal:       # accepted: answered (the delivery stays handled), then ended below
        answer = refusal.message
    log.info("phone.call_accepted", supervisor=str(answer), media=incoming.media)
    if answer != ConnectOutcome.CONNECTED:
        # accepted, but no actor joins it here: end it rather than leave the caller in silence
        log.error("phone.call_not_joined", reply=str(answer)[:64])
        await _hang_up(voice, key, incoming.call_id)
    return Handled.ACCEPTED


async def _hang_up(voice: VoiceState, key: str, call_id: str) -> None:
    settings = voice.settings
    assert voice.openai_clients is not None
    try:
        with trio.fail_after(settings.mint_timeout_s + 1.0):
            async with voice.openai_clients.use(key, settings.openai_base_url) as client:
                await client.realtime.calls.hangup(call_id)
    except Exception as error:  # noqa: BLE001 - the service ends an unjoined call by itself too
        _log.error("phone.hangup_failed", call_id=call_id, error_type=type(error).__name__)


def _first_headers() -> dict[str, str]:
    """The request's headers, lower-case, the first of each name (as Quart's ``headers.get``)."""
    found: dict[str, str] = {}
    for name, value in request.headers.items():
        found.setdefault(name.lower(), value)
    return found


@bp.post("/phone/incoming")
async def phone_incoming() -> Any:
    voice = state()
    settings = voice.settings
    secret = read_config(voice_config.webhook_secret, settings)
    if not secret:
        raise ApiError(503, E.PHONE_UNAVAILABLE)
    if _secret_problem(secret):
        _log.error("phone.webhook_secret_invalid")
        raise ApiError(503, E.PHONE_SECRET_INVALID)
    data = await request.get_data(cache=True)        # 413 past the body limit
    raw = data if isinstance(data, bytes) else data.encode("utf-8")
    webhook_id = verify(voice, raw, _first_headers(), secret)
    event = incoming_event(raw)
    if event is None:
        return jsonify({"status": Handled.IGNORED})
    runtime = voice.runtime
    if runtime is None:
        raise ApiError(500, E.RUNTIME_UNAVAILABLE)
    if not await _claim(voice, runtime, webhook_id):
        _log.info("phone.webhook_duplicate", call_id=event.data.call_id)
        return jsonify({"status": Handled.DUPLICATE})
    try:
        handled = await _answer(voice, runtime, Incoming.of(event))
    except ApiError:
        await _forget(voice, runtime, webhook_id)
        raise
    except Exception as error:  # noqa: BLE001 - the service unreachable or refusing: its retry may act
        _log.error("phone.answer_failed", call_id=event.data.call_id, error_type=type(error).__name__,
                   status=getattr(error, "status_code", None), detail=str(error)[:300])
        await _forget(voice, runtime, webhook_id)
        raise ApiError(502, E.PHONE_ANSWER_FAILED) from None
    return jsonify({"status": handled})
