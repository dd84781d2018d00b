"""The clock of a fuzz run: a mock clock that jumps to the next deadline
once every task waits, as trio's autojump clock does, except while a worker
thread of ours is at work.

The autojump clock jumps as soon as every task waits, and a task waiting
for a tool's thread waits: the replay's next event would then come before
the tool's answer or after it depending on how fast the thread ran, and a
seed would not replay the run it named. Here a jump waits for the threads
(``storage``'s limiters, trio's default one) to be idle, so a run's order
of events is its schedule's, not the machine's."""

from __future__ import annotations

import math

import trio
import trio.testing

from voiceactors import storage

__all__ = ["jump_when_idle"]

#: Real seconds every task must have waited before the clock jumps (and
#: between looks at the threads while one works): small, so a run still
#: spends no real time in its waits.
IDLE_S = 0.002


def _threads_busy() -> bool:
    limiters = (storage.limiter(), storage.write_limiter(), trio.to_thread.current_default_thread_limiter())
    return any(limiter.borrowed_tokens for limiter in limiters)


async def jump_when_idle(clock: trio.testing.MockClock) -> None:
    """Jump ``clock`` (a ``MockClock`` without autojump: the run's clock) to
    the next deadline whenever every other task has waited ``IDLE_S`` and no
    worker thread is busy. Runs until cancelled."""
    while True:
        await trio.testing.wait_all_tasks_blocked(IDLE_S)
        if _threads_busy():
            continue
        jump = trio.lowlevel.current_statistics().seconds_to_next_deadline
        if 0 < jump < math.inf:
            clock.jump(jump)
