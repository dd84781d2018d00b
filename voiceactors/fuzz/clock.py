"""The clock of a fuzz run: a mock clock that jumps to the next deadline
once every task waits, as trio's autojump clock does, except while a worker
thread of ours is at work.

The autojump clock jumps as soon as every task waits, and a task waiting
for a tool's thread waits: the replay's next event would then come before
the tool's answer or after it depending on how fast the thread ran, and a
seed would not replay the run it named. Here a jump waits for the threads
(``storage.thread_limiters``, trio's default one) to be idle, so a run's order
of events is its schedule's, not the machine's."""

from __future__ import annotations

import math

import trio
import trio.testing

from voiceactors import storage

__all__ = ["jump_when_idle", "seed_scheduler"]

#: Real seconds every task must have waited before the clock jumps (and
#: between looks at the threads while one works): small, so a run still
#: spends no real time in its waits.
IDLE_S = 0.002


async def jump_when_idle(clock: trio.testing.MockClock) -> None:
    """Jump ``clock`` (a ``MockClock`` without autojump: the run's clock) to
    the next deadline whenever every other task has waited ``IDLE_S`` and no
    worker thread of this run is busy. Runs until cancelled.

    ``storage``'s limiters live as long as the process: a thread an earlier
    run left behind (abandoned by its cancelled caller) still holds its
    token. What was held when this run began is not this run's (and once
    such a thread ends, its token is not counted again)."""
    before = storage.threads_at_work()
    while True:
        await trio.testing.wait_all_tasks_blocked(IDLE_S)
        at_work = storage.threads_at_work()
        before = min(before, at_work)
        if at_work > before:
            continue
        jump = trio.lowlevel.current_statistics().seconds_to_next_deadline
        if 0 < jump < math.inf:
            clock.jump(jump)


def seed_scheduler(seed: int) -> None:
    """Seed trio's scheduler: it runs the tasks ready at once in an order it
    draws at random (to shake out order bugs), from a generator of its own
    that it lets Hypothesis seed the same way (``trio._core._run._r``, the
    one private name this package reads of trio's). Seeded, a run's tasks
    take their turns in the same order each time its seed is replayed."""
    from trio._core import _run

    _run._r.seed(seed)
