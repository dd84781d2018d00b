"""Prometheus metrics, all named ``voiceactors_*``.

The instruments live in a ``Metrics`` object with its own ``CollectorRegistry``
(never prometheus_client's global one), so a test or a second app can build a
fresh ``Metrics()`` without "duplicated timeseries" errors. The module-level
functions record into the process's default ``METRICS``; actors call those::

    metrics.call_started(); metrics.call_ended()
    metrics.tool_finished("journal.get_day", "ok", 0.012)
    metrics.reconnect()
    metrics.turn_first_audio(0.62)        # a user turn's wait for the reply's first sound
    metrics.rate_limits(requests=4999, tokens=39000)
    metrics.usage("gpt-realtime", {"audio_in": 120}, 0.00384)
    metrics.brain_refreshed("ok", refreshed_at=trio.current_time())
    metrics.http_request("/api/voice/session", 200)
    body, content_type = metrics.render()

Every function is synchronous, cheap and never raises into its caller's path
of work (a metric must not fail a tool call).
"""

from __future__ import annotations

import math
import threading
from typing import Any

import trio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

PREFIX = "voiceactors"
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
TOOL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0)
# the actors' own share of a round trip: sub-millisecond when all is well
TURN_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# what a person waits for a reply: a tenth of a second to several
FELT_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
#: The parts of a tool turn's wait (``voiceactors_turn_share_seconds``'s ``part``).
TURN_PARTS = ("tools", "overhead", "service")
MAX_TOOL_LABELS = 64   # unknown tool names come from the model: bound the label set
MAX_MODEL_LABELS = 16  # model names come from the journal config: bound them too
_OTHER = "other"
CHILDREN_KEPT = 1024   # labelled children remembered per family (beyond: looked up each time)


