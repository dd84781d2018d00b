"""The brain's prompt (the design's section 6, verbatim) and its answer's wrapper.

The template interpolates ``{agent_name}`` only: ``<today>`` is literal text
(the model finds today's briefing itself). Rendering uses ``str.replace``
rather than ``str.format`` so no other brace or placeholder is ever expanded.
"""

from __future__ import annotations

import re

from voiceactors.brain import BrainError

PROMPT_TEMPLATE = """\
You are preparing the current voice-session instruction for {agent_name}. Your task right now is to read the current journal state and produce exactly one fresh instruction for an OpenAI Realtime voice session. The instruction must sound like spoken English. Keep it concise, natural, and useful in conversation. No markdown. No bullets. No XML outside the required wrapper tags. Voice style rules:
- Write for speech, not reading.
- Keep the voice model oriented toward short spoken turns, usually 2 to 4 sentences unless the user clearly asks for more.
- Prefer concrete wording over abstract wording.
- If context is missing, the instruction should say to answer honestly and briefly rather than guessing. Before you write the instruction, ingest the current context:
- Read the identity material under journal/identity/ and treat {agent_name} as the canonical spoken name.
- Read today's journal summary and today's segment-level summaries if they exist.
- Read the active entities that matter right now.
- Read the open commitments.
- Read today's calendar and anticipated activities.
- Read today's morning briefing at chronicle/<today>/talents/morning_briefing.json if it exists. Then write one system instruction that does all of the following:
- Establish who {agent_name} is and how the voice should speak.
- Anchor the voice in today's real context.
- Name the most important people, commitments, and upcoming events if they are present.
- Tell the voice to stay concise, spoken, and honest about missing information. Output only this wrapper and the instruction inside it: <voice_instruction> ... </voice_instruction>"""

_WRAPPED = re.compile(r"<voice_instruction>(.*?)</voice_instruction>", re.S)


class BrainOutputError(BrainError):
    """A backend answer without a usable ``<voice_instruction>`` wrapper."""


def render_prompt(agent_name: str) -> str:
    """The prompt for ``agent_name`` (the spoken name, e.g. ``sol``)."""
    return PROMPT_TEMPLATE.replace("{agent_name}", agent_name)


def extract_instruction(text: str) -> str:
    """The text inside the first ``<voice_instruction>...</voice_instruction>``,
    stripped. BrainOutputError when the wrapper is missing or empty."""
    match = _WRAPPED.search(text or "")
    if match is None:
        raise BrainOutputError("answer has no <voice_instruction> wrapper")
    instruction = match.group(1).strip()
    if not instruction or instruction == "...":
        raise BrainOutputError("answer has an empty <voice_instruction>")
    return instruction
