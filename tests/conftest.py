"""Shared fixtures. The fixture journal is read from ../shared at run time and
never copied into the project; tests that need it skip when it is absent."""

from __future__ import annotations

import io
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest
import structlog

from voiceactors import clock, logs

# Every simulator the suite makes holds the events it sends and receives to the
# SDK's types exactly (docs/simulator.md § Conformance); a test meeting one
# that does not conform fails (``_simulator_conformance`` below). Set before
# any simulator is made; subprocesses the tests start inherit it.
os.environ.setdefault("VOICEACTORS_SIM_CONFORMANCE", "1")

FIXTURE_JOURNAL = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "solstone-journal"
FIXTURE_BRIEFING_DAY = "2026-03-27"


def _make_writable(root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        os.chmod(dirpath, os.stat(dirpath).st_mode | stat.S_IWUSR | stat.S_IRUSR | stat.S_IXUSR)
        for name in filenames:
            path = os.path.join(dirpath, name)
            os.chmod(path, os.stat(path).st_mode | stat.S_IWUSR | stat.S_IRUSR)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give each of schemathesis' per-operation items its own node id.

    schemathesis 4 (under pytest 9) names them ``test_fuzz_every_operation[POST
    /api/voice/session]`` but gives all of them the function's bare node id;
    pytest-xdist schedules by node id, so all but one would never run."""
    for item in items:
        parent_id, _, last = item.nodeid.rpartition("::")
        if last != item.name and item.name.startswith(last + "[") and item.name.endswith("]"):
            if hasattr(item, "_id"):    # pytest 9.2's structured node ids
                item._id = item._id.with_params(item.name[len(last) + 1:-1])
            else:
                item._nodeid = f"{parent_id}::{item.name}"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "nonconforming_events: the test sends a simulator events the SDK's "
                                       "types refuse on purpose (the conformance check lets it pass)")


@pytest.fixture(autouse=True)
def _simulator_conformance(request: pytest.FixtureRequest):
    """A test fails when a simulator with conformance on (``Simulator(conformance=True)``,
    or every simulator under ``VOICEACTORS_SIM_CONFORMANCE=1``) sent or received an
    event the SDK's types do not hold exactly (docs/simulator.md § Conformance).
    Nothing to do in a process that never imported the simulator."""
    module = sys.modules.get("voiceactors.simulator.conformance")
    if module is not None:
        module.take()
    yield
    module = sys.modules.get("voiceactors.simulator.conformance")
    found = module.take() if module is not None else []
    if found and request.node.get_closest_marker("nonconforming_events") is None:
        lines = "\n".join(f"  {f.call_id} {f.direction} {f.type}: {f.reason}" for f in found[:20])
        pytest.fail(f"{len(found)} event(s) not held to the SDK's types:\n{lines}", pytrace=False)


@pytest.fixture(scope="module", autouse=True)
def _structlog_defaults_per_file():
    """Each test file starts (and ends) with structlog's defaults: under
    pytest-xdist a file follows whichever files its worker ran before, and a
    configuration one of them left (an ``info`` level, a buffer as the
    stream) would hide the lines a later file captures
    (``tests/test_tool_log_order.py``'s debug lines, once)."""
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()


@pytest.fixture
def fixture_journal() -> Path:
    """The shared solstone fixture journal, read-only."""
    if not FIXTURE_JOURNAL.is_dir():
        pytest.skip(f"fixture journal not found at {FIXTURE_JOURNAL} (../shared is absent)")
    return FIXTURE_JOURNAL


@pytest.fixture
def fixture_copy(fixture_journal: Path, tmp_path: Path) -> Path:
    """A writable temp copy of the fixture journal, for tests that write."""
    dest = tmp_path / "journal"
    shutil.copytree(fixture_journal, dest, symlinks=True)
    _make_writable(dest)
    return dest


@pytest.fixture
def pin_today():
    """Call ``pin_today("2026-03-27")`` to pin the clock seam for this test."""

    def _pin(day: str) -> None:
        clock.pin(day)

    yield _pin
    clock.pin(None)


@pytest.fixture(autouse=True)
def _unpinned_today(monkeypatch):
    monkeypatch.delenv("VOICEACTORS_TODAY", raising=False)
    yield
    clock.pin(None)


SAMPLE_TODAY = "2026-03-27"


@pytest.fixture(scope="session")
def _sample_templates(tmp_path_factory):
    """Sample journals written once per session, keyed by (days, today, seed)."""
    from voiceactors.journal.sample import write_sample_journal

    made: dict[tuple[int, str, int], Path] = {}

    def template(days: int, today: str, seed: int) -> Path:
        key = (days, today, seed)
        if key not in made:
            dest = tmp_path_factory.mktemp(f"sample-{days}d-{seed}") / "journal"
            made[key] = write_sample_journal(dest, days=days, today=clock.parse_day(today), seed=seed)
        return made[key]

    return template


@pytest.fixture
def make_sample(_sample_templates, tmp_path):
    """``make_sample(days=2, today=SAMPLE_TODAY, seed=0)``: a fresh, writable copy
    of a generated sample journal under this test's tmp_path."""
    copies = iter(range(1000))

    def make(days: int = 2, today: str = SAMPLE_TODAY, seed: int = 0) -> Path:
        dest = tmp_path / f"sample-{next(copies)}"
        return Path(shutil.copytree(_sample_templates(days, today, seed), dest))

    return make


@pytest.fixture
def sample_ctx(make_sample, tmp_path):
    """A ToolContext over a 14-day sample journal with today pinned to its today."""
    from voiceactors.tools import ToolContext

    today = clock.parse_day(SAMPLE_TODAY)
    return ToolContext(make_sample(days=14), tmp_path / "state", today=lambda: today)


@pytest.fixture
def log_stream():
    """Every log line of the test, as JSON (debug level up), in one buffer."""
    buffer = io.StringIO()
    logs.configure("json", "debug", stream=buffer)
    yield buffer
    structlog.reset_defaults()


@pytest.fixture
def settled_clock(autojump_clock):
    """``autojump_clock`` that jumps only after 50 ms of real idleness: the
    actors read files in worker threads, and a jump while one runs would fire
    deadlines that real time never reaches."""
    autojump_clock.autojump_threshold = 0.05
    return autojump_clock
