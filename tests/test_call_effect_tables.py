"""The shell carries out a ``Publish`` or ``Measure`` effect through a table
named once (``call/actor.py``: ``_PUBLISHERS``, ``_MEASURES``), not by
looking an attribute up by its name: every kind the protocol can emit has
its entry, and each entry is the feed's method or the metric of that name."""

from __future__ import annotations

import ast
import inspect

from voiceactors import metrics
from voiceactors.call import actor as call
from voiceactors.call import protocol as call_protocol
from voiceactors.call.feed import CallFeed


def _emitted(effect: str) -> set[str]:
    """The literal first argument of every ``effect(...)`` in the protocol's source."""
    tree = ast.parse(inspect.getsource(call_protocol))
    return {node.args[0].value for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == effect
            and node.args and isinstance(node.args[0], ast.Constant)}


def test_every_published_kind_has_its_feed_method():
    kinds = _emitted("Publish")
    assert kinds and kinds <= set(call._PUBLISHERS)
    for kind, method in call._PUBLISHERS.items():
        assert method is getattr(CallFeed, kind)


def test_every_measure_has_its_metric():
    names = _emitted("Measure")
    assert names and names <= set(call._MEASURES)
    for name, observe in call._MEASURES.items():
        assert observe is getattr(metrics, name)
