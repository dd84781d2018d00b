"""The commands as users run them: ``voiceactors demo`` and a signalled
``voiceactors serve --demo`` with a live call."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from child_support import die_with_parent

VOICEACTORS = [sys.executable, "-m", "voiceactors.cli"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "VOICEACTORS_API_TOKEN", "VOICEACTORS_HOST"):
        env.pop(name, None)
    return env


def test_demo_exits_zero_and_tells_what_happened():
    done = subprocess.run(VOICEACTORS + ["demo"], capture_output=True, text=True, timeout=90, env=_env())
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "POST /api/voice/session → 200" in out
    assert "POST /api/voice/connect → 200" in out
    for tool in ("briefing.get", "calendar.today", "commitments.list", "journal.search", "weather.forecast"):
        assert f"tool ◀ {tool}  ok" in out   # weather.forecast: the demo's MCP source
    assert "cancelled (turn_detected)" in out          # the barge-in
    assert "protocol errors caused: 0" in out
    assert "usage: " in out and "the call so far" in out          # the feed's usage events, narrated
    assert "OK — every tool call was answered exactly once" in out
    assert "sk-demo" not in out + done.stderr


class _Lines:
    """A child's stderr, read on a thread, as parsed JSON log lines."""

    def __init__(self, stream) -> None:
        self.queue: queue.Queue = queue.Queue()
        self.seen: list[dict] = []
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream) -> None:
        for line in stream:
            try:
                self.queue.put(json.loads(line))
            except ValueError:
                self.queue.put({"event": "raw", "text": line})

    def wait_for(self, event: str, timeout: float = 30.0, **fields) -> dict:
        deadline = time.monotonic() + timeout
        for line in self.seen:
            if line.get("event") == event and all(line.get(k) == v for k, v in fields.items()):
                return line
        while True:
            line = self.queue.get(timeout=max(0.01, deadline - time.monotonic()))
            self.seen.append(line)
            if line.get("event") == event and all(line.get(k) == v for k, v in fields.items()):
                return line


def test_sigterm_with_a_live_call_closes_it_flushes_its_record_and_exits_zero(tmp_path: Path):
    state = tmp_path / "state"
    child = subprocess.Popen(VOICEACTORS + ["serve", "--demo", "--port", "0", "--state-dir", str(state),
                                            "--log-format", "json"],
                             stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=_env(),
                             preexec_fn=die_with_parent())
    try:
        lines = _Lines(child.stderr)
        sim_url = lines.wait_for("server.demo_simulator", timeout=60)["base_url"]
        [base] = lines.wait_for("server.serving")["urls"]
        with httpx.Client(base_url=base, timeout=10) as client:
            key = client.post("/api/voice/session").json()["ephemeral_key"]
            offer = client.post(f"{sim_url}/realtime/calls", content=b"v=0\r\n",
                                headers={"Authorization": f"Bearer {key}", "Content-Type": "application/sdp"})
            call_id = offer.headers["location"].rsplit("/", 1)[-1]
            assert client.post("/api/voice/connect", json={"call_id": call_id}).status_code == 200
            lines.wait_for("call.connected", call_id=call_id)
            assert client.get("/api/voice/status").json()["active_sessions"] == 1
        signalled = time.monotonic()
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=15) == 0
        assert time.monotonic() - signalled < 15
        record = [json.loads(line) for line in (state / "calls" / f"{call_id}.jsonl").read_text().splitlines()]
        assert record[0]["kind"] == "start" and record[-1]["kind"] == "end"
        assert record[-1]["reason"] == "shutdown"
        lines.wait_for("runtime.stopped", timeout=1)
        lines.wait_for("server.stopped", timeout=1)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
