"""The simulator's phone calls: the signed ``realtime.call.incoming`` webhook
the service posts for a call to the project's SIP address, and what a
caller sends (keypad presses).

``Simulator.place_phone_call`` registers a pending SIP call; ``delivery``
builds its webhook (the standard-webhooks scheme the service signs with:
``webhook-id``, ``webhook-timestamp``, ``webhook-signature`` =
``v1,`` + base64 HMAC-SHA256 of ``"{id}.{timestamp}." + body`` under the
secret, a ``whsec_`` secret's base64 decoded first); ``post`` sends it to a
server. Tests forge, age and alter deliveries through ``delivery``'s
arguments.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

WEBHOOK_PATH = "/api/voice/phone/incoming"
#: ``serve --demo``'s webhook secret and the one caller its sample journal lets in (a public
#: secret: the demo serves on loopback only, against the simulator)
DEMO_WEBHOOK_SECRET = "whsec_" + base64.b64encode(b"voiceactors demo webhook secret").decode("ascii")
DEMO_CALLER = "+15555550100"
#: the SIP trunk's host in the simulated INVITE's URIs
TRUNK_HOST = "trunk.sim.invalid"


def new_secret() -> str:
    """A webhook secret as the service's dashboard hands one out."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode("ascii")


def signature(secret: str, webhook_id: str, timestamp: str, body: bytes) -> str:
    """The ``webhook-signature`` value of a delivery."""
    key = base64.b64decode(secret[6:]) if secret.startswith("whsec_") else secret.encode("utf-8")
    digest = hmac.new(key, f"{webhook_id}.{timestamp}.".encode("utf-8") + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def sip_headers(caller: str | None, *, asserted: str | None = None,
                extra: list[tuple[str, str]] | None = None) -> list[tuple[str, str]]:
    """An INVITE's headers (authorization headers removed, as the service
    does): ``From`` naming ``caller`` (None: anonymous), a
    ``P-Asserted-Identity`` naming ``asserted`` when the trunk asserts one."""
    user = caller if caller is not None else "anonymous"
    host = TRUNK_HOST if caller is not None else "anonymous.invalid"
    headers = [("From", f'"{"Caller" if caller else "Anonymous"}" <sip:{user}@{host};user=phone>;tag={secrets.token_hex(4)}'),
               ("To", "<sip:voice@sip.api.openai.com>"),
               ("Call-ID", secrets.token_hex(8) + "@" + TRUNK_HOST)]
    if asserted is not None:
        headers.append(("P-Asserted-Identity", f"<tel:{asserted}>"))
    return headers + list(extra or ())


def incoming_event(call_id: str, headers: list[tuple[str, str]], *, media: str | None = "srtp") -> dict[str, Any]:
    """The ``realtime.call.incoming`` event of a pending SIP call."""
    data: dict[str, Any] = {"call_id": call_id, "sip_headers": [{"name": n, "value": v} for n, v in headers]}
    if media is not None:
        data["sip_media_security"] = media
    return {"id": "evt_" + secrets.token_hex(12), "object": "event", "created_at": int(time.time()),
            "type": "realtime.call.incoming", "data": data}


@dataclass
class Delivery:
    """One webhook delivery: its headers and body, as posted."""

    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def webhook_id(self) -> str:
        return self.headers.get("webhook-id", "")


def delivery(event: dict[str, Any], secret: str, *, webhook_id: str | None = None,
             timestamp: int | None = None, signed_with: str | None = None) -> Delivery:
    """``event`` as the service delivers it, signed with ``secret`` (or
    ``signed_with``: another secret, a forgery), stamped ``timestamp``
    (default now; an old one is a stale delivery)."""
    body = json.dumps(event, separators=(",", ":")).encode("utf-8")
    webhook_id = webhook_id or "wh_" + secrets.token_hex(12)
    stamp = str(int(time.time()) if timestamp is None else timestamp)
    return Delivery(body, {"content-type": "application/json", "webhook-id": webhook_id,
                           "webhook-timestamp": stamp,
                           "webhook-signature": signature(signed_with or secret, webhook_id, stamp, body)})


async def post(server_url: str, sent: Delivery, *, timeout_s: float = 30.0) -> httpx.Response:
    """POST the delivery to a server's webhook (``server_url``: its base, ``http://host:port``)."""
    async with httpx.AsyncClient(base_url=server_url, timeout=timeout_s) as client:
        return await client.post(WEBHOOK_PATH, content=sent.body, headers=sent.headers)


def dtmf_event(key: str) -> dict[str, Any]:
    """The server event of one keypad press."""
    return {"type": "input_audio_buffer.dtmf_event_received", "event": key, "received_at": int(time.time())}


def phone_call_view(call: Any) -> dict[str, Any]:
    """What became of a placed call (``GET /v1/simulator/phone-calls/{id}``)."""
    spoken = [e.get("transcript") for e in call.sent
              if e.get("type") == "response.output_audio_transcript.done" and e.get("transcript")]
    return {"call_id": call.call_id, "accepted": call.accepted is not None, "rejected_with": call.rejected_with,
            "referred_to": call.referred_to, "ended": call.closed, "tool_calls": sorted(call.tool_calls),
            "said": spoken}
