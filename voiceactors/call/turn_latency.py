"""The latency a person feels, per turn, without I/O (the protocol's bookkeeping).

A turn starts where the service says the user stopped speaking
(``input_audio_buffer.speech_stopped``, read by us) and is measured to:

* **the first sound** of the reply: the first ``output_audio_buffer.started``
  read after it. A call's sideband is a WebRTC or SIP call's: its audio goes
  over the media path, never the websocket, so the service's announcement
  that it started streaming a response's audio is the first sign of sound the
  sideband gets (one event per response; ``response.output_audio.delta`` is
  a websocket session's audio and never comes here);
* **the answer after a tool**: the first ``output_audio_buffer.started`` read
  after a ``response.create`` of ours that carried the turn's tool outputs
  forward (a turn whose reply needed no tool has none).

For a turn with a tool, the time to the answer is split by who held it
up. Ours is each follow-up ``response.create``'s wait, from the latest
``response.done`` of the responses it carries forward (the service had
asked for the tools and finished speaking) to the create written; the tools'
part of it is how long a tool of the turn was still running in that
span, the rest is our overhead (hops, writes, the create's own rules). The
service's share is everything else: hearing the turn, deciding on the tool,
then the reply. A tool that ran while the service was still speaking held
no one up and counts nowhere.

Times are the caller's clock (the shell's ``trio.current_time()`` at each
input); nothing here reads a clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(slots=True)
class Turn:
    """One user turn's marks, seconds on the caller's clock."""

    number: int
    stopped_at: float
    first_audio_s: float | None = None     # to the first sound of the reply
    answer_s: float | None = None          # to the first sound after a tool's output
    ours_s: float = 0.0                    # our share before that answer: the tools' and our overhead
    tools_s: float = 0.0                   # ... the tools' part of it
    follow_ups: int = 0                    # our response.creates carrying the turn's tool outputs forward
    awaiting_answer: bool = False          # a follow-up is written, its sound has not come yet

    @property
    def overhead_s(self) -> float:
        return max(0.0, self.ours_s - self.tools_s)

    @property
    def service_s(self) -> float | None:
        """The service's share of the time to the answer (to the first sound
        for a turn without a tool)."""
        if self.answer_s is not None:
            return max(0.0, self.answer_s - self.ours_s)
        return self.first_audio_s

    def fields(self) -> dict[str, object]:
        """The record's ``turn`` line (milliseconds, rounded)."""
        def ms(seconds: float | None) -> float | None:
            return None if seconds is None else round(seconds * 1000, 1)

        line: dict[str, object] = {"turn": self.number, "first_audio_ms": ms(self.first_audio_s)}
        if self.follow_ups:
            line.update(answer_ms=ms(self.answer_s), tools_ms=ms(self.tools_s), overhead_ms=ms(self.overhead_s),
                        service_ms=ms(self.service_s))
        return line


@dataclass(frozen=True, slots=True)
class Heard:
    """What one ``output_audio_buffer.started`` closed: the turn's first
    sound, its answer after a tool, or both (a tool's answer the first sound)."""

    turn: Turn
    first_audio: bool
    answer: bool


class TurnLatency:
    """The current turn's marks (one turn at a time: a new turn settles the last)."""

    def __init__(self) -> None:
        self.current: Turn | None = None
        self._tool_done_at = -math.inf     # when a tool of ours last answered

    def speech_stopped(self, number: int, now: float) -> Turn | None:
        """A turn ends its speech: the turn before it, settled (None: none, or no reply was heard)."""
        settled = self.settle()
        self.current = Turn(number, now)
        return settled

    def settle(self) -> Turn | None:
        """The current turn is over (the user speaks again, the call ends): it,
        when its reply was heard (a turn with no sound has no latency)."""
        turn, self.current = self.current, None
        return turn if turn is not None and turn.first_audio_s is not None else None

    def tool_answered(self, now: float) -> None:
        self._tool_done_at = now

    def follow_up_written(self, now: float, service_done_at: float) -> None:
        """A response.create of ours carrying tool outputs forward is written;
        ``service_done_at``: the latest response.done of the responses it follows."""
        turn = self.current
        if turn is None or turn.answer_s is not None or service_done_at < turn.stopped_at:
            return
        ours = max(0.0, now - service_done_at)
        turn.ours_s += ours
        turn.tools_s += min(ours, max(0.0, self._tool_done_at - service_done_at))
        turn.follow_ups += 1
        turn.awaiting_answer = True

    def audio_started(self, now: float) -> Heard | None:
        """The service started a response's sound: what it closes (None: nothing)."""
        turn = self.current
        if turn is None:
            return None
        first = turn.first_audio_s is None
        if first:
            turn.first_audio_s = max(0.0, now - turn.stopped_at)
        answer = turn.awaiting_answer
        if answer:
            turn.awaiting_answer = False
            turn.answer_s = max(0.0, now - turn.stopped_at)
        return Heard(turn, first, answer) if first or answer else None
