"""A fuzz run's schedule: a captured call's steps (``ReplayScript``) with a
few changes drawn from a seed, each one something the service may do.

- ``delay``: one event comes later (its gap grows by ``amount`` seconds);
- ``duplicate``: one event is delivered twice (an item or response event
  the service may repeat after a hiccup);
- ``drop``: the sideband drops before one step (no close frame); the call
  reconnects and the replay goes on, what was in flight lost with the socket;
- ``barge_in``: the user starts speaking before one step. A response the
  replay had under way is cut there as the service cuts it (its
  ``response.done`` ``cancelled``, ``turn_detected``) and the rest of its
  recorded events are not played;
- ``late_transcript``: the user's transcript comes ``amount`` steps later
  (after the reply has begun);
- ``kill``: our server is killed (as by SIGKILL) before one step while a
  write tool call of the model is under way (asked, its turn not yet
  followed up), and a fresh one starts on what the dead one left on disk: it
  rejoins the call as crash recovery does (``replay.play_script``).

The same seed draws the same schedule from the same capture, so a failure's
seed replays exactly that schedule (``voiceactors fuzz --seed``)."""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Iterable

from voiceactors.simulator.capture_player import ReplayScript, Step
from voiceactors.tools.registry import REGISTRY, WRITE

__all__ = ["Change", "Perturbation", "Schedule"]

#: The events a duplicate delivery may repeat (the service's item and response
#: events; never a user turn's or a response's start, which are new things).
DUPLICABLE = frozenset({
    "response.output_item.done", "conversation.item.done", "response.function_call_arguments.done",
    "response.done", "conversation.item.input_audio_transcription.completed",
    "response.output_audio_transcript.done",
})
TRANSCRIPT = "conversation.item.input_audio_transcription.completed"
#: At most this many changes in one schedule.
MAX_CHANGES = 4


class Change(StrEnum):
    DELAY = "delay"
    DUPLICATE = "duplicate"
    DROP = "drop"
    BARGE_IN = "barge_in"
    LATE_TRANSCRIPT = "late_transcript"
    KILL = "kill"


@dataclass(frozen=True)
class Perturbation:
    """One change at step ``at`` of the recorded script (``amount``: the
    delay's seconds, or how many steps later a transcript comes)."""

    change: Change
    at: int
    amount: float = 0.0

    def describe(self, script: ReplayScript) -> str:
        step = script.steps[self.at]
        what = step.event.get("type") if step.event else step.kind
        if self.change is Change.DELAY:
            return f"step {self.at} ({what}) comes {self.amount:g} s later"
        if self.change is Change.DUPLICATE:
            return f"step {self.at} ({what}) is delivered twice"
        if self.change is Change.DROP:
            return f"the sideband drops before step {self.at} ({what})"
        if self.change is Change.BARGE_IN:
            return f"the user barges in before step {self.at} ({what})"
        if self.change is Change.KILL:
            return f"our server is killed before step {self.at} ({what}) and a fresh one starts on its files"
        return f"step {self.at} ({what}) comes {int(self.amount)} steps later"


@dataclass(frozen=True)
class Schedule:
    seed: int
    changes: tuple[Perturbation, ...]

    @classmethod
    def draw(cls, script: ReplayScript, seed: int) -> Schedule:
        """The schedule of ``seed`` for ``script``: one to ``MAX_CHANGES``
        changes where each can apply."""
        rng = random.Random(seed)
        places = _places(script)
        kinds = [kind for kind in Change if places[kind]]
        changes = []
        for _ in range(rng.randint(1, MAX_CHANGES) if kinds else 0):
            kind = rng.choice(kinds)
            at = rng.choice(places[kind])
            amount = 0.0
            if kind is Change.DELAY:
                amount = round(rng.uniform(0.05, 3.0), 2)
            elif kind is Change.LATE_TRANSCRIPT:
                amount = float(rng.randint(1, 8))
            changes.append(Perturbation(kind, at, amount))
        return cls(seed, tuple(sorted(set(changes), key=lambda p: (p.at, p.change))))

    def without(self, index: int) -> Schedule:
        return replace(self, changes=self.changes[:index] + self.changes[index + 1:])

    def describe(self, script: ReplayScript) -> list[str]:
        return [change.describe(script) for change in self.changes] or ["no change: the call as recorded"]

    def apply(self, script: ReplayScript) -> ReplayScript:
        """The script with these changes (a copy; ``script`` is unchanged)."""
        by_step: dict[int, list[Perturbation]] = {}
        for change in self.changes:
            by_step.setdefault(change.at, []).append(change)
        steps: list[Step] = []
        cut: set[str] = set()           # responses a barge-in cut: their later events are not played
        late: list[tuple[int, Step]] = []   # (steps still to pass, the step) of late transcripts
        for index, recorded in enumerate(script.steps):
            step = copy.deepcopy(recorded)
            changes = by_step.get(index, [])
            for change in changes:
                if change.change is Change.DROP:
                    steps += [Step("drop"), Step("connect")]
                elif change.change is Change.KILL:
                    steps += [Step("kill"), Step("connect")]
                elif change.change is Change.BARGE_IN:
                    steps += _barge_in(steps, cut, index)
            if _response_of(step) in cut:
                continue
            if any(c.change is Change.LATE_TRANSCRIPT for c in changes):
                late.append((max(int(c.amount) for c in changes if c.change is Change.LATE_TRANSCRIPT), step))
                continue
            for change in changes:
                if change.change is Change.DELAY:
                    step.gap += change.amount
            steps.append(step)
            if any(c.change is Change.DUPLICATE for c in changes):
                steps.append(replace(copy.deepcopy(step), gap=0.0))
            late = _release(late, steps, step)
        steps += [held for _, held in late if held.kind == "send"]
        return ReplayScript(script.call_id, _closing_last(steps), script.truncated)


