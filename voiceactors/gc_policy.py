"""The cyclic garbage collector, for a process that serves live calls.

A collection stops every call of the process at once: a full (generation 2)
collection walks every tracked object, and right after startup most of those
are the modules, classes and validators the server loaded while starting
(the openai SDK and pydantic alone are ~100,000 objects), which never become
garbage. ``freeze_startup_heap``, run once the server is serving, moves them
out of the collector's sight (``gc.freeze``), so the full collections that
happen while calls are live walk only what the calls made (~250 objects per
idle call). ``watch_pauses`` times every collection into
``voiceactors_gc_pause_seconds`` so the pauses stay visible.

Even so a full collection costs ~0.7 µs per tracked object on a small
machine, ~320 objects per live call: ~200 ms at 750 calls, during which no
call is answered. Python starts one whenever the long-lived heap grew by a
quarter, which at hundreds of calls is every 20–60 s. ``collect_on_schedule``
takes that decision away from the allocation counters: automatic full
collections are deferred (young ones still run, and still free the cycles
that die young), and one full collection runs every ``interval_s`` instead.
Cyclic garbage that outlived its young generations (mostly the state of
ended calls) waits for the next scheduled collection.

All of this is process-wide and meant for the process's entry point
(``serve``, the benchmark peer), not for code that runs many times in one
process (tests).
"""

from __future__ import annotations

import gc
import time
from typing import Any, Callable

import trio

#: A generation-2 threshold no run reaches: counted in generation-1
#: collections (one per ~7,000 net allocations), it is hours away.
DEFERRED = 1_000_000

def freeze_startup_heap() -> int:
    """Collect once, then exclude every object alive now from later
    collections. Returns how many objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def watch_pauses(record: Callable[[int, float], None]) -> Callable[[], None]:
    """Call ``record(generation, seconds)`` after every collection (from
    whichever thread triggered it; ``record`` must be cheap and thread-safe).
    Returns the function that stops watching."""

    began: float | None = None   # collections never nest: one start at a time

    def callback(phase: str, info: dict[str, Any]) -> None:
        nonlocal began
        if phase == "start":
            began = time.perf_counter()
        elif began is not None:
            record(int(info.get("generation", -1)), time.perf_counter() - began)
            began = None

    gc.callbacks.append(callback)
    return lambda: gc.callbacks.remove(callback)


async def collect_on_schedule(interval_s: float) -> None:
    """Defer automatic full collections and run one every ``interval_s``
    seconds until cancelled; restores Python's thresholds when cancelled.
    ``interval_s <= 0`` keeps Python's own policy and returns at once."""
    if interval_s <= 0:
        return
    young0, young1, full = gc.get_threshold()
    gc.set_threshold(young0, young1, DEFERRED)
    try:
        while True:
            await trio.sleep(interval_s)
            gc.collect()
    finally:
        gc.set_threshold(young0, young1, full)
