"""Peer (b): the OpenAI Agents SDK realtime session (``openai-agents``).

One ``RealtimeSession`` per call (``RealtimeRunner(agent).run(model_config=...)``)
joined to the simulator by ``model_config={"call_id": ..., "url":
"ws://127.0.0.1:PORT/v1/realtime?call_id=...", "api_key": ...}``: the SDK's
``OpenAIRealtimeWebSocketModel.connect`` takes ``url`` from the model config
(default ``wss://api.openai.com/v1/realtime?call_id=...``), so it can be
pointed at a local URL. The agent's tools are ``FunctionTool``s with the
voiceactors tool names and JSON Schemas, each running the same handler in a
worker thread (``asyncio.to_thread``, as the SDK does for a synchronous
``function_tool``). The session iterates its events until the call closes;
tool execution, outputs and ``response.create`` are entirely the SDK's.

Started by the drivers; the stdin/stdout protocol is in ``benchmarks.peers``.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from agents import FunctionTool, Tool, set_tracing_disabled
from agents.realtime import RealtimeAgent, RealtimeRunner

from voiceactors.tools import REGISTRY

from benchmarks.peers.args import call_ids, run_asyncio_peer, serve_calls
from benchmarks.peers.tool_calls import context, run_tool


def make_tools(ctx) -> list[Tool]:
    def invoker(name: str):
        async def invoke(_tool_ctx: Any, arguments: str) -> str:
            return await asyncio.to_thread(run_tool, ctx, name, arguments)
        return invoke

    return [FunctionTool(name=spec.name, description=spec.description, params_json_schema=spec.parameters,
                         on_invoke_tool=invoker(spec.name), strict_json_schema=False)
            for spec in REGISTRY.values()]


def ws_url(base_url: str, call_id: str) -> str:
    base = base_url.rstrip("/").replace("http://", "ws://", 1).replace("https://", "wss://", 1)
    return f"{base}/realtime?call_id={call_id}"


async def serve_call(agent: RealtimeAgent, base_url: str, api_key: str, call_id: str,
                     counts: dict[str, int]) -> None:
    try:
        # one runner per call: a runner holds one model, i.e. one websocket
        session = await RealtimeRunner(agent).run(model_config={"call_id": call_id, "url": ws_url(base_url, call_id),
                                                 "api_key": api_key})
        async with session:
            async for event in session:
                if event.type == "tool_end":
                    counts["tools"] += 1
                elif event.type == "error":
                    counts["session_errors"] += 1
    except Exception as exc:
        counts["errors"] += 1
        print(f"agents {call_id}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


async def main(args) -> None:
    set_tracing_disabled(True)   # no trace export: loopback only
    ctx = context(args.journal, args.state_dir)
    agent = RealtimeAgent(name="bench", instructions="Answer from the journal tools.", tools=make_tools(ctx))
    counts = {"tools": 0, "errors": 0, "session_errors": 0}
    await serve_calls("agents", (serve_call(agent, args.base_url, args.api_key, cid, counts)
                                 for cid in call_ids(args.prefix, args.calls)), counts, args.max_seconds)


def run(argv: list[str] | None = None) -> int:
    return run_asyncio_peer("OpenAI Agents SDK realtime peer", main, argv)


if __name__ == "__main__":
    sys.exit(run())
