"""voiceactors.metrics: voiceactors_* names, valid Prometheus text, own registry."""

from __future__ import annotations

import math

import trio
from prometheus_client.parser import text_string_to_metric_families

from voiceactors import metrics
from voiceactors.metrics import Metrics


def _samples(m: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    body, content_type = m.render()
    assert content_type.startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        assert family.name.startswith("voiceactors_"), family.name
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_every_name_is_prefixed_and_render_parses():
    m = Metrics()
    m.call_started()
    m.tool_finished("journal.get_day", "ok", 0.02)
    m.reconnect()
    m.brain_refreshed("failed")
    m.http_request("/api/voice/status", 200)
    names = {name for name, _ in _samples(m)}
    for expected in ("voiceactors_live_calls", "voiceactors_tool_calls_total", "voiceactors_tool_latency_seconds_bucket",
                     "voiceactors_sideband_reconnects_total", "voiceactors_brain_refreshes_total",
                     "voiceactors_brain_age_seconds", "voiceactors_brain_ready", "voiceactors_http_requests_total"):
        assert expected in names


def test_values_by_label():
    m = Metrics()
    m.call_started(); m.call_started(); m.call_ended()
    m.tool_finished("journal.get_day", "ok", 0.02)
    m.tool_finished("journal.get_day", "ok", 0.3)
    m.tool_finished("journal.get_day", "timeout", 10.0)
    m.reconnect(); m.reconnect()
    m.brain_refreshed("ok"); m.brain_refreshed("timeout")
    m.http_request("/api/voice/session", 503)
    s = _samples(m)
    assert s[("voiceactors_live_calls", ())] == 1
    assert s[("voiceactors_tool_calls_total", (("outcome", "ok"), ("tool", "journal.get_day")))] == 2
    assert s[("voiceactors_tool_calls_total", (("outcome", "timeout"), ("tool", "journal.get_day")))] == 1
    assert s[("voiceactors_tool_latency_seconds_count", (("tool", "journal.get_day"),))] == 3
    assert s[("voiceactors_tool_latency_seconds_bucket", (("le", "0.025"), ("tool", "journal.get_day")))] == 1
    assert s[("voiceactors_sideband_reconnects_total", ())] == 2
    assert s[("voiceactors_brain_refreshes_total", (("outcome", "timeout"),))] == 1
    assert s[("voiceactors_http_requests_total", (("route", "/api/voice/session"), ("status", "503")))] == 1


def test_registries_are_separate():
    a, b = Metrics(), Metrics()
    a.reconnect()
    assert _samples(b)[("voiceactors_sideband_reconnects_total", ())] == 0


def test_tool_label_set_is_bounded():
    m = Metrics()
    for i in range(metrics.MAX_TOOL_LABELS + 10):
        m.tool_finished(f"made.up.{i}", "invalid", 0.001)
    tools = {dict(labels)["tool"] for (name, labels) in _samples(m) if name == "voiceactors_tool_calls_total"}
    assert len(tools) == metrics.MAX_TOOL_LABELS + 1 and "other" in tools


async def test_brain_age_is_computed_at_scrape_time(autojump_clock):
    m = Metrics()
    assert math.isnan(_samples(m)[("voiceactors_brain_age_seconds", ())])
    assert _samples(m)[("voiceactors_brain_ready", ())] == 0
    m.brain_refreshed("ok", refreshed_at=trio.current_time())
    await trio.sleep(90)
    assert _samples(m)[("voiceactors_brain_age_seconds", ())] == 90
    assert _samples(m)[("voiceactors_brain_ready", ())] == 1


def test_module_functions_record_into_the_default_registry():
    before = _samples(metrics.METRICS)[("voiceactors_sideband_reconnects_total", ())]
    metrics.reconnect()
    metrics.call_started(); metrics.call_ended()
    metrics.tool_finished("calendar.today", "ok", 0.01)
    metrics.brain_refreshed("ok")
    metrics.http_request("/metrics", 200)
    body, _ = metrics.render()
    assert _samples(metrics.METRICS)[("voiceactors_sideband_reconnects_total", ())] == before + 1
    assert b'voiceactors_tool_calls_total{outcome="ok",tool="calendar.today"}' in body
