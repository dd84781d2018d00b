"""McpHub: the MCP tool sources, their discovered tools and their sessions.

The hub owns, per configured source (``sources.py``), one shared
``SourceConnection`` with the source's configured token (read from its
``token_env`` at each discovery) and the tools that discovery found; and per
call that brought credentials (``POST /api/voice/connect``), that call's
connections and the tools its own discovery found. Each connection runs in a
task of the hub's nursery, so a failing source never reaches a call's.

Discovery runs at start, then every ``mcp_discovery_ttl_s`` (a source that
is down or refused stays without tools until a discovery answers). Its
inbox (``McpMessage``): ``OpenCall`` (a call's credentials; that call's
discovery starts in the background) and ``GetMcpManifest`` (the source tools
for a session's ``tools``). The executor uses ``lookup`` (synchronous: the
hub's current tool tables, only ever replaced whole) and ``call`` (a
request to the right connection; always a value).

Authentication: a 401/403 on a configured token marks the source
unavailable until its next discovery (its calls answer an error); on a
call's own token, the call's token is expired: its calls answer
``auth_expired``, which ends the call (``docs/mcp.md``).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Mapping, TypeAlias

import trio

from voiceactors import voice_config, metrics, storage
from voiceactors.mcp.client.connection import Failure, SourceConnection, ToolAnswer
from voiceactors.logs import get_logger, register_secret
from voiceactors.settings import InvalidSettings, Settings
from voiceactors.mcp.client import tool_specs
from voiceactors.mcp.client.sources import McpSource, SourceConfigError, parse_sources, source_of, spelled, token_of
from voiceactors.messages import ProgressNote
from voiceactors.tools.registry import ToolSpec

CALLS_KEPT = 1024           # calls whose credentials are kept, oldest evicted
SWEEP_S = 60.0
START_WAIT_S = 2.0          # how long the start waits for the first discovery round

_log = get_logger(actor="mcp")


@dataclass(frozen=True)
class OpenCall:
    """``call_id`` brings its own tokens (source name -> token). Reply: None
    (kept; that call's discovery starts), or the name of a source that is not configured."""

    call_id: str
    credentials: Mapping[str, str] = field(repr=False)
    reply: trio.MemorySendChannel[str | None] = field(repr=False, compare=False)


@dataclass(frozen=True)
class GetMcpManifest:
    """Reply: the function tools of every source's shared discovery, named in ``style``."""

    style: str
    reply: trio.MemorySendChannel[list[dict[str, Any]]] = field(repr=False, compare=False)


McpMessage: TypeAlias = OpenCall | GetMcpManifest


@dataclass
class _Source:
    source: McpSource
    connection: SourceConnection | None = None
    token: str | None = None
    specs: dict[str, ToolSpec] = field(default_factory=dict)
    available: bool = False          # the last discovery answered and nothing refused the token since


@dataclass
class _Call:
    tokens: dict[str, str] = field(repr=False)
    opened: float
    connections: dict[str, SourceConnection] = field(default_factory=dict)
    specs: dict[str, dict[str, ToolSpec]] = field(default_factory=dict)   # source -> its discovery for this call
    expired: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Answer:
    """What ``call`` got: the wire result dict, or a Failure; ``token`` says
    whose token it was (``call`` or ``configured``)."""

    result: dict[str, Any] | None
    failure: Failure | None
    token: str
    size: int = 0       # the answer's bytes (``connection.ToolAnswer``)


def configured_sources(settings: Settings) -> tuple[McpSource, ...]:
    """The ``mcp_sources`` setting when set, else the journal's ``voice.mcp_sources``
    (SourceConfigError when invalid)."""
    if settings.mcp_sources and settings.mcp_sources.strip():
        return parse_sources(settings.mcp_sources)
    return parse_sources(voice_config.mcp_sources_block(settings))


def check_sources(settings: Settings) -> None:
    """InvalidSettings when the MCP sources (setting or journal) cannot be
    used, a clash of names included: the server refuses to start. A journal
    config that cannot be read now is left for the hub to report."""
    try:
        configured_sources(settings)
    except SourceConfigError as error:
        raise InvalidSettings(f"invalid settings: {error}") from None
    except voice_config.ConfigUnreadable:
        pass


class McpHub:
    """See the module docstring. ``sources`` None: from the settings and journal."""

    def __init__(self, settings: Settings, sources: tuple[McpSource, ...] | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        self.settings = settings
        self._given = sources
        self._env = env if env is not None else os.environ
        self.inbox, self._receive = trio.open_memory_channel[McpMessage](64)
        self._sources: dict[str, _Source] = {}
        self._calls: OrderedDict[str, _Call] = OrderedDict()
        self._nursery: trio.Nursery | None = None
        self._write_locks: dict[str, tuple[trio.Lock, int]] = {}
        self.discoveries = 0     # completed discovery rounds (tests wait on it)
        self._discovered = trio.Event()

    @property
    def sources(self) -> tuple[McpSource, ...]:
        return tuple(s.source for s in self._sources.values())

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        sources = self._given if self._given is not None else await self._configured()
        self._sources = {s.name: _Source(s) for s in sources}
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if self._sources:
                nursery.start_soon(self._discovery_loop)
                nursery.start_soon(self._sweep_loop)
                # the first sessions should list the tools of sources that answer at once; a
                # source that is slow or down does not hold up the start for longer than this
                with trio.move_on_after(START_WAIT_S):
                    await self._discovered.wait()
            else:
                self._discovered.set()
            task_status.started()
            async with self._receive:
                async for message in self._receive:
                    self._handle(message)
            nursery.cancel_scope.cancel()

    async def _configured(self) -> tuple[McpSource, ...]:
        try:
            return await storage.run_sync(configured_sources, self.settings)
        except (SourceConfigError, voice_config.ConfigUnreadable) as error:
            _log.error("mcp.config_invalid", error=str(error)[:300])
            return ()

    def _handle(self, message: McpMessage) -> None:
        if isinstance(message, OpenCall):
            unknown = [name for name in message.credentials if name not in self._sources]
            if unknown:
                _reply(message.reply, str(unknown[0])[:32])
            else:
                self._open_call(message.call_id, dict(message.credentials))
                _reply(message.reply, None)
        elif isinstance(message, GetMcpManifest):
            _reply(message.reply, self.manifest(message.style))
        else:
            _log.error("mcp.unknown_message", kind=type(message).__name__)

    async def wait_discovered(self) -> None:
        """Until the first discovery round ended (tests, the demo)."""
        await self._discovered.wait()

    # --- discovery --------------------------------------------------------------

    async def _discovery_loop(self) -> None:
        while True:
            async with trio.open_nursery() as round_:
                for state in self._sources.values():
                    round_.start_soon(self._discover_shared, state)
            self.discoveries += 1
            self._discovered.set()
            await trio.sleep(self.settings.mcp_discovery_ttl_s)

    def _timeout(self, source: McpSource) -> float:
        return source.timeout(self.settings.mcp_timeout_s)

    async def _discover_shared(self, state: _Source) -> None:
        source = state.source
        token = token_of(source, self._env)
        if token is None:
            state.available, state.specs = False, {}
            _log.warning("mcp.token_missing", source=source.name, token_env=source.token_env)
            return
        register_secret(token)
        if state.connection is None or state.token != token or state.connection.denied_status is not None:
            if state.connection is not None:
                state.connection.close()
            state.connection = self._connection(source, token, source.name)
            state.token = token
        specs = await self._discover(state.connection, source, "configured")
        if specs is None:
            state.available, state.specs = False, {}
        else:
            state.available, state.specs = True, specs

    async def _discover(self, connection: SourceConnection, source: McpSource, token: str
                        ) -> dict[str, ToolSpec] | None:
        started = trio.current_time()
        listed = await connection.list_tools()
        seconds = trio.current_time() - started
        if isinstance(listed, Failure):
            metrics.mcp_request(source.name, "discovery", listed.kind, seconds)
            _log.warning("mcp.discovery_failed", source=source.name, token=token, kind=listed.kind,
                         error=listed.detail)
            return None
        metrics.mcp_request(source.name, "discovery", "ok", seconds)
        try:
            # in proportion to the listing (schemas checked, validators built): a worker thread
            specs, left_out = await storage.run_sync(tool_specs.build_specs, source.name, listed,
                                                     self.settings.tool_name_style)
        except Exception:   # a listing no rule foresaw must not take the hub (and the runtime) down
            _log.exception("mcp.discovery_failed", source=source.name, token=token, kind="listing")
            return None
        for name, why in left_out:
            _log.warning("mcp.tool_left_out", source=source.name, tool=name, why=why)
        _log.info("mcp.discovered", source=source.name, token=token, tools=len(specs), left_out=len(left_out),
                  duration_ms=round(seconds * 1000, 1))
        return specs

    def _connection(self, source: McpSource, token: str, label: str) -> SourceConnection:
        assert self._nursery is not None
        connection = SourceConnection(source, token, self._timeout(source), label)
        self._nursery.start_soon(connection.run)
        return connection

    # --- calls with their own tokens ----------------------------------------------

    def _open_call(self, call_id: str, tokens: dict[str, str]) -> None:
        for token in tokens.values():
            register_secret(token)
        old = self._calls.pop(call_id, None)
        if old is not None:
            self._close_call(old)
        call = self._calls[call_id] = _Call(tokens, trio.current_time())
        while len(self._calls) > CALLS_KEPT:
            self._close_call(self._calls.popitem(last=False)[1])
        for name, token in tokens.items():
            source = self._sources[name].source
            call.connections[name] = self._connection(source, token, f"{name}/call")
            assert self._nursery is not None
            self._nursery.start_soon(self._discover_for_call, call_id, call, name)

    async def _discover_for_call(self, call_id: str, call: _Call, name: str) -> None:
        source = self._sources[name].source
        connection = call.connections[name]
        specs = await self._discover(connection, source, "call")
        if connection.denied_status is not None:
            call.expired.add(name)
            _log.warning("mcp.call_token_refused", call_id=call_id, source=name)
        elif specs is not None:
            call.specs[name] = specs

    @staticmethod
    def _close_call(call: _Call) -> None:
        for connection in call.connections.values():
            connection.close()

    async def _sweep_loop(self) -> None:
        """Forget the credentials of calls past the longest a call may last."""
        while True:
            await trio.sleep(SWEEP_S)
            limit = self.settings.call_max_duration_s
            if not math.isfinite(limit):
                continue
            now = trio.current_time()
            for call_id in [c for c, call in self._calls.items() if now - call.opened > limit]:
                self._close_call(self._calls.pop(call_id))

    # --- what the executor and the routes see ---------------------------------------

    @contextlib.asynccontextmanager
    async def write_lock(self, tool_call_id: str) -> AsyncIterator[None]:
        """Held around one write's check-request-record (``execution.py``):
        a second request with the same id waits, then finds the record."""
        lock, users = self._write_locks.get(tool_call_id, (trio.Lock(), 0))
        self._write_locks[tool_call_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._write_locks[tool_call_id]
            if users <= 1:
                del self._write_locks[tool_call_id]
            else:
                self._write_locks[tool_call_id] = (lock, users - 1)

    def manifest(self, style: str) -> list[dict[str, Any]]:
        return [{"type": "function", "name": spelled(spec.remote.source, spec.remote.tool, style),
                 "description": spec.description, "parameters": spec.parameters}
                for state in self._sources.values() if state.available for spec in state.specs.values()]

    def lookup(self, call_id: str, name: str) -> ToolSpec | None:
        """The source tool ``name`` (either spelling) as ``call_id`` sees it:
        from that call's own discovery when it has one for the source, else
        the shared one. None when unknown."""
        source = source_of(name)
        state = self._sources.get(source) if source is not None else None
        if state is None:
            return None
        call = self._calls.get(call_id)
        specs = call.specs.get(state.source.name) if call is not None else None
        if specs is None:
            specs = state.specs
        return tool_specs.lookup(specs, name)

    async def call(self, call_id: str, spec: ToolSpec, arguments: dict[str, Any],
                   progress: ProgressNote | None = None) -> Answer:
        """Run ``spec`` at its source with the call's token when it brought
        one, else the configured one (``progress``: gets the source's
        progress notifications). Never raises but Cancelled."""
        remote = spec.remote
        state = self._sources[remote.source]
        call = self._calls.get(call_id)
        if call is not None and remote.source in call.tokens:
            kind, connection = "call", call.connections.get(remote.source)
            if remote.source in call.expired:
                return Answer(None, Failure("denied", "call token refused"), kind)
        else:
            kind, connection = "configured", state.connection
            if not state.available:
                return Answer(None, Failure("unavailable", "source unavailable"), kind)
        if connection is None:
            return Answer(None, Failure("unavailable", "no connection"), kind)
        started = trio.current_time()
        outcome = "cancelled"
        try:
            value = await connection.call_tool(remote.tool, arguments, self._timeout(state.source), progress)
            outcome = value.kind if isinstance(value, Failure) else \
                ("tool_error" if value.result.get("isError") else "ok")
        finally:
            metrics.mcp_request(remote.source, "call", outcome, trio.current_time() - started)
        if isinstance(value, Failure):
            if value.kind == "denied":
                if kind == "call" and call is not None:
                    call.expired.add(remote.source)
                else:
                    state.available = False
                    _log.warning("mcp.source_unavailable", source=remote.source, why="token refused")
            return Answer(None, value, kind)
        return Answer(value.result, None, kind, value.size)


def _reply(reply: trio.MemorySendChannel[Any], value: Any) -> None:
    try:
        reply.send_nowait(value)
    except (trio.BrokenResourceError, trio.ClosedResourceError, trio.WouldBlock):
        pass
