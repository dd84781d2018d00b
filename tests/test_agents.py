"""Agents from the journal's ``voice.agents`` (``voiceactors/agents.py``):
the shipped set, the checks and how a bad entry is named, the handoff tools
and the words an agent speaks with; the minted session starts with the first
agent's tools and instruction (over the HTTP API and the simulator)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from clock_support import serving
from simulator_support import serving_simulator
from voiceactors import agents as agent_config, voice_config
from voiceactors.agents import DEFAULT_AGENTS, Agent, Agents, CallAgents, handoff_target, handoff_tool_name
from voiceactors.http import create_app
from voiceactors.mcp.client.sources import SourceConfigError, parse_sources
from voiceactors.settings import InvalidSettings, Settings
from voiceactors.simulator import Simulator
from voiceactors.tools.registry import REGISTRY, manifest
from journal_support import set_voice

SIM_KEY = "sk-test-agents-7a8b9c"
JOURNAL_TOOLS = list(REGISTRY)


def parse(block: Any, sources: list[str] | None = None) -> tuple[Agents, list[str]]:
    return agent_config.parse(block, journal_tools=JOURNAL_TOOLS, sources=sources or [])


def test_the_shipped_set_is_used_when_the_journal_declares_none():
    agents, problems = parse(None)
    assert problems == [] and agents is DEFAULT_AGENTS
    assert agents.names() == ["assistant", "planner", "researcher"]
    assert agents.first.name == "assistant"
    for agent in agents.agents:
        assert agent.tools <= set(REGISTRY), agent.name        # every default tool is the journal's
        assert "journal.select" in agent.tools
        assert set(agent.handoffs) == set(agents.names()) - {agent.name}
    writes = {name for name, spec in REGISTRY.items() if spec.effect == "write"}
    assert [a.name for a in agents.agents if a.tools & writes] == ["planner"]


def test_declared_agents_their_defaults_and_order():
    agents, problems = parse([
        {"name": "host", "description": "Greets and routes.", "tools": ["journal.search", "journal.select"]},
        {"name": "keeper", "description": "Commitments.", "instruction": "Confirm before you change anything.",
         "tools": ["commitments.list", "commitments.complete"], "handoffs": ["host"], "mcp_sources": []},
    ])
    assert problems == []
    host, keeper = agents.agents
    assert agents.first is host and host.handoffs == ("keeper",) and host.mcp_sources is None
    assert keeper.handoffs == ("host",) and keeper.mcp_sources == frozenset()
    assert keeper.instruction == "Confirm before you change anything."
    # no tools listed: every journal tool
    [everything] = parse([{"name": "solo", "description": "All of it."}])[0].agents
    assert everything.tools == set(REGISTRY) and everything.handoffs == ()


@pytest.mark.parametrize("block, problems, names", [
    ("planner", ["voice.agents must be a list of 1 to 8 agents"], ["assistant", "planner", "researcher"]),
    ([], ["voice.agents must be a list of 1 to 8 agents"], ["assistant", "planner", "researcher"]),
    ([{"name": "Bad Name", "description": "x"}, {"name": "ok", "description": "fine"}],
     ["voice.agents[0].name must be a lowercase word of at most 32 letters, digits or _, not 'Bad Name'"], ["ok"]),
    ([{"name": "a", "description": ""}, {"name": "b", "description": "fine"}],
     ["voice.agents[0].description must be a text of 1 to 200 characters"], ["b"]),
    ([{"name": "a", "description": "x", "colour": "red"}, {"name": "b", "description": "y"}],
     ["voice.agents[0] has unknown keys: colour (allowed: description, handoffs, instruction, mcp_sources, "
      "name, tools)"], ["b"]),
    ([{"name": "a", "description": "x"}, {"name": "a", "description": "y"}],
     ["voice.agents[1].name 'a' is used twice"], ["a"]),
    ([{"name": "a", "description": "x", "tools": "journal.search"}, {"name": "b", "description": "y"}],
     ["voice.agents[0].tools must be a list of journal tool names"], ["b"]),
])
def test_a_bad_entry_is_named_and_left_out(block, problems, names):
    agents, found = parse(block)
    assert found == problems
    assert agents.names() == names


def test_an_unknown_tool_source_or_agent_drops_only_that_name():
    agents, problems = parse([
        {"name": "a", "description": "x", "tools": ["journal.search", "journal.delete_everything"],
         "mcp_sources": ["crm", "nowhere"], "handoffs": ["b", "ghost"]},
        {"name": "b", "description": "y"},
    ], sources=["crm"])
    assert problems == ["voice.agents[0].tools names unknown journal tools: 'journal.delete_everything'",
                        "voice.agents[0].mcp_sources names unknown mcp sources: 'nowhere'",
                        "voice.agents[0].handoffs names unknown other agents: 'ghost'"]
    a = agents.agents[0]
    assert a.tools == {"journal.search"} and a.mcp_sources == {"crm"} and a.handoffs == ("b",)


def test_serve_refuses_to_start_with_a_bad_agent(tmp_path, make_sample):
    journal = make_sample(days=1)
    set_voice(journal, {"agents": [{"name": "helper", "description": "x", "tools": ["journal.nothing"]}]})
    with pytest.raises(InvalidSettings) as refused:
        create_app(Settings(journal=journal, state_dir=tmp_path / "state"))
    assert str(refused.value) == ("invalid settings: voice.agents[0].tools names unknown journal tools: "
                                  "'journal.nothing'")


def test_no_mcp_source_may_take_the_handoff_family():
    with pytest.raises(SourceConfigError, match="'handoff' clashes"):
        parse_sources([{"name": "handoff", "url": "http://127.0.0.1:1/mcp", "token_env": "T"}])


@pytest.mark.parametrize("style, spelled", [("dotted", "handoff.planner"), ("underscore", "handoff_planner")])
def test_handoff_tools_are_spelled_as_the_journal_tools_are(style, spelled):
    # journal.search is spelled so on the wire in the same style
    assert any(tool["name"] == ("journal.search" if style == "dotted" else "journal_search")
               for tool in manifest(style))
    assert handoff_tool_name("planner", style) == spelled
    assert handoff_target(spelled, DEFAULT_AGENTS) == "planner"
    assert handoff_target("handoff.nobody", DEFAULT_AGENTS) is None
    assert handoff_target("journal.search", DEFAULT_AGENTS) is None


def call_agents(style: str = "dotted", agents: Agents = DEFAULT_AGENTS,
                sources: tuple[dict[str, Any], ...] = ()) -> CallAgents:
    ours = manifest(style)
    return CallAgents(agents, (*ours, *sources), style, {t["name"]: n for t, n in zip(ours, REGISTRY)},
                      agents.first.name)


def test_an_agents_session_has_its_tools_its_sources_and_its_handoffs():
    crm = {"type": "function", "name": "crm.lookup", "description": "d", "parameters": {"type": "object"}}
    wiki = {"type": "function", "name": "wiki.page", "description": "d", "parameters": {"type": "object"}}
    agents = Agents((Agent("front", "Front.", "", frozenset({"journal.search"}), frozenset({"crm"}), ("back",)),
                     Agent("back", "Back.", "Be thorough.", frozenset({"commitments.complete"}), None, ("front",))))
    transfer = {"type": "function", "name": "call.transfer", "description": "d", "parameters": {"type": "object"}}
    found = call_agents(agents=agents, sources=(crm, wiki, transfer))
    front = found.session("front", "The brain's words.")
    # its journal tool, its source's, the phone call's own transfer (every agent has it), its handoff
    assert [t["name"] for t in front["tools"]] == ["journal.search", "crm.lookup", "call.transfer", "handoff.back"]
    assert front["instructions"].startswith("The brain's words.\n\n<<<agent\nYou are the front agent: Front.")
    assert "- back: Back." in front["instructions"]
    back = found.session("back", None)
    assert [t["name"] for t in back["tools"]] == ["commitments.complete", "crm.lookup", "wiki.page", "call.transfer",
                                                  "handoff.front"]
    assert "instructions" not in back     # no instruction known: none sent (it would erase the session's)


async def test_the_minted_session_starts_with_the_first_agent(make_sample, tmp_path):
    journal = make_sample(days=1)
    async with serving_simulator(Simulator("silence", api_key=SIM_KEY, conformance=True)) as sim:
        settings = Settings(journal=journal, state_dir=tmp_path / "state", openai_api_key_env=SIM_KEY,
                            openai_base_url=sim.base_url, rate_limit_per_s=0)
        async with serving(create_app(settings)) as test_app:
            response = await test_app.test_client().post("/api/voice/session", json={})
            assert response.status_code == 200, await response.get_json()
    session = sim.client_secret_requests[-1]["body"]["session"]
    names = [tool["name"] for tool in session["tools"]]
    assert "commitments.complete" not in names          # the planner's alone
    assert names[-2:] == ["handoff.planner", "handoff.researcher"]
    assert "<<<agent\nYou are the assistant agent" in session["instructions"]


def test_a_bad_entry_edited_in_while_serving_is_logged_and_left_out(tmp_path, make_sample):
    journal = make_sample(days=1)
    set_voice(journal, {"agents": [{"name": "desk", "description": "Front desk.", "tools": ["journal.nothing"]},
                                   {"name": "back", "description": "Back office."}]})
    with capture_logs() as captured:
        agents = voice_config.agents(Settings(journal=journal, state_dir=tmp_path / "state"), REGISTRY)
    assert agents.names() == ["desk", "back"] and agents.first.tools == frozenset()
    [line] = [e for e in captured if e["event"] == "config.voice_setting_invalid"]
    assert line["error"] == "voice.agents[0].tools names unknown journal tools: 'journal.nothing'"
