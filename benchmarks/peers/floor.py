"""Peer (control): the harness floor — the least a sideband client can do.

One trio task per call on a raw ``trio_websocket`` connection: it decodes
with ``json.loads`` (no model validation) only the messages that mention
``response.done``, and on a completed ``response.done`` carrying function
calls it immediately writes a constant ``{"ok": true}`` output for each and
then one ``response.create``. No tool runs, nothing is logged, and the
cyclic garbage collector is off (its full collections stalled every call at
once). Its round trips are what the simulator, the loopback and the
scheduler cost by themselves: subtract them from a real peer's to see that
peer's own overhead.

Started by the drivers; the stdin/stdout protocol is in ``benchmarks.peers``.
"""

from __future__ import annotations

import gc
import json
import sys
from urllib.parse import urlsplit

import trio
import trio_websocket

from benchmarks.peers.args import call_ids, peer_parser


async def serve_call(base_url: str, api_key: str, call_id: str) -> None:
    url = urlsplit(base_url)
    async with trio_websocket.open_websocket(url.hostname or "127.0.0.1", url.port or 80,
                                             f"{url.path}/realtime?call_id={call_id}", use_ssl=False,
                                             extra_headers=[(b"authorization", f"Bearer {api_key}".encode())]) as ws:
        try:
            while True:
                message = await ws.get_message()
                if "response.done" not in message:
                    continue
                event = json.loads(message)
                if event.get("type") != "response.done" or event["response"].get("status") != "completed":
                    continue
                calls = [o for o in event["response"].get("output", []) if o.get("type") == "function_call"]
                for item in calls:
                    await ws.send_message(json.dumps({"type": "conversation.item.create", "item": {
                        "type": "function_call_output", "call_id": item["call_id"], "output": '{"ok": true}'}}))
                if calls:
                    await ws.send_message(json.dumps({"type": "response.create"}))
        except trio_websocket.ConnectionClosed:
            return


async def main(args) -> None:
    with trio.move_on_after(args.max_seconds):
        async with trio.open_nursery() as nursery:
            for cid in call_ids(args.prefix, args.calls):
                nursery.start_soon(serve_call, args.base_url, args.api_key, cid)
            print("JOINED", flush=True)


def run(argv: list[str] | None = None) -> int:
    args = peer_parser("harness-floor peer").parse_args(argv)
    print("STARTED", flush=True)
    sys.stdin.readline()  # GO
    gc.freeze()
    gc.disable()
    trio.run(main, args)
    return 0


if __name__ == "__main__":
    sys.exit(run())