class Metrics:
    """One registry and its instruments."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.live_calls = Gauge(f"{PREFIX}_live_calls", "Calls with a live sideband actor.", registry=r)
        self.tool_calls = Counter(f"{PREFIX}_tool_calls", "Tool calls answered, by tool and outcome.",
                                  ["tool", "outcome"], registry=r)
        self.tool_latency = Histogram(f"{PREFIX}_tool_latency_seconds", "Tool call latency, by tool.",
                                      ["tool"], buckets=TOOL_BUCKETS, registry=r)
        self.tool_overhead = Histogram(
            f"{PREFIX}_tool_overhead_seconds",
            "Per tool call: first write of its output - its start - the executor's own duration.",
            buckets=TURN_BUCKETS, registry=r)
        self.tool_turnaround = Histogram(
            f"{PREFIX}_tool_turnaround_seconds",
            "Per response.create of ours: written - the response.done it follows was read.",
            buckets=TOOL_BUCKETS, registry=r)
        self.turn_first_audio = Histogram(
            f"{PREFIX}_turn_first_audio_seconds",
            "Per user turn: the end of the user's speech to the first sound of the reply (both as read by us).",
            buckets=FELT_BUCKETS, registry=r)
        self.turn_answer = Histogram(
            f"{PREFIX}_turn_answer_seconds",
            "Per user turn with a tool call: the end of the user's speech to the first sound after our tool outputs.",
            buckets=FELT_BUCKETS, registry=r)
        self.turn_share = Histogram(
            f"{PREFIX}_turn_share_seconds",
            "Per user turn with a tool call: who held up its answer, by part (tools: a tool still running after the "
            "service's response ended; overhead: ours besides; service: the rest).",
            ["part"], buckets=TOOL_BUCKETS, registry=r)
        self._turn_parts = {part: self.turn_share.labels(part=part) for part in TURN_PARTS}
        self.gc_pauses = Histogram(
            f"{PREFIX}_gc_pause_seconds", "Garbage collections (every call of the process waits), by generation.",
            ["generation"], buckets=TURN_BUCKETS, registry=r)
        # children made up front: the gc callback must not allocate under a lock
        self._gc_children = {g: self.gc_pauses.labels(generation=str(g)) for g in (0, 1, 2)}
        self.reconnects = Counter(f"{PREFIX}_sideband_reconnects", "Sideband websocket reconnect attempts.",
                                  registry=r)
        self.brain_refreshes = Counter(f"{PREFIX}_brain_refreshes", "Brain backend runs, by outcome.",
                                       ["outcome"], registry=r)
        self.brain_ready = Gauge(f"{PREFIX}_brain_ready", "1 when the brain has an instruction.", registry=r)
        self.brain_age = Gauge(f"{PREFIX}_brain_age_seconds",
                               "Age of the brain's instruction (NaN before the first one).", registry=r)
        self.http_requests = Counter(f"{PREFIX}_http_requests", "HTTP requests, by route and status.",
                                     ["route", "status"], registry=r)
        self.openai_clients = Counter(f"{PREFIX}_openai_clients_created",
                                      "OpenAI SDK clients built for minting (one per key and base URL).",
                                      registry=r)
        self.tokens = Counter(f"{PREFIX}_tokens", "Model tokens, by source (call, brain), model and kind.",
                              ["source", "model", "kind"], registry=r)
        self.cost = Counter(f"{PREFIX}_cost_usd", "What the model tokens cost in US dollars (priced models only), "
                            "by source and model.", ["source", "model"], registry=r)
        self.mcp_requests = Counter(f"{PREFIX}_mcp_requests", "MCP source requests, by source, operation "
                                    "(call, discovery) and outcome.", ["source", "op", "outcome"], registry=r)
        self.mcp_errors = Counter(f"{PREFIX}_mcp_errors", "MCP source requests that got no result or an "
                                  "isError one, by source and kind.", ["source", "kind"], registry=r)
        self.mcp_latency = Histogram(f"{PREFIX}_mcp_request_seconds", "MCP source request latency, by source "
                                     "and operation.", ["source", "op"], buckets=TOOL_BUCKETS, registry=r)
        self.rate_limit_remaining = Gauge(
            f"{PREFIX}_rate_limit_remaining", "What the service last said is left (rate_limits.updated), "
            "by limit (requests, tokens).", ["limit"], registry=r)
        # a limit's series exists once the service has reported it: a 0 before
        # any report would read as "spent" (deploy/alerts.yml)
        self._rate_children: dict[str, Any] = {}
        self._tools: set[str] = set()
        self._models: set[str] = set()
        # labelled children by their labels: ``labels()`` takes a lock and
        # validates every call (a few µs of the trio thread per tool call)
        self._tool_children: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._http_children: dict[tuple[str, int], Any] = {}
        # (source, model, kind) -> the tokens counter's child; kind "" is the cost's (every response.done)
        self._usage_children: dict[tuple[str, str, str], Any] = {}
        self._lock = threading.Lock()   # tool label set: recorded from worker threads too
        self._refreshed_at: float | None = None
        self._last_age = math.nan
        self.brain_age.set_function(self._brain_age)

    # --- calls --------------------------------------------------------------
    def call_started(self) -> None:
        self.live_calls.inc()

    def call_ended(self) -> None:
        self.live_calls.dec()

    def set_live_calls(self, count: int) -> None:
        self.live_calls.set(count)

    def reconnect(self) -> None:
        self.reconnects.inc()

    def rate_limits(self, requests: int | None, tokens: int | None) -> None:
        for name, left in (("requests", requests), ("tokens", tokens)):
            if left is not None:
                child = self._rate_children.get(name)
                if child is None:
                    child = self._rate_children[name] = self.rate_limit_remaining.labels(limit=name)
                child.set(left)

    # --- tools --------------------------------------------------------------
    def _tool_label(self, tool: str) -> str:
        tool = str(tool)[:64]
        with self._lock:
            if tool in self._tools:
                return tool
            if len(self._tools) >= MAX_TOOL_LABELS:
                return _OTHER
            self._tools.add(tool)
            return tool

    def tool_finished(self, tool: str, outcome: str, seconds: float) -> None:
        children = self._tool_children.get((tool, outcome))
        if children is None:
            label = self._tool_label(tool)
            children = (self.tool_calls.labels(tool=label, outcome=str(outcome)[:32]),
                        self.tool_latency.labels(tool=label))
            if len(self._tool_children) < CHILDREN_KEPT:   # names come from the model: bounded
                self._tool_children[(tool, outcome)] = children
        children[0].inc()
        children[1].observe(max(0.0, float(seconds)))

    def mcp_request(self, source: str, op: str, outcome: str, seconds: float) -> None:
        """One request to an MCP source (source names are configured: a bounded set)."""
        source, outcome = str(source)[:32], str(outcome)[:32]
        self.mcp_requests.labels(source=source, op=op, outcome=outcome).inc()
        if outcome != "ok":
            self.mcp_errors.labels(source=source, kind=outcome).inc()
        self.mcp_latency.labels(source=source, op=op).observe(max(0.0, float(seconds)))

    def observe_overhead(self, seconds: float) -> None:
        self.tool_overhead.observe(max(0.0, float(seconds)))

    def observe_turnaround(self, seconds: float) -> None:
        self.tool_turnaround.observe(max(0.0, float(seconds)))

    def turn_part(self, part: str, seconds: float) -> None:
        self._turn_parts[part].observe(max(0.0, float(seconds)))

    def gc_pause(self, generation: int, seconds: float) -> None:
        child = self._gc_children.get(generation)
        if child is not None:
            child.observe(max(0.0, seconds))

    # --- usage --------------------------------------------------------------
    def _model_label(self, model: str) -> str:
        model = str(model)[:64]
        with self._lock:
            if model in self._models:
                return model
            if len(self._models) >= MAX_MODEL_LABELS:
                return _OTHER
            self._models.add(model)
            return model

    def count_usage(self, source: str, model: str, tokens: dict[str, int], cost_usd: float | None) -> None:
        """One model call's tokens by kind and, when priced, its cost."""
        for kind, count in tokens.items():
            if count > 0:
                self._usage_child(source, model, str(kind)).inc(count)
        if cost_usd is not None and cost_usd > 0:
            self._usage_child(source, model, "").inc(cost_usd)

    def _usage_child(self, source: str, model: str, kind: str) -> Any:
        """The labelled child of the tokens counter (the cost counter for
        kind ""), kept: ``labels()`` takes a lock and checks its arguments
        at every call, twice or more per response."""
        key = (source, model, kind)
        child = self._usage_children.get(key)
        if child is None:
            label = self._model_label(model)
            if kind:
                child = self.tokens.labels(source=source, model=label, kind=kind[:32])
            else:
                child = self.cost.labels(source=source, model=label)
            if len(self._usage_children) < CHILDREN_KEPT:   # model names come from the journal: bounded
                self._usage_children[key] = child
        return child

    # --- brain --------------------------------------------------------------
    def brain_refreshed(self, outcome: str, refreshed_at: float | None = None) -> None:
        """Count one backend run; ``refreshed_at`` (``trio.current_time()``)
        is the time of the instruction now in use, when there is one."""
        self.brain_refreshes.labels(outcome=str(outcome)[:32]).inc()
        if refreshed_at is not None:
            self.set_brain_refreshed_at(refreshed_at)

    def set_brain_refreshed_at(self, refreshed_at: float | None) -> None:
        self._refreshed_at = refreshed_at
        self.brain_ready.set(0 if refreshed_at is None else 1)

    def _brain_age(self) -> float:
        # Computed at scrape time from trio's clock. Outside a trio run (a
        # scrape from a plain thread) the last computed age is reported.
        if self._refreshed_at is None:
            return math.nan
        try:
            self._last_age = max(0.0, trio.current_time() - self._refreshed_at)
        except RuntimeError:
            pass
        return self._last_age

    # --- http ---------------------------------------------------------------
    def http_request(self, route: str, status: int) -> None:
        """``route`` is the route's rule (``/api/voice/session``), never the
        raw path, so the label set stays bounded."""
        child = self._http_children.get((route, status))
        if child is None:
            child = self.http_requests.labels(route=str(route)[:128], status=str(int(status)))
            if len(self._http_children) < CHILDREN_KEPT:
                self._http_children[(route, status)] = child
        child.inc()

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE


