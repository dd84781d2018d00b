"""A hostile MCP tool source: real MCP servers on loopback (``tests/mcp_support.py``)
whose schemas and answers are built to cost us time and memory, against our
hub and executor (docs/reliability.md § 14.4)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

import mcp.types as types
from clock_support import real_time_limit, serving
from mcp_support import McpTestServer, ToolDef, mcp_rig, text_result
from test_http_routes import make_settings
from voiceactors.executor.actor import ToolExecutor
from voiceactors.messages import ToolRequest, ToolResult
from voiceactors.http import create_app, voice_state
from voiceactors.mcp.client.tool_specs import build_specs

CATASTROPHIC = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}},
                "required": ["s"]}
#: 26 a's and a '!': Python's re takes seconds to give up on ^(a+)+$ (it doubles with each a)
CATASTROPHIC_ARGUMENT = {"s": "a" * 26 + "!"}


async def echo(args: dict[str, Any]) -> types.CallToolResult:
    return text_result("matched")


async def ask(executor: ToolExecutor, call_id: str, tool_call_id: str, name: str, args: dict[str, Any]
              ) -> ToolResult:
    send, receive = trio.open_memory_channel[ToolResult](1)
    await executor.inbox.send(ToolRequest(call_id, tool_call_id, name, json.dumps(args), epoch=0, turn=1, reply=send))
    return await receive.receive()


@pytest.fixture
def journal(make_sample) -> Path:
    return make_sample(days=2)


async def test_a_catastrophic_pattern_does_not_stall_the_server(journal, tmp_path, monkeypatch):
    """While a call's arguments are checked against ``^(a+)+$``, ``/api/voice/status`` answers at once."""
    server = McpTestServer([ToolDef("match", echo, CATASTROPHIC)])
    monkeypatch.setenv("CRM_TOKEN", "server-token")
    async with trio.open_nursery() as nursery:
        url = await nursery.start(server.serve)
        sources = json.dumps([{"name": "crm", "url": url, "token_env": "CRM_TOKEN"}])
        app = create_app(make_settings(journal, tmp_path, mcp_sources=sources))
        async with serving(app) as test_app:
            runtime = voice_state(app).runtime
            await runtime.actors["mcp"].wait_discovered()
            executor = runtime.actors["tools"]
            client = test_app.test_client()
            answered: list[ToolResult] = []

            async def call_tool() -> None:
                answered.append(await ask(executor, "rtc_regex", "fc_regex", "crm.match", CATASTROPHIC_ARGUMENT))

            with real_time_limit(60):
                nursery.start_soon(call_tool)
                await trio.sleep(0)      # the request is in the executor's inbox
                started = time.monotonic()
                response = await client.get("/api/voice/status")
                status_s = time.monotonic() - started
                while not answered:
                    await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert response.status_code == 200
    assert status_s < 0.5
    assert json.loads(answered[0].output) == {"error": "invalid arguments: s has the wrong format"}
    assert server.calls == []


def test_schemas_that_cost_without_bound_are_left_out_at_discovery():
    """A look-around pattern (RE2 cannot run it), a schema nested past any use,
    one too large to check in proportion, a nested ``$schema`` (it would switch
    validation to jsonschema's own classes and ``re``) and a reference outside
    the document, beside a tool that is fine: discovery takes well under a second."""
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(3000):
        deep = {"type": "object", "properties": {"x": deep}}
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string", "minLength": 1, "maxLength": 9}
                                             for i in range(40_000)}}
    nested_dialect = {"type": "object", "properties": {"s": {
        "$schema": "https://json-schema.org/draft/2020-12/schema", "type": "string", "pattern": "^(a+)+$"}}}
    listed = [
        {"name": "ok", "inputSchema": CATASTROPHIC},
        {"name": "lookaround", "inputSchema": {"type": "object",
                                               "properties": {"s": {"type": "string", "pattern": "^(?=a)a$"}}}},
        {"name": "deep", "inputSchema": {"type": "object", "properties": {"x": deep}}},
        {"name": "wide", "inputSchema": wide},
        {"name": "dialect", "inputSchema": nested_dialect},
        {"name": "remote", "inputSchema": {"type": "object", "properties": {"s": {"$ref": "https://evil/s.json"}}}},
    ]
    started = time.monotonic()
    specs, left_out = build_specs("crm", listed, "dotted")
    assert time.monotonic() - started < 1.0
    assert list(specs) == ["crm.ok"]
    why = dict(left_out)
    assert "linear-time" in why["lookaround"]
    assert why["deep"] == why["wide"] == "input schema larger than 5000 values or deeper than 32"
    assert why["dialect"] == "invalid input schema: $schema inside the schema is not supported"
    assert why["remote"] == "invalid input schema: $ref outside the schema is not supported"


