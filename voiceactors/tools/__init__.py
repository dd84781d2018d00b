"""The voice tools: a registry of ten tools (nine over the journal and
``journal.select``), each a plain
synchronous handler ``handler(ctx, args) -> dict`` that the ToolExecutor runs
in a worker thread. See ``docs/tools.md``."""

from voiceactors.tools.handler_context import ToolContext
from voiceactors.tools.registry import (
    REGISTRY,
    ArgumentError,
    ToolSpec,
    lookup,
    make_registry,
    manifest,
    prepare,
)

__all__ = ["REGISTRY", "ArgumentError", "ToolContext", "ToolSpec", "lookup", "make_registry",
           "manifest", "prepare"]
