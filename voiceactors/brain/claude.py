"""The ``claude`` brain backend: the Claude CLI with a resumable session.

One run is one process::

    <claude_command> -p <prompt> --output-format json --model <brain_model> [--resume <session_id>]

started with ``trio.run_process`` from an argument list (never a shell), in
the journal folder, with empty stdin. The CLI prints one JSON object
(``{"type": "result", "is_error": false, "result": "...", "session_id": "..."}``);
the instruction is the text inside ``<voice_instruction>...</voice_instruction>``
of ``result``. A non-zero exit, output that is not that object, ``is_error``
or a missing wrapper is a ``BrainError``.

A resumed session that the CLI no longer knows makes it exit non-zero: the
run is then retried once as a fresh session, so a stale session file costs
one extra process, not the brain.

Cancellation: cancelling ``generate`` (the actor's timeout) ends the process:
SIGTERM, then SIGKILL after ``KILL_AFTER_S``; it is reaped before the run ends.
"""

from __future__ import annotations

import json
from typing import Any

import trio

from voiceactors import voice_config
from voiceactors.brain import BrainError
from voiceactors.usage import brain_calls as brain_usage
from voiceactors.brain.snapshot import ContextSnapshot
from voiceactors.brain.prompt import extract_instruction, render_prompt
from voiceactors.brain.session_file import valid_session_id
from voiceactors.logs import get_logger
from voiceactors.settings import Settings
from voiceactors.storage import run_sync

NAME = "claude"
KILL_AFTER_S = 3.0      # a cancelled CLI gets SIGTERM, then SIGKILL after this long
_log = get_logger(actor="brain")


def command(settings: Settings, prompt: str, model: str, session_id: str | None) -> list[str]:
    """The argument list of one CLI run."""
    argv = [settings.claude_command, "-p", prompt, "--output-format", "json", "--model", model]
    if session_id:
        argv += ["--resume", session_id]
    return argv


def parse_output(stdout: bytes) -> tuple[str, str | None]:
    """``(result text, session_id)`` from the CLI's JSON; BrainError otherwise."""
    try:
        data: Any = json.loads(stdout.decode("utf-8", errors="replace"))
    except ValueError:
        raise BrainError("claude printed no JSON object") from None
    if not isinstance(data, dict):
        raise BrainError("claude printed JSON that is not an object")
    if data.get("is_error"):
        raise BrainError(f"claude reported an error ({str(data.get('subtype') or 'error')[:40]})")
    result = data.get("result")
    if not isinstance(result, str):
        raise BrainError("claude output has no result text")
    session_id = data.get("session_id")
    return result, session_id if valid_session_id(session_id) else None


def _json_or_none(stdout: bytes) -> Any:
    try:
        return json.loads(stdout.decode("utf-8", errors="replace"))
    except ValueError:
        return None


async def _terminate(process: trio.Process) -> None:
    """How a cancelled run ends its process: SIGTERM, then SIGKILL if it
    lingers (``run_process`` then waits for it to be reaped)."""
    process.terminate()
    with trio.move_on_after(KILL_AFTER_S):
        await process.wait()
        return
    process.kill()


class ClaudeProcessError(BrainError):
    """The CLI exited non-zero."""


class ClaudeBackend:
    name = NAME

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    async def _run(self, prompt: str, model: str, session_id: str | None) -> tuple[str, str | None]:
        argv = command(self.settings, prompt, model, session_id)
        try:
            done = await trio.run_process(
                argv, stdin=b"", capture_stdout=True, capture_stderr=True, check=False,
                cwd=str(self.settings.journal), deliver_cancel=_terminate,
            )
        except OSError as exc:   # not installed, not executable
            raise BrainError(f"claude could not start ({type(exc).__name__})") from None
        if done.returncode != 0:
            raise ClaudeProcessError(f"claude exited with status {done.returncode}")
        result, new_session = parse_output(done.stdout)
        brain_usage.record(self.settings, NAME, model, *brain_usage.claude_tokens(_json_or_none(done.stdout)))
        return extract_instruction(result), new_session or session_id

    async def generate(self, snapshot: ContextSnapshot, session_id: str | None) -> tuple[str, str | None]:
        prompt = render_prompt(snapshot.agent_name)
        model = await run_sync(voice_config.brain_model, self.settings)
        if session_id:
            try:
                return await self._run(prompt, model, session_id)
            except ClaudeProcessError as exc:
                _log.warning("brain.resume_failed", backend=NAME, error=str(exc), retry="fresh session")
        return await self._run(prompt, model, None)
