"""CallSupervisor: the registry of live calls, one CallActor each.

The supervisor runs a nursery holding every CallActor, and answers its inbox
synchronously (it never awaits while handling a message, so one slow call
cannot delay another's Connect):

* ``Connect(call_id)`` — a ``ConnectOutcome``: "connected" (a live call is
  found, not started twice) or "at_capacity" (``settings.max_calls`` live calls already);
  the connect route asks it in its own step (``connect_now``: the same
  answer, no ask);
* ``CountCalls`` — the number of live calls;
* ``Subscribe(call_id)`` — a receive channel of the call's feed events,
  None when the call is not live, or a ``SubscribeRefusal`` (a string) at a
  subscriber cap (``feed.TOO_MANY_FOR_CALL`` / ``feed.TOO_MANY``);
* ``TakeNavHints(call_id)`` / ``TakeObserverActions`` — the polling queues,
  consumed;
* ``GetDailyUsage`` — the day's cost against the daily budget
  (``usage.daily.DailyState``; the supervisor owns the ``DailyUsage`` its
  calls add to, and its writer task).

At start-up, before serving the inbox, the supervisor rejoins the calls that
were live when the previous server died (``recovery.find_crashed``: a call
record whose last block has no ``end``), at most ``settings.rejoin_max_calls``;
each new actor answers the tool calls the crashed run left pending and
carries on with the linked context its record kept. This
happens before ``run`` reports started, so no Connect races it (a Connect
for such a call finds it live).

With a shared registry (``--redis``, ``voiceactors.cluster``) a Connect
runs in its own task (or, for the connect route, in the request's:
``connect_leased``): the call's actor starts only if this process wins the
call's lease; a call held by another process answers "connected" without an
actor here; a Redis that does not answer gives "registry_down". The actor
runs inside its lease's stop (``cluster.leases.run_leased``) while the
registry renews every kept lease in one request, and is stopped when the
lease cannot be kept. Every third of a lease the
supervisor takes over the calls whose holder died (their lease expired
unreleased), answering their pending tool calls from the shared mirror and
carrying on with the linked context mirrored with them (its link, current
selection and the brain's instruction it was connected with; a taker never
greets).

An actor leaves the registry when its ``run`` returns (after its call record
is written); a later Connect with the same id starts a new actor, which ends
at once with ``call_gone`` if the service really ended the call.
Cancelling ``run`` stops every actor (a local call runs shielded in its one
task, ``CallActor.run_shielded``, and is told ``stop``; a leased one is
cancelled); each closes within its own ``close_deadline_s``.
"""

from __future__ import annotations

import contextvars
from dataclasses import replace
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, TypeVar

import trio

from voiceactors import voice_config, metrics, storage
from voiceactors.executor import write_log
from voiceactors.call.actor import AnswerNow, CallActor
from voiceactors.call.arrival import ArrivalKind, arrive
from voiceactors.call.call_context import LinkedContext
from voiceactors.call.protocol import EndReason
from voiceactors.call.recovery import PendingCall, find_crashed
from voiceactors.usage.daily import DailyUsage
from voiceactors.call.feed import FeedHub
from voiceactors.cluster.leases import release_quietly, run_leased
from voiceactors.cluster.call_registry import CallRegistry, Carried, Lease, LocalRegistry, RegistryDown
from voiceactors.messages import (Connect, ConnectOutcome, CountCalls, ExecutorMessage, GetDailyUsage, Subscribe,
                                         SupervisorMessage, TakeNavHints, TakeObserverActions, drain)
from voiceactors.logs import get_logger
from voiceactors.realtime import tls as client_tls
from voiceactors.settings import Settings
from voiceactors.tool_effect import WRITE
from voiceactors.tools.registry import REGISTRY, manifest
from voiceactors.agents import DEFAULT_AGENTS, CallAgents

INBOX_SIZE = 256


