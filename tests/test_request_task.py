"""A request is handled in its connection's own task (issue 14, the
connect; ``http/asgi.py``'s ``ClosingHTTPConnection``): quart-trio spawned
a task for the handler beside the one that reads the ASGI messages; the
handler now runs in the nursery's body, so a request spawns one task
fewer. The cancellations it keeps (a client leaving an event stream ends
it; keep-alive and ``Connection: close``) are tests/test_http_hardening.py's.
Checked on a real server (hypercorn through ``serving.serve``), the tasks
counted by a trio instrument."""

from __future__ import annotations

import datetime as dt
import socket

import trio

from mcp_server_support import served
from voiceactors.journal.sample import write_sample_journal
from voiceactors.settings import Settings

DAY = dt.date(2026, 3, 27)


class Spawned(trio.abc.Instrument):
    def __init__(self) -> None:
        self.names: list[str] = []

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.names.append(task.name)


def _get(port: int, path: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


async def test_a_request_spawns_no_task_for_its_handler(tmp_path):
    journal = write_sample_journal(tmp_path / "journal", days=1, today=DAY)
    settings = Settings(journal=journal, state_dir=tmp_path / "state").replace(rate_limit_per_s=0)
    async with served(settings) as base:
        port = int(base.rsplit(":", 1)[1])
        spawned = Spawned()
        trio.lowlevel.add_instrument(spawned)
        try:
            answer = await trio.to_thread.run_sync(_get, port, "/api/voice/status")
        finally:
            trio.lowlevel.remove_instrument(spawned)
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert any(name.endswith("handle_messages") for name in spawned.names), spawned.names   # the reader still is
    assert not any(name.endswith("handle_request") for name in spawned.names), spawned.names
