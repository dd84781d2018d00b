"""ToolExecutor: runs the model's tool calls safely under timeouts, barge-in and retries.

Call actors send ``ToolRequest`` and ``CancelReads`` to ``inbox``. Every
request runs in its own task of the executor's nursery; reads under one
global ``CapacityLimiter(settings.tool_concurrency)`` (except a reusable read
answered from memory, rule 4), writes under ``storage.write_limiter()``; each
gets exactly one ``ToolResult`` on its ``reply``
channel (if that channel is closed because the call ended, the result is
logged and dropped).

Rules, in the order a request meets them:

1. A write whose tool call id is already recorded answers the recorded output
   (outcome ``replayed``) without running again and without counting toward
   the turn. With a shared registry (``--redis``) the id is claimed in the
   cluster's write log first; one claimed by a run still applying it, here
   or on another process, waits for that run's record and answers it the
   same way (``_claim_shared``).
2. Turn bounds (per call id and turn): at most ``tool_calls_per_turn``
   attempts; an identical call (canonical name + canonical JSON arguments)
   under a different tool call id is rejected. The same tool call id again is
   a retry, not a new attempt.
3. Unknown tool, bad JSON, non-object and schema failures answer the
   registry's error objects (outcome ``invalid``). A tool of an MCP source
   has its arguments checked within a budget (``tools/schema_bounds.py``),
   past which it answers ``ARGUMENTS_TOO_COSTLY``.
4. The handler runs in a worker thread. Reads: bounded by
   ``tool_timeout_read_s`` (``{"error": "tool timed out"}``) and cancellable by
   ``CancelReads`` (``{"error": "cancelled"}``). Writes: never cancelled once
   started (shielded); the check-apply-record step runs in the thread under
   the write log's lock, so the record is durable before the result is
   reported. A write still running at ``tool_timeout_write_s`` answers
   ``tool timed out`` while its thread finishes and records the real outcome,
   which a retry with the same id then gets. Writes hold their own limiter
   (``storage.write_limiter()``), never the reads' ones, and wait for a
   journal file's lock at most ``ctx.journal_lock_timeout_s``: then they
   answer ``JOURNAL_BUSY`` (outcome ``busy``), with nothing applied and
   nothing recorded.
   A *reusable* read (``ToolSpec.reusable``: the answer depends only on the
   journal, today and the arguments) that answered ``ok`` less than
   ``tool_reuse_s`` ago — counted from when that run started — is answered
   again from memory, in the executor's own task: no worker thread, no
   limiter, no task of its own; while its next run is in flight, requests
   for the same read wait for that run instead of starting their own. Any
   write we apply forgets every kept answer. A call actor may ask for a
   fresh kept answer in its own step (``answer_now``): the same rules, run
   synchronously, with no hop through the inbox.
5. Any exception answers ``{"error": "tool failed"}``; the detail goes to the
   log only.
6. ``_nav_target`` / ``_observer_action`` (and any other ``_``-key) are removed
   from the output and returned as ``client_events``. Outputs are capped at
   ``tool_output_cap`` characters, and read outputs within a turn share
   ``turn_output_cap``; a cut output is still one JSON object that says so.

Cancellation: cancelling ``run`` cancels unfinished reads (they answer
``cancelled``) and writes not yet started; started writes finish first.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Mapping

import trio

from voiceactors import metrics, storage, tracing
from voiceactors.executor import write_log
from voiceactors.mcp.client import execution as mcp_execution
from voiceactors.call.state import ToolOutcome
from voiceactors.cluster.call_registry import CallRegistry, RegistryDown, WriteClaim
from voiceactors.messages import CancelReads, ExecutorMessage, ToolRequest, ToolResult, drain
from voiceactors.logs import get_logger
from voiceactors.realtime.events import clip
from voiceactors.settings import Settings
from voiceactors.tools import schema_bounds
from voiceactors.tools.handler_context import ToolContext
from voiceactors.tools.select_tool import fill_from_selection
from voiceactors.tools.registry import (
    REGISTRY,
    WRITE,
    ArgumentError,
    ToolSpec,
    canonical_parsed,
    canonical_unparsed,
    lookup,
    parse_arguments,
    without_nulls,
    validate,
)

if TYPE_CHECKING:
    from voiceactors.mcp.client.hub import McpHub

_log = get_logger(actor="tools")

# Error objects the executor itself answers (the registry owns the argument ones).
UNKNOWN_TOOL = {"error": "unknown tool"}
TIMED_OUT = {"error": "tool timed out"}
FAILED = {"error": "tool failed"}
CANCELLED = {"error": "cancelled"}
TOO_MANY_CALLS = {"error": "too many tool calls this turn; answer with what you have"}
DUPLICATE_CALL = {"error": "duplicate call: this tool was already called with the same arguments this turn"}
TURN_OUTPUT_FULL = {"error": "turn output limit reached; answer with what you have"}
OUTPUT_TOO_LARGE = {"error": "output too large"}
ARGUMENTS_TOO_COSTLY = {"error": "invalid arguments: too costly to check against the tool's schema"}
JOURNAL_BUSY = {"error": "journal busy: another program holds the file; nothing was changed, try again"}
# the shared write log's refusals (--redis; docs/operations.md § Scaling out)
SHARED_LOG_DOWN = {"error": "shared write log unreachable; nothing was changed, try again"}
NOT_HOLDER = {"error": "this server no longer holds the call; nothing was changed"}
WRITE_ELSEWHERE = {"error": "another server started this write and its outcome is unknown; it is not applied again"}

#: Outcomes of a run whose answer holds for the same request made meanwhile
#: (and, for ``ok``, for a while after: ``FRESH_KEPT``): what the journal said.
SHARED_OUTCOMES = frozenset({ToolOutcome.OK, ToolOutcome.ERROR})

PEER_ID_LOG_MAX = 64        # peer-sent ids and names are clipped in log lines
TOOL_NAME_LOG_MAX = 128
TRUNCATED_NOTE = "output exceeded the size limit; partial is the beginning of the JSON text"
TURNS_KEPT = 4096          # (call_id, turn) bound states remembered, oldest evicted
REPLY_DEADLINE_S = 5.0     # how long a full reply channel may hold up a result
FRESH_KEPT = 256           # reusable answers kept (distinct tool + arguments + day)
# A write claimed in the shared log by another run (another process, or a
# duplicate here) is waited for until its record is there: polled from the
# first to the last pause, doubling; at most the write's own deadline less
# the margin (one more claim request's bound and its answer), at most the cap
# when that deadline is unbounded
CLAIMED_POLL_S = (0.01, 0.25)
CLAIMED_WAIT_MARGIN_S = 2.5
CLAIMED_WAIT_MAX_S = 60.0


def observe_result(result: ToolResult) -> None:
    """The one place a finished run is observed (outcome, latency) for
    metrics. Called once per reply, from the trio thread; never raises."""
    metrics.tool_finished(result.tool, result.outcome, result.duration_ms / 1000.0)


@dataclass
class _Run:
    """What a request produced, before the turn budget and the reply."""

    output: str
    outcome: ToolOutcome
    client_events: tuple[dict[str, Any], ...] = ()
    truncated: bool = False
    budgeted: bool = True     # read outputs share the turn budget; writes and error objects are never cut


@dataclass
class _Turn:
    calls: dict[str, str] = field(default_factory=dict)   # tool_call_id -> call key
    chars: int = 0


def _dumps(obj: object) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _error(obj: dict[str, Any], outcome: ToolOutcome) -> _Run:
    return _Run(output=_dumps(obj), outcome=outcome, budgeted=False)


def cap_output(text: str, limit: int) -> str | None:
    """``text`` if it fits in ``limit`` characters, else one JSON object
    ``{"truncated": true, "note", "original_chars", "partial": <prefix>}`` of
    at most ``limit`` characters; None when not even an empty envelope fits."""
    if len(text) <= limit:
        return text
    envelope = {"truncated": True, "note": TRUNCATED_NOTE, "original_chars": len(text), "partial": ""}
    room = limit - len(_dumps(envelope))
    if room < 0:
        return None
    prefix = text[:room]
    while True:  # escaping may lengthen the prefix; shrink by the excess until it fits
        envelope["partial"] = prefix
        out = _dumps(envelope)
        excess = len(out) - limit
        if excess <= 0:
            return out
        prefix = prefix[: max(0, len(prefix) - excess)]


def shape(raw: object, cap: int) -> _Run:
    """A handler's dict as model-facing output plus client events. Keys
    starting with ``_`` never reach the model. TypeError for a non-dict."""
    if not isinstance(raw, dict):
        raise TypeError(f"handler returned {type(raw).__name__}, not dict")
    events: list[dict[str, Any]] = []
    nav = raw.get("_nav_target")
    if isinstance(nav, str) and nav:
        events.append({"type": "nav_hint", "target": nav})
    action = raw.get("_observer_action")
    if isinstance(action, dict):
        events.append({"type": "observer_action", "action": dict(action)})
    body = {k: v for k, v in raw.items() if not (isinstance(k, str) and k.startswith("_"))}
    text = _dumps(body)
    output = cap_output(text, cap)
    if output is None:
        return _error(OUTPUT_TOO_LARGE, ToolOutcome.ERROR)
    is_error = set(body) == {"error"}
    return _Run(output=output, outcome=ToolOutcome.ERROR if is_error else ToolOutcome.OK,
                client_events=tuple(events), truncated=output is not text, budgeted=not is_error)


FreshKey = tuple[str, str, str]     # (tool, canonical arguments, today)


@dataclass(frozen=True)
class _Resolved:
    """A request resolved once, when it arrives: its spec (None: unknown
    tool), the name it is reported under, its canonical arguments (the turn's
    duplicate check and the reuse key), and its parsed arguments or the
    registry's error object for them. Every later step reads these."""

    req: ToolRequest
    spec: ToolSpec | None
    tool: str
    canonical: str
    args: dict[str, Any] | None          # None when they did not parse: see ``args_error``
    args_error: dict[str, Any] | None
    fresh_key: FreshKey | None           # set for a reusable read while reuse is on

    @property
    def is_write(self) -> bool:
        return self.spec is not None and self.spec.effect == WRITE


