"""One bounded Redis request for every cluster client (``redis_client.bounded``)
and the reachability each one logs once per change: a request that does
not answer in time is ``RegistryDown`` (``TooSlowError``), a refused one
``RegistryDown`` naming the client's error, and the registry's and brain's
log lines keep their ``error`` values (``TooSlowError`` / ``RegistryDown``).
"""

from __future__ import annotations

import json

import pytest
import trio

from voiceactors.cluster import redis_client as rc
from voiceactors.cluster.brain_flight import BrainFlight
from voiceactors.cluster.call_registry import RedisRegistry
from voiceactors.cluster.redis_client import RegistryDown


async def _answer(value):
    await trio.sleep(0)
    return value


async def _refused():
    raise ConnectionRefusedError("no redis here")


def _events(log_stream, name):
    return [json.loads(line) for line in log_stream.getvalue().splitlines() if f'"{name}"' in line]


async def test_a_request_past_its_bound_is_registry_down_too_slow(autojump_clock):
    start = trio.current_time()
    with pytest.raises(RegistryDown) as caught:
        await rc.bounded(trio.sleep_forever(), 2.0)
    assert trio.current_time() - start == pytest.approx(2.0)
    assert caught.value.timed_out and str(caught.value) == "TooSlowError"
    assert caught.value.error_name == "TooSlowError"


async def test_a_failed_request_is_registry_down_naming_the_error():
    with pytest.raises(RegistryDown) as caught:
        await rc.bounded(_refused(), 2.0)
    assert not caught.value.timed_out and str(caught.value) == "ConnectionRefusedError"
    assert caught.value.error_name == "RegistryDown"
    assert await rc.bounded(_answer(7), 2.0) == 7


async def test_the_registry_logs_each_change_of_reachability_once(autojump_clock, log_stream):
    registry = RedisRegistry("unix:///nonexistent/redis.sock", 2.0, node="n1")    # its client is never used
    for _ in range(3):
        with pytest.raises(RegistryDown):
            await registry._request(trio.sleep_forever())
    with pytest.raises(RegistryDown):
        await registry._request(_refused())
    assert registry.health()["reachable"] is False
    assert await registry._request(_answer("ok")) == "ok"
    assert await registry._request(_answer("ok")) == "ok"
    with pytest.raises(RegistryDown):
        await registry._request(_refused())
    down = _events(log_stream, "registry.unreachable")
    assert [(e["error"], e["node"]) for e in down] == [("TooSlowError", "n1"), ("RegistryDown", "n1")]
    assert len(_events(log_stream, "registry.reachable")) == 1
    assert registry.health()["reachable"] is False


async def test_the_brain_logs_each_change_of_reachability_once(autojump_clock, log_stream):
    flight = BrainFlight("unix:///nonexistent/redis.sock", 10.0)
    with pytest.raises(RegistryDown, match="TooSlowError"):
        await flight._request(trio.sleep_forever())
    with pytest.raises(RegistryDown, match="RegistryDown"):
        await flight._request(_refused())
    assert await flight._request(_answer(1)) == 1
    with pytest.raises(RegistryDown):
        await flight._request(_refused())
    assert [e["error"] for e in _events(log_stream, "brain.cluster_unreachable")] == ["TooSlowError", "RegistryDown"]
    assert len(_events(log_stream, "brain.cluster_reachable")) == 1
