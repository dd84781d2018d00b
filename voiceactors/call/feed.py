"""The per-call client feed and the polling queues (nav hints, observer actions).

What a browser may see about its call, as small dicts with a ``"type"``:

* ``tool.started`` / ``tool.finished`` / ``tool.failed`` — tool name, the
  model's ``tool_call_id``, epoch, outcome and ``duration_ms``. Never argument
  values, never outputs, never secrets.
* ``nav.hint`` / ``observer.action`` — the ``client_events`` a tool result
  carried (``_nav_target`` / ``_observer_action`` of a handler).
* ``transcript`` — ``role`` ``user`` or ``assistant`` and the final ``text``
  of one utterance.
* ``usage`` — after each response: its ``tokens`` by kind and ``cost_usd``
  (None when the model has no prices), the ``model``, and the call's totals
  so far (``call``).
* ``call.ended`` — the last event of a feed, with the end ``reason``.

Publishing never waits: every subscriber has a bounded buffer and a
subscriber that falls behind loses events (counted in ``CallFeed.dropped``)
rather than slowing the call down.

With ``--redis`` the hub has a ``sink`` (``cluster.shared_feed.SharedFeed``)
and a call's feed an ``epoch`` (its lease's fence): every event then carries
an ``id``, ``<epoch>-<seq>``, and goes to the sink too, which writes it to
the call's Redis stream for clients on other processes; nav hints and
observer actions go to the sink's shared queues instead of the local ones.
The hub is owned by the CallSupervisor;
a CallActor only publishes into its own ``CallFeed``. Everything here is
synchronous and runs on the trio thread, so no locks are needed.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any, Iterable, Protocol

import trio

from voiceactors.call.state import ToolOutcome
from voiceactors.messages import SubscribeRefusal
from voiceactors.logs import get_logger
from voiceactors.settings import default

#: The outcomes a ``tool.finished`` event carries (any other is ``tool.failed``).
FINISHED_OUTCOMES = frozenset({ToolOutcome.OK, ToolOutcome.REPLAYED})
#: Events a subscriber may have buffered before newer ones are dropped.
SUBSCRIBER_BUFFER = 64

#: ``FeedHub.subscribe`` answers these (the ``/events`` route's 503 errors)
#: when a subscriber cap is reached.
TOO_MANY_FOR_CALL = SubscribeRefusal.TOO_MANY_FOR_CALL
TOO_MANY = SubscribeRefusal.TOO_MANY

_log = get_logger(actor="feed")


@dataclass
class RetainedQueue:
    """A small polling queue: items expire after ``retention_s`` (trio clock)
    and at most ``max_items`` are kept, the oldest dropped first."""

    retention_s: float
    max_items: int
    _items: collections.deque[tuple[float, dict[str, Any]]] = field(default_factory=collections.deque)
    dropped: int = 0

    def _prune(self) -> None:
        cutoff = trio.current_time() - self.retention_s
        while self._items and self._items[0][0] <= cutoff:
            self._items.popleft()

    def put(self, item: dict[str, Any]) -> None:
        self._prune()
        self._items.append((trio.current_time(), item))
        while len(self._items) > self.max_items:
            self._items.popleft()
            self.dropped += 1

    def take(self) -> list[dict[str, Any]]:
        """All live items, oldest first; the queue is empty afterwards."""
        self._prune()
        items = [item for _, item in self._items]
        self._items.clear()
        return items

    def __len__(self) -> int:
        self._prune()
        return len(self._items)


class FeedSink(Protocol):
    """Where a shared feed's events go as well (never blocks)."""

    def append(self, call_id: str, event: dict[str, Any], queued: tuple[str, dict[str, Any]] | None) -> None: ...


def split_client_event(event: dict[str, Any]) -> tuple[str, Any] | None:
    """``("nav", target)`` or ``("observer", action)`` for one
    ``ToolResult.client_events`` entry (``{"type": "nav_hint", "target"}`` /
    ``{"type": "observer_action", "action"}``, as the executor makes them);
    None for anything else."""
    kind = event.get("type")
    if kind == "nav_hint" and event.get("target"):
        return "nav", event["target"]
    if kind == "observer_action" and isinstance(event.get("action"), dict):
        return "observer", event["action"]
    return None


