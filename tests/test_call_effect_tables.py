"""The shell carries out a ``Publish`` or ``Measure`` effect by its kind, an
enum member (``PublishKind``, ``Metric``), through a table made from an
exhaustive match (``call/actor.py``: ``_publisher``, ``_metric``; mypy
refuses a member without its case). These tests check that each member
reaches the feed method or the metric it names: a real ``CallFeed`` with a
subscriber, the process's metrics registry."""

from __future__ import annotations

import pytest

from voiceactors import metrics
from voiceactors.call import actor as call
from voiceactors.call.protocol import Metric, PublishKind
from voiceactors.call.state import ToolOutcome
from voiceactors.call.feed import FeedHub

#: For each kind: the fields the protocol gives it, and the feed event's type it makes.
PUBLISHED = {
    PublishKind.TOOL_STARTED: ({"tool": "calendar.today", "tool_call_id": "c1", "epoch": 0}, "tool.started"),
    PublishKind.TOOL_DONE: ({"tool": "calendar.today", "tool_call_id": "c1", "epoch": 0,
                             "outcome": ToolOutcome.OK, "duration_ms": 3.0}, "tool.finished"),
    PublishKind.TOOL_PROGRESS: ({"tool": "crm.crawl", "tool_call_id": "c1", "epoch": 0, "progress": 1,
                                 "total": 4, "message": "page 1 of 4"}, "tool.progress"),
    PublishKind.CLIENT_EVENTS: ({"events": [{"type": "nav_hint", "target": "/day/2026-12-06"}],
                                 "tool": "journal.select", "tool_call_id": "c1"}, "nav.hint"),
    PublishKind.TRANSCRIPT: ({"role": "assistant", "text": "hello", "item_id": "i1"}, "transcript"),
    PublishKind.USAGE: ({"response_id": "r1", "model": "gpt-realtime", "tokens": {}, "cost_usd": None,
                         "call": {}}, "usage"),
    PublishKind.SELECTION: ({"tool_call_id": "c1", "selection": None, "link": None}, "selection"),
    PublishKind.AGENT: ({"agent": "planner", "previous": "assistant", "status": "updating"}, "agent"),
}

#: The histogram each metric observes into, and its labels.
OBSERVED: dict[Metric, tuple[str, dict[str, str]]] = {
    Metric.TOOL_OVERHEAD: ("voiceactors_tool_overhead_seconds", {}),
    Metric.TOOL_TURNAROUND: ("voiceactors_tool_turnaround_seconds", {}),
    Metric.TURN_FIRST_AUDIO: ("voiceactors_turn_first_audio_seconds", {}),
    Metric.TURN_ANSWER: ("voiceactors_turn_answer_seconds", {}),
    Metric.TURN_TOOLS: ("voiceactors_turn_share_seconds", {"part": "tools"}),
    Metric.TURN_OVERHEAD: ("voiceactors_turn_share_seconds", {"part": "overhead"}),
    Metric.TURN_SERVICE: ("voiceactors_turn_share_seconds", {"part": "service"}),
}


def test_every_kind_is_covered_here():
    assert set(PUBLISHED) == set(PublishKind) == set(call._PUBLISHERS)
    assert set(OBSERVED) == set(Metric) == set(call._MEASURES)


@pytest.mark.parametrize("kind", list(PublishKind))
async def test_a_published_kind_reaches_its_feed_method(kind: PublishKind):
    fields, event_type = PUBLISHED[kind]
    feed = FeedHub().open("rtc_tables")
    events = feed.subscribe()
    call._PUBLISHERS[kind](feed, **fields)
    event = events.receive_nowait()
    assert event["type"] == event_type
    assert event["call_id"] == "rtc_tables"


def _observed(histogram: tuple[str, dict[str, str]]) -> float:
    name, labels = histogram
    value = metrics.METRICS.registry.get_sample_value(f"{name}_count", labels)
    return value or 0.0


@pytest.mark.parametrize("name", list(Metric))
def test_a_measure_reaches_its_metric(name: Metric):
    before = {m: _observed(h) for m, h in OBSERVED.items()}
    call._MEASURES[name](0.25)
    after = {m: _observed(h) for m, h in OBSERVED.items()}
    assert {m: after[m] - before[m] for m in OBSERVED} == {m: 1.0 if m is name else 0.0 for m in OBSERVED}