class CallSupervisor:
    """``api_key`` is a provider of the standard OpenAI key (default: the
    journal's voice block, then ``OPENAI_API_KEY``) or a fixed key."""

    def __init__(self, settings: Settings, executor_inbox: trio.MemorySendChannel[ExecutorMessage],
                 api_key: str | None | Callable[[], str | None] = None, *, hangup: bool = True,
                 registry: CallRegistry | None = None, answer_now: AnswerNow | None = None) -> None:
        self.settings = settings
        self._executor = executor_inbox
        self._answer_now = answer_now     # the executor's in-step answer, handed to each call
        self._api_key = api_key if api_key is not None else (lambda: voice_config.openai_api_key(settings))
        self._hangup = hangup
        self.inbox, self._receive = trio.open_memory_channel[SupervisorMessage](INBOX_SIZE)
        self.hub = FeedHub(settings.feed_retention_s, settings.feed_max_items,
                           max_per_call=settings.feed_max_subscribers_per_call,
                           max_total=settings.feed_max_subscribers)
        self.calls: dict[str, CallActor] = {}
        self.daily = DailyUsage(settings.state_dir, settings.daily_budget_usd)
        self._model = lambda: voice_config.voice_model(settings)
        self.ended: list[tuple[str, str]] = []   # (call_id, reason), most recent last; bounded
        self.log = get_logger(actor="supervisor")
        self.registry: CallRegistry = registry if registry is not None else LocalRegistry()
        self._acquiring: dict[str, trio.Event] = {}   # shared registry: a lease being asked for
        self._serving: trio.Nursery | None = None    # the calls' nursery while the inbox is served
        self._context: contextvars.Context | None = None   # the supervisor task's, for connect_now

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve the inbox until cancelled (or the inbox is closed; then wait
        for the live calls to end)."""
        await storage.run_sync(self.daily.load)
        if self._hangup:
            # made here, in a worker thread, not at the first hangup on the trio thread (tls.py)
            await client_tls.REST.get()
        try:
            async with self._calls_nursery() as nursery:
                nursery.start_soon(self.daily.run_writer)
                # before reporting started: no Connect can race the rejoin
                await self._rejoin_crashed(nursery)
                if self.registry.shared:
                    nursery.start_soon(self._take_over_orphans, nursery)
                task_status.started()
                self._serving, self._context = nursery, contextvars.copy_context()
                try:
                    async with self._receive:
                        async for message in drain(self._receive):
                            self._handle(message, nursery)
                finally:
                    self._serving = None
        finally:
            await self.daily.final_write()

    def _handle(self, message: SupervisorMessage, nursery: trio.Nursery) -> None:
        if isinstance(message, Connect) and self.registry.shared:
            nursery.start_soon(self._connect_shared, message, nursery)
        elif isinstance(message, Connect):
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

    def connect_now(self, call_id: str, context: LinkedContext | None = None) -> ConnectOutcome | None:
        """``Connect`` answered in the caller's step (the connect route's):
        the supervisor's own ``_connect``, which never awaits, run as its
        task runs it for a message from the inbox, so nothing can come
        between; no reply channel and no two scheduler turns per connect.
        It may answer before messages already in the inbox: no answer here
        depends on their order (a call id found live, or a free slot, is the
        same before or after a ``Subscribe`` or a count, and two requests
        racing for the last slot never had an order). None (send ``Connect``
        instead) while the inbox is not served (not started yet, or
        stopped) and with a shared registry (a lease to win: a task of its own)."""
        nursery, own = self._serving, self._context
        if nursery is None or own is None or self.registry.shared:
            return None
        # In the supervisor's context, not the caller's: a call's task copies
        # the context it is started from, and the request's (its request_id,
        # bound for the request's log lines) is not the call's.
        return own.run(self._connect, call_id, nursery, context=context)

    async def connect_leased(self, call_id: str, context: LinkedContext | None = None) -> ConnectOutcome | None:
        """``Connect`` with a shared registry, answered in the caller's task
        (the connect handler's, ``http/connect.py``): the lease won as the
        inbox's ``Connect`` wins it, without the message, the task per connect
        and the reply channel. Shielded, as that task was the supervisor's: a
        caller that goes away does not cut a lease's win short (every request
        in it is bounded; the HTTP server's connections end before the
        runtime stops). None (send ``Connect``) while the inbox is not served
        and without a shared registry (``connect_now`` answers there)."""
        nursery, own = self._serving, self._context
        if nursery is None or own is None or not self.registry.shared:
            return None
        with trio.CancelScope(shield=True):
            answer = await self._lease_and_connect(call_id, nursery, context=context, own=own)
        return answer

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
            if self.registry.shared:    # only if no other process took it over meanwhile
                await self._lease_and_connect(call.call_id, nursery, recovered=call.pending, context=call.context)
            else:
                self._connect(call.call_id, nursery, recovered=call.pending, context=call.context)

    def _connect(self, call_id: str, nursery: trio.Nursery, *, recovered: list[PendingCall] | None = None,
                 context: LinkedContext | None = None, lease: Lease | None = None) -> ConnectOutcome:
        """Start the actor of ``call_id`` (its transport opened as its arrival
        says: ``call/arrival.py``; a context with a caller is a phone call's,
        one with a Live session a Live call's, also at a rejoin and a takeover) unless it runs already or the process is full."""
        if call_id in self.calls:
            return ConnectOutcome.CONNECTED
        if len(self.calls) >= self.settings.max_calls:
            self.log.warning("supervisor.at_capacity", call_id=call_id, live=len(self.calls))
            if lease is not None:
                nursery.start_soon(release_quietly, self.registry, lease, self.settings.connect_timeout_s)
            return ConnectOutcome.AT_CAPACITY
        context = self._with_agents(self._pin_again(context))
        feed = self.hub.open(call_id, lease.fence if lease is not None else None)   # the fence: event ids
        fence = self.registry.fence_of(call_id) if lease is not None else None
        if lease is not None and context is not None:
            self.registry.note_context(call_id, context)    # a taker carries it on (the mirror)
        arrival = arrive(arrival_of(context), self.settings, call_id, context)
        actor = CallActor(self.settings, call_id, self._executor, self._api_key, feed, hangup=self._hangup,
                          recovered=recovered, context=context, model=_model_of(context, self._model),
                          on_cost=self.daily.add,
                          on_record=self.registry.note_record if lease is not None else None, fence=fence,
                          answer_now=self._answer_now, open_transport=arrival.open_transport,
                          hangup_path=arrival.hangup_path, acknowledges_slow_tools=not arrival.service_acknowledges)
        self.calls[call_id] = actor
        metrics.set_live_calls(len(self.calls))
        nursery.start_soon(self._run_call, actor, lease, name=f"call:{call_id}")
        self.log.debug("supervisor.call_started", call_id=call_id, live=len(self.calls))
        return ConnectOutcome.CONNECTED

    def _with_agents(self, context: LinkedContext | None) -> LinkedContext | None:
        """A rejoined or taken-over call whose record or mirror named the
        agent in charge: the journal's agents as they are now, with that one
        in charge (its session.update goes at the first connection;
        docs/agents.md § Crash recovery and takeover). The MCP sources'
        tools are not known here: a later handoff offers the journal's."""
        if context is None or context.agents is not None or context.carried_agent is None:
            return context
        try:
            agents = voice_config.agents(self.settings, REGISTRY)
        except voice_config.ConfigUnreadable:
            agents = DEFAULT_AGENTS
        style = self.settings.tool_name_style
        made = CallAgents.made(agents, manifest(style), REGISTRY, style).starting(context.carried_agent)
        return replace(context, agents=made)

    def _pin_again(self, context: LinkedContext | None) -> LinkedContext | None:
        """A rejoined or taken-over phone call that asked for a PIN (its
        carried context says so, never the PIN): locked again with the
        journal's PIN as it is now (none now: open; the config unreadable:
        locked with no PIN that opens it), so a restart never opens a line."""
        phone = context.phone if context is not None else None
        if context is None or phone is None or phone.pin is not None or not phone.pin_required:
            return context
        try:
            pin = voice_config.phone_settings(self.settings).pin
        except voice_config.ConfigUnreadable:
            return context
        return replace(context, phone=replace(phone, pin=pin, pin_required=pin is not None))

    @asynccontextmanager
    async def _calls_nursery(self) -> AsyncIterator[trio.Nursery]:
        """The nursery of the calls. When the supervisor is cancelled (or
        fails), every local call is told to stop gracefully: they run
        shielded (``CallActor.run_shielded``, no guard task per call), so the
        cancellation itself does not reach them; each closes within its
        ``close_deadline_s``. A leased call runs cancellable (``_run_leased``)."""
        async with trio.open_nursery() as nursery:
            try:
                yield nursery
            except BaseException:
                for actor in list(self.calls.values()):
                    actor.stop()
                raise

    async def _run_call(self, actor: CallActor, lease: Lease | None = None) -> None:
        reason = EndReason.ERROR
        try:
            if lease is None:
                reason = await actor.run_shielded()
            else:
                reason = await self._run_leased(actor, lease)
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

    # --- the shared registry (--redis) -----------------------------------------

    async def _connect_shared(self, message: Connect, nursery: trio.Nursery) -> None:
        _reply(message.reply, await self._lease_and_connect(message.call_id, nursery, context=message.context))

    async def _lease_and_connect(self, call_id: str, nursery: trio.Nursery, *,
                                 recovered: list[PendingCall] | None = None, context: LinkedContext | None = None,
                                 own: contextvars.Context | None = None) -> ConnectOutcome:
        """Start the call's actor if this process wins its lease (``own``:
        the supervisor's context, to start it in from another task's)."""
        def start(call_id: str, nursery: trio.Nursery, **options: Any) -> ConnectOutcome:
            if own is None:
                return self._connect(call_id, nursery, **options)
            return own.run(self._connect, call_id, nursery, **options)

        while call_id in self._acquiring:     # a duplicate Connect here waits for the first one
            await self._acquiring[call_id].wait()
        if call_id in self.calls:
            return ConnectOutcome.CONNECTED
        if len(self.calls) >= self.settings.max_calls:
            return start(call_id, nursery)      # answers at_capacity (and logs it)
        asking = self._acquiring[call_id] = trio.Event()
        lease = None
        try:
            lease = await self.registry.acquire(call_id)
            if lease is not None and lease.previous is not None:
                if recovered is None:
                    carried = await self._taken_over(lease)
                    recovered = carried.pending
                else:               # a rejoin: its own record's pending calls, the mirror's context
                    carried = await self.registry.carried(call_id)
                if carried.context is not None:     # the call's own, not this request's
                    context = carried.context
        except RegistryDown as exc:
            self.log.error("supervisor.registry_down", call_id=call_id, error=str(exc)[:120])
            if lease is not None:       # won, but the takeover's reads failed: let another try
                nursery.start_soon(release_quietly, self.registry, lease, self.settings.connect_timeout_s)
            return ConnectOutcome.REGISTRY_DOWN
        finally:
            del self._acquiring[call_id]
            asking.set()
        if lease is None:
            self.log.info("supervisor.call_held_elsewhere", call_id=call_id)
            return ConnectOutcome.CONNECTED
        return start(call_id, nursery, recovered=recovered, context=context, lease=lease)

    async def _taken_over(self, lease: Lease) -> Carried:
        """A dead holder's call as the shared mirror has it: its unsettled
        tool calls, with the shared write log's records copied into ours so
        the new actor answers an applied write from it, and its linked
        context."""
        carried = await self.registry.carried(lease.call_id)
        pending = carried.pending
        for call in pending:
            if call.effect != WRITE:
                continue
            answer = await self.registry.claim_write(lease.call_id, call.tool_call_id)
            if answer.record is not None:
                record = answer.record
                try:
                    await storage.run_sync(write_log.apply_once, self.settings.state_dir, call.tool_call_id,
                                           lambda: record)
                except OSError as exc:   # then the new actor answers it with the restart error
                    self.log.error("supervisor.take_over_record_failed", call_id=lease.call_id,
                                   tool_call_id=call.tool_call_id, error=type(exc).__name__)
        self.log.info("supervisor.take_over", call_id=lease.call_id, fence=lease.fence, pending=len(pending))
        return carried

    async def _run_leased(self, actor: CallActor, lease: Lease) -> EndReason:
        """Run the actor while its lease is kept (in this task: the registry's
        batch renews it); stopped gracefully when it is not."""
        try:
            why = await run_leased(self.registry, lease, self.settings.close_deadline_s, actor.run)
            if why is not None:
                self.log.error("supervisor.lease_lost", call_id=actor.call_id, why=why, fence=lease.fence)
        finally:
            current = self.registry.lease_of(actor.call_id) or lease     # renewed with a new token, maybe
            await release_quietly(self.registry, current, self.settings.connect_timeout_s)
        return actor.end_reason or EndReason.ERROR

    async def _take_over_orphans(self, nursery: trio.Nursery) -> None:
        """Every third of a lease: start the calls whose holder died."""
        while True:
            await trio.sleep(self.registry.ttl_s / 3)
            try:
                orphans = await self.registry.orphans()
            except RegistryDown:
                continue
            for call_id, _token in orphans:
                if call_id not in self.calls and len(self.calls) < self.settings.max_calls:
                    await self._lease_and_connect(call_id, nursery)


def _model_of(context: LinkedContext | None, default: Callable[[], str]) -> str | Callable[[], str]:
    """The model a call's usage is priced as: a Live call's, the Responses
    model it delegates to (the tokens its usage reports); else the journal's
    voice model, read when the call starts."""
    live = context.live if context is not None else None
    return live.model if live is not None and live.model else default


def arrival_of(context: LinkedContext | None) -> ArrivalKind:
    """How a call arrived: a context that names a caller is a phone call's,
    one that holds a Live session's a Live call's."""
    if context is not None and context.live is not None:
        return ArrivalKind.LIVE
    return ArrivalKind.PHONE if context is not None and context.phone is not None else ArrivalKind.BROWSER


_Answer = TypeVar("_Answer")


def _reply(reply: trio.MemorySendChannel[_Answer], value: _Answer) -> None:
    """Answer a request; an asker that gave up (closed its end) is not an error."""
    try:
        reply.send_nowait(value)
    except (trio.BrokenResourceError, trio.ClosedResourceError, trio.WouldBlock):
        if isinstance(value, trio.MemoryReceiveChannel):
            value.close()  # an orphaned feed subscription: let the feed forget it
