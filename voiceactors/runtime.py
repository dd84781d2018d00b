"""The runtime: the root nursery of the actors.

``open_runtime(settings)`` starts the BrainActor, the ToolExecutor and the
CallSupervisor in one nursery and hands back their inboxes::

    async with open_runtime(settings) as rt:
        await ask(rt.calls, lambda reply: Connect(call_id, reply), timeout=10)

Leaving the block stops them in dependency order, bounded by
``settings.shutdown_deadline_s``: first the supervisor (each CallActor, on
cancellation, sends its last outputs, closes its sideband and flushes its call
record within ``close_deadline_s``), then the executor (started writes finish,
reads answer cancelled) and the brain; then it waits for the call records'
writer to retire (its last fsyncs, when no record is live elsewhere in the
run). Whatever is still running when the deadline passes is cancelled outright. The join is shielded, so a cancelled
caller (a server shutting down) still waits for the bounded cleanup.

An actor that crashes crashes the runtime: the exception propagates out of
the ``async with`` after every other actor has been cancelled.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Mapping

import trio

from voiceactors.call.record import writer_retired
from voiceactors.messages import BrainMessage, BrainState, ConnectOutcome, ExecutorMessage, SupervisorMessage
if TYPE_CHECKING:
    from voiceactors.mcp.client.hub import McpMessage
from voiceactors.logs import get_logger
from voiceactors.settings import Settings

_log = get_logger(actor="runtime")
#: How long a stop waits for the call records' writer to retire (its last
#: fsyncs in a worker thread), within what is left of the shutdown deadline.
RECORD_WRITER_BOUND_S = 2.0


@dataclass
class _Hosted:
    """One actor's task: its own cancel scope (so the actors can be stopped in
    order) and an event set when its ``run`` has returned."""

    name: str
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    done: trio.Event = field(default_factory=trio.Event)


@dataclass
class Runtime:
    """The live actors' inboxes (send ``voiceactors.messages`` to them)."""

    settings: Settings
    brain: trio.MemorySendChannel[BrainMessage]
    tools: trio.MemorySendChannel[ExecutorMessage]
    calls: trio.MemorySendChannel[SupervisorMessage]
    nursery: trio.Nursery = field(repr=False)
    actors: dict[str, Any] = field(default_factory=dict, repr=False)
    mcp: trio.MemorySendChannel[McpMessage] | None = None    # the MCP sources' hub (docs/mcp.md)
    #: The brain's state as ``GetBrain`` (without ``start``) answers it, read
    #: in the caller's step: the BrainActor's own ``state()``, which changes
    #: nothing (the connect route's read; no ask, no scheduler turn).
    brain_now: Callable[[], BrainState] | None = field(default=None, repr=False)
    #: ``Connect`` answered in the caller's step (``CallSupervisor.connect_now``;
    #: None from it: send ``Connect``), the connect route's; None itself with a
    #: shared registry (every connect asks there: ``connect_leased``).
    connect_now: Callable[[str, Any], ConnectOutcome | None] | None = field(default=None, repr=False)
    #: With a shared registry instead: ``Connect`` answered in the caller's
    #: task (``CallSupervisor.connect_leased``: the lease's await in it; None
    #: from it: send ``Connect``), the connect handler's; None without one.
    connect_leased: Callable[[str, Any], Awaitable[ConnectOutcome | None]] | None = field(default=None, repr=False)


