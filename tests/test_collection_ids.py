"""Every collected test has its own node id: pytest-xdist (the README's test
command runs it) schedules tests by node id, so two items sharing one would
run as one, silently."""

from __future__ import annotations

import collections

import pytest


def test_every_collected_test_has_its_own_node_id(request: pytest.FixtureRequest) -> None:
    ids = collections.Counter(item.nodeid for item in request.session.items)
    assert [nodeid for nodeid, n in ids.items() if n > 1] == []


def test_the_fuzz_cases_are_one_per_operation(request: pytest.FixtureRequest) -> None:
    fuzz = [item.nodeid for item in request.session.items if "test_fuzz_every_operation" in item.nodeid]
    if not fuzz:
        pytest.skip("run with tests/test_reliability_http.py collected (the whole suite)")
    assert len(fuzz) >= 10 and all(nodeid.endswith("]") for nodeid in fuzz), fuzz[:3]