@dataclass
class _Flight:
    """A reusable read in flight: when it started, and who waits for it."""

    started: float
    waiters: list[tuple[_Resolved, float]] = field(default_factory=list)


class ToolExecutor:
    """See the module docstring. ``registry`` is replaceable (tests register
    their own tools); ``on_result`` observes every reply (metrics);
    ``remote`` holds the tools of MCP sources (``mcp/client/hub.py``; None: ours only)."""

    def __init__(self, settings: Settings, ctx: ToolContext, registry: Mapping[str, ToolSpec] = REGISTRY,
                 on_result: Callable[[ToolResult], None] = observe_result, remote: McpHub | None = None,
                 cluster: CallRegistry | None = None):
        self.settings = settings
        self.remote = remote
        # with --redis: the shared write log (a write is claimed there, fenced, before it applies)
        self.cluster = cluster
        self.ctx = ctx
        self.registry = registry
        self.on_result = on_result
        self.inbox, self._receive = trio.open_memory_channel[ExecutorMessage](max(1, settings.tool_concurrency))
        self._limiter = trio.CapacityLimiter(max(1, settings.tool_concurrency))
        self._turns: OrderedDict[tuple[str, int], _Turn] = OrderedDict()
        # call_id -> {cancel scope: (epoch, tool call id)} of reads not yet answered
        self._reads: dict[str, dict[trio.CancelScope, tuple[int, str]]] = {}
        # (tool, canonical arguments, today) -> (run started at, its answer)
        self._fresh: OrderedDict[FreshKey, tuple[float, _Run]] = OrderedDict()
        self._writes_applied = 0   # a read that saw a write start under it is not kept
        # key -> the run of a reusable read in flight and the requests waiting for it
        self._flights: dict[FreshKey, _Flight] = {}
        self._nursery: trio.Nursery | None = None
        self._serving = False      # run() is taking requests: answer_now may answer

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve the inbox until it is closed or this task is cancelled;
        returns once every request in flight has been answered."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            async with self._receive, self._answering_now():
                async for message in drain(self._receive):
                    if isinstance(message, ToolRequest):
                        resolved = self._resolve(message)
                        # counted here, in arrival order: the calls of one
                        # response reach us in the model's order, and the
                        # bound and duplicate check must not depend on how
                        # the tasks that serve them get scheduled
                        admission = self._admit(resolved)
                        if not self._answer_shared(resolved, admission):
                            nursery.start_soon(self._serve, resolved, self._scope_for(resolved), admission)
                    elif isinstance(message, CancelReads):
                        self._cancel_reads(message)
                    else:
                        _log.warning("tool.unknown_message", kind=type(message).__name__)

    @contextlib.asynccontextmanager
    async def _answering_now(self) -> AsyncIterator[None]:
        """``answer_now`` answers only while the inbox is served."""
        self._serving = True
        try:
            yield
        finally:
            self._serving = False

    def answer_now(self, req: ToolRequest, later: list[Callable[[], None]] | None = None) -> ToolResult | None:
        """Answer ``req`` at once, in the caller's step, when it is a
        reusable read whose kept answer is fresh (rule 4); None otherwise,
        with nothing counted: the caller then sends it to ``inbox``.

        ``later``: the report of an answer (its ``tool.run`` line and
        metrics, ``_reported``) is appended to it instead of made at once;
        the caller runs it after writing what the answer lets it send (the
        call actor's reader: after the output's write, or at the end of the
        socket read), so the line costs the output's path nothing. The line
        and its fields are the same; only its timestamp is later.

        The call actor's in-step answer: the executor's own code,
        state and rules, run synchronously by the caller's task instead of
        by the executor's after a hop through the inbox; it never awaits, so
        no other request comes between. Every rule of the inbox path holds:
        the turn's count and identical-call check (``_admit``), the turn's
        output budget (``_spend``), the ``tool.run`` line and the metrics
        (``_reported``); only the reply channel is not used. Arrival order is the
        caller's to keep: it asks only when none of its requests is still on
        its way through the inbox (``CallActor._start_tool``)."""
        if not self._serving or self.settings.tool_reuse_s <= 0:
            return None
        spec = lookup(req.name, self.registry)
        if spec is None or not spec.reusable:
            return None   # before parsing anything: the inbox path resolves it once
        res = self._resolve(req)
        key = res.fresh_key
        if key is None:
            return None
        now = trio.current_time()
        kept = self._fresh.get(key)
        if kept is None or now - kept[0] >= self.settings.tool_reuse_s:
            return None   # stale, or never run: the inbox path runs it (or waits for its flight)
        rejection = self._admit(res)
        result, run = self._result(res, rejection or kept[1], now)
        if later is None:
            self._reported(req, result, run, True, reused=True)
        else:
            later.append(functools.partial(self._reported, req, result, run, True, reused=True))
        return result

    # --- resolution -----------------------------------------------------------

    def _resolve(self, req: ToolRequest) -> _Resolved:
        """Look the tool up and parse the arguments, once per request."""
        spec = lookup(req.name, self.registry)
        if spec is None and self.remote is not None:
            spec = self.remote.lookup(req.call_id, req.name)
        try:
            parsed = parse_arguments(req.arguments)
            if spec is not None and spec.remote is None:
                parsed = without_nulls(spec, parsed)      # our schemas: a null is "left out"
            if spec is not None and req.selection is not None:
                parsed = fill_from_selection(spec, parsed, req.selection)   # "this day / this person"
            args: dict[str, Any] | None = parsed
            args_error = None
        except ArgumentError as exc:
            args, args_error = None, exc.error
        canonical = canonical_parsed(args) if args is not None else canonical_unparsed(req.arguments)
        fresh_key = None
        if (spec is not None and spec.reusable and spec.effect != WRITE
                and self.settings.tool_reuse_s > 0):
            fresh_key = (spec.name, canonical, self.ctx.today().isoformat())
        return _Resolved(req, spec, spec.name if spec else str(req.name), canonical, args,
                         args_error, fresh_key)

    # --- cancellation ---------------------------------------------------------

    def _scope_for(self, res: _Resolved) -> trio.CancelScope:
        # Registered before the task starts, so a CancelReads right behind
        # the request still reaches it. Writes are never registered.
        scope = trio.CancelScope()
        if not res.is_write:
            self._reads.setdefault(res.req.call_id, {})[scope] = (res.req.epoch, res.req.tool_call_id)
        return scope

    def _forget(self, req: ToolRequest, scope: trio.CancelScope) -> None:
        reads = self._reads.get(req.call_id)
        if reads is not None:
            reads.pop(scope, None)
            if not reads:
                del self._reads[req.call_id]

    def _cancel_reads(self, msg: CancelReads) -> None:
        for scope, (epoch, tool_call_id) in list(self._reads.get(msg.call_id, {}).items()):
            if msg.before_epoch is None or (epoch < msg.before_epoch and tool_call_id not in msg.keep):
                scope.cancel()

    # --- reusable reads ---------------------------------------------------------

    def _answer_shared(self, res: _Resolved, rejection: _Run | None) -> bool:
        """Answer ``req`` from a kept answer if there is a fresh one, or wait
        for the run of the same read already in flight if it started less
        than ``tool_reuse_s`` ago (the turn bounds apply either way).
        Synchronous: True when answered or waiting.

        Waiting matters under load: when a kept answer expires, every request
        arriving while its next run is in flight would otherwise start a
        worker thread of its own, which slows that run, which lets more
        requests in — a collapse seen at 750 calls."""
        key = res.fresh_key
        if key is None:
            return False
        now = trio.current_time()
        kept = self._fresh.get(key)
        flight = self._flights.get(key)
        if kept is not None and now - kept[0] < self.settings.tool_reuse_s:
            self._answer(res, rejection or kept[1], now, reused=True)
        elif flight is not None and now - flight.started < self.settings.tool_reuse_s:
            if rejection is not None:
                self._answer(res, rejection, now)
            else:
                flight.waiters.append((res, now))
        else:
            return False
        return True

    def _answer(self, res: _Resolved, run: _Run, started: float, reused: bool = False) -> None:
        """Reply now, from whichever executor task has the answer; a full
        (shared) reply channel is waited for in a task of its own."""
        result, run = self._result(res, run, started)
        delivered = self._try_deliver(res.req, result)
        if delivered is None:
            assert self._nursery is not None
            self._nursery.start_soon(self._deliver_late, res.req, result, run)
        else:
            self._reported(res.req, result, run, delivered, reused=reused)

    def _land(self, key: FreshKey, run: _Run | None, shared: bool) -> None:
        """The leading run of a flight ended: its waiters get its answer if
        it holds for them (it answered, and no write of ours overtook it),
        else each runs on its own (as a retry of itself)."""
        for waiter, arrived in self._flights.pop(key).waiters:
            if shared and run is not None:
                self._answer(waiter, run, arrived, reused=True)
            else:
                assert self._nursery is not None
                self._nursery.start_soon(self._serve, waiter, self._scope_for(waiter), None)   # admitted to wait

    def _keep(self, key: FreshKey | None, run: _Run, started: float) -> None:
        if key is None or run.outcome != ToolOutcome.OK:
            return
        self._fresh[key] = (started, run)
        self._fresh.move_to_end(key)
        while len(self._fresh) > FRESH_KEPT:
            self._fresh.popitem(last=False)

    # --- one request ------------------------------------------------------------

    async def _serve(self, res: _Resolved, scope: trio.CancelScope, rejection: _Run | None) -> None:
        # the request's span, under the one it carried (tracing on): its phases and lines hang from it
        with tracing.span("tool.execute", res.req.trace, tool=res.tool, tool_call_id=res.req.tool_call_id,
                          effect="write" if res.is_write else "read"):
            await self._serve_request(res, scope, rejection)

    async def _serve_request(self, res: _Resolved, scope: trio.CancelScope, rejection: _Run | None) -> None:
        started = trio.current_time()
        writes_before = self._writes_applied
        req, key = res.req, res.fresh_key
        leading = key is not None and key not in self._flights
        if leading:
            assert key is not None
            self._flights[key] = _Flight(started)   # later requests for it wait (_answer_shared)
        run: _Run | None = None
        shared = False   # its answer holds for the requests that waited for it
        try:
            with scope:
                run = await self._handle(res, rejection)
            if scope.cancelled_caught:
                run = _error(CANCELLED, ToolOutcome.CANCELLED)
            elif run is not None and writes_before == self._writes_applied and run.outcome in SHARED_OUTCOMES:
                shared = True
                self._keep(key, run, started)
        except trio.Cancelled:   # the executor itself is shutting down
            run = _error(CANCELLED, ToolOutcome.CANCELLED)
            raise
        except Exception as exc:
            _log.error("tool.failed", call_id=req.call_id, tool=res.tool,
                       tool_call_id=req.tool_call_id, error=type(exc).__name__, exc_info=True)
            run = _error(FAILED, ToolOutcome.FAILED)
        finally:
            self._forget(req, scope)
            if leading:
                assert key is not None
                self._land(key, run, shared)
            self._answer(res, run or _error(FAILED, ToolOutcome.FAILED), started)

    async def _handle(self, res: _Resolved, rejection: _Run | None) -> _Run:
        """Run one request; ``rejection`` is the turn's verdict taken at its
        arrival (``_admit``; None: admitted)."""
        req, spec = res.req, res.spec
        if res.is_write:
            recorded = await storage.run_sync(write_log.load, self.ctx.state_dir, req.tool_call_id)
            if recorded is not None:
                return self._replayed(recorded)
        if rejection is not None:
            return rejection
        if spec is None:
            return _error(UNKNOWN_TOOL, ToolOutcome.INVALID)
        if res.args is None:
            return _error(res.args_error or FAILED, ToolOutcome.INVALID)
        if spec.remote is not None:
            return await self._remote(req, spec, res.args)
        invalid = validate(spec, res.args)
        if invalid is not None:
            return _error(invalid, ToolOutcome.INVALID)
        if res.is_write:
            return await self._write(req, spec, res.args)
        return await self._read(spec, res.args)

    def _admit(self, res: _Resolved) -> _Run | None:
        """Count the attempt against its turn; a rejection when over the
        bound or identical to an earlier call of the turn."""
        req = res.req
        key = f"{res.tool}\n{res.canonical}"
        turn = self._turn(req.call_id, req.turn)
        if req.tool_call_id in turn.calls:
            return None     # a retry of the same call, not a new attempt
        if len(turn.calls) >= self.settings.tool_calls_per_turn:
            return _error({**TOO_MANY_CALLS, "limit": self.settings.tool_calls_per_turn}, ToolOutcome.REJECTED)
        duplicate = key in turn.calls.values()
        turn.calls[req.tool_call_id] = key
        return _error(DUPLICATE_CALL, ToolOutcome.REJECTED) if duplicate else None

    def _turn(self, call_id: str, number: int) -> _Turn:
        key = (call_id, number)
        turn = self._turns.get(key)
        if turn is None:
            turn = self._turns[key] = _Turn()
            while len(self._turns) > TURNS_KEPT:
                self._turns.popitem(last=False)
        else:
            self._turns.move_to_end(key)
        return turn

    async def _read(self, spec: ToolSpec, args: dict[str, Any]) -> _Run:
        with trio.move_on_after(self.settings.tool_timeout_read_s):
            with tracing.span("tool.queue"):
                await self._limiter.acquire()
            try:
                with tracing.span("tool.run"):
                    raw = await storage.run_sync(spec.handler, self.ctx, args)
            finally:
                self._limiter.release()
            return shape(raw, self.settings.tool_output_cap)
        return _error(TIMED_OUT, ToolOutcome.TIMEOUT)

    async def _write(self, req: ToolRequest, spec: ToolSpec, args: dict[str, Any]) -> _Run:
        timeout = self.settings.tool_timeout_write_s
        deadline = trio.current_time() + timeout if math.isfinite(timeout) else math.inf
        # Writes have their own limiter, never the reads' (self._limiter) nor
        # storage's shared one: a write stuck on a journal lock must not hold
        # a slot that reads, key lookups or call records need.
        limiter = storage.write_limiter()
        with trio.move_on_at(deadline) as waiting, tracing.span("tool.queue"):
            await limiter.acquire()   # not started yet: shutdown may still cancel it
        if waiting.cancelled_caught:
            return _error(TIMED_OUT, ToolOutcome.TIMEOUT)
        try:
            # Started: only our own deadline reaches inside. On it the thread
            # is left to finish; it records the real outcome itself.
            with trio.CancelScope(shield=True, deadline=deadline) as running:
                refused = await self._claim_shared(req, deadline) if self.cluster is not None else None
                if refused is not None:
                    return refused
                try:
                    with tracing.span("tool.write"):
                        record, replayed = await storage.run_in_write_slot(self._apply_write, req, spec, args,
                                                                           self._replace_guard(req))
                except storage.LockTimeout:
                    if self.cluster is not None:        # nothing applied: its retry, anywhere, applies it
                        await self._unclaim_shared(req)
                    raise
                if self.cluster is not None and not replayed:
                    await self._record_shared(req, record)
        except storage.Fenced:
            # the lease may have expired while the write waited (a paused holder):
            # the journal file was left as it was, the shared claim stays unfinished
            _log.error("tool.write_fenced", call_id=req.call_id, tool_call_id=req.tool_call_id)
            return _error(NOT_HOLDER, ToolOutcome.REJECTED)
        except storage.LockTimeout as exc:
            # nothing applied, nothing recorded: a retry with the same id tries again
            _log.warning("tool.write_lock_busy", call_id=req.call_id, tool=spec.name,
                         tool_call_id=req.tool_call_id, file=exc.path.name, timeout_s=exc.timeout_s)
            return _error(JOURNAL_BUSY, ToolOutcome.BUSY)
        finally:
            limiter.release()
            self._writes_applied += 1
            self._fresh.clear()   # the journal may have changed under every kept answer
        if running.cancelled_caught:
            _log.warning("tool.write_overran", call_id=req.call_id, tool=spec.name,
                         tool_call_id=req.tool_call_id, timeout_s=timeout)
            return _error(TIMED_OUT, ToolOutcome.TIMEOUT)
        if replayed:
            return self._replayed(record)
        return _Run(output=record["output"], outcome=ToolOutcome(record["outcome"]),
                    client_events=tuple(record.get("client_events") or ()), budgeted=False)

    async def _remote(self, req: ToolRequest, spec: ToolSpec, args: dict[str, Any]) -> _Run:
        """A tool of an MCP source: its arguments checked against the source's
        schema within a budget, away from the trio thread unless it is short
        (``schema_bounds``: the schema is the source's to write);
        ``mcp_execution`` has its rules; the caps are ours."""
        assert self.remote is not None
        try:
            raw_chars = len(req.arguments) if isinstance(req.arguments, str) else schema_bounds.INLINE_ARGUMENTS + 1
            invalid = await schema_bounds.check_arguments(raw_chars, validate, spec, args)
        except schema_bounds.TooCostly:
            return _error(ARGUMENTS_TOO_COSTLY, ToolOutcome.INVALID)
        if invalid is not None:
            return _error(invalid, ToolOutcome.INVALID)

        def render(body: dict[str, Any]) -> str:
            return cap_output(_dumps(body), self.settings.tool_output_cap) or _dumps(OUTPUT_TOO_LARGE)

        with tracing.span("tool.run"):
            done = await mcp_execution.run(self.remote, self.ctx.state_dir, req, spec, args, render)
        return _Run(output=done.output, outcome=done.outcome, budgeted=done.budgeted,
                    truncated=done.output.startswith('{"truncated":true'))

    def _replace_guard(self, req: ToolRequest) -> Callable[[], bool] | None:
        """For a leased call's write: the check its journal replace makes
        first (from the worker thread, on trio's clock: a process paused
        past its lease finds the fence passed when it wakes)."""
        if self.cluster is None or not req.fenced_by_call or req.call_id is None:
            return None
        fence = self.cluster.fence_of(req.call_id)
        if fence is None:
            return None
        allows = fence.allows

        def allowed() -> bool:
            try:
                return trio.from_thread.run_sync(allows)
            except (RuntimeError, trio.RunFinishedError):    # trio is gone: act on nothing
                return False

        return allowed

    def _apply_write(self, req: ToolRequest, spec: ToolSpec, args: dict[str, Any],
                     guard: Callable[[], bool] | None = None) -> tuple[dict[str, Any], bool]:
        """Worker thread: check, apply and record under the write log lock;
        ``guard`` fences the tool's own journal replace (not our record)."""

        def apply() -> dict[str, Any]:
            token = storage.replace_guard.set(guard)
            try:
                result = spec.handler(self.ctx, args)
            finally:
                storage.replace_guard.reset(token)
            run = shape(result, self.settings.tool_output_cap)
            return {"tool": spec.name, "call_id": req.call_id, "outcome": run.outcome,
                    "output": run.output, "client_events": list(run.client_events)}

        return write_log.apply_once(self.ctx.state_dir, req.tool_call_id, apply)

    async def _claim_shared(self, req: ToolRequest, deadline: float) -> _Run | None:
        """Claim the write in the shared log (one Lua step: not recorded, not
        claimed, and this process holds the call's current lease); None when
        it is ours to apply, else the answer instead of applying. Claimed by
        another run still applying it: its record is waited for (the same
        answer a duplicate on one process gets from the local log's lock),
        the claim asked again until it is there, or the claim given back
        (that run applied nothing: ours to apply), or the wait's bound
        (``_claimed_wait_until``): only then is the outcome unknown."""
        assert self.cluster is not None
        call_id = req.call_id if req.fenced_by_call else None
        try:
            answer = await self.cluster.claim_write(call_id, req.tool_call_id)
            until = self._claimed_wait_until(deadline)
            pause = CLAIMED_POLL_S[0]
            while answer.state == WriteClaim.TAKEN and answer.record is None and trio.current_time() + pause < until:
                await trio.sleep(pause)
                pause = min(pause * 2, CLAIMED_POLL_S[1])
                answer = await self.cluster.claim_write(call_id, req.tool_call_id)
        except RegistryDown:
            _log.error("tool.shared_log_down", call_id=req.call_id, tool_call_id=req.tool_call_id)
            return _error(SHARED_LOG_DOWN, ToolOutcome.BUSY)
        if answer.state == WriteClaim.CLAIMED:
            return None
        if answer.state == WriteClaim.STALE:
            _log.error("tool.write_fenced", call_id=req.call_id, tool_call_id=req.tool_call_id)
            return _error(NOT_HOLDER, ToolOutcome.REJECTED)
        if answer.record is not None:
            return self._replayed(answer.record)
        return _error(WRITE_ELSEWHERE, ToolOutcome.RESTARTED)

    @staticmethod
    def _claimed_wait_until(deadline: float) -> float:
        """Until when a write claimed by another run is waited for: its
        record can come while the write's own deadline allows one more
        claim request (a claim request is never cut short: one Redis ran
        would leave a claim nobody applies)."""
        return min(deadline, trio.current_time() + CLAIMED_WAIT_MAX_S) - CLAIMED_WAIT_MARGIN_S

    async def _unclaim_shared(self, req: ToolRequest) -> None:
        """Give the shared claim back (the write applied nothing); a Redis
        that fails here leaves it, and the retry answers the unknown
        outcome as before."""
        assert self.cluster is not None
        try:
            await self.cluster.unclaim_write(req.call_id if req.fenced_by_call else None, req.tool_call_id)
        except RegistryDown:
            _log.error("tool.shared_record_failed", call_id=req.call_id, tool_call_id=req.tool_call_id)

    async def _record_shared(self, req: ToolRequest, record: dict[str, Any]) -> None:
        """The applied write's record into the shared log (the local file has
        it already); a Redis that fails here leaves the claim, so another
        process answers the unknown-outcome error, never a second apply."""
        assert self.cluster is not None
        try:
            await self.cluster.record_write(req.tool_call_id, record)
        except RegistryDown:
            _log.error("tool.shared_record_failed", call_id=req.call_id, tool_call_id=req.tool_call_id)

    @staticmethod
    def _replayed(record: dict[str, Any]) -> _Run:
        events = record.get("client_events")
        return _Run(output=record["output"], outcome=ToolOutcome.REPLAYED,
                    client_events=tuple(events) if isinstance(events, list) else (), budgeted=False)

    # --- the reply --------------------------------------------------------------

    def _spend(self, req: ToolRequest, run: _Run) -> _Run:
        """Charge the output to its turn; cut a read output that would go
        over the turn's budget."""
        turn = self._turn(req.call_id, req.turn)
        left = self.settings.turn_output_cap - turn.chars
        if run.budgeted and len(run.output) > left:
            output = cap_output(run.output, max(0, left))
            if output is None:
                run = _error(TURN_OUTPUT_FULL, ToolOutcome.REJECTED)
            else:
                run = _Run(output=output, outcome=run.outcome, client_events=run.client_events,
                           truncated=True, budgeted=True)
        turn.chars += len(run.output)
        return run

    def _result(self, res: _Resolved, run: _Run, started: float) -> tuple[ToolResult, _Run]:
        req = res.req
        run = self._spend(req, run)
        result = ToolResult(
            call_id=req.call_id, tool_call_id=req.tool_call_id,
            tool=res.tool, output=run.output, outcome=run.outcome,
            epoch=req.epoch, duration_ms=round((trio.current_time() - started) * 1000, 1),
            client_events=run.client_events,
        )
        return result, run

    @staticmethod
    def _try_deliver(req: ToolRequest, result: ToolResult) -> bool | None:
        """True: delivered; False: the call ended (logged and dropped); None:
        the reply channel is full (a shared one), see ``_deliver_late``."""
        try:
            req.reply.send_nowait(result)
            return True
        except trio.WouldBlock:
            return None
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False

    async def _deliver_late(self, req: ToolRequest, result: ToolResult, run: _Run) -> None:
        """Wait a little for room on a full reply channel, then drop."""
        delivered = False
        with trio.CancelScope(shield=True):
            with trio.move_on_after(REPLY_DEADLINE_S):
                try:
                    await req.reply.send(result)
                    delivered = True
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
        self._reported(req, result, run, delivered)

    def _reported(self, req: ToolRequest, result: ToolResult, run: _Run, delivered: bool,
                  reused: bool = False) -> None:
        _log.info("tool.run", call_id=req.call_id, tool=clip(result.tool, TOOL_NAME_LOG_MAX),
                  tool_call_id=clip(req.tool_call_id, PEER_ID_LOG_MAX),
                  epoch=req.epoch, turn=req.turn, duration_ms=result.duration_ms, outcome=result.outcome,
                  output_chars=len(result.output), truncated=run.truncated, delivered=delivered,
                  reused=reused)
        try:
            self.on_result(result)
        except Exception:
            _log.warning("tool.observer_failed", exc_info=True)
