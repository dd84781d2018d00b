"""The transcripts of one call in the order the turns were spoken.

A transcript arrives when the service has it, not when the turn happened: a
user's transcription often completes after the reply it prompted has been
transcribed. The conversation itself is ordered, though: every
``conversation.item.added`` / ``.created`` / ``.done`` names the item before
it (``previous_item_id``). ``TranscriptOrder`` keeps that order as a number
per item (``order``): an item appended after the last one gets the last
number + 1, one inserted after an earlier item gets the midpoint between its
neighbours, so a number once given never changes and a transcript line
written as the call goes keeps its place. Sorting a run's transcripts by
``order`` gives the spoken order.

It also knows which assistant messages were cut short: the message items of a
response that ended ``cancelled`` (the user barged in, or we cancelled).

Sans-IO and cheap: ``CallProtocol`` hands it the fields of the events it
observes as its handlers read them (``item_seen``, ``output_item_seen``,
``response_done``; ``observe`` takes a whole event); it reads fields by
attribute with None defaults (an SDK model or a light view).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ITEM_EVENTS", "OUTPUT_ITEM_EVENTS", "TranscriptOrder"]

#: The events whose item ``item_seen`` takes, and those ``output_item_seen``
#: takes (with ``response.done``: every event ``observe`` takes into account).
ITEM_EVENTS = frozenset({"conversation.item.added", "conversation.item.created", "conversation.item.done"})
OUTPUT_ITEM_EVENTS = frozenset({"response.output_item.added", "response.output_item.done"})


class TranscriptOrder:
    """Conversation order and cut-short replies of one actor run."""

    def __init__(self) -> None:
        self._items: list[str] = []            # item ids in conversation order
        self._order: dict[str, float] = {}     # item id -> its order number
        self._messages_of: dict[str, list[str]] = {}  # response id -> its assistant message items, until done
        self._cut: set[str] = set()            # message items of cancelled responses
        self._transcribed: set[str] = set()    # items whose transcript line is written

    def observe(self, event: Any) -> list[str]:
        """Take one server event into account. Returns the ids of items that
        this event cut short and whose transcript was already written (the
        caller records them: ``transcript_cut``)."""
        kind = getattr(event, "type", None)
        if kind in ITEM_EVENTS:
            self.item_seen(getattr(event, "item", None), getattr(event, "previous_item_id", None))
        elif kind in OUTPUT_ITEM_EVENTS:
            self.output_item_seen(getattr(event, "response_id", None), getattr(event, "item", None))
        elif kind == "response.done":
            return self.response_done(getattr(event, "response", None))
        return []

    # ``observe``'s parts, for a caller that has read the event's fields
    # already (``CallProtocol``: each field of a view read once per event)

    def item_seen(self, item: Any, previous_item_id: str | None) -> None:
        """A ``conversation.item.added`` / ``.created`` / ``.done``'s item."""
        item_id = getattr(item, "id", None)
        if item_id:
            self._place(item_id, previous_item_id)

    def output_item_seen(self, response_id: str | None, item: Any) -> None:
        """A ``response.output_item.added`` / ``.done``'s item."""
        if response_id and getattr(item, "type", None) == "message":
            item_id = getattr(item, "id", None)
            if item_id:
                messages = self._messages_of.setdefault(response_id, [])
                if item_id not in messages:
                    messages.append(item_id)

    def messages_of(self, response_id: str) -> list[str]:
        """The assistant message items of a response not done yet."""
        return list(self._messages_of.get(response_id, ()))

    def place_transcript(self, item_id: str | None) -> dict[str, Any]:
        """The fields a transcript line of ``item_id`` carries besides its
        text: ``order`` and, for a reply already known to be cut short,
        ``cut_short``. An item the conversation never announced is placed
        last (it is as late as it can be)."""
        if not item_id:
            return {}
        self._place(item_id, None)
        self._transcribed.add(item_id)
        fields: dict[str, Any] = {"order": self._order[item_id]}
        if item_id in self._cut:
            fields["cut_short"] = True
        return fields

    def transcribed(self, item_id: str) -> bool:
        """Whether ``item_id``'s transcript line is written (a repeated
        delivery of its transcript adds none)."""
        return item_id in self._transcribed

    def order_of(self, item_id: str) -> float | None:
        return self._order.get(item_id)

    def _place(self, item_id: str, previous: str | None) -> None:
        if item_id in self._order:
            return
        items = self._items
        if not items or previous is None or previous not in self._order or items[-1] == previous:
            # appended: the usual case (also an unknown predecessor, e.g. lost in a drop)
            number = self._order[items[-1]] + 1.0 if items else 1.0
            items.append(item_id)
        else:
            at = items.index(previous) + 1
            number = (self._order[previous] + self._order[items[at]]) / 2
            items.insert(at, item_id)
        self._order[item_id] = number

    def response_done(self, response: Any) -> list[str]:
        """A ``response.done``'s response: the ids ``observe`` returns for it."""
        cut = self._messages_of.pop(getattr(response, "id", None) or "", [])
        if getattr(response, "status", None) != "cancelled":
            return []
        for item in getattr(response, "output", None) or ():
            if getattr(item, "type", None) == "message" and getattr(item, "id", None):
                cut.append(item.id)
        newly = []
        for item_id in dict.fromkeys(cut):
            if item_id not in self._cut:
                self._cut.add(item_id)
                if item_id in self._transcribed:
                    newly.append(item_id)
        return newly
