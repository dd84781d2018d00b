"""Agents: the named voices a call can hand over between (``docs/agents.md``).

The journal's ``voice.agents`` declares them; without it a call has the
shipped set, ``DEFAULT_AGENTS``: ``assistant`` (general, starts every call),
``planner`` (commitments and calendar, the only one with the journal's write
tool) and ``researcher`` (search, days, people). Each agent has a short
description, its own part of the instruction (after the brain's), the
journal's tools it may use (a subset of the journal's, ``journal.select``
among them), the MCP sources whose tools it may use, and the agents it may
hand the call to (by default every other one): one ``handoff.<agent>`` tool
each, spelled as the journal's tools are (``handoff_<agent>`` in the
underscore style).

Pure: no I/O and nothing of trio, so the call's core (``call/handoff.py``,
``call/call_context.py``) uses it; ``voice_config.agents`` reads the block and
hands in the journal's tool names and the configured sources.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Collection, Iterable, Mapping

#: The family of the handoff tools (``handoff.planner``): no MCP source may take it.
HANDOFF_FAMILY = "handoff"
#: The family of the call's own tools (a phone call's ``call.transfer``): every agent has them.
CALL_FAMILY = "call"
#: An agent's name: a short lowercase word, so its handoff tool is a valid function name in either style.
AGENT_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
MAX_AGENTS = 8
DESCRIPTION_MAX = 200
INSTRUCTION_MAX = 4000
#: The keys an entry of ``voice.agents`` may have.
AGENT_KEYS = frozenset({"name", "description", "instruction", "tools", "mcp_sources", "handoffs"})


@dataclass(frozen=True)
class Agent:
    """One agent. ``mcp_sources`` None: every configured source's tools;
    ``handoffs``: the agents it may hand to, in the set's order."""

    name: str
    description: str
    instruction: str = ""
    tools: frozenset[str] = frozenset()
    mcp_sources: frozenset[str] | None = None
    handoffs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Agents:
    """The call's agents, in declared order: the first starts every call."""

    agents: tuple[Agent, ...]
    _by_name: dict[str, Agent] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.agents:
            raise ValueError("a set of agents needs at least one")
        object.__setattr__(self, "_by_name", {agent.name: agent for agent in self.agents})

    @property
    def first(self) -> Agent:
        return self.agents[0]

    def get(self, name: str | None) -> Agent | None:
        return self._by_name.get(name) if name is not None else None

    def names(self) -> list[str]:
        return [agent.name for agent in self.agents]


# ----------------------------------------------------------- the defaults

_READS_OF_THE_DAY = ("journal.get_day", "journal.search", "entities.get", "entities.recent_with",
                     "commitments.list", "calendar.today", "briefing.get", "observer.start_listening")

#: The shipped set, used when the journal declares none. ``assistant`` has
#: every read; ``planner`` alone the write (``commitments.complete``).
DEFAULT_AGENTS = Agents((
    Agent("assistant", "General help with the journal: days, people, commitments, the calendar and the briefing.",
          "You are the general assistant. Hand the call to the planner when the user wants to change a "
          "commitment, and to the researcher for a longer search through days and people.",
          frozenset({*_READS_OF_THE_DAY, "journal.select"}), None, ("planner", "researcher")),
    Agent("planner", "Commitments and the calendar: what is owed, what is planned, and marking commitments done.",
          "You are the planner: you keep the user's commitments and calendar. You alone may mark a "
          "commitment done; confirm which one before you do.",
          frozenset({"commitments.list", "commitments.complete", "calendar.today", "briefing.get",
                     "journal.select"}), None, ("assistant", "researcher")),
    Agent("researcher", "Searching the journal: what happened on which day, and with whom.",
          "You are the researcher: you search the journal's days and the people and organisations in it, "
          "and say what you found and where.",
          frozenset({"journal.search", "journal.get_day", "entities.get", "entities.recent_with",
                     "journal.select"}), None, ("assistant", "planner")),
))


# ------------------------------------------------------------- the config

def _names(where: str, key: str, value: Any, known: Collection[str], what: str,
           problems: list[str]) -> frozenset[str] | None:
    """A list of names from ``known``; None when not a list of strings (a
    problem), the unknown ones left out (a problem each entry)."""
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        problems.append(f"{where}.{key} must be a list of {what} names")
        return None
    unknown = [item for item in value if item not in known]
    if unknown:
        problems.append(f"{where}.{key} names unknown {what}s: {', '.join(repr(u[:64]) for u in unknown[:8])}")
    return frozenset(item for item in value if item in known)


def _text(where: str, key: str, value: Any, limit: int, problems: list[str], *, required: bool) -> str | None:
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        problems.append(f"{where}.{key} must be a text of 1 to {limit} characters")
        return None
    return value.strip()


