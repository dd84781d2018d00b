"""The registry as MCP tools, and one MCP tool call through the ToolExecutor.

Nothing about a tool is restated here: its name, description and input
schema are the registry's (``voiceactors.tools.registry``), and its
``readOnlyHint`` / ``destructiveHint`` follow its effect. A call goes to the
same ToolExecutor the voice calls use, as a ``ToolRequest``, so it meets the
same validation, output caps, timeouts and exactly-once writes.

What differs from a voice call:

- *No turn.* Each MCP call is a call and a turn of its own (a fresh
  ``call_id``), so the per-turn bound and the identical-call rejection never
  apply; the HTTP endpoint limits each client's rate instead (``http.py``).
- *The write's id.* The executor applies a write once per tool call id. An
  MCP client names a write by an idempotency key in the request's ``_meta``
  (``IDEMPOTENCY_META_KEY``); the write is recorded under ``mcp:<key>``, so
  the same key again (a retry after a lost answer, a reconnect, a restart of
  either side) answers the recorded output without applying it again. A
  write without a key gets a fresh id: it is applied once per request, and
  a client that retries such a request may apply it twice. The JSON-RPC
  request id is not used: it is unique only within one client's session
  (the SDK numbers from 1 in every session, and stateless HTTP has no
  session), so two clients' first writes would share it.
- *The answer.* The executor's JSON output becomes the result's
  ``structuredContent`` and its one text block; an output that is an error
  object (``{"error": ...}``) sets ``isError``. Events meant for a voice
  client (``_nav_target``, ``_observer_action``) ride in the result's
  ``_meta`` under ``CLIENT_EVENTS_META_KEY``.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from typing import Any, Callable, Mapping

import mcp_types as types
import trio

from voiceactors.executor.actor import UNKNOWN_TOOL
from voiceactors.messages import CancelReads, ExecutorMessage, ToolRequest, ToolResult, ask
from voiceactors.settings import Settings
from voiceactors.tools.registry import JOURNAL_TOOLS, WRITE, ToolSpec, lookup

IDEMPOTENCY_META_KEY = "voiceactors/idempotency_key"
CLIENT_EVENTS_META_KEY = "voiceactors/client_events"
IDEMPOTENCY_KEY = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
WRITE_ID_PREFIX = "mcp:"
REPLY_MARGIN_S = 5.0        # the executor answers at its own deadline; this is only a backstop
REPLY_BACKSTOP_S = 300.0    # the backstop when a tool timeout is unbounded

INVALID_IDEMPOTENCY_KEY = {"error": "invalid idempotency key"}
RUNTIME_UNAVAILABLE = {"error": "voice runtime unavailable"}
TIMED_OUT = {"error": "tool timed out"}
#: Outcomes whose output is the tool's answer, not an error object.
ANSWERED = frozenset({"ok"})

ExecutorInbox = trio.MemorySendChannel[ExecutorMessage]


def mcp_tool(spec: ToolSpec) -> types.Tool:
    """``spec`` as an MCP tool: the registry's name, description and schema."""
    writes = spec.effect == WRITE
    return types.Tool(name=spec.name, description=spec.description, input_schema=spec.parameters,
                      annotations=types.ToolAnnotations(read_only_hint=not writes, destructive_hint=writes))


def mcp_tools(registry: Mapping[str, ToolSpec] = JOURNAL_TOOLS) -> list[types.Tool]:
    return [mcp_tool(spec) for spec in registry.values()]


def write_id(meta: Mapping[str, Any] | None) -> str | None:
    """The tool call id a write is recorded under: ``mcp:<key>`` for the
    caller's idempotency key, a fresh one without a key; None for a key that
    is not a short string of ``[A-Za-z0-9._:-]``."""
    key = (meta or {}).get(IDEMPOTENCY_META_KEY)
    if key is None:
        return f"{WRITE_ID_PREFIX}{uuid.uuid4().hex}"
    if not isinstance(key, str) or not IDEMPOTENCY_KEY.fullmatch(key):
        return None
    return f"{WRITE_ID_PREFIX}{key}"


def reply_timeout(settings: Settings) -> float:
    """How long a caller waits for the executor's one answer."""
    longest = max(settings.tool_timeout_read_s, settings.tool_timeout_write_s)
    return longest + REPLY_MARGIN_S if math.isfinite(longest) else REPLY_BACKSTOP_S


def error_result(error: dict[str, Any]) -> types.CallToolResult:
    text = json.dumps(error, ensure_ascii=False, separators=(",", ":"))
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                structured_content=error, is_error=True)


def tool_result(result: ToolResult) -> types.CallToolResult:
    """The executor's answer as an MCP result (see the module docstring)."""
    body = json.loads(result.output)
    is_error = result.outcome not in ANSWERED and not (result.outcome == "replayed" and "error" not in body)
    meta = {CLIENT_EVENTS_META_KEY: list(result.client_events)} if result.client_events else None
    return types.CallToolResult(content=[types.TextContent(type="text", text=result.output)],
                                structured_content=body, is_error=is_error, _meta=meta)


class ToolCaller:
    """Runs MCP tool calls through the executor whose inbox ``inbox()``
    answers (None while no runtime is up)."""

    def __init__(self, settings: Settings, inbox: Callable[[], ExecutorInbox | None],
                 registry: Mapping[str, ToolSpec] = JOURNAL_TOOLS) -> None:
        self.settings = settings
        self.inbox = inbox
        self.registry = registry

    def list_tools(self) -> list[types.Tool]:
        return mcp_tools(self.registry)

    def input_schema(self, name: str) -> dict[str, Any] | None:
        spec = lookup(name, self.registry)
        return spec.parameters if spec is not None else None

    async def call(self, name: str, arguments: Mapping[str, Any] | None,
                   meta: Mapping[str, Any] | None) -> types.CallToolResult:
        inbox = self.inbox()
        if inbox is None:
            return error_result(RUNTIME_UNAVAILABLE)
        spec = lookup(name, self.registry)
        if spec is None:   # the executor knows the call-scoped tools too: not offered here
            return error_result(UNKNOWN_TOOL)
        call_id = f"mcp-{uuid.uuid4().hex}"
        tool_call_id = write_id(meta) if spec is not None and spec.effect == WRITE else call_id
        if tool_call_id is None:
            return error_result(INVALID_IDEMPOTENCY_KEY)
        raw = json.dumps(dict(arguments or {}), ensure_ascii=False)

        def request(reply: trio.MemorySendChannel[ToolResult]) -> ToolRequest:
            return ToolRequest(call_id=call_id, tool_call_id=tool_call_id, name=name, arguments=raw,
                               epoch=0, turn=0, reply=reply, fenced_by_call=False)

        try:
            result: ToolResult = await ask(inbox, request, timeout=reply_timeout(self.settings))
        except trio.TooSlowError:
            return error_result(TIMED_OUT)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.EndOfChannel):
            return error_result(RUNTIME_UNAVAILABLE)
        except trio.Cancelled:
            # Our caller went away (shutdown): its unfinished read need not run on.
            # A started write is not cancelled (the executor shields it).
            try:
                inbox.send_nowait(CancelReads(call_id))
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            raise
        return tool_result(result)
