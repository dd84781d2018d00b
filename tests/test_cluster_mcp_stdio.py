"""``voiceactors mcp --redis URL``: the stdio MCP server claims its writes'
idempotency keys in the cluster's shared write log (issue 18), so a key
applied by one process is answered from its record by another with its own
state folder, never applied again. Against a real redis-server."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import structlog
from mcp import StdioServerParameters
from mcp.client import Client
from mcp.client.stdio import stdio_client

from conftest import SAMPLE_TODAY
from redis_support import REDIS_SERVER, redis_server  # noqa: F401  (the fixture)
from voiceactors.journal import ledger
from voiceactors.mcp.server.tools import IDEMPOTENCY_META_KEY

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")


@pytest.fixture(autouse=True)
def _reset_logs():
    yield
    structlog.reset_defaults()


def child(journal: Path, state_dir: Path, redis_url: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "voiceactors.cli", "mcp", "--journal", str(journal), "--state-dir", str(state_dir),
              "--today", SAMPLE_TODAY, "--redis", redis_url])


async def test_a_key_applied_by_one_stdio_process_is_answered_by_another_from_the_shared_log(
        make_sample, tmp_path, redis_server):
    journal = make_sample(days=14)
    [item] = ledger.list_items(journal, state="open", top=1)
    args = {"commitment_id": item.id, "resolution": "done"}
    key = {IDEMPOTENCY_META_KEY: "stdio-cluster-1"}
    errlog = tmp_path / "stderr.log"
    with errlog.open("w", encoding="utf-8") as err:
        async with Client(stdio_client(child(journal, tmp_path / "state_1", redis_server.url), errlog=err)) as one:
            first = await one.call_tool("commitments.complete", args, meta=key)
        # another process, its own state folder (no local record): the shared log answers the retry
        async with Client(stdio_client(child(journal, tmp_path / "state_2", redis_server.url), errlog=err)) as two:
            retry = await two.call_tool("commitments.complete", {**args, "resolution": "dropped"}, meta=key)
    assert not first.is_error and first.structured_content["commitment"]["state"] == "closed"
    assert retry.structured_content == first.structured_content
    [after] = [i for i in ledger.list_items(journal, top=500) if i.id == item.id]
    assert after.state == "closed"                      # the "dropped" retry never applied
    assert not list((tmp_path / "state_2").glob("writes/*.json"))   # nothing applied by the second
    events = [json.loads(line)["event"] for line in errlog.read_text().splitlines() if line.strip()]
    assert events.count("registry.started") == 2 and "tool.shared_log_down" not in events
