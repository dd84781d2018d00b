"""The suite's own waits on a loaded machine (``clock_support.py``).

Under ``settled_clock`` a startup thread that outlasts 50 ms of real
idleness is a clock jump: with quart-trio's ``app.test_app()`` (startup under
``trio.fail_after(60)`` on trio's clock) the jump lands on that deadline and
the runtime is cancelled mid-start. ``serving`` bounds startup by real time.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import trio
from quart_trio import QuartTrio

from clock_support import LifespanFailed, serving, without_clock_jumps

TESTS = Path(__file__).resolve().parent


def app_starting_with(startup) -> QuartTrio:
    app = QuartTrio(__name__)
    app.before_serving(startup)

    @app.route("/")
    async def index() -> str:
        return "up"

    return app


async def test_a_startup_thread_longer_than_the_idleness_threshold_is_no_clock_jump(settled_clock):
    async def startup() -> None:
        await trio.to_thread.run_sync(time.sleep, 0.3)    # 6x settled_clock's threshold, in real time

    began = trio.current_time()
    async with serving(app_starting_with(startup)) as app:
        assert trio.current_time() - began < 1      # no jump to a startup deadline
        response = await app.test_client().get("/")
        assert response.status_code == 200 and await response.get_data(as_text=True) == "up"


async def test_a_startup_that_never_finishes_fails_in_real_time(autojump_clock):
    async def startup() -> None:
        await trio.sleep_forever()

    began = time.monotonic()
    with pytest.raises(AssertionError, match="real time"):
        async with serving(app_starting_with(startup), real_s=0.5):
            pytest.fail("the app never started")
    assert 0.5 <= time.monotonic() - began < 10


async def test_a_failed_startup_is_reported():
    async def startup() -> None:
        raise RuntimeError("no journal here")

    with pytest.raises(LifespanFailed, match="no journal here"):
        async with serving(app_starting_with(startup)):
            pytest.fail("the app never started")


async def test_work_under_without_clock_jumps_sees_no_clock_move(autojump_clock):
    async def slow_thread() -> float:
        began = trio.current_time()
        with trio.move_on_after(30):          # a deadline the clock would jump to
            await trio.to_thread.run_sync(time.sleep, 0.2)
        return trio.current_time() - began

    assert await without_clock_jumps(slow_thread) == 0


def test_no_test_starts_an_app_with_quarts_trio_clock_startup():
    offenders = [f"{path.name}:{number}" for path in sorted(TESTS.glob("test_*.py"))
                 for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                 if re.search(r"\.test_app\(\)", line) and path.name != Path(__file__).name]
    assert offenders == [], f"use clock_support.serving(app) instead of app.test_app(): {offenders}"