async def test_an_exponential_schema_answers_an_error_within_its_budget(tmp_path):
    """``anyOf`` through ``$ref``, 2 ways at each of 40 levels: the check stops at its budget."""
    defs = {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]} for i in range(40)}
    defs["d40"] = {"type": "integer"}
    schema = {"type": "object", "$defs": defs, "properties": {"v": {"$ref": "#/$defs/d0"}}}
    server = McpTestServer([ToolDef("costly", echo, schema)])
    async with mcp_rig(tmp_path, {"crm": server}) as (r, hub):
        with real_time_limit(30):
            result = await ask(r.executor, "rtc_exp", "fc_exp", "crm.costly", {"v": "not a number"})
    assert json.loads(result.output) == {"error": "invalid arguments: too costly to check against the tool's schema"}
    assert result.outcome == "invalid" and server.calls == []


class LongestStall:
    """The longest the trio thread went without running a task that asks to
    run every 5 ms (seconds of real time)."""

    def __init__(self) -> None:
        self.longest = 0.0

    async def watch(self) -> None:
        last = time.monotonic()
        while True:
            await trio.sleep(0.005)
            now = time.monotonic()
            self.longest = max(self.longest, now - last - 0.005)
            last = now


async def test_a_catastrophic_output_schema_is_never_run(tmp_path):
    """The SDK checks a result against the tool's ``outputSchema`` with Python's ``re``:
    a structured result of 26 a's and '!' against ``^(a+)+$`` held the trio thread for seconds."""
    async def catastrophic(args: dict[str, Any]) -> types.CallToolResult:
        return text_result("see data", structured=CATASTROPHIC_ARGUMENT)

    server = McpTestServer([ToolDef("regex", catastrophic, output_schema=CATASTROPHIC)])
    stall = LongestStall()
    async with mcp_rig(tmp_path, {"crm": server}) as (r, hub):
        with real_time_limit(60):
            r.nursery.start_soon(stall.watch)
            result = await ask(r.executor, "rtc_out", "fc_out", "crm.regex", {})
    assert json.loads(result.output)["data"] == CATASTROPHIC_ARGUMENT, result.output
    assert stall.longest < 0.25, f"the trio thread stalled {stall.longest:.2f} s"


class PeakRss:
    """The process's resident memory, sampled every 5 ms by a thread of its own
    (the trio thread may be the one busy): the highest seen, in bytes."""

    def __init__(self) -> None:
        self._process = psutil.Process()
        self.start = self._process.memory_info().rss
        self.peak = self.start
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(0.005):
            self.peak = max(self.peak, self._process.memory_info().rss)

    def __enter__(self) -> "PeakRss":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


