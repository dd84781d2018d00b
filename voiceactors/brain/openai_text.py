"""The ``openai`` brain backend: the snapshot sent to an OpenAI text model.

One run is one Chat Completions request (``POST {OPENAI_BASE_URL}/chat/completions``)
through the SDK's ``AsyncOpenAI``::

    {"model": <voice.brain_model or gpt-5-mini>,
     "messages": [{"role": "system", "content": <the section 6 prompt>},
                  {"role": "user", "content": "Current journal context:\\n" + <snapshot as text>}]}

The answer's ``choices[0].message.content`` must hold the
``<voice_instruction>`` wrapper. The model cannot read files, so the snapshot
(``context.render_text``) is what "ingest the current context" means here.
There is no session: the session id passes through unchanged.

``summarise`` writes the summary of an ended call for the call that continues
it (``brain/call_summary.py``): one request with ``call_summary.SUMMARY_PROMPT``
as the system message and the transcript as the user's; the answer's text as
it is (the caller bounds it).

The key is read at call time (journal, then ``OPENAI_API_KEY``); none is a
``BrainError``. Runs share one client per (key, base URL) from a bounded
table the backend keeps (``voiceactors.openai_clients``: building a client
costs ~46 ms of CPU on the trio thread); the SDK's own retries are off (the
actor decides about retries and bounds the run).
"""

from __future__ import annotations

import openai
from openai.types.chat import ChatCompletionMessageParam

from voiceactors import voice_config
from voiceactors.brain import BrainError
from voiceactors.usage import brain_calls as brain_usage
from voiceactors.brain.snapshot import ContextSnapshot, render_text
from voiceactors.brain.call_summary import SUMMARY_PROMPT
from voiceactors.brain.prompt import extract_instruction, render_prompt
from voiceactors.openai_clients import OpenAIClients
from voiceactors.settings import Settings
from voiceactors.storage import run_sync

NAME = "openai"
DEFAULT_MODEL = "gpt-5-mini"


def messages(snapshot: ContextSnapshot) -> list[ChatCompletionMessageParam]:
    return [
        {"role": "system", "content": render_prompt(snapshot.agent_name)},
        {"role": "user", "content": "Current journal context:\n" + render_text(snapshot)},
    ]


class OpenAITextBackend:
    name = NAME

    def __init__(self, settings: Settings, clients: OpenAIClients | None = None) -> None:
        self.settings = settings
        self.clients = clients or OpenAIClients(settings.openai_clients, settings.brain_timeout_s)

    async def generate(self, snapshot: ContextSnapshot, session_id: str | None) -> tuple[str, str | None]:
        content = await self._complete(messages(snapshot), self.settings.brain_timeout_s)
        return extract_instruction(content), session_id

    async def summarise(self, transcript: str) -> str:
        """An ended call's summary from its transcript (the caller bounds the time)."""
        return await self._complete([{"role": "system", "content": SUMMARY_PROMPT},
                                     {"role": "user", "content": "Transcript:\n" + transcript}],
                                    self.settings.continue_summary_timeout_s)

    async def _complete(self, request: list[ChatCompletionMessageParam], timeout_s: float) -> str:
        """One Chat Completions request's answer text; BrainError for any failure."""
        key = await run_sync(voice_config.openai_api_key, self.settings)
        if not key:
            raise BrainError("openai key not configured")
        model = await run_sync(voice_config.brain_model, self.settings, DEFAULT_MODEL)
        try:
            async with self.clients.use(key, self.settings.openai_base_url) as client:
                answer = await client.chat.completions.create(model=model, messages=request, timeout=timeout_s)
        except openai.APIStatusError as exc:
            raise BrainError(f"openai request failed (status {exc.status_code})") from None
        except openai.OpenAIError as exc:
            raise BrainError(f"openai request failed ({type(exc).__name__})") from None
        brain_usage.record(self.settings, NAME, model, brain_usage.openai_tokens(getattr(answer, "usage", None)))
        choices = getattr(answer, "choices", None) or []
        content = choices[0].message.content if choices and choices[0].message else None
        if not isinstance(content, str):
            raise BrainError("openai answer has no text")
        return content
