"""CallSupervisor: the registry of live calls, one CallActor each.

The supervisor runs a nursery holding every CallActor, and answers its inbox
synchronously (it never awaits while handling a message, so one slow call
cannot delay another's Connect):

* ``Connect(call_id)`` — a ``ConnectOutcome``: "connected" (a live call is
  found, not started twice) or "at_capacity" (``settings.max_calls`` live calls already);
* ``CountCalls`` — the number of live calls;
* ``Subscribe(call_id)`` — a receive channel of the call's feed events,
  None when the call is not live, or a ``SubscribeRefusal`` (a string) at a
  subscriber cap (``feed.TOO_MANY_FOR_CALL`` / ``feed.TOO_MANY``);
* ``TakeNavHints(call_id)`` / ``TakeObserverActions`` — the polling queues,
  consumed;
* ``GetDailyUsage`` — the day's cost against the daily budget
  (``daily_usage.DailyState``; the supervisor owns the ``DailyUsage`` its
  calls add to, and its writer task).

At start-up, before serving the inbox, the supervisor rejoins the calls that
were live when the previous server died (``recovery.find_crashed``: a call
record whose last block has no ``end``), at most ``settings.rejoin_max_calls``;
each new actor answers the tool calls the crashed run left pending. This
happens before ``run`` reports started, so no Connect races it (a Connect
for such a call finds it live).

An actor leaves the registry when its ``run`` returns (after its call record
is written); a later Connect with the same id starts a new actor, which ends
at once with ``call_gone`` if the service really ended the call.
Cancelling ``run`` cancels every actor; each closes within its own
``close_deadline_s``.
"""

from __future__ import annotations

from typing import Any, Callable

import trio

from voiceactors import config, metrics, storage
from voiceactors.actors.call import CallActor
from voiceactors.actors.call_protocol import EndReason
from voiceactors.actors.recovery import PendingCall, find_crashed
from voiceactors.actors.daily_usage import DailyUsage
from voiceactors.actors.feed import FeedHub
from voiceactors.actors.messages import (Connect, ConnectOutcome, CountCalls, ExecutorMessage, GetDailyUsage, Subscribe,
                                         SupervisorMessage, TakeNavHints, TakeObserverActions, drain)
from voiceactors.logs import get_logger
from voiceactors.settings import Settings

INBOX_SIZE = 256


class CallSupervisor:
    """``api_key`` is a provider of the standard OpenAI key (default: the
    journal's voice block, then ``OPENAI_API_KEY``) or a fixed key."""

    def __init__(self, settings: Settings, executor_inbox: trio.MemorySendChannel[ExecutorMessage],
                 api_key: str | None | Callable[[], str | None] = None, *, hangup: bool = True) -> None:
        self.settings = settings
        self._executor = executor_inbox
        self._api_key = api_key if api_key is not None else (lambda: config.openai_api_key(settings))
        self._hangup = hangup
        self.inbox, self._receive = trio.open_memory_channel[SupervisorMessage](INBOX_SIZE)
        self.hub = FeedHub(settings.feed_retention_s, settings.feed_max_items,
                           max_per_call=settings.feed_max_subscribers_per_call,
                           max_total=settings.feed_max_subscribers)
        self.calls: dict[str, CallActor] = {}
        self.daily = DailyUsage(settings.state_dir, settings.daily_budget_usd)
        self._model = lambda: config.voice_model(settings)
        self.ended: list[tuple[str, str]] = []   # (call_id, reason), most recent last; bounded
        self.log = get_logger(actor="supervisor")

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve the inbox until cancelled (or the inbox is closed; then wait
        for the live calls to end)."""
        await storage.run_sync(self.daily.load)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.daily.run_writer)
                # before reporting started: no Connect can race the rejoin
                await self._rejoin_crashed(nursery)
                task_status.started()
                async with self._receive:
                    async for message in drain(self._receive):
                        self._handle(message, nursery)
        finally:
            await self.daily.final_write()

    def _handle(self, message: SupervisorMessage, nursery: trio.Nursery) -> None:
        if isinstance(message, Connect):
            _reply(message.reply, self._connect(message.call_id, nursery, context=message.context))
        elif isinstance(message, CountCalls):
            _reply(message.reply, len(self.calls))
        elif isinstance(message, Subscribe):
            _reply(message.reply, self.hub.subscribe(message.call_id))
        elif isinstance(message, TakeNavHints):
            _reply(message.reply, self.hub.take_nav_hints(message.call_id))
        elif isinstance(message, TakeObserverActions):
            _reply(message.reply, self.hub.take_observer_actions())
        elif isinstance(message, GetDailyUsage):
            _reply(message.reply, self.daily.state())
        else:
            self.log.error("supervisor.unknown_message", kind=type(message).__name__)

    async def _rejoin_crashed(self, nursery: trio.Nursery) -> None:
        """Start an actor for every call live at the previous server's death."""
        if self.settings.rejoin_max_calls <= 0:
            return
        try:
            crashed = await storage.run_sync(lambda: find_crashed(
                self.settings.state_dir, max_age_s=self.settings.call_max_duration_s,
                limit=self.settings.rejoin_max_calls))
        except OSError as exc:
            self.log.error("supervisor.rejoin_failed", error=type(exc).__name__)
            return
        for call in crashed:
            self.log.info("supervisor.rejoin", call_id=call.call_id, pending=len(call.pending))
            self._connect(call.call_id, nursery, recovered=call.pending)

    def _connect(self, call_id: str, nursery: trio.Nursery, *,
                 recovered: list[PendingCall] | None = None, context: Any = None) -> ConnectOutcome:
        if call_id in self.calls:
            return ConnectOutcome.CONNECTED
        if len(self.calls) >= self.settings.max_calls:
            self.log.warning("supervisor.at_capacity", call_id=call_id, live=len(self.calls))
            return ConnectOutcome.AT_CAPACITY
        feed = self.hub.open(call_id)
        actor = CallActor(self.settings, call_id, self._executor, self._api_key, feed, hangup=self._hangup,
                          recovered=recovered, context=context, model=self._model, on_cost=self.daily.add)
        self.calls[call_id] = actor
        metrics.set_live_calls(len(self.calls))
        nursery.start_soon(self._run_call, actor, name=f"call:{call_id}")
        self.log.debug("supervisor.call_started", call_id=call_id, live=len(self.calls))
        return ConnectOutcome.CONNECTED

    async def _run_call(self, actor: CallActor) -> None:
        reason = EndReason.ERROR
        try:
            reason = await actor.run()
        except Exception:  # run() already logs and swallows its errors; belt and braces
            self.log.exception("supervisor.call_crashed", call_id=actor.call_id)
        finally:
            if self.calls.get(actor.call_id) is actor:
                del self.calls[actor.call_id]
            if actor.feed is not None:
                self.hub.close(actor.feed, actor.end_reason or reason)
            self.ended.append((actor.call_id, actor.end_reason or reason))
            del self.ended[:-100]
            metrics.set_live_calls(len(self.calls))
            self.log.debug("supervisor.call_removed", call_id=actor.call_id, live=len(self.calls))


def _reply(reply: trio.MemorySendChannel[Any], value: Any) -> None:
    """Answer a request; an asker that gave up (closed its end) is not an error."""
    try:
        reply.send_nowait(value)
    except (trio.BrokenResourceError, trio.ClosedResourceError, trio.WouldBlock):
        if isinstance(value, trio.MemoryReceiveChannel):
            value.close()  # an orphaned feed subscription: let the feed forget it
