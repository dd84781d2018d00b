"""OpenTelemetry traces, off unless the standard ``OTEL_*`` variables turn them on.

``configure()`` (``serve`` calls it once) reads the environment
(``setup.py``): with no exporter named, nothing is installed and every
helper here is a test of one module flag (``ON``), so a process that does not
trace pays nothing per call, turn, tool or request. Turned on, spans go to the
SDK's ``TracerProvider`` through a batch processor: the OTLP HTTP exporter
(the ``otel`` extra) or the console's.

The span tree of a call (docs/operations.md § Traces):

    call ─┬─ turn ── tool ── tool.execute ─┬─ tool.queue
          │                                ├─ tool.run ── mcp.request (traceparent to the source)
          │                                └─ tool.write ── journal.write
          └─ (a tool call outside any turn hangs from the call)
    http.request (one per HTTP request, a root of its own)

A tool call the executor answers in the call's own step (a fresh reusable
read, ``answer_now``) crosses no channel and has no ``tool`` span: its
``tool.run`` line carries the call's span.

The span context lives on trio's context (contextvars: a task started
inherits its starter's, a worker thread ``storage.run_sync`` starts gets a
copy). Where work crosses an actor's channel, the message carries its parent
(``ToolRequest.trace``, an MCP operation's ``_Op.trace``: a ``Parent``), and
the receiving task makes it current. Attributes are ids, names, counts,
outcomes and times: never a secret, a tool's arguments or output, or any
journal text.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Iterator, MutableMapping, TypeAlias

if TYPE_CHECKING:   # the API itself is imported when tracing is turned on (``install``), not by every command
    from opentelemetry.trace import Span as Span

#: Whether spans are made (set by ``configure``/``install``; read on every hot path).
ON = False

#: What crosses a channel with a request: the span its work hangs from.
Parent: TypeAlias = "Span"

_TRACER: Any = None
_NOTHING = contextlib.nullcontext(None)
SCOPE = "voiceactors"


class _Api:
    """The OpenTelemetry API's parts used here, imported once tracing is on."""

    def __init__(self) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace import Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.context, self.trace, self.Status, self.StatusCode = context, trace, Status, StatusCode
        self.propagator = TraceContextTextMapPropagator()


_API: _Api | None = None


def install(provider: Any) -> None:
    """Trace into ``provider`` (an SDK ``TracerProvider``) from now on
    (``configure``'s end; tests hand one with an in-memory exporter)."""
    global ON, _TRACER, _API
    _API = _API or _Api()
    _TRACER = provider.get_tracer(SCOPE)
    ON = True


def uninstall() -> None:
    """Stop making spans (a test's end)."""
    global ON, _TRACER
    ON, _TRACER = False, None


def configure() -> bool:
    """Turn tracing on when the environment asks for it (``setup.py``); whether it is on."""
    from voiceactors.tracing.setup import provider_from_env

    provider = provider_from_env()
    if provider is not None:
        install(provider)
    return ON


def start(name: str, parent: Parent | None = None, /, **attributes: Any) -> Span | None:
    """A span not made current (ended by ``finish``): its parent ``parent``,
    else the current span. None when tracing is off."""
    if not ON or _TRACER is None or _API is None:
        return None
    ctx = _API.trace.set_span_in_context(parent) if parent is not None else None
    span: Span = _TRACER.start_span(name, context=ctx, attributes=_clean(attributes))
    return span


def finish(span: Span | None, *, outcome: str | None = None, **attributes: Any) -> None:
    """End ``span`` (None: nothing), with the attributes known by then."""
    if span is None:
        return
    if attributes:
        span.set_attributes(_clean(attributes))
    if outcome is not None:
        span.set_attribute("voiceactors.outcome", outcome)
        if outcome not in _FINE and _API is not None:
            span.set_status(_API.Status(_API.StatusCode.ERROR, outcome))
    span.end()


_FINE = frozenset({"ok", "replayed", "200", "201", "202", "204", "304"})


@contextlib.contextmanager
def _current_span(name: str, parent: Parent | None, attributes: dict[str, Any]) -> Iterator[Span]:
    span = start(name, parent, **attributes)
    assert span is not None and _API is not None
    api = _API
    token = api.context.attach(api.trace.set_span_in_context(span))
    try:
        yield span
    except BaseException as exc:
        span.set_status(api.Status(api.StatusCode.ERROR, type(exc).__name__))
        raise
    finally:
        api.context.detach(token)
        span.end()


def span(name: str, parent: Parent | None = None, /,
         **attributes: Any) -> contextlib.AbstractContextManager[Span | None]:
    """``with span("tool.run", tool=name) as s:`` a span current in the block
    (its parent ``parent``, else the current one); ``s`` is None and the block
    runs as it is when tracing is off."""
    if not ON:
        return _NOTHING
    return _current_span(name, parent, attributes)


@contextlib.contextmanager
def _under(parent: Span) -> Iterator[None]:
    assert _API is not None
    api = _API
    token = api.context.attach(api.trace.set_span_in_context(parent))
    try:
        yield
    finally:
        api.context.detach(token)


def under(parent: Parent | None) -> contextlib.AbstractContextManager[Any]:
    """Make ``parent`` (carried across a channel) current in the block."""
    if parent is None or not ON:
        return _NOTHING
    return _under(parent)


def current() -> Parent | None:
    """The current span, to carry with a request across a channel (None: off, or none)."""
    if not ON or _API is None:
        return None
    current_span: Span = _API.trace.get_current_span()
    return current_span if current_span.get_span_context().is_valid else None


def inject(headers: MutableMapping[str, str]) -> None:
    """Put the current span's ``traceparent`` on an outgoing request's headers."""
    if ON and _API is not None:
        _API.propagator.inject(headers)


def add_trace_ids(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: a line made under a span carries ``trace_id`` and ``span_id``."""
    if ON and _API is not None:
        context = _API.trace.get_current_span().get_span_context()
        if context.is_valid:
            event.setdefault("trace_id", format(context.trace_id, "032x"))
            event.setdefault("span_id", format(context.span_id, "016x"))
    return event


#: Longest string attribute kept (a tool's name comes from the model: bounded like a log line's).
ATTRIBUTE_MAX = 64


def _clean(attributes: dict[str, Any]) -> dict[str, Any]:
    """Attributes OpenTelemetry takes: None left out, enums as their strings,
    strings clipped, our own names under ``voiceactors.``."""
    return {f"voiceactors.{k}" if "." not in k else k:
            v if isinstance(v, (bool, int, float)) else str(v)[:ATTRIBUTE_MAX]
            for k, v in attributes.items() if v is not None}
