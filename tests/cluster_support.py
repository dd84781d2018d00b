"""Shared pieces of the multi-process tests (test_cluster_serve, test_workers):
``voiceactors serve`` children on one Redis, ``serve --workers N`` parents,
and the checks that read their JSON log lines."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import trio

from child_support import Child
from redis_support import RedisServer
from test_call_crash import Server, stop_all, stop_cleanly  # noqa: F401  (stop_all, stop_cleanly re-exported for the cluster tests)
from voiceactors.cluster import redis_client as rc
from voiceactors.simulator import Simulator

TTL_S = 2.0


class ClusterServer(Server):
    """One ``voiceactors serve --redis URL`` child."""

    def __init__(self, journal: Path, state: Path, sim: Simulator, redis: RedisServer) -> None:
        super().__init__(journal, state, sim)
        self.args += ["--redis", redis.url]
        self.env["VOICEACTORS_REDIS_LEASE_TTL"] = str(TTL_S)
        # the tests count actors by supervisor.call_started, a debug line
        self.env["VOICEACTORS_LOG_LEVEL"] = "debug"


class WorkersServer(Server):
    """One ``voiceactors serve --workers N`` parent; its stderr carries its
    own lines and every worker's (each with ``worker``)."""

    def __init__(self, journal: Path, state: Path, sim: Simulator, workers: int) -> None:
        super().__init__(journal, state, sim)
        self.session = False        # start_new_session: the test can signal its process group (a Ctrl-C)
        self.args += ["--workers", str(workers)]
        self.env["VOICEACTORS_REDIS_LEASE_TTL"] = str(TTL_S)
        self.env["VOICEACTORS_LOG_LEVEL"] = "debug"
        self.env.pop("VOICEACTORS_REDIS_URL", None)
        self.workers = workers

    async def start(self, nursery: trio.Nursery) -> str:
        self.proc = Child(self.args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=self.env,
                          cwd=Path(__file__).resolve().parents[1], start_new_session=self.session)
        nursery.start_soon(self._read_log)
        with trio.fail_after(60):
            while not self.events("workers.serving"):
                assert self.proc.poll() is None, self.lines[-20:]
                await trio.sleep(0.05)
        return str(self.events("workers.serving")[0]["url"])

    def worker_events(self, name: str, worker: int) -> list[dict]:
        return [line for line in self.events(name) if line.get("worker") == worker]

    def worker_pid(self, worker: int) -> int:
        """The pid of ``worker``'s latest run."""
        return int(self.worker_events("workers.worker_started", worker)[-1]["pid"])

    def pids(self) -> list[int]:
        """Every process the parent started: each worker run, the private Redis."""
        return [int(x["pid"]) for x in self.events("workers.worker_started") + self.events("workers.redis_started")]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def kill_9(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def started_calls(*servers: Server) -> list[str]:
    """The call ids whose actor started (first run), over every server's lines."""
    return [line["call_id"] for server in servers for line in server.events("supervisor.call_started")]


def takers(*servers: Server) -> list[dict]:
    """Every take-over line (a dead holder's call started elsewhere), over every server."""
    return [line for server in servers for line in server.events("supervisor.take_over")]


async def mirrored(url: str, call_id: str, pending: set[str]) -> None:
    """Wait until the holder's mirror of its record has exactly these
    unsettled tool calls (its writer runs a moment after the record's lines;
    the call's mirrored context is no tool call)."""
    with trio.fail_after(10):
        async with rc.client(url) as redis:
            while set(await redis.hgetall(rc.pending_key(call_id))) - {rc.CONTEXT_FIELD} != pending:
                await trio.sleep(0.05)
