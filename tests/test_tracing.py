"""OpenTelemetry traces (``voiceactors/tracing/``), caught with the SDK's
in-memory exporter: the span tree of a real call (a parallel batch of a read
and a journal write, an MCP source's tool whose request carries its
``traceparent`` to the real source, a barge-in), no secret and no journal
text in any attribute, every log line of the traced call with its
``trace_id`` and ``span_id``; which ``OTEL_*`` variables turn tracing on;
and once, spans sent over OTLP HTTP to a receiver here that decodes the
protobuf."""

from __future__ import annotations

import functools
import io
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
import trio
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from calls_support import steady
from mcp_support import McpTestServer, ToolDef, mcp_rig, text_result
from voiceactors import logs, tracing
from voiceactors.testing.rig import KEY
from voiceactors.tracing import setup

CUSTOMER = "Acme Industrial, renewal due in March"
USER_WORDS = ("What is on today", "close the dentist one", "Look Acme up", "that's all")


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        yield exporter
    finally:
        tracing.uninstall()
        provider.shutdown()


async def lookup(arguments: dict[str, Any]) -> Any:
    return text_result(CUSTOMER)


CALL = [
    {"user_turn": {"text": "What is on today, and close the dentist one."}},
    {"response": {"tool_calls": [
        {"name": "calendar.today", "arguments": {}},
        {"name": "commitments.complete", "arguments": {"commitment_id": "e98f3ce7ef58afa3", "resolution": "done"}}]}},
    {"wait_outputs": {}},
    {"response": {"text": "Two meetings, and the dentist is closed."}},
    {"user_turn": {"text": "Look Acme up in the CRM."}},
    {"response": {"tool_calls": [{"name": "crm.lookup", "arguments": {}}]}},
    {"wait_outputs": {}},
    {"response": {"text": "Acme renews in March.", "hold_s": 2.0}},
    {"barge_in": {"after_ms": 200, "text": "Thanks, that's all."}},
    {"response": {"text": "Bye."}},
    {"sleep": 0.3},
    {"close": 1000},
]


def _by_id(finished: tuple[ReadableSpan, ...]) -> dict[int, ReadableSpan]:
    return {s.context.span_id: s for s in finished}


def _parent(span: ReadableSpan, by_id: dict[int, ReadableSpan]) -> ReadableSpan | None:
    return by_id.get(span.parent.span_id) if span.parent is not None else None


async def test_a_calls_span_tree_its_source_request_and_its_log_lines(tmp_path, spans):
    source = McpTestServer([ToolDef("lookup", lookup)])
    out = io.StringIO()
    saved = structlog.get_config()
    logs.configure("json", "info", stream=out)
    try:
        async with mcp_rig(tmp_path, {"crm": source}) as (r, _hub):
            await r.run_call("rtc_traced", steady(CALL))
    finally:
        structlog.configure(**saved)
    finished = spans.get_finished_spans()
    by_id = _by_id(finished)
    [call] = [s for s in finished if s.name == "call"]
    assert call.parent is None and call.attributes["voiceactors.call_id"] == "rtc_traced"
    assert call.attributes["voiceactors.end"] == "closed_by_service"
    trace_id = call.context.trace_id
    ours = [s for s in finished if s.context.trace_id == trace_id]

    turns = [s for s in ours if s.name == "turn"]
    assert [t.attributes["voiceactors.turn"] for t in turns] == [1, 2, 3]
    assert all(_parent(t, by_id) is call for t in turns)
    assert "voiceactors.first_audio_ms" in turns[0].attributes and "voiceactors.answer_ms" in turns[0].attributes
    # the barge-in: the user spoke over turn 2's answer, which ended its span; the third turn came after
    assert "voiceactors.answer_ms" in turns[1].attributes and turns[1].end_time <= turns[2].start_time

    tools = {s.attributes["voiceactors.tool"]: s for s in ours if s.name == "tool"}
    assert set(tools) == {"calendar.today", "commitments.complete", "crm.lookup"}
    # the parallel batch: both under the first turn, their runs overlapping
    assert _parent(tools["calendar.today"], by_id) is turns[0] is _parent(tools["commitments.complete"], by_id)
    assert _parent(tools["crm.lookup"], by_id) is turns[1]
    assert {k: s.attributes["voiceactors.outcome"] for k, s in tools.items()} == dict.fromkeys(tools, "ok")

    def children(span: ReadableSpan, name: str) -> list[ReadableSpan]:
        return [s for s in ours if s.name == name and _parent(s, by_id) is span]

    for tool in tools.values():
        [execute] = children(tool, "tool.execute")
        assert [s.name for s in sorted((s for s in ours if _parent(s, by_id) is execute),
                                       key=lambda s: s.start_time)] in (
            ["tool.queue", "tool.run"], ["tool.queue", "tool.write"], ["tool.run"])
    [write] = children(children(tools["commitments.complete"], "tool.execute")[0], "tool.write")
    [journal] = children(write, "journal.write")
    assert journal.attributes["voiceactors.changed"] is True

    # the source's request: a span under the tool's run, its traceparent seen by the source
    [run] = children(children(tools["crm.lookup"], "tool.execute")[0], "tool.run")
    [request] = children(run, "mcp.request")
    assert request.attributes["rpc.method"] == "tools/call"
    assert f"00-{trace_id:032x}-{request.context.span_id:016x}" in {p[:-3] for p in source.traceparents}

    # nothing secret, nothing the user said, nothing the journal or the source answered
    forbidden = [KEY, "server-token", CUSTOMER, "Acme", "dentist", *USER_WORDS]
    for span in finished:
        for name, value in span.attributes.items():
            if isinstance(value, str):
                assert len(value) <= 64 and not any(word.lower() in value.lower() for word in forbidden), (
                    span.name, name, value)
                assert re.fullmatch(r"[\w.:/\-]*", value), (span.name, name, value)

    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    of_call = [x for x in lines if x.get("call_id") == "rtc_traced" and x.get("actor") != "simulator"]
    assert {"call.connected", "tool.run", "call.ended"} <= {x["event"] for x in of_call}
    assert all(x.get("trace_id") == f"{trace_id:032x}" and re.fullmatch("[0-9a-f]{16}", x.get("span_id", ""))
               for x in of_call), [x["event"] for x in of_call if "trace_id" not in x]
    # the executor's line of a tool run carries that run's own span
    tool_run_spans = {f"{s.context.span_id:016x}" for s in ours if s.name == "tool.execute"}
    assert {x["span_id"] for x in of_call if x["event"] == "tool.run"} <= tool_run_spans