def _places(script: ReplayScript) -> dict[Change, list[int]]:
    """Where each change can apply: a step index list per change."""
    places: dict[Change, list[int]] = {kind: [] for kind in Change}
    connected = False
    for index, step in enumerate(script.steps):
        if step.kind == "connect":
            connected = True
            continue
        if step.kind in ("close", "drop") or not connected:
            continue
        type_ = (step.event or {}).get("type")
        places[Change.DROP].append(index)
        places[Change.BARGE_IN].append(index)
        if step.kind == "send":
            places[Change.DELAY].append(index)
            if type_ in DUPLICABLE:
                places[Change.DUPLICATE].append(index)
            if type_ == TRANSCRIPT:
                places[Change.LATE_TRANSCRIPT].append(index)
    places[Change.KILL] = _mid_write(script)
    return places


def _mid_write(script: ReplayScript) -> list[int]:
    """The connected steps while a write tool call is under way: from the
    step after the model asks for it up to our ``response.create`` that
    follows its turn up (a kill there finds the write queued, running,
    applied but unanswered, or answered but not yet in the record)."""
    places: list[int] = []
    writing = False
    for index, step in enumerate(script.steps):
        if step.kind in ("close", "drop"):
            writing = False
        if writing and step.kind != "connect":
            places.append(index)
        if step.kind == "await_create":
            writing = False
        if step.kind == "send" and _asks_for_a_write(step.event or {}):
            writing = True
    return places


def _asks_for_a_write(event: dict[str, Any]) -> bool:
    """A recorded event in which the model asks for a journal write tool."""
    if event.get("type") != "response.function_call_arguments.done":
        return False
    name = event.get("name")
    spec = REGISTRY.get(name) if isinstance(name, str) else None
    return spec is not None and spec.effect == WRITE


def _response_of(step: Step) -> str | None:
    """The response a step's event belongs to (None: none, or a gate)."""
    event = step.event or {}
    if step.kind != "send":
        return None
    if event.get("type") in ("response.created", "response.done"):
        return (event.get("response") or {}).get("id")
    rid = event.get("response_id")
    return rid if isinstance(rid, str) else None


def _open_response(steps: Iterable[Step]) -> dict[str, Any] | None:
    """The response the steps so far leave under way (its ``response.created`` event)."""
    active: dict[str, Any] | None = None
    for step in steps:
        event = step.event or {}
        if step.kind != "send":
            if step.kind in ("drop", "close"):
                active = None
            continue
        response = event.get("response") or {}
        if event.get("type") == "response.created":
            active = response
        elif event.get("type") == "response.done" and active is not None and response.get("id") == active.get("id"):
            active = None
    return active


def _barge_in(steps: list[Step], cut: set[str], index: int) -> list[Step]:
    """The user's speech starting here, and the cut of a response under way."""
    added = [Step("send", {"type": "input_audio_buffer.speech_started", "audio_start_ms": 0,
                           "item_id": f"item_fuzz_barge_{index}", "event_id": f"event_fuzz_barge_{index}"})]
    active = _open_response(steps)
    if active is not None and active.get("id"):
        rid = active["id"]
        cut.add(rid)
        done = {**copy.deepcopy(active), "status": "cancelled",
                "status_details": {"type": "cancelled", "reason": "turn_detected"}}
        added.append(Step("send", {"type": "response.done", "event_id": f"event_fuzz_cut_{index}",
                                   "response": done}))
    return added


def _release(late: list[tuple[int, Step]], steps: list[Step], passed: Step) -> list[tuple[int, Step]]:
    """One more step played: late transcripts whose count ran out follow
    it; a drop or close takes them first (a transcript never outlives its
    connection's end)."""
    ending = passed.kind in ("drop", "close")
    kept = []
    for left, held in late:
        if left <= 1 or ending:
            if ending:
                steps.insert(len(steps) - 1, held)
            else:
                steps.append(held)
        else:
            kept.append((left - 1, held))
    return kept


def _closing_last(steps: list[Step]) -> list[Step]:
    """A recorded close stays the last step (a late event moved past it is
    played before it)."""
    closes = [i for i, step in enumerate(steps) if step.kind == "close"]
    if not closes or closes[-1] == len(steps) - 1:
        return steps
    last = closes[-1]
    return steps[:last] + steps[last + 1:] + [steps[last]]