METRICS = Metrics()


def call_started() -> None:
    METRICS.call_started()


def call_ended() -> None:
    METRICS.call_ended()


def set_live_calls(count: int) -> None:
    METRICS.set_live_calls(count)


def reconnect() -> None:
    METRICS.reconnect()


def tool_finished(tool: str, outcome: str, seconds: float) -> None:
    METRICS.tool_finished(tool, outcome, seconds)


def mcp_request(source: str, op: str, outcome: str, seconds: float) -> None:
    METRICS.mcp_request(source, op, outcome, seconds)


def tool_overhead(seconds: float) -> None:
    METRICS.observe_overhead(seconds)


def tool_turnaround(seconds: float) -> None:
    METRICS.observe_turnaround(seconds)


def turn_first_audio(seconds: float) -> None:
    METRICS.turn_first_audio.observe(max(0.0, float(seconds)))


def turn_answer(seconds: float) -> None:
    METRICS.turn_answer.observe(max(0.0, float(seconds)))


def turn_tools(seconds: float) -> None:
    METRICS.turn_part("tools", seconds)


def turn_overhead(seconds: float) -> None:
    METRICS.turn_part("overhead", seconds)


def turn_service(seconds: float) -> None:
    METRICS.turn_part("service", seconds)


def rate_limits(requests: int | None, tokens: int | None) -> None:
    METRICS.rate_limits(requests, tokens)


def gc_pause(generation: int, seconds: float) -> None:
    METRICS.gc_pause(generation, seconds)


def usage(model: str, tokens: dict[str, int], cost_usd: float | None, *, source: str = "call") -> None:
    METRICS.count_usage(source, model, tokens, cost_usd)


def brain_refreshed(outcome: str, refreshed_at: float | None = None) -> None:
    METRICS.brain_refreshed(outcome, refreshed_at)


def set_brain_refreshed_at(refreshed_at: float | None) -> None:
    METRICS.set_brain_refreshed_at(refreshed_at)


def http_request(route: str, status: int) -> None:
    METRICS.http_request(route, status)


def openai_client_created() -> None:
    METRICS.openai_clients.inc()


def render() -> tuple[bytes, str]:
    return METRICS.render()
