"""``voiceactors mcp --journal DIR``: the journal's tools over MCP stdio,
spawned as a child process by the SDK's own client."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import structlog
from mcp import StdioServerParameters
from mcp.client import Client
from mcp.client.stdio import stdio_client

from conftest import SAMPLE_TODAY
from mcp_server_support import MODES
from voiceactors.mcp import server as mcp_server
from voiceactors.cli import main
from voiceactors.journal import ledger
from voiceactors.mcp.server.tools import IDEMPOTENCY_META_KEY
from voiceactors.tools.registry import JOURNAL_TOOLS, WRITE


@pytest.fixture(autouse=True)
def _reset_logs():
    yield
    structlog.reset_defaults()      # main() configures logging onto the captured stderr


def child(journal: Path, state_dir: Path) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "voiceactors.cli", "mcp", "--journal", str(journal), "--state-dir", str(state_dir),
              "--today", SAMPLE_TODAY])


def log_events(path: Path) -> list[str]:
    """The child's stderr, every line a JSON log line."""
    return [json.loads(line)["event"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.mark.parametrize("mode", MODES)
async def test_stdio_lists_the_registry_and_calls_a_read(make_sample, tmp_path, mode):
    journal = make_sample(days=14)
    errlog = tmp_path / "stderr.log"
    with errlog.open("w", encoding="utf-8") as err:
        async with Client(stdio_client(child(journal, tmp_path / "state"), errlog=err), mode=mode) as client:
            listed = (await client.list_tools()).tools
            day = await client.call_tool("journal.get_day", {"day": SAMPLE_TODAY})
            invalid = await client.call_tool("journal.get_day", {"day": "tomorrow"})
    assert [(t.name, t.description, t.input_schema) for t in listed] == [
        (s.name, s.description, s.parameters) for s in JOURNAL_TOOLS.values()]
    assert [t.name for t in listed if t.annotations.destructive_hint] == [
        s.name for s in JOURNAL_TOOLS.values() if s.effect == WRITE]
    assert not day.is_error and day.structured_content["day"] == SAMPLE_TODAY and day.structured_content["segments"]
    assert (invalid.is_error, invalid.structured_content) == (True, {"error": "invalid day"})
    # stdout carried the protocol alone (the client parsed every line); the logs went to stderr
    events = log_events(errlog)
    assert "mcp.serving" in events and "tool.run" in events and events[-1] == "mcp.stopped"


async def test_stdio_write_applies_once_per_idempotency_key_across_processes(make_sample, tmp_path):
    journal = make_sample(days=14)
    [item] = ledger.list_items(journal, state="open", top=1)
    args = {"commitment_id": item.id, "resolution": "done"}
    key = {IDEMPOTENCY_META_KEY: "stdio-close-1"}
    state = tmp_path / "state"
    with (tmp_path / "stderr.log").open("w", encoding="utf-8") as err:
        async with Client(stdio_client(child(journal, state), errlog=err)) as client:
            first = await client.call_tool("commitments.complete", args, meta=key)
        # a new process on the same state folder: the retry gets the recorded answer
        async with Client(stdio_client(child(journal, state), errlog=err)) as client:
            retry = await client.call_tool("commitments.complete", {**args, "resolution": "dropped"}, meta=key)
    assert not first.is_error and first.structured_content["commitment"]["state"] == "closed"
    assert retry.structured_content == first.structured_content
    [after] = [i for i in ledger.list_items(journal, top=500) if i.id == item.id]
    assert after.state == "closed"


def test_mcp_without_a_journal_folder_is_a_usage_error(tmp_path, capsys):
    code = main(["mcp", "--journal", str(tmp_path / "missing"), "--state-dir", str(tmp_path / "state")])
    assert code == 2
    assert "journal folder not found" in capsys.readouterr().err


def test_each_mcp_module_imports_first_on_its_own():
    # the endpoint (``voiceactors.http.mcp``) imported first used to fail:
    # voiceactors.http's package init imported it back while it was half-initialised
    modules = sorted(f"voiceactors.mcp.server.{path.stem}" for path in Path(mcp_server.__file__).parent.glob("*.py")
                     if path.stem != "__init__") + ["voiceactors.http.mcp"]
    # each in a fresh interpreter, all at once: the imports are independent
    children = {module: subprocess.Popen([sys.executable, "-c", f"import {module}"], stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, text=True)
                for module in modules if importlib.util.find_spec(module) is not None}
    for module, child in children.items():
        _, err = child.communicate(timeout=120)
        assert child.returncode == 0, (module, err[-2000:])
    assert importlib.util.find_spec("voiceactors.http.mcp") is not None
