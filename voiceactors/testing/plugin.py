"""The pytest plugin of ``voiceactors.testing`` (registered through the
``pytest11`` entry point: installing voiceactors is enough). It gives the
``voice`` fixture and runs every async test that takes it under trio
(pytest-trio), so a test needs no marker of its own; take pytest-trio's
``autojump_clock`` too and the call's waits take no real time."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from voiceactors.testing.voice import Voice


@pytest.fixture
def voice(tmp_path: Path) -> "Voice":
    """A ``Voice``: the sample journal in ``tmp_path/journal``, calls played
    by the simulator against the real call layer (``docs/testing.md``)."""
    from voiceactors.testing.voice import Voice   # here: a pytest run that never asks pays no import

    return Voice(tmp_path)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        function = getattr(item, "function", None)
        if (function is not None and inspect.iscoroutinefunction(function)
                and "voice" in getattr(item, "fixturenames", ()) and item.get_closest_marker("trio") is None):
            item.add_marker(pytest.mark.trio)
