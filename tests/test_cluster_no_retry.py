"""A script Redis ran whose reply was lost is never sent again by the client
(issue 18): the request fails as ``RegistryDown`` and its caller answers
honestly, on a real ``redis-server``.

A unix-socket relay between our client and Redis forwards everything; once
it has passed on a chosen request (matched by its script's text), it throws
away the reply that follows (matched by a marker in it) and closes that
client connection, as a network failure loses a reply after Redis applied
the request. Redis's own ``INFO commandstats`` counts how often it ran a
script. coredis's default retry policy sent the script again on a new
connection: a second ``CLAIM_WRITE`` saw its own ``applying:`` marker and
answered ``taken`` with no record (the write then reported as another
server's, outcome unknown), a second ``ACQUIRE_MANY`` saw its own token and
answered "held" (a lease won, then reported lost)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import trio

from calls_support import DAY
from redis_support import needs_redis, redis_server  # noqa: F401  (the fixture)
from test_reliability_faults import item_file
from voiceactors.executor.actor import SHARED_LOG_DOWN, ToolExecutor
from voiceactors.messages import ToolRequest, ask
from voiceactors.cluster import redis_client as rc
from voiceactors.cluster.call_registry import RedisRegistry, RegistryDown
from voiceactors.journal import ledger
from voiceactors.journal.sample import write_sample_journal
from voiceactors.settings import Settings
from voiceactors.tools.handler_context import ToolContext

pytestmark = needs_redis

CALL = "rtc_noretry"
CLAIM_TEXT = b"'applying:' .. ARGV[1]"        # in CLAIM_WRITE's text only
ACQUIRE_TEXT = b"redis.call('INCR', fence_key)"  # in ACQUIRE_MANY's text only


class ReplyDroppingProxy:
    """A unix-socket relay to redis-server. After ``drop_after(request,
    reply)``, the first request holding ``request`` goes on to Redis; the
    first data back holding ``reply`` after it is thrown away and that
    connection closed, once (``dropped`` counts it). Everything else passes."""

    def __init__(self, folder: Path, upstream: Path) -> None:
        self.path = folder / "proxy.sock"
        self.upstream = upstream
        self.request: bytes | None = None
        self.reply = b""
        self.armed = False        # the chosen request went on to Redis: drop its reply
        self.dropped = 0

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    def drop_after(self, request: bytes, reply: bytes) -> None:
        self.request, self.reply, self.armed = request, reply, False

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        await sock.bind(str(self.path))
        sock.listen()
        task_status.started()
        await trio.serve_listeners(self._relay, [trio.SocketListener(sock)])

    async def _relay(self, client: trio.abc.Stream) -> None:
        upstream = await trio.open_unix_socket(str(self.upstream))
        async with client, upstream, trio.open_nursery() as nursery:
            nursery.start_soon(self._requests, client, upstream, nursery.cancel_scope)
            nursery.start_soon(self._replies, upstream, client, nursery.cancel_scope)

    async def _requests(self, source: trio.abc.Stream, sink: trio.abc.Stream, connection: trio.CancelScope) -> None:
        pending = b""      # a request's text may come in more than one read
        try:
            async for data in source:
                if self.request is not None:
                    pending = (pending + data)[-65536:]
                    if self.request in pending:
                        self.request, pending = None, b""
                        self.armed = True             # before it goes on: its reply can come back at once
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        connection.cancel()

    async def _replies(self, source: trio.abc.Stream, sink: trio.abc.Stream, connection: trio.CancelScope) -> None:
        try:
            async for data in source:
                if self.armed and self.reply in data:
                    self.armed = False
                    self.dropped += 1
                    break                             # Redis ran it; the reply is lost with the connection
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        connection.cancel()


async def _evals(redis: Any) -> int:
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_eval", {}).get("calls", 0))


async def test_a_claim_whose_reply_was_lost_is_not_run_again(redis_server, tmp_path):
    proxy = ReplyDroppingProxy(tmp_path, redis_server.socket)
    async with rc.client(redis_server.url) as direct, trio.open_nursery() as nursery:
        await nursery.start(proxy.serve)
        async with rc.client(proxy.url) as redis:
            await rc.run_script(redis, "return 1", [], [])          # the client's connection is up
            before = await _evals(direct)
            proxy.drop_after(CLAIM_TEXT, b"claimed")
            try:
                answer = await rc.run_script(redis, rc.CLAIM_WRITE, [rc.lease_key(""), rc.write_key("call_w")],
                                             [rc.UNFENCED, 60])
            except RegistryDown:
                answer = None
            assert proxy.dropped == 1
            assert await _evals(direct) - before == 1, f"the claim ran again; its second answer: {answer}"
            assert answer is None                                    # RegistryDown: no answer made up
            assert await direct.get(rc.write_key("call_w")) == rc.APPLYING + rc.UNFENCED   # claimed once
        nursery.cancel_scope.cancel()


async def test_an_acquire_whose_reply_was_lost_is_not_run_again(redis_server, tmp_path):
    proxy = ReplyDroppingProxy(tmp_path, redis_server.socket)
    keys = [rc.lease_key(CALL), rc.FENCE_KEY, rc.CALLS_KEY, rc.void_key("noretry-node")]
    async with rc.client(redis_server.url) as direct, trio.open_nursery() as nursery:
        await nursery.start(proxy.serve)
        async with rc.client(proxy.url) as redis:
            await rc.run_script(redis, "return 1", [], [])
            before = await _evals(direct)
            proxy.drop_after(ACQUIRE_TEXT, b"noretry-node:")
            try:
                answer = await rc.run_script(redis, rc.ACQUIRE_MANY, keys, ["noretry-node", 60_000, CALL])
            except RegistryDown:
                answer = None
            assert proxy.dropped == 1
            assert await _evals(direct) - before == 1, f"the acquire ran again; its second answer: {answer}"
            assert answer is None
            token = await direct.get(rc.lease_key(CALL))
            assert token == f"noretry-node:{await direct.get(rc.FENCE_KEY)}"     # one fence drawn, ours
        nursery.cancel_scope.cancel()


async def test_a_write_whose_claim_reply_was_lost_answers_the_shared_log_down_and_applies_nothing(
        redis_server, tmp_path):
    """The write path on it: the claim fails as ``RegistryDown``, so the tool
    answers "shared write log unreachable; nothing was changed" and the
    journal is untouched (not "another server started this write")."""
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    [item] = ledger.list_items(journal, state="open", top=1)
    before = item_file(journal, item).read_bytes()
    proxy = ReplyDroppingProxy(tmp_path, redis_server.socket)
    async with rc.client(redis_server.url) as direct, trio.open_nursery() as nursery:
        await nursery.start(proxy.serve)
        registry = RedisRegistry(proxy.url, 30.0, node="a")
        await nursery.start(registry.run)
        state = tmp_path / "state"
        settings = Settings(journal=journal, state_dir=state, tool_timeout_read_s=math.inf,
                            tool_timeout_write_s=math.inf)
        executor = ToolExecutor(settings, ToolContext(journal=journal, state_dir=state, today=lambda: DAY),
                                cluster=registry)
        await nursery.start(executor.run)
        lease = await registry.acquire(CALL)
        assert lease is not None
        proxy.drop_after(CLAIM_TEXT, b"claimed")
        arguments = json.dumps({"commitment_id": item.id, "resolution": "done"})
        with trio.fail_after(20):
            answer = await ask(executor.inbox, lambda reply: ToolRequest(
                call_id=CALL, tool_call_id="call_w", name="commitments.complete", arguments=arguments,
                epoch=0, turn=0, reply=reply), timeout=math.inf)
        assert proxy.dropped == 1
        assert (answer.outcome, json.loads(answer.output)) == ("busy", SHARED_LOG_DOWN)
        assert item_file(journal, item).read_bytes() == before
        assert await direct.get(rc.write_key("call_w")) == rc.APPLYING + lease.token
        nursery.cancel_scope.cancel()