async def test_a_huge_answer_is_refused_at_the_cap_and_never_held(tmp_path):
    size = 50 * 1024 * 1024
    server = McpTestServer([ToolDef("dump", echo), ToolDef("small", echo)])
    server.streamed = {"dump": size}
    async with mcp_rig(tmp_path, {"crm": server}) as (r, hub):
        with real_time_limit(60), PeakRss() as rss:
            result = await ask(r.executor, "rtc_huge", "fc_huge", "crm.dump", {})
            after = await ask(r.executor, "rtc_huge", "fc_after", "crm.small", {})
    assert json.loads(result.output) == {
        "error": "crm answered more than 1048576 bytes; the answer was not read"}
    assert result.outcome == "failed"
    assert server.streamed_bytes < 16 * 1024 * 1024      # the read stopped at the cap (plus socket buffers)
    assert rss.peak - rss.start < 24 * 1024 * 1024, f"grew by {(rss.peak - rss.start) >> 20} MiB"
    assert json.loads(after.output)["text"] == "matched"      # the source's session carries on


async def test_a_compressed_answer_is_capped_at_what_it_inflates_to(tmp_path):
    """50 MB of text sent gzipped (about 50 KB on the wire): the cap counts the inflated bytes."""
    server = McpTestServer([ToolDef("bomb", echo)])
    server.streamed, server.gzipped = {"bomb": 50 * 1024 * 1024}, True
    async with mcp_rig(tmp_path, {"crm": server}) as (r, hub):
        with real_time_limit(60), PeakRss() as rss:
            result = await ask(r.executor, "rtc_gzip", "fc_gzip", "crm.bomb", {})
    assert json.loads(result.output) == {
        "error": "crm answered more than 1048576 bytes; the answer was not read"}
    assert rss.peak - rss.start < 24 * 1024 * 1024, f"grew by {(rss.peak - rss.start) >> 20} MiB"


async def test_an_event_stream_answer_meets_the_cap_too(tmp_path):
    async def big(args: dict[str, Any]) -> types.CallToolResult:
        return text_result("x" * (2 * 1024 * 1024))

    async def small(args: dict[str, Any]) -> types.CallToolResult:
        return text_result("fine")

    server = McpTestServer([ToolDef("big", big), ToolDef("small", small)], event_stream=True)
    async with mcp_rig(tmp_path, {"crm": server}) as (r, hub):
        with real_time_limit(60):
            refused = await ask(r.executor, "rtc_sse", "fc_big", "crm.big", {})
            answered = await ask(r.executor, "rtc_sse", "fc_small", "crm.small", {})
    assert json.loads(refused.output) == {"error": "crm did not answer"}
    assert json.loads(answered.output)["text"] == "fine"


async def test_a_hung_read_that_times_out_does_not_fail_another_calls_write(tmp_path, autojump_clock):
    """The read times out at 10 s; its HTTP request, left open, used to time out
    itself at 15 s and take the shared session down under the write then in flight."""
    async def hang(args: dict[str, Any]) -> types.CallToolResult:
        await trio.sleep_forever()
        raise AssertionError

    async def save(args: dict[str, Any]) -> types.CallToolResult:
        await trio.sleep(9.0)
        return text_result("saved")

    # the clock jumps only after 0.1 s of real idleness: between loopback sockets an
    # answer may take a few real milliseconds to arrive, and a jump at once would
    # pass a deadline that it was on its way to meet
    autojump_clock.autojump_threshold = 0.1
    server = McpTestServer([ToolDef("hang", hang), ToolDef("save", save, read_only=False)])
    async with mcp_rig(tmp_path, {"crm": server}, mcp_timeout_s=10.0) as (r, hub):
        results: dict[str, ToolResult] = {}

        async def run(call_id: str, tool_call_id: str, name: str, delay: float) -> None:
            await trio.sleep(delay)
            results[name] = await ask(r.executor, call_id, tool_call_id, name, {})

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "rtc_reader", "fc_read", "crm.hang", 0.0)
            nursery.start_soon(run, "rtc_writer", "fc_write", "crm.save", 6.0)
    assert json.loads(results["crm.hang"].output) == {"error": "tool timed out"}
    assert results["crm.save"].outcome == "ok", results["crm.save"].output
    assert json.loads(results["crm.save"].output)["text"] == "saved"
