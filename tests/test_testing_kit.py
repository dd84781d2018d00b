"""The testing kit (``voiceactors.testing``, docs/testing.md): its fixture,
scripted calls and expectations, each expectation seen to fail when the call
went otherwise, and docs/testing.md's first example run as written in a
folder of its own."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from voiceactors.testing import ExpectationFailed, Script, ToolCall
from voiceactors.tools import ToolSpec

DOC = Path(__file__).resolve().parents[1] / "docs" / "testing.md"


async def test_a_scripted_call_reads_like_the_conversation(voice, autojump_clock):
    call = await voice.call(Script().user_says("What is on today?").model_calls("calendar.today")
                            .model_says("You have two meetings."))
    call.expect.tool_called("calendar.today").answered_once()
    call.expect.spoken(contains="two meetings")
    call.expect.no_protocol_violation()
    call.expect.ended("closed_by_service")


async def test_each_expectation_fails_when_the_call_went_otherwise(voice, autojump_clock):
    call = await voice.call(Script().user_says("Find the launch.").model_calls("journal.search", query="launch")
                            .model_says("Found it."))
    call.expect.tool_called("journal.search", query="launch").answered_once()
    with pytest.raises(ExpectationFailed, match=r"expected calendar.today to be called; the model called journal.search"):
        call.expect.tool_called("calendar.today")
    with pytest.raises(ExpectationFailed, match="expected journal.search"):
        call.expect.tool_called("journal.search", query="budget")
    with pytest.raises(ExpectationFailed, match="containing 'weather'"):
        call.expect.spoken(contains="weather")
    with pytest.raises(ExpectationFailed, match="not to be called"):
        call.expect.tool_not_called("journal.search")
    with pytest.raises(ExpectationFailed, match="to end 'budget_spent'"):
        call.expect.ended("budget_spent")


async def test_a_tool_called_twice_fails_called_once(voice, autojump_clock):
    call = await voice.call(Script().user_says("Twice.")
                            .model_calls_in_parallel(ToolCall("calendar.today"), ToolCall("calendar.today")))
    with pytest.raises(ExpectationFailed, match="called once; it was called 2 times"):
        call.expect.tool_called("calendar.today")
    call.expect.no_protocol_violation()


async def test_a_protocol_violation_fails_no_protocol_violation(voice, autojump_clock):
    # the service refuses our response.create: what the check is there to see
    script = Script().user_says("Hi.").step({"refuse": {"event": "response.create",
                                                         "code": "conversation_already_has_active_response"}})
    call = await voice.call(script.model_calls("calendar.today").model_says("Done."))
    with pytest.raises(ExpectationFailed, match="the service refused an event: conversation_already_has_active_response"):
        call.expect.no_protocol_violation()


async def test_a_new_tool_joins_the_real_ones(voice, autojump_clock):
    def weather(ctx, args):
        return {"city": args["city"], "sky": "clear"}

    spec = ToolSpec(name="weather.now", description="The weather in a city.", effect="read", handler=weather,
                    parameters={"type": "object", "properties": {"city": {"type": "string"}},
                                "required": ["city"], "additionalProperties": False})
    call = await voice.call(Script().user_says("Weather in Oslo?").model_calls("weather.now", city="Oslo")
                            .model_says("Clear."), tools=[spec])
    assert call.expect.tool_called("weather.now", city="Oslo").output == {"city": "Oslo", "sky": "clear"}


async def test_in_charge_fails_naming_who_was_and_the_handoffs(voice, autojump_clock):
    call = await voice.call(Script().user_says("Let's look into last week.").model_calls("handoff.researcher")
                            .model_says("Researcher here."), agents=True)
    call.expect.in_charge("researcher")
    with pytest.raises(ExpectationFailed, match=r"expected planner in charge at the end; researcher was "
                                                r"\(handoffs: assistant→researcher"):
        call.expect.in_charge("planner")


def test_a_hung_up_script_takes_no_more_steps():
    script = Script().user_says("Bye.").hang_up()
    with pytest.raises(ValueError, match="hung up"):
        script.model_says("Wait.")


def _examples() -> list[str]:
    """docs/testing.md's ``python`` blocks: each a test file of its own."""
    found = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert found, "docs/testing.md has no python example"
    return found


def _run_examples(root: Path, examples: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Each example copied into a file of its own (``test_<name>.py``: one
    pytest imports them all) in an empty folder of its own, and every folder
    run by one pytest (one interpreter's start-up, not one per example)."""
    folders = []
    for name, text in examples.items():
        folder = root / name
        folder.mkdir(parents=True)
        (folder / f"test_{name}.py").write_text(text, encoding="utf-8")
        folders.append(str(folder))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-rA", *folders], cwd=root, capture_output=True, text=True, timeout=120)


def test_the_docs_examples_run_as_written_and_the_first_fails_when_its_tool_changes(tmp_path):
    """The first example (a tool), the MCP source's and the agent's, each
    alone in an empty folder; the first again with the tool it scripts changed."""
    first, mcp_source, agent = _examples()
    changed = first.replace('model_calls("journal.search"', 'model_calls("calendar.today"', 1)
    assert changed != first
    ran = _run_examples(tmp_path, {"as_written": first, "mcp_source": mcp_source, "agent": agent,
                                   "changed": changed})
    summary = ran.stdout + ran.stderr
    assert ran.returncode == 1 and "1 failed, 3 passed" in summary, summary
    assert "PASSED as_written/test_as_written.py" in summary, summary
    assert "PASSED mcp_source/test_mcp_source.py" in summary, summary
    assert "PASSED agent/test_agent.py" in summary, summary
    assert "FAILED changed/test_changed.py" in summary and "ExpectationFailed" in summary, summary
