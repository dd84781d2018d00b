"""``voiceactors mcp --journal DIR``: the journal's tools over MCP stdio.

For desktop assistants that start their MCP servers as child processes.
The process runs its own ToolExecutor (the voice server's rules: validation,
output caps, timeouts, exactly-once writes recorded in ``--state-dir``'s
write log) and serves the same tools as ``/mcp`` until its stdin closes.
stdout carries the protocol only: logs go to stderr, and while serving the
SDK points fd 1 at stderr, so a stray print cannot corrupt the stream.

It takes no lock on the state folder: it writes only the write log (which
locks each tool call id across processes) and the search index (replaced
atomically), so it may run beside a voice server on the same folders.
There is no rate limit and no token: the assistant that started the process
is its only client.

With ``--redis URL`` (or ``VOICEACTORS_REDIS_URL``) its writes are claimed in
the cluster's shared write log too, as the voice servers' are
(``cluster/call_registry.py``): an idempotency key applied by any process of the
cluster, this one or a server's ``/mcp``, is answered from its record and
never applied again. A Redis that does not answer refuses writes with
``shared write log unreachable``; reads go on.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import trio
from mcp.server.stdio import stdio_server

from voiceactors.executor.actor import ToolExecutor
from voiceactors.cluster.call_registry import make_registry
from voiceactors.commands import EXIT_USAGE
from voiceactors.logs import get_logger
from voiceactors.mcp.server.tool_server import build_server
from voiceactors.mcp.server.tools import ToolCaller
from voiceactors.settings import Settings
from voiceactors.tools.handler_context import ToolContext

_log = get_logger(actor="mcp")


async def serve_stdio(settings: Settings) -> None:
    """Serve the tools on stdin/stdout until stdin closes; then the executor
    answers what is in flight (started writes finish), within
    ``shutdown_deadline_s``."""
    registry = make_registry(settings)
    shared = registry if registry.shared else None
    executor = ToolExecutor(settings, ToolContext.from_settings(settings), cluster=shared)
    server = build_server(ToolCaller(settings, lambda: executor.inbox))
    async with trio.open_nursery() as nursery:
        if shared is not None:
            await nursery.start(shared.run)
        await nursery.start(executor.run)
        _log.info("mcp.serving", transport="stdio", journal=str(settings.journal))
        try:
            async with stdio_server() as (read_stream, write_stream):
                await server.run(read_stream, write_stream, server.create_initialization_options())
        finally:
            with trio.move_on_after(settings.shutdown_deadline_s, shield=True):
                await executor.inbox.aclose()
            nursery.cancel_scope.cancel()
    _log.info("mcp.stopped", transport="stdio")


def cli_mcp(args: argparse.Namespace) -> int:
    """``voiceactors mcp``: exit 0 when stdin closes, 2 on a usage error."""
    from voiceactors.server import prepare

    prepared = prepare(args)
    if isinstance(prepared, int):
        return prepared
    if not Path(prepared.journal).is_dir():
        print(f"voiceactors: journal folder not found: {prepared.journal} "
              "(--journal, VOICEACTORS_JOURNAL or SOLSTONE_JOURNAL)", file=sys.stderr)
        return EXIT_USAGE
    trio.run(partial(serve_stdio, prepared))
    return 0