class CallFeed:
    """The feed of one call: fan-out to subscribers, plus the call's nav hints.

    ``publish`` never blocks and never raises for a slow or gone subscriber.
    """

    def __init__(self, call_id: str, hub: FeedHub, epoch: int | None = None) -> None:
        self.call_id = call_id
        self._hub = hub
        self.epoch = epoch if hub.sink is not None else None
        self._seq = 0
        # the agent in charge, as last published: a subscriber that comes
        # later (a console whose stream opened after the first response) hears it first
        self._in_charge: dict[str, Any] | None = None
        self._subscribers: list[trio.MemorySendChannel[dict[str, Any]]] = []
        self.nav_hints = RetainedQueue(hub.retention_s, hub.max_items)
        self.closed = False
        self.dropped = 0
        self.ended_at: float | None = None

    def subscribe(self) -> trio.MemoryReceiveChannel[dict[str, Any]]:
        """A new subscriber channel. After the call ended it yields nothing
        (already closed), so a late subscriber ends at once."""
        send, receive = trio.open_memory_channel[dict[str, Any]](SUBSCRIBER_BUFFER)
        if self.closed:
            send.close()
        else:
            if self._in_charge is not None:
                send.send_nowait(self._in_charge)
            self._subscribers.append(send)
        return receive

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def listened(self) -> bool:
        """Whether an event published now reaches anyone: a subscriber (a
        gone one is noticed at the next publish) or, with ``--redis``, the
        sink. While it is False a ``publish`` goes nowhere, so a caller may
        skip building its event; ``client_events`` is more than a publish
        (the nav hints and observer actions are queued for polling)."""
        return bool(self._subscribers) or self.epoch is not None

    def prune(self) -> int:
        """Forget subscribers whose stream has gone (receive side closed);
        the number left."""
        self._subscribers = [s for s in self._subscribers if s.statistics().open_receive_channels > 0]
        return len(self._subscribers)

    def publish(self, event: dict[str, Any], queued: tuple[str, dict[str, Any]] | None = None) -> None:
        """``queued``: the nav hint / observer action the event carries,
        for the shared queues (the local ones are filled by the caller)."""
        event = {"call_id": self.call_id, **event}
        if self.epoch is not None and self._hub.sink is not None:
            self._seq += 1
            event["id"] = f"{self.epoch}-{self._seq}"
            self._hub.sink.append(self.call_id, event, queued)
        for send in list(self._subscribers):
            try:
                send.send_nowait(event)
            except trio.WouldBlock:
                self.dropped += 1
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._subscribers.remove(send)

    # --- typed publishers (the one place that decides what a feed event holds)

    def tool_started(self, *, tool: str, tool_call_id: str, epoch: int) -> None:
        self.publish({"type": "tool.started", "tool": tool, "tool_call_id": tool_call_id, "epoch": epoch})

    def tool_done(self, *, tool: str, tool_call_id: str, epoch: int, outcome: ToolOutcome,
                  duration_ms: float) -> None:
        kind = "tool.finished" if outcome in FINISHED_OUTCOMES else "tool.failed"
        self.publish({"type": kind, "tool": tool, "tool_call_id": tool_call_id, "epoch": epoch,
                      "outcome": outcome, "duration_ms": round(duration_ms, 1)})

    def tool_progress(self, *, tool: str, tool_call_id: str, epoch: int, progress: float, total: float | None,
                      message: str | None) -> None:
        """A running tool's source reported progress (MCP ``notifications/progress``)."""
        self.publish({"type": "tool.progress", "tool": tool, "tool_call_id": tool_call_id, "epoch": epoch,
                      "progress": progress, "total": total, "message": message})

    def transcript(self, *, role: str, text: str, item_id: str | None = None) -> None:
        self.publish({"type": "transcript", "role": role, "text": text, "item_id": item_id})

    def selection(self, *, tool_call_id: str, selection: dict[str, Any] | None,
                  link: dict[str, Any] | None) -> None:
        """The call's current selection changed (``journal.select``); ``link``
        is the original link, unchanged."""
        self.publish({"type": "selection", "tool_call_id": tool_call_id, "selection": selection, "link": link})
    def agent(self, *, agent: str | None, previous: str | None, status: str) -> None:
        """The agent in charge: at the call's first response (``status`` ``start``), after a
        handoff's update went (``updating``: ``previous`` handed over), or
        back after the service refused it (``failed``). Kept for a later
        subscriber (``subscribe``)."""
        self._in_charge = {"call_id": self.call_id, "type": "agent", "agent": agent, "from": previous,
                           "status": status}
        self.publish(self._in_charge)

    def usage(self, *, response_id: str, model: str, tokens: dict[str, int], cost_usd: float | None,
              call: dict[str, Any]) -> None:
        """One response's tokens and cost, and the call's totals so far (``call``)."""
        self.publish({"type": "usage", "response_id": response_id, "model": model, "tokens": tokens,
                      "cost_usd": cost_usd, "call": call})

    def client_events(self, events: Iterable[dict[str, Any]], *, tool: str, tool_call_id: str) -> None:
        """Route a tool result's client events: nav hints to this call's queue,
        observer actions to the global queue, both to the subscribers."""
        for event in events:
            split = split_client_event(event)
            if split is None:
                _log.warning("feed.client_event_unknown", call_id=self.call_id, tool=tool)
                continue
            kind, payload = split
            shared = self.epoch is not None     # the sink's queues, not the local ones
            if kind == "nav":
                hint = {"target": payload, "tool": tool, "call_id": self.call_id}
                if not shared:
                    self.nav_hints.put(hint)
                self.publish({"type": "nav.hint", "tool": tool, "tool_call_id": tool_call_id, "target": payload},
                             ("nav", hint) if shared else None)
            else:
                action = {"call_id": self.call_id, "tool": tool, "action": payload}
                if not shared:
                    self._hub.observer_actions.put(action)
                self.publish({"type": "observer.action", "tool": tool, "tool_call_id": tool_call_id,
                              "action": payload}, ("observer", action) if shared else None)

    def close(self, reason: str) -> None:
        """End the feed: publish ``call.ended`` and close every subscriber."""
        if self.closed:
            return
        self.publish({"type": "call.ended", "reason": reason})
        self.closed = True
        self.ended_at = trio.current_time()
        for send in self._subscribers:
            send.close()
        self._subscribers.clear()