def _agent(index: int, item: Any, journal_tools: Collection[str], sources: Collection[str],
           problems: list[str]) -> tuple[Agent, Any] | None:
    """One entry, and its raw ``handoffs`` (checked once every name is
    known); None when it is left out (its problems said why)."""
    where = f"voice.agents[{index}]"
    if not isinstance(item, dict):
        problems.append(f"{where} must be an object with name and description")
        return None
    unknown = sorted(str(key)[:32] for key in item if key not in AGENT_KEYS)
    if unknown:
        problems.append(f"{where} has unknown keys: {', '.join(unknown)} (allowed: {', '.join(sorted(AGENT_KEYS))})")
        return None
    name = item.get("name")
    if not isinstance(name, str) or not AGENT_NAME_RE.fullmatch(name):
        problems.append(f"{where}.name must be a lowercase word of at most 32 letters, digits or _, "
                        f"not {str(name)[:40]!r}")
        return None
    description = _text(where, "description", item.get("description"), DESCRIPTION_MAX, problems, required=True)
    instruction = _text(where, "instruction", item.get("instruction"), INSTRUCTION_MAX, problems, required=False)
    tools = frozenset(journal_tools) if "tools" not in item else _names(
        where, "tools", item["tools"], journal_tools, "journal tool", problems)
    chosen_sources = None if "mcp_sources" not in item else _names(
        where, "mcp_sources", item["mcp_sources"], sources, "mcp source", problems)
    if description is None or instruction is None or tools is None or (
            "mcp_sources" in item and chosen_sources is None):
        return None
    return Agent(name, description, instruction, tools, chosen_sources), item.get("handoffs")


def parse(block: Any, *, journal_tools: Collection[str], sources: Collection[str]) -> tuple[Agents, list[str]]:
    """The agents of ``voice.agents`` and the problems of its bad entries,
    one message each, named as the other ``voice`` settings are. A bad entry
    is left out (an unknown tool or source name only drops that name); none
    declared, or none left, is the shipped set (``DEFAULT_AGENTS``)."""
    if block is None:
        return DEFAULT_AGENTS, []
    problems: list[str] = []
    if not isinstance(block, list) or not block:
        return DEFAULT_AGENTS, ["voice.agents must be a list of 1 to 8 agents"]
    if len(block) > MAX_AGENTS:
        problems.append(f"voice.agents lists {len(block)} agents; at most {MAX_AGENTS} (the rest are left out)")
    read: list[tuple[Agent, Any, int]] = []
    for index, item in enumerate(block[:MAX_AGENTS]):
        found = _agent(index, item, journal_tools, sources, problems)
        if found is None:
            continue
        if any(agent.name == found[0].name for agent, _, _ in read):
            problems.append(f"voice.agents[{index}].name {found[0].name!r} is used twice")
            continue
        read.append((*found, index))
    if not read:
        return DEFAULT_AGENTS, problems
    names = [agent.name for agent, _, _ in read]
    agents = []
    for agent, handoffs, index in read:
        others = [name for name in names if name != agent.name]
        if handoffs is None:
            chosen = others
        else:
            picked = _names(f"voice.agents[{index}]", "handoffs", handoffs, others, "other agent", problems)
            chosen = [name for name in others if picked is not None and name in picked]
        agents.append(Agent(agent.name, agent.description, agent.instruction, agent.tools, agent.mcp_sources,
                            tuple(chosen)))
    return Agents(tuple(agents)), problems


# ------------------------------------------------------ tools and words

def handoff_tool_name(agent: str, style: str) -> str:
    """``handoff.<agent>`` (dotted) or ``handoff_<agent>`` (underscore)."""
    return f"{HANDOFF_FAMILY}.{agent}" if style == "dotted" else f"{HANDOFF_FAMILY}_{agent}"


def handoff_target(tool: str | None, agents: Agents) -> str | None:
    """The agent a handoff tool's name (either spelling) hands to; None when
    ``tool`` is no handoff tool of ``agents``."""
    if not tool or not tool.startswith(HANDOFF_FAMILY) or len(tool) <= len(HANDOFF_FAMILY) + 1:
        return None
    if tool[len(HANDOFF_FAMILY)] not in "._":
        return None
    name = tool[len(HANDOFF_FAMILY) + 1:]
    return name if agents.get(name) is not None else None


def handoff_tools(agent: Agent, agents: Agents, style: str) -> list[dict[str, Any]]:
    """The function tools ``agent`` hands the call over with, one per agent it may hand to."""
    tools = []
    for name in agent.handoffs:
        target = agents.get(name)
        if target is None:
            continue
        tools.append({"type": "function", "name": handoff_tool_name(name, style),
                      "description": (f"Hand the conversation to the {name} agent: {target.description} "
                                      "Call it alone, once you have said in a few words that you hand over."),
                      "parameters": {"type": "object", "properties": {}, "additionalProperties": False}})
    return tools


