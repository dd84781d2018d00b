"""``voiceactors serve --demo`` as a newcomer runs it: it prints the console's
URL on stdout once serving, and that URL is the console, pointed at the
embedded simulator."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading

import httpx

from child_support import die_with_parent

VOICEACTORS = [sys.executable, "-m", "voiceactors.cli"]


def test_serve_demo_prints_the_console_url(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "VOICEACTORS_API_TOKEN", "VOICEACTORS_HOST")}
    child = subprocess.Popen(VOICEACTORS + ["serve", "--demo", "--port", "0", "--state-dir", str(tmp_path / "state")],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                             preexec_fn=die_with_parent())
    try:
        line = child.stdout.readline()
        match = re.search(r"(http://127\.0\.0\.1:\d+/) ", line)
        assert match, line
        url = match.group(1)
        page = httpx.get(url, timeout=10)
        assert page.status_code == 200 and 'id="start"' in page.text
        assert "Content-Security-Policy" in page.headers
        config = httpx.get(url + "api/voice/console-config", timeout=10).json()
        assert config["demo"] is True and config["token_required"] is False
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v1", config["realtime_base_url"]), config
        assert config["realtime_base_url"].split("/v1")[0] in page.headers["Content-Security-Policy"]
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=20) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def stdout_lines(child: subprocess.Popen) -> queue.Queue[str]:
    """The child's stdout lines as they come (a reader thread), so a test can
    wait for one with a timeout instead of hanging on a line that never comes."""
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in child.stdout], daemon=True).start()
    return lines


def line_within(lines: queue.Queue[str], seconds: float) -> str:
    try:
        return lines.get(timeout=seconds)
    except queue.Empty:
        return ""


def test_serve_says_at_start_what_a_call_will_lack(tmp_path):
    """No key and an empty journal used to be found out at Start, or never:
    ``serve`` says both under the console's address."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "VOICEACTORS_API_TOKEN", "VOICEACTORS_HOST")}
    (tmp_path / "journal").mkdir()
    child = subprocess.Popen(VOICEACTORS + ["serve", "--port", "0", "--journal", str(tmp_path / "journal"),
                                            "--state-dir", str(tmp_path / "state")],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                             preexec_fn=die_with_parent())
    try:
        said = stdout_lines(child)
        lines = [line_within(said, 60) for _ in range(3)]
        assert "the voice console is at" in lines[0], lines
        assert lines[1].startswith("voiceactors: note: no OpenAI key is configured"), lines
        assert "restart with OPENAI_API_KEY set" in lines[1] and "no restart" in lines[1]
        assert lines[2].startswith("voiceactors: note: the journal folder has no days"), lines
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=20) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
