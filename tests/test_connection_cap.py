"""The cap on open connections (issue 11 item 8, ``max_connections``).

Past the cap a new client waits in the kernel's listen backlog, holding no
descriptor of the server's, while the connections already open are served;
once clients leave, the waiting ones are served in turn. Checked on real
sockets: the listener wrapper on its own (the seam with hypercorn, whose
trio internals ``voiceactors/http/serving.py`` drives), and a real
``voiceactors serve`` child whose descriptors are counted in ``/proc``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio
import trio.testing

from voiceactors.http.serving import CappedListener
from voiceactors.journal.sample import write_sample_journal
from voiceactors.settings import Settings
from child_support import die_with_parent, pump_stderr

DAY = dt.date(2026, 3, 27)


async def test_the_listener_waits_for_a_slot_and_a_closed_stream_frees_it():
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    capped = CappedListener(sock, trio.Semaphore(2), cap=2)
    clients = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(3)]
    first = await capped.accept()
    second = await capped.accept()
    with trio.move_on_after(0.5) as waited:
        await capped.accept()                      # the third client waits: no slot
    assert waited.cancelled_caught
    assert first.socket.getpeername() == clients[0].socket.getsockname()
    await clients[0].send_all(b"ping")             # the open ones work as streams do
    assert await first.receive_some(10) == b"ping"
    await first.send_all(b"pong")
    assert await clients[0].receive_some(10) == b"pong"
    await first.aclose()
    await first.aclose()                           # closing twice frees one slot, not two
    with trio.fail_after(5):
        third = await capped.accept()              # the slot came back
    assert third.socket.getpeername() == clients[2].socket.getsockname()
    extra = await trio.open_tcp_stream("127.0.0.1", port)
    with trio.move_on_after(0.3) as waited:
        await capped.accept()
    assert waited.cancelled_caught                 # still two open: second and third
    assert not hasattr(second, "do_handshake")     # hypercorn's TCPServer takes it for plain TCP
    for stream in (second, third, extra, *clients):
        await stream.aclose()
    await capped.aclose()


async def _waiting_clients(n: int) -> tuple[socket.socket, list[trio.SocketStream]]:
    """A listening socket and ``n`` clients whose connects the kernel has
    completed (they wait in its backlog: nothing has accepted them)."""
    sock = socket.create_server(("127.0.0.1", 0), backlog=64)
    port = sock.getsockname()[1]
    return sock, [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(n)]


@pytest.mark.parametrize("cap", [0, 3])
async def test_one_accept_takes_the_whole_backlog_and_the_next_accepts_do_not_wait(cap):
    # One connection per scheduler pass queued a burst of joins behind a busy
    # trio thread's rounds (the `burst` benchmark's join p99).
    sock, clients = await _waiting_clients(5)
    capped = CappedListener(sock, trio.Semaphore(cap) if cap else None, cap=cap)
    taken = [await capped.accept()]
    with trio.testing.assert_no_checkpoints():
        taken += [await capped.accept() for _ in range((cap or 5) - 1)]
    assert [t.socket.getpeername() for t in taken] == [c.socket.getsockname() for c in clients[:cap or 5]]
    if cap:
        with trio.move_on_after(0.3) as waited:
            await capped.accept()                   # the cap holds: the other two wait in the backlog
        assert waited.cancelled_caught
        await taken[0].aclose()
        with trio.fail_after(5):
            fourth = await capped.accept()
        assert fourth.socket.getpeername() == clients[3].socket.getsockname()
        taken.append(fourth)
    for stream in (*taken, *clients):
        await stream.aclose()
    await capped.aclose()


async def test_closing_the_listener_closes_the_connections_it_took_but_did_not_hand_out():
    sock, clients = await _waiting_clients(3)
    slots = trio.Semaphore(3)
    capped = CappedListener(sock, slots, cap=3)
    first = await capped.accept()            # the other two are taken with it
    assert slots.value == 0
    await capped.aclose()
    assert slots.value == 2                  # their slots came back; the handed-out one still holds its own
    for client in clients[1:]:
        with trio.fail_after(5):
            assert await client.receive_some(10) == b""     # closed by the server
    await first.aclose()
    for client in clients:
        await client.aclose()


def test_the_setting_comes_from_the_environment():
    assert Settings.from_env({"VOICEACTORS_MAX_CONNECTIONS": "32"}).max_connections == 32
    assert Settings.from_env({}).max_connections == 1000


CAP = 8


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts the child's descriptors in /proc")
def test_past_the_cap_new_connections_wait_and_descriptors_stay_bounded(tmp_path):
    journal = write_sample_journal(tmp_path / "journal", days=1, today=DAY)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VOICEACTORS_", "OPENAI_"))}
    env.update(VOICEACTORS_MAX_CONNECTIONS=str(CAP), VOICEACTORS_KEEP_ALIVE_TIMEOUT="2",
               VOICEACTORS_RATE_LIMIT_PER_S="0", OPENAI_API_KEY="sk-cap-test-0000")
    child = subprocess.Popen([sys.executable, "-c", "import sys; from voiceactors.cli import main; sys.exit(main(sys.argv[1:]))", "serve", "--port", "0", "--journal", str(journal),
                              "--state-dir", str(tmp_path / "state")],
                             stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env,
                             preexec_fn=die_with_parent())
    lines, serving = pump_stderr(child, "server.serving")
    sockets: list[socket.socket] = []

    def connect() -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sockets.append(sock)
        return sock

    def fds() -> int:
        return len(os.listdir(f"/proc/{child.pid}/fd"))

    def wait_for(predicate, what: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, (what, fds(), "".join(lines)[-3000:])
            time.sleep(0.05)

    try:
        assert serving.wait(60), "".join(lines)[-2000:]
        port = int(json.loads(next(line for line in lines if '"server.serving"' in line))["urls"][0].rsplit(":", 1)[1])
        host = f"127.0.0.1:{port}"
        status = f"GET /api/voice/status HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
        time.sleep(0.5)
        baseline = fds()
        # CAP uploads that stall mid-body: requests in flight, so no idle timer closes them
        held = [connect() for _ in range(CAP)]
        for sock in held[1:]:
            sock.sendall(f"POST /api/voice/connect HTTP/1.1\r\nHost: {host}\r\n"
                         "Content-Type: application/json\r\nContent-Length: 40\r\n\r\n{".encode())
        wait_for(lambda: fds() >= baseline + CAP, "the held connections accepted")
        waiting = [connect() for _ in range(40)]
        waiting[0].sendall(status)
        time.sleep(1.0)
        assert fds() <= baseline + CAP + 2, (baseline, fds())       # 48 clients, CAP descriptors
        waiting[0].settimeout(0.5)
        with pytest.raises(socket.timeout):                          # past the cap: it waits
            waiting[0].recv(65536)
        held[0].sendall(status)                                      # an open connection is served
        held[0].settimeout(10)
        assert held[0].recv(65536).startswith(b"HTTP/1.1 200")
        # the clients go: the first waiting one is accepted and answered
        for sock in held:
            sock.close()
        waiting[0].settimeout(15)
        answer = waiting[0].recv(65536)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:80]
        for sock in waiting:
            sock.close()
        wait_for(lambda: fds() <= baseline + 2, "every connection released", timeout=20)
        fresh = connect()                                            # and service goes on
        fresh.sendall(status)
        fresh.settimeout(10)
        assert fresh.recv(65536).startswith(b"HTTP/1.1 200")
    finally:
        for sock in sockets:
            sock.close()
        child.terminate()
        child.wait(timeout=30)
    text = "".join(lines)
    assert "Traceback" not in text
    assert sum('"server.connections_at_cap"' in line for line in lines) >= 1
