"""The brain: the backends that write the voice's instruction, and the ``BrainActor`` that runs them (``actor``).

A backend is any object with ``name`` and
``async generate(snapshot, session_id) -> (instruction, session_id)``: given the
journal's ``ContextSnapshot`` and the session to resume (None for a fresh
one) it returns the instruction text and the session id to keep (None when
the backend has no sessions). It raises ``BrainError`` (or anything else) on
failure; the ``BrainActor`` bounds it with ``settings.brain_timeout_s`` and
cancels it on timeout, so a backend needs no timeout of its own.

* ``local`` — composed from the snapshot, no model (``brain.local``);
* ``claude`` — the Claude CLI with a resumable session (``brain.claude``);
* ``openai`` — an OpenAI text model over Chat Completions (``brain.openai_text``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from voiceactors.brain.snapshot import ContextSnapshot
    from voiceactors.settings import Settings


class BrainError(Exception):
    """A backend run that produced no usable instruction. Its message is safe
    to log (never a key, never the model's whole answer)."""


class BrainTimeout(BrainError):
    """A backend run that outlived ``settings.brain_timeout_s`` (and was cancelled)."""


class Backend(Protocol):
    name: str

    async def generate(self, snapshot: "ContextSnapshot", session_id: str | None) -> tuple[str, str | None]:
        ...


def make_backend(settings: "Settings", name: str) -> Any:
    """The backend called ``name`` (``local`` | ``claude`` | ``openai``)."""
    if name == "claude":
        from voiceactors.brain.claude import ClaudeBackend
        return ClaudeBackend(settings)
    if name == "openai":
        from voiceactors.brain.openai_text import OpenAITextBackend
        return OpenAITextBackend(settings)
    if name == "local":
        from voiceactors.brain.local import LocalBackend
        return LocalBackend()
    raise ValueError(f"unknown brain backend: {name!r}")