def _source_of(tool: str) -> str:
    return re.split(r"[._]", tool, maxsplit=1)[0]


def session_tools(agent: Agent, agents: Agents, tools: Iterable[Mapping[str, Any]], style: str,
                  journal_tool: Mapping[str, str]) -> list[dict[str, Any]]:
    """``agent``'s tools from the session's full list (``tools``: the
    journal's and the MCP sources', as minted): the journal's that it may
    use (``journal_tool``: a manifest name to its dotted name), the tools of
    its sources, then its handoff tools."""
    chosen = []
    for tool in tools:
        name = str(tool.get("name", ""))
        dotted = journal_tool.get(name)
        if dotted is not None:
            if dotted in agent.tools:
                chosen.append(dict(tool))
        elif agent.mcp_sources is None or _source_of(name) in agent.mcp_sources or _source_of(name) == CALL_FAMILY:
            chosen.append(dict(tool))       # a source's, or the call's own (a phone call's transfer)
    return chosen + handoff_tools(agent, agents, style)


def agent_section(agent: Agent, agents: Agents) -> str:
    """The agent's part of the instruction, after the brain's."""
    lines = [f"<<<agent\nYou are the {agent.name} agent: {agent.description}"]
    if agent.instruction:
        lines.append(agent.instruction)
    others = [agents.get(name) for name in agent.handoffs]
    if others:
        lines.append("Other agents can take over the call; hand it over with their handoff tool when the user's "
                     "request is theirs, and never pretend to be one of them:")
        lines.extend(f"- {other.name}: {other.description}" for other in others if other is not None)
    lines.append("agent>>>")
    return "\n".join(lines)


def with_agent(instruction: str, agent: Agent, agents: Agents) -> str:
    """The instruction ``agent`` speaks with: the call's, then its own section."""
    return f"{instruction.rstrip()}\n\n{agent_section(agent, agents)}"


def taking_over(agent: Agent, previous: str) -> str:
    """The new agent's first words after a handoff (one response's instructions, after its own)."""
    return (f"You have just taken over this call from the {previous} agent. Speak first: in one short sentence, "
            f"say that you are the {agent.name} and go on with what the user asked. Do not greet again and do "
            "not repeat what was already said.")


def handoff_failed(agent: Agent, target: str) -> str:
    """What the agent still in charge says when its handoff did not go through."""
    return (f"Handing the call to the {target} agent did not work: you are still the {agent.name} agent, with "
            "your own tools. Tell the user so in one short sentence and carry on helping them.")


@dataclass(frozen=True)
class CallAgents:
    """What a call knows of its agents: the set, the session's full tool
    list as minted (the journal's and the sources'), the tool name style,
    each journal tool's manifest name to its dotted name, and the agent in
    charge when this actor starts (the first, or a rejoined or taken-over
    call's: the one that was in charge)."""

    agents: Agents
    tools: tuple[Mapping[str, Any], ...]
    style: str
    journal_tool: Mapping[str, str]
    in_charge: str

    def agent(self, name: str | None = None) -> Agent:
        found = self.agents.get(name or self.in_charge)
        return found if found is not None else self.agents.first

    def session(self, name: str, instruction: str | None) -> dict[str, Any]:
        """The ``session.update`` body that puts ``name`` in charge: its
        tools, and its instructions when the call's are known."""
        agent = self.agent(name)
        body: dict[str, Any] = {"type": "realtime",
                                "tools": session_tools(agent, self.agents, self.tools, self.style,
                                                       self.journal_tool)}
        if instruction is not None:
            body["instructions"] = with_agent(instruction, agent, self.agents)
        return body

    @classmethod
    def made(cls, agents: Agents, ours: list[dict[str, Any]], dotted: Iterable[str], style: str,
             source_tools: Iterable[Mapping[str, Any]] = ()) -> CallAgents:
        """A call's agents, the first in charge: ``ours`` the journal's tools
        as the manifest spells them in ``style`` and ``dotted`` their dotted
        names in the same order, then the MCP sources' tools."""
        journal_tool = {str(tool["name"]): name for tool, name in zip(ours, dotted)}
        return cls(agents, (*ours, *source_tools), style, journal_tool, agents.first.name)

    def starting(self, name: str) -> CallAgents:
        """The same with ``name`` in charge at the start (a rejoin, a takeover)."""
        return CallAgents(self.agents, self.tools, self.style, self.journal_tool,
                          name if self.agents.get(name) is not None else self.agents.first.name)
