"""A bare sideband client for the simulator's tests: a raw trio-websocket
connection on which every server message must conform to the SDK's types."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from typing import AsyncIterator

import trio
import trio_websocket

from voiceactors.realtime import events
from voiceactors.realtime.sideband import close_code
from voiceactors.simulator import Simulator, conformance

KEY = "sk-test"
AUTH = [(b"authorization", f"Bearer {KEY}".encode())]


class Client:
    """A bare sideband client: every server message must conform to the SDK's types."""

    def __init__(self, ws: trio_websocket.WebSocketConnection) -> None:
        self.ws = ws
        self.seen: list[dict] = []

    async def recv(self, within_s: float = 30) -> dict:
        with trio.fail_after(within_s):  # virtual seconds under autojump_clock: a stuck test fails fast
            raw = await self.ws.get_message()
        event = json.loads(raw)
        reason, _ = conformance.conformance_error(events.SERVER_EVENTS, event)
        assert reason is None, (reason, raw)
        self.seen.append(event)
        return event

    async def until(self, type_: str, within_s: float = 30, **match) -> dict:
        """The next event of ``type_`` whose fields match (``a__b=v``: ``event["a"]["b"] == v``),
        each event within ``within_s``."""
        while True:
            event = await self.recv(within_s)
            if event["type"] == type_ and all(field(event, k) == v for k, v in match.items()):
                return event

    async def send(self, event: dict) -> dict:
        await self.ws.send_message(json.dumps(event))
        return event

    async def closed_code(self, within_s: float = 30) -> int | None:
        try:
            while True:
                await self.recv(within_s)
        except trio_websocket.ConnectionClosed as exc:
            return close_code(exc)


def field(event: dict, dotted: str):
    for part in dotted.split("__"):
        event = event.get(part) if isinstance(event, dict) else None
    return event


def ws_url(sim: Simulator, call_id: str, extra: str = "") -> str:
    return sim.base_url.replace("http://", "ws://") + f"/realtime?call_id={call_id}{extra}"


def connect(sim: Simulator, call_id: str, headers=AUTH, extra: str = ""):
    return trio_websocket.open_websocket_url(ws_url(sim, call_id, extra), extra_headers=headers)


def calls_in(done: dict) -> list[dict]:
    return [i for i in done["response"]["output"] if i["type"] == "function_call"]


async def answer(client: Client, done: dict, *, create: bool = True) -> list[str]:
    call_ids = [i["call_id"] for i in calls_in(done)]
    for call_id in call_ids:
        await client.send(events.function_call_output(call_id, json.dumps({"ok": call_id})))
    for call_id in call_ids:
        await client.until("conversation.item.added", item__call_id=call_id)
    if create:
        await client.send(events.response_create())
    return call_ids


@asynccontextmanager
async def serving_simulator(simulator: Simulator) -> AsyncIterator[Simulator]:
    """``simulator`` serving its REST API and sidebands on a loopback port
    until the block ends (every connection then dropped)."""
    async with trio.open_nursery() as nursery:
        await nursery.start(simulator.serve, 0)
        yield simulator
        nursery.cancel_scope.cancel()