def test_tracing_is_off_unless_the_environment_turns_it_on():
    assert setup.choice({}).exporter is None
    assert setup.choice({"OTEL_SERVICE_NAME": "x"}).exporter is None
    assert setup.choice({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}).exporter is setup.Exporter.OTLP
    assert setup.choice({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c/v1/traces"}).exporter is setup.Exporter.OTLP
    assert setup.choice({"OTEL_TRACES_EXPORTER": "console"}).exporter is setup.Exporter.CONSOLE
    assert setup.choice({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}).exporter is None
    assert setup.choice({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}).exporter is None
    with pytest.raises(setup.TracingUnavailable, match="use otlp, console or none"):
        setup.choice({"OTEL_TRACES_EXPORTER": "zipkin"})
    assert setup.provider_from_env({}) is None
    # off: no span, no context to carry, no header, no ids on a line
    assert not tracing.ON
    with tracing.span("call", call_id="rtc_off") as span:
        assert span is None and tracing.current() is None
    headers: dict[str, str] = {}
    tracing.inject(headers)
    assert headers == {} and tracing.add_trace_ids(None, "info", {"event": "x"}) == {"event": "x"}


async def test_spans_go_over_otlp_http_to_a_receiver_that_decodes_them(monkeypatch):
    """A receiver on loopback (a trio socket server speaking just enough
    HTTP/1.1) takes the exporter's POST to ``/v1/traces`` and decodes its
    protobuf body."""
    received: list[tuple[str, dict[str, str], bytes]] = []

    async def receive(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(65536)
        head, body = data.split(b"\r\n\r\n", 1)
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (h.split(":", 1) for h in header_lines)}
        while len(body) < int(headers.get("content-length", "0")):
            body += await stream.receive_some(65536)
        received.append((request_line, headers, body))
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n"
                              b"connection: close\r\n\r\n")
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(functools.partial(trio.serve_tcp, receive, 0, host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        # the exporter and the resource read the process's environment themselves
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "voiceactors-test")
        monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
        provider = setup.provider_from_env()
        assert provider is not None
        tracing.install(provider)
        try:
            with tracing.span("call", call_id="rtc_otlp"):
                with tracing.span("tool", tool="calendar.today"):
                    pass
        finally:
            tracing.uninstall()
        # the batch processor's thread sends them (blocking): flushed from a worker thread
        await trio.to_thread.run_sync(provider.shutdown)
        nursery.cancel_scope.cancel()
    [(request_line, headers, body)] = received
    assert request_line == "POST /v1/traces HTTP/1.1"
    assert headers["content-type"] == "application/x-protobuf"
    export = ExportTraceServiceRequest.FromString(body)
    [resource_spans] = export.resource_spans
    service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}["service.name"]
    assert service == "voiceactors-test"
    names = {s.name: s for scope in resource_spans.scope_spans for s in scope.spans}
    assert set(names) == {"call", "tool"}
    assert names["tool"].parent_span_id == names["call"].span_id
    assert names["tool"].trace_id == names["call"].trace_id


def test_the_brains_session_file_is_a_journal_write_naming_only_the_file(tmp_path, spans):
    from voiceactors.brain.session_file import FILE_NAME, save_session_id

    save_session_id(tmp_path, "sess_0123")
    [write] = spans.get_finished_spans()
    assert write.name == "journal.write" and dict(write.attributes) == {"voiceactors.file": FILE_NAME}
