"""voiceactors: a trio voice server that answers OpenAI Realtime tool calls from a journal."""

__version__ = "0.1.0"