class FeedHub:
    """All feeds and the polling queues. Owned by the CallSupervisor.

    A call's nav hints stay takeable for ``retention_s`` after the call ended
    (a poll may race the end), then the feed is forgotten.
    """

    def __init__(self, retention_s: float = default("feed_retention_s"),
                 max_items: int = default("feed_max_items"), *,
                 max_per_call: int = default("feed_max_subscribers_per_call"),
                 max_total: int = default("feed_max_subscribers")) -> None:
        self.retention_s = retention_s
        self.max_items = max_items
        self.max_per_call = max_per_call
        self.max_total = max_total
        self.observer_actions = RetainedQueue(retention_s, max_items)
        self.sink: FeedSink | None = None      # --redis: the shared feed (set before any call opens)
        self._live: dict[str, CallFeed] = {}
        self._ended: collections.OrderedDict[str, CallFeed] = collections.OrderedDict()

    def open(self, call_id: str, epoch: int | None = None) -> CallFeed:
        """The feed of a call that is starting (a new one, even if an ended
        feed of the same id is still retained: its hints move over).
        ``epoch``: the call's lease fence, with a sink (event ids)."""
        feed = CallFeed(call_id, self, epoch)
        old = self._ended.pop(call_id, None)
        if old is not None:
            for hint in old.nav_hints.take():
                feed.nav_hints.put(hint)
        self._live[call_id] = feed
        return feed

    def live(self, call_id: str) -> CallFeed | None:
        return self._live.get(call_id)

    def close(self, feed: CallFeed, reason: str) -> None:
        """The call ended: close its feed and retain its nav hints for a while."""
        feed.close(reason)
        if self._live.get(feed.call_id) is feed:
            del self._live[feed.call_id]
            self._ended[feed.call_id] = feed
        self._sweep()

    def _sweep(self) -> None:
        cutoff = trio.current_time() - self.retention_s
        while self._ended:
            call_id, feed = next(iter(self._ended.items()))
            if feed.ended_at is not None and feed.ended_at > cutoff:
                break
            del self._ended[call_id]

    def subscribe(self, call_id: str) -> trio.MemoryReceiveChannel[dict[str, Any]] | SubscribeRefusal | None:
        """A subscriber channel of a live call; None when the call is not
        live; ``TOO_MANY_FOR_CALL`` / ``TOO_MANY`` at a cap (every stream
        is a task and a buffer: a flood of them must not slow live calls)."""
        feed = self._live.get(call_id)
        if feed is None:
            return None
        if feed.prune() >= self.max_per_call:
            _log.warning("feed.too_many_subscribers", call_id=call_id, limit=self.max_per_call)
            return TOO_MANY_FOR_CALL
        if sum(f.prune() for f in self._live.values()) >= self.max_total:
            _log.warning("feed.too_many_subscribers", limit=self.max_total, scope="all")
            return TOO_MANY
        return feed.subscribe()

    def take_nav_hints(self, call_id: str) -> list[dict[str, Any]]:
        self._sweep()
        feed = self._live.get(call_id) or self._ended.get(call_id)
        return feed.nav_hints.take() if feed is not None else []

    def take_observer_actions(self) -> list[dict[str, Any]]:
        return self.observer_actions.take()
