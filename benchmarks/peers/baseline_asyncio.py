"""Peer (a): the straightforward asyncio baseline over the openai SDK.

Written for these benchmarks after the design's description of the
reference sideband loop (no code copied): one asyncio task per call opens
``AsyncOpenAI(base_url=<simulator>).realtime.connect(call_id=...)``, iterates
the events, and on every ``response.function_call_arguments.done`` runs the
tool inline (a plain synchronous call, on the event loop), posts the
``function_call_output`` with ``conn.conversation.item.create`` and calls
``conn.response.create()`` right after it. Nothing else is tracked: no
active-response state, no batching, no epochs.

The SDK's ``connect`` takes ``call_id`` and builds the websocket URL from
``base_url`` (``http://127.0.0.1:PORT/v1`` → ``ws://127.0.0.1:PORT/v1/realtime?call_id=...``),
so it reaches the simulator unchanged.

Started by the drivers; the stdin/stdout protocol is in ``benchmarks.peers``.
"""

from __future__ import annotations

import sys

from openai import AsyncOpenAI

from benchmarks.peers.args import call_ids, run_asyncio_peer, serve_calls
from benchmarks.peers.tool_calls import context, run_tool


async def serve_call(client: AsyncOpenAI, call_id: str, ctx, counts: dict[str, int]) -> None:
    try:
        async with client.realtime.connect(call_id=call_id) as conn:
            async for event in conn:
                if event.type != "response.function_call_arguments.done":
                    continue
                output = run_tool(ctx, event.name, event.arguments)
                await conn.conversation.item.create(
                    item={"type": "function_call_output", "call_id": event.call_id, "output": output})
                await conn.response.create()
                counts["tools"] += 1
    except Exception as exc:  # a naive loop just logs and ends the call
        counts["errors"] += 1
        print(f"baseline {call_id}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


async def main(args) -> None:
    ctx = context(args.journal, args.state_dir)
    client = AsyncOpenAI(api_key=args.api_key, base_url=args.base_url, max_retries=0)
    counts = {"tools": 0, "errors": 0}
    await serve_calls("baseline", (serve_call(client, cid, ctx, counts) for cid in call_ids(args.prefix, args.calls)),
                      counts, args.max_seconds)


def run(argv: list[str] | None = None) -> int:
    return run_asyncio_peer("asyncio + openai SDK baseline peer", main, argv)


if __name__ == "__main__":
    sys.exit(run())
