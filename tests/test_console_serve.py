"""``voiceactors serve --demo`` as a newcomer runs it: it prints the console's
URL on stdout once serving, and that URL is the console, pointed at the
embedded simulator."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

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