async def _host(hosted: _Hosted, run: Callable[..., Awaitable[None]], *,
                task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
    try:
        with hosted.scope:
            await run(task_status=task_status)
    finally:
        hosted.done.set()


def _make_actors(settings: Settings, brain_backend: Any | None,
                 mcp_env: Mapping[str, str] | None = None) -> dict[str, Any]:
    # Imported here so that importing the runtime (e.g. for the CLI's --help)
    # does not pull in every actor.
    from voiceactors.brain.actor import BrainActor
    from voiceactors.call.supervisor import CallSupervisor
    from voiceactors.executor.actor import ToolExecutor
    from voiceactors.mcp.client.hub import McpHub
    from voiceactors.tools.handler_context import ToolContext

    from voiceactors.cluster.brain_flight import make_flight
    from voiceactors.cluster.call_registry import make_registry

    registry = make_registry(settings)
    shared = registry if registry.shared else None     # no Redis: the actors as they always were
    mcp = McpHub(settings, env=mcp_env)
    executor = ToolExecutor(settings, ToolContext.from_settings(settings), remote=mcp, cluster=shared)
    actors: dict[str, Any] = {"registry": shared} if shared is not None else {}
    actors.update(mcp=mcp, brain=BrainActor(settings, brain_backend, flight=make_flight(settings)), tools=executor,
                  calls=CallSupervisor(settings, executor.inbox, registry=shared,
                                       answer_now=executor.answer_now))
    if shared is not None:
        actors["feed"] = _shared_feed(settings)
        actors["calls"].hub.sink = actors["feed"]
        actors["daily_total"] = _daily_total(settings, actors["calls"].daily)
    return actors


def _shared_feed(settings: Settings) -> Any:
    from voiceactors.cluster.shared_feed import SharedFeed

    return SharedFeed(settings.redis_url or "", max_len=settings.feed_stream_max_len,
                      retention_s=settings.feed_retention_s, max_items=settings.feed_max_items,
                      max_duration_s=settings.call_max_duration_s,
                      max_per_call=settings.feed_max_subscribers_per_call, max_total=settings.feed_max_subscribers)


def _daily_total(settings: Settings, usage: Any) -> Any:
    from voiceactors.usage.cluster_total import DailyTotal

    return DailyTotal(settings.redis_url or "", usage)     # the daily budget for the cluster


async def _stop(hosted: list[_Hosted], deadline_s: float) -> None:
    """Cancel the actors in ``hosted`` order, each after the previous one has
    finished, all within ``deadline_s``."""
    with trio.move_on_after(deadline_s, shield=True) as bound:
        for item in hosted:
            item.scope.cancel()
            await item.done.wait()
    if bound.cancelled_caught:
        _log.warning("runtime.shutdown_deadline_passed", deadline_s=deadline_s,
                     unfinished=[h.name for h in hosted if not h.done.is_set()])
    for item in hosted:
        item.scope.cancel()


@contextlib.asynccontextmanager
async def open_runtime(settings: Settings, *, brain_backend: Any | None = None,
                       mcp_env: Mapping[str, str] | None = None) -> AsyncIterator[Runtime]:
    """Start the three actors; yield their inboxes; stop them (bounded) on exit.

    ``brain_backend`` overrides the BrainActor's backend (None: the actor
    chooses from the journal's ``voice.brain`` setting); ``mcp_env``: where
    the MCP sources' ``token_env`` names are looked up (None: the process's
    environment).
    """
    actors = _make_actors(settings, brain_backend, mcp_env)
    # Start order: the cluster registry, shared feed and daily total (with --redis), the MCP sources,
    # brain and executor before the supervisor that feeds the executor; stop
    # order is the reverse (the supervisor releases its leases before the
    # registry goes).
    order = [name for name in ("registry", "feed", "daily_total", "mcp", "brain", "tools", "calls") if name in actors]
    hosted = {name: _Hosted(name) for name in order}
    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        for name in order:
            await nursery.start(_host, hosted[name], actors[name].run)
        _log.info("runtime.started", duration_ms=round((trio.current_time() - started) * 1000, 1))
        try:
            yield Runtime(settings=settings, brain=actors["brain"].inbox, tools=actors["tools"].inbox,
                          calls=actors["calls"].inbox, nursery=nursery, actors=actors, mcp=actors["mcp"].inbox,
                          brain_now=actors["brain"].state,
                          # with a shared registry a connect always asks (a lease to win in a task): none
                          connect_now=actors["calls"].connect_now if "registry" not in actors else None,
                          connect_leased=actors["calls"].connect_leased if "registry" in actors else None)
        finally:
            stopping = trio.current_time()
            await _stop([hosted[name] for name in reversed(order)], settings.shutdown_deadline_s)
            left_s = settings.shutdown_deadline_s - (trio.current_time() - stopping)
            await writer_retired(max(0.0, min(left_s, RECORD_WRITER_BOUND_S)))
            _log.info("runtime.stopped", duration_ms=round((trio.current_time() - stopping) * 1000, 1))
