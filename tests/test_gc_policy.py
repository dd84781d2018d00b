"""gc_policy: startup objects leave the collector's sight; pauses are timed."""

from __future__ import annotations

import gc

import trio

from voiceactors import gc_policy
from voiceactors.metrics import Metrics


def test_watch_pauses_times_every_collection_into_the_histogram():
    m = Metrics()
    stop = gc_policy.watch_pauses(m.gc_pause)
    try:
        gc.collect(0)
        gc.collect(2)
    finally:
        stop()
    gc.collect(2)   # not watched any more
    count = m.registry.get_sample_value
    assert count("voiceactors_gc_pause_seconds_count", {"generation": "0"}) == 1
    assert count("voiceactors_gc_pause_seconds_count", {"generation": "2"}) == 1


def test_freeze_startup_heap_moves_live_objects_out_of_collections():
    before = gc.get_freeze_count()
    try:
        frozen = gc_policy.freeze_startup_heap()
        assert frozen == gc.get_freeze_count() > before
        assert sum(gc.get_count()) < 100   # nothing left for the next collection but new objects
    finally:
        gc.unfreeze()


async def test_collect_on_schedule_defers_automatic_full_collections_and_runs_its_own(autojump_clock):
    m = Metrics()
    before = gc.get_threshold()
    stop = gc_policy.watch_pauses(m.gc_pause)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(gc_policy.collect_on_schedule, 10.0)
            await trio.sleep(1)
            assert gc.get_threshold() == (before[0], before[1], gc_policy.DEFERRED)
            await trio.sleep(24)                      # scheduled at 10 s and 20 s
            nursery.cancel_scope.cancel()
    finally:
        stop()
    assert gc.get_threshold() == before               # Python's policy is back
    assert m.registry.get_sample_value("voiceactors_gc_pause_seconds_count", {"generation": "2"}) == 2


async def test_collect_on_schedule_with_no_interval_keeps_pythons_policy():
    before = gc.get_threshold()
    with trio.fail_after(1):
        await gc_policy.collect_on_schedule(0)
    assert gc.get_threshold() == before
