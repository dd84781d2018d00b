"""The simulator's token counts: a ``usage`` for every ``response.done``.

The service bills a response for its whole context (everything said so far)
as input, with the part it had already seen cached, and for what the
response produced as output. The simulator counts the same way, with
deterministic counts derived from the scripted content, so tests can check
totals to the token (docs/simulator.md § Usage):

* ``text_tokens(s)`` = ⌈UTF-8 bytes of ``s`` / 4⌉ (0 for an empty string);
* a user turn with transcript ``T`` adds ``AUDIO_PER_TEXT × text_tokens(T)``
  audio tokens to the context; a tool output ``O`` adds ``text_tokens(O)``
  text tokens; the session's ``instructions`` are text in every response's
  input;
* a response's output: for a message, ``text_tokens(transcript)`` text and
  ``AUDIO_PER_TEXT ×`` that audio tokens; for a function call,
  ``text_tokens(name) + text_tokens(arguments)`` text tokens; what it
  produced joins the context;
* its input is the context when it ends, of which the previous response's
  input is cached (text and audio alike; the first response has none).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

AUDIO_PER_TEXT = 8


def text_tokens(text: str | None) -> int:
    size = len((text or "").encode("utf-8"))
    return (size + 3) // 4


def _transcript(item: dict[str, Any]) -> str:
    parts = item.get("content") or []
    return "".join(p.get("transcript") or p.get("text") or "" for p in parts if isinstance(p, dict))


@dataclass
class ConversationTokens:
    """One simulated call's context, in tokens (text and audio)."""

    text: int = 0
    audio: int = 0
    cached_text: int = 0     # the previous response's input
    cached_audio: int = 0

    def user_said(self, transcript: str) -> None:
        self.audio += AUDIO_PER_TEXT * text_tokens(transcript)

    def tool_output(self, output: str) -> None:
        self.text += text_tokens(output)

    def response_usage(self, output: list[dict[str, Any]], instructions: str | None) -> dict[str, Any]:
        """The ``usage`` of a response ending now with ``output`` (its items);
        what it produced joins the context."""
        in_text = self.text + text_tokens(instructions)
        in_audio = self.audio
        out_text = out_audio = 0
        for item in output:
            if item.get("type") == "function_call":
                out_text += text_tokens(item.get("name")) + text_tokens(item.get("arguments"))
            elif item.get("type") == "message":
                spoken = text_tokens(_transcript(item))
                out_text += spoken
                out_audio += AUDIO_PER_TEXT * spoken
        cached_text, cached_audio = min(self.cached_text, in_text), min(self.cached_audio, in_audio)
        self.cached_text, self.cached_audio = in_text, in_audio
        self.text += out_text
        self.audio += out_audio
        return {
            "total_tokens": in_text + in_audio + out_text + out_audio,
            "input_tokens": in_text + in_audio,
            "output_tokens": out_text + out_audio,
            "input_token_details": {
                "text_tokens": in_text, "audio_tokens": in_audio, "image_tokens": 0,
                "cached_tokens": cached_text + cached_audio,
                "cached_tokens_details": {"text_tokens": cached_text, "audio_tokens": cached_audio,
                                          "image_tokens": 0},
            },
            "output_token_details": {"text_tokens": out_text, "audio_tokens": out_audio},
        }
