"""The ``local`` brain backend: the instruction composed from the snapshot.

No model and no network: the same snapshot always gives the same text, so the
voice works (and tests are exact) without any key. It follows the prompt's
voice rules: spoken English, no markdown or bullets, short turns, concrete
names and times, honest about what the journal does not say.
"""

from __future__ import annotations

from voiceactors.brain.snapshot import Commitment, ContextSnapshot, Event, spoken_day

NAME = "local"


def spoken_list(items: list[str] | tuple[str, ...]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    items = [i for i in items if i]
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _sentence(text: str) -> str:
    text = text.strip()
    return text if not text or text[-1] in ".!?…" else text + "."


def _who(snap: ContextSnapshot) -> str:
    owner = f", the voice of {snap.owner_name}'s journal" if snap.owner_name else ", the voice of this journal"
    lines = [f"You are {snap.agent_name}{owner}, talking out loud."]
    if snap.identity_notes:
        lines.append("From your identity notes: " + " ".join(_sentence(n) for n in snap.identity_notes))
    return " ".join(lines)


STYLE = (
    "Speak natural spoken English: no markdown, no lists, and never read out links or ids. "
    "Keep each turn to two to four short sentences unless the user asks for more, "
    "and prefer concrete names, times and facts over general talk. "
    "Use your journal tools before answering about days, people, commitments, the calendar or the briefing. "
    "If the journal does not say, answer honestly and briefly that you do not know rather than guessing."
)


def _today(snap: ContextSnapshot) -> str:
    text = f"Today is {spoken_day(snap.day)}."
    if snap.segment_count == 0:
        return text + " Nothing has been recorded in the journal yet today."
    text += f" The journal holds {snap.segment_count} recorded segment{'s' if snap.segment_count != 1 else ''} today."
    latest = next((s for s in reversed(snap.segments) if s.summary), None)
    if latest is not None:
        text += f" The latest summarized one, at {latest.start}, was about this: {_sentence(latest.summary)}"
    return text


def _people(snap: ContextSnapshot) -> str:
    if not snap.people:
        return ""
    if len(snap.people) == 1:
        return f"The person who matters most right now is {snap.people[0]}."
    return f"The people who matter right now are {spoken_list(snap.people)}."


def _person(name: str, owner_names: set[str]) -> str:
    """``you`` when ``name`` is the journal's owner."""
    return "you" if name.casefold() in owner_names else name


def _commitment(c: Commitment, owner_names: set[str]) -> str:
    owner = _person(c.owner, owner_names) if c.owner else "you"
    text = f"{owner} {'are' if owner == 'you' else 'is'} to {c.action.rstrip('.')}"
    if c.counterparty:
        text += f" for {_person(c.counterparty, owner_names)}"
    if c.when:
        text += f", due {c.when}"
    return text


def _commitments(snap: ContextSnapshot) -> str:
    if not snap.commitments:
        return "There are no open commitments in the journal."  # said, so the voice does not invent any
    owners = {n.casefold() for n in snap.owner_names}
    parts = [_commitment(c, owners) for c in snap.commitments]
    return f"Open commitments: {'; '.join(parts)}."


def _event(e: Event) -> str:
    text = f"at {e.time}, {e.title}" if e.time else f"sometime today, {e.title}"
    if e.attendees:
        text += f" with {spoken_list(e.attendees)}"
    if e.location:
        text += f", at {e.location}"
    return text


def _calendar(snap: ContextSnapshot) -> str:
    if not snap.calendar:
        return "Nothing is on today's calendar."
    return f"On today's calendar: {'; '.join(_event(e) for e in snap.calendar)}."


def _briefing(snap: ContextSnapshot) -> str:
    if not snap.highlights:
        return "There is no morning briefing for today."
    return "From this morning's briefing: " + " ".join(_sentence(h) for h in snap.highlights)


def _missing(snap: ContextSnapshot) -> str:
    if not snap.unavailable:
        return ""
    return (f"Some of the journal could not be read just now ({spoken_list(list(snap.unavailable))}), "
            "so say so if asked about it.")


def compose(snap: ContextSnapshot) -> str:
    """The spoken instruction for ``snap`` (deterministic)."""
    parts = [_who(snap), STYLE, _today(snap), _people(snap), _commitments(snap),
             _calendar(snap), _briefing(snap), _missing(snap)]
    return "\n\n".join(p for p in parts if p)


class LocalBackend:
    """``generate`` composes the instruction; the session id passes through
    unchanged (there is no session)."""

    name = NAME

    async def generate(self, snapshot: ContextSnapshot, session_id: str | None) -> tuple[str, str | None]:
        return compose(snapshot), session_id
