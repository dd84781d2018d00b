"""Waits that hold on a loaded machine, for tests on trio's fake clocks.

``autojump_clock`` (and ``settled_clock``, which jumps after 50 ms of real
idleness) move trio's clock to the next deadline whenever every task waits.
A worker thread, a child process or a slow startup is real time the clock
does not see: on a busy machine it outlasts the idleness threshold, the clock
jumps, and a deadline that real time never reaches fires. So:

* a bound on test *setup* (an app's startup and shutdown) is real time:
  ``serving(app)``, ``real_time_limit``;
* a wait for real work under a fake clock holds the clock still:
  ``clock_held_still``, ``without_clock_jumps``;
* trio's clock is for the behaviour under test (a timeout, a retry gap).
"""

from __future__ import annotations

import threading
from contextlib import asynccontextmanager, contextmanager
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator

import trio

STARTUP_REAL_S = 60.0       # quart-trio's own bound, but on trio's clock (see serving)


@contextmanager
def real_time_limit(seconds: float = 20.0) -> Iterator[None]:
    """Fail a block that takes more than ``seconds`` of REAL time. A trio
    deadline would be a place for ``autojump_clock`` to jump to while a tool
    thread works; a thread timer is not."""
    token = trio.lowlevel.current_trio_token()
    with trio.CancelScope() as scope:
        timer = threading.Timer(seconds, lambda: trio.from_thread.run_sync(scope.cancel, trio_token=token))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
    if scope.cancelled_caught:
        raise AssertionError(f"took more than {seconds} s of real time")


async def _spin() -> None:
    while True:
        await trio.sleep(0)


@asynccontextmanager
async def clock_held_still() -> AsyncIterator[None]:
    """Inside the block a task that never sleeps keeps trio busy, so the
    autojump clock cannot move: for real work (threads, files, processes)
    while a trio deadline is pending. Never ``trio.sleep`` inside it (the
    fake clock would not reach the sleep's end)."""
    error: Exception | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_spin)
        try:
            yield
        except Exception as raised:      # the test's own failure, raised as itself below
            error = raised
        finally:
            nursery.cancel_scope.cancel()
    if error is not None:
        raise error


async def without_clock_jumps(work: Callable[[], Awaitable[Any]]) -> Any:
    """``await work()`` with the clock held still (``clock_held_still``)."""
    async with clock_held_still():
        return await work()


class LifespanFailed(AssertionError):
    pass


@asynccontextmanager
async def serving(app: Any, real_s: float = STARTUP_REAL_S) -> AsyncIterator[Any]:
    """Run ``app``'s ASGI lifespan around the block (startup before it, shutdown
    after it); yields the app (``.test_client()``). Instead of
    ``app.test_app()``: quart-trio bounds startup and shutdown with
    ``trio.fail_after(60)``, and under a fake clock a slow startup thread lets
    the clock jump past it (the runtime is cancelled mid-start). Here each
    phase is bounded by ``real_s`` of real time instead."""
    to_app, app_inbox = trio.open_memory_channel[dict](2)
    phase_done = {"startup": trio.Event(), "shutdown": trio.Event()}
    failures: list[str] = []

    async def from_app(message: dict) -> None:
        phase, _, outcome = message["type"].removeprefix("lifespan.").partition(".")
        if outcome == "failed":
            failures.append(f"{phase}: {message.get('message', '')}")
        phase_done[phase].set()

    async def phase(name: str) -> None:
        await to_app.send({"type": f"lifespan.{name}"})
        with real_time_limit(real_s):
            await phase_done[name].wait()
        if failures:
            raise LifespanFailed(f"the app's lifespan failed: {failures}")

    # the errors are raised after the nursery, as themselves (not in a group)
    error: Exception | None = None
    scope = {"type": "lifespan", "asgi": {"spec_version": "2.0"}}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(app, scope, app_inbox.receive, from_app)
        try:
            await phase("startup")
        except AssertionError as failed:
            error = failed
        else:
            try:
                yield app
            except Exception as raised:     # the test's own failure
                error = raised
            finally:
                with trio.CancelScope(shield=True):   # a cancelled test still shuts its app down
                    try:
                        await phase("shutdown")
                    except AssertionError as failed:
                        error = error or failed
        nursery.cancel_scope.cancel()   # the lifespan task returns after shutdown; a failed one is ended
    if error is not None:
        raise error
