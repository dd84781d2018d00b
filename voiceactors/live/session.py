"""A Live session's startup configuration, and its sideband's translator again.

``session_config`` is what ``POST /api/voice/live`` creates a session with
(``openai.types.live.MediaSessionConfigParam``): the Live model, the
brain's instruction (with the call's linked context) as its instructions,
and delegation to a Responses model with the journal's tools (and the MCP
sources') as function tools under names the Responses API accepts
(``names.py``). ``live_session`` is what the call keeps of it
(``call_context.LiveSession``: in its record and the cluster's mirror), from
which ``translator_for`` makes the sideband's translator again at a rejoin
or a takeover. Plain data; no I/O.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from voiceactors.call.call_context import LiveSession
from voiceactors.live.names import FunctionNames
from voiceactors.live.translate import LiveTranslator

__all__ = ["DELEGATE_INSTRUCTIONS", "live_session", "session_config", "translator_for"]

#: The delegated model's instructions: the voice says the answers, the delegated model finds them.
DELEGATE_INSTRUCTIONS = (
    "You look things up in the user's journal for a voice assistant, with the tools you are given, and answer "
    "with what you found in a few short sentences the assistant can say aloud. Use only what the tools "
    "return; say plainly when they found nothing. Make a change to the journal only when the user asked for it.")


def session_config(model: str, delegate_model: str, instructions: str,
                   tools: Iterable[Mapping[str, Any]]) -> tuple[dict[str, Any], FunctionNames]:
    """The session's startup config and its function names' table, for the
    Realtime ``tools`` manifest ``tools`` (ours, then the sources')."""
    tools = list(tools)
    names = FunctionNames.of(tool["name"] for tool in tools if tool.get("type") == "function")
    config = {
        "model": model,
        "instructions": instructions,
        "delegation": {"type": "responses", "responses": {
            "model": delegate_model, "instructions": DELEGATE_INSTRUCTIONS, "tools": names.declare(tools),
            "tool_choice": "auto", "parallel_tool_calls": True}},
    }
    return config, names


def live_session(names: FunctionNames, instructions: str, is_write: Callable[[str], bool],
                 delegate_model: str | None = None, live_model: str | None = None) -> LiveSession:
    """What the call keeps of its session (``call_context.LiveSession``)."""
    return LiveSession(dict(names.to_responses), instructions,
                       tuple(tool for tool in names.to_responses if is_write(tool)), delegate_model, live_model)


def translator_for(live: LiveSession) -> LiveTranslator:
    """The sideband's translator for the session ``live`` describes."""
    names = FunctionNames(dict(live.names), {spelled: tool for tool, spelled in live.names.items()})
    writes = frozenset(live.writes)
    return LiveTranslator(names, is_write=writes.__contains__, instructions=live.instructions)
