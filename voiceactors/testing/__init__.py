"""A testing kit for people who extend voiceactors (``docs/testing.md``): a
scripted call (``Script``) played by the simulator against the real call
layer and tool executor, on a journal the test owns (the ``voice`` fixture,
``Voice``), and assertions that read like the conversation
(``CallResult.expect``). Its pytest plugin (``voiceactors.testing.plugin``)
is registered when voiceactors is installed."""

from voiceactors.testing.expect import CallResult, Expect, ExpectationFailed, ToolCallExpect
from voiceactors.testing.script import Script, ToolCall
from voiceactors.testing.voice import INSTRUCTION, Voice

__all__ = ["INSTRUCTION", "CallResult", "Expect", "ExpectationFailed", "Script", "ToolCall", "ToolCallExpect", "Voice"]
