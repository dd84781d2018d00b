"""gc_policy: startup objects leave the collector's sight; pauses are timed."""

from __future__ import annotations

import gc

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
