"""A small synchronous Chrome DevTools Protocol client for the browser tests,
talking to ``console_harness.py`` (which relays to Chromium inside a
loopback-only network namespace) over the harness process's stdin/stdout.

Synchronous on purpose: the harness (and its browser) is shared by every test
of a module, longer than one test's trio run lives.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from child_support import die_with_parent

CHROMIUM = "/usr/lib/chromium/chromium"
HARNESS = Path(__file__).with_name("console_harness.py")
# axe-core, vendored unmodified (tests/vendor/axe-core/README.md says why and which)
AXE = Path(__file__).with_name("vendor") / "axe-core" / "axe.min.js"
#: where the browser tests keep their screenshots (git-ignored; CI keeps the folder as its artefacts)
ARTIFACTS = Path(__file__).with_name("artifacts") / "console"
KEYS = {"Tab": 9, "Enter": 13, "Escape": 27, "Space": 32}

# Everything that sticks out: the page wider than its window, or an element
# past its card's edges (an element inside a sideways scroller is its
# scroller's business, not the page's). Hidden elements do not count.
OVERFLOW_PROBE = """
(() => {
  const found = [];
  const root = document.documentElement;
  if (root.scrollWidth > window.innerWidth)
    found.push(`page ${root.scrollWidth} px wide in a ${window.innerWidth} px window`);
  const name = (e) => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') +
    (e.className && typeof e.className === 'string' ? '.' + e.className.split(' ')[0] : '');
  for (const e of document.querySelectorAll('body *')) {
    const box = e.getBoundingClientRect();
    if (!box.width || !box.height || e.closest('[hidden]') || getComputedStyle(e).visibility === 'hidden') continue;
    if (e.closest('.timeline-scroll') && !e.classList.contains('timeline-scroll')) continue;
    if (e.classList.contains('visually-hidden') || e.classList.contains('skip') || e.closest('thead')) continue;
    if (box.right > window.innerWidth + 0.5 || box.left < -0.5)
      found.push(`${name(e)} spans ${Math.round(box.left)}..${Math.round(box.right)} in ${window.innerWidth}`);
    const card = e.parentElement && e.parentElement.closest('.card');
    if (card) {
      const edge = card.getBoundingClientRect();
      if (box.right > edge.right + 0.5 || box.left < edge.left - 0.5)
        found.push(`${name(e)} spans ${Math.round(box.left)}..${Math.round(box.right)}, its card ${Math.round(edge.left)}..${Math.round(edge.right)}`);
    }
  }
  return found;
})()
"""

AXE_RUN = """
axe.run(document, {resultTypes: ['violations']}).then((result) => result.violations.map((v) => ({
  id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.slice(0, 5).map((n) => n.target.join(' '))})))
"""
# setup, in real time: six servers and Chromium (up to two 20 s tries) on a loaded machine
HARNESS_START_S = 120.0

# Injected into every page before its own scripts (CDP scripts are not subject
# to the page's CSP): report every CSP violation where the test can read it.
CSP_LISTENER = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__cspViolations.push({directive: e.violatedDirective, blocked: e.blockedURI, sample: e.sample});
});
"""


def unavailable() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not os.path.exists(CHROMIUM):
        return f"{CHROMIUM} not found (apt-get install chromium; .ci/run installs it)"
    if not shutil.which("unshare") or not shutil.which("ip"):
        return "unshare or ip (util-linux, iproute2) not found: no loopback-only network namespace"
    if os.geteuid() != 0:
        return "not root: unshare -n (a loopback-only network namespace) needs root"
    probe = subprocess.run(["unshare", "-n", "sh", "-c", "ip link set lo up"], capture_output=True)
    if probe.returncode != 0:
        return f"unshare -n failed here: {probe.stderr.decode(errors='replace').strip()[:200]}"
    return None


class CdpError(RuntimeError):
    pass


class Harness:
    """The harness process and a CDP client over its pipes."""

    def __init__(self, tmp: Path, servers: dict[str, dict[str, Any]]) -> None:
        self.tmp = tmp
        config = json.dumps({"tmp": str(tmp), "servers": servers})
        script = 'ip link set lo up && exec "$0" "$1" "$2"'
        self.process = subprocess.Popen(
            ["unshare", "-n", "sh", "-c", script, sys.executable, str(HARNESS), config],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(tmp / "harness.stderr", "wb"),
            cwd=Path(__file__).resolve().parents[1], preexec_fn=die_with_parent())
        self._ids = itertools.count(1)
        self._lock = threading.Condition()
        self._replies: dict[int, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self._ready: dict[str, Any] | None = None
        self._reader = threading.Thread(target=self._read, daemon=True, name="cdp-reader")
        self._reader.start()
        try:
            self.ready = self._wait(lambda: self._ready, HARNESS_START_S, "the harness to start")
        except BaseException:
            self.close()      # no harness (and so no Chromium: it dies with the harness) left behind
            raise

    def _read(self) -> None:
        for raw in self.process.stdout:
            message = json.loads(raw)
            with self._lock:
                if message.get("harness") == "ready":
                    self._ready = message
                elif "id" in message:
                    self._replies[message["id"]] = message
                else:
                    self.events.append(message)
                self._lock.notify_all()
        with self._lock:
            self._lock.notify_all()

    def _wait(self, predicate, timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                value = predicate()
                if value:
                    return value
                if self.process.poll() is not None:
                    raise CdpError(f"the harness exited ({self.process.returncode}) waiting for {what}; "
                                   f"see {self.tmp / 'harness.stderr'}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"timed out waiting for {what}")
                self._lock.wait(min(left, 0.5))

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = 15.0) -> dict[str, Any]:
        message_id = next(self._ids)
        message: dict[str, Any] = {"id": message_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self.process.stdin.write((json.dumps(message) + "\n").encode())
        self.process.stdin.flush()
        reply = self._wait(lambda: self._replies.pop(message_id, None), timeout, method)
        if "error" in reply:
            raise CdpError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()   # the harness kills its Chromium and stops its servers
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()      # the harness we started, by its handle; its Chromium dies with it
                self.process.wait(10)

    # --- pages -----------------------------------------------------------------------------

    def new_page(self) -> "Page":
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        return Page(self, target, session)


class Page:
    """One tab. Collects its JavaScript errors, console errors, log errors."""

    def __init__(self, harness: Harness, target: str, session: str) -> None:
        self.harness, self.target, self.session = harness, target, session
        self._first_event = len(harness.events)
        self._taken: set[int] = set()
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable")
        self.send("Page.addScriptToEvaluateOnNewDocument", {"source": CSP_LISTENER})

    def send(self, method: str, params: dict[str, Any] | None = None, timeout: float = 15.0) -> dict[str, Any]:
        return self.harness.send(method, params, self.session, timeout)

    def goto(self, url: str, ready: str = "document.readyState === 'complete'") -> None:
        self.send("Page.navigate", {"url": url})
        self.wait_for(ready, 15, f"{url} to load")

    def js(self, expression: str, *, gesture: bool = False, timeout: float = 15.0) -> Any:
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True, "userGesture": gesture}, timeout)
        if "exceptionDetails" in result:
            raise CdpError(f"{expression[:80]}: {result['exceptionDetails'].get('text')} "
                           f"{result['exceptionDetails'].get('exception', {}).get('description', '')}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.js(expression)
            except CdpError:        # e.g. still the previous document during a navigation
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:g} s waiting for {what} ({expression})")
            time.sleep(0.1)

    def take_events(self, method: str) -> list[dict[str, Any]]:
        """This tab's events named ``method`` not taken before."""
        with self.harness._lock:
            found = [e for e in self.harness.events[self._first_event:]
                     if e.get("method") == method and e.get("sessionId") == self.session
                     and id(e) not in self._taken]
            self._taken.update(id(e) for e in found)
        return found

    def on_new_document(self, source: str) -> None:
        self.send("Page.addScriptToEvaluateOnNewDocument", {"source": source})

    def click(self, selector: str) -> None:
        self.js(f"document.querySelector({json.dumps(selector)}).click()", gesture=True)

    def text(self, selector: str) -> str:
        return self.js(f"(document.querySelector({json.dumps(selector)}) || {{}}).textContent || ''")

    def texts(self, selector: str) -> list[str]:
        return self.js(f"[...document.querySelectorAll({json.dumps(selector)})].map(e => e.textContent)")

    def visible(self, selector: str) -> bool:
        return self.js(f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
                       " return Boolean(e && !e.closest('[hidden]') && e.getClientRects().length); })()")

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})["data"]
        path.write_bytes(base64.b64decode(data))
        print(f"screenshot: {path}")
        return path

    def problems(self, allow_network: tuple[str, ...] = ()) -> list[str]:
        """Every JavaScript exception, console error, browser log error and CSP
        violation this page reported. ``allow_network``: texts of network errors
        the test provoked on purpose ("status of 503", "ERR_CONNECTION_REFUSED";
        Chromium logs each failed request as a network error)."""
        found = []
        for event in self.harness.events[self._first_event:]:
            if event.get("sessionId") != self.session:
                continue
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                found.append(f"exception: {details.get('text')} {details.get('exception', {}).get('description', '')}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append("console.error: " + " ".join(str(a.get("value", a.get("description")))
                                                          for a in params.get("args", [])))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                entry = params["entry"]
                if entry.get("source") == "network" and any(a in entry.get("text", "")
                                                             for a in allow_network):
                    continue
                found.append(f"log ({entry.get('source')}): {entry.get('text')}")
        try:
            violations = self.js("window.__cspViolations || []")
        except CdpError:
            violations = []
        found += [f"CSP violation: {v}" for v in violations]
        return found

    def set_width(self, width: int, height: int = 800) -> None:
        """Lay the page out as a window ``width`` CSS pixels wide (a phone's
        viewport rules below 800 px)."""
        self.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                         "mobile": width < 800})

    def press(self, key: str) -> None:
        """One key, pressed and released, as the keyboard sends it (to whatever has focus)."""
        code = KEYS[key]
        down = {"type": "keyDown", "key": " " if key == "Space" else key, "code": key,
                "windowsVirtualKeyCode": code, "nativeVirtualKeyCode": code}
        if key == "Enter":
            down["text"] = "\r"
        self.send("Input.dispatchKeyEvent", down)
        self.send("Input.dispatchKeyEvent", {**down, "type": "keyUp", "text": ""} if "text" in down
                  else {**down, "type": "keyUp"})

    def focused(self) -> str:
        """What has focus: ``#id``, ``tag[href]``, or ``body``."""
        return self.js("(() => { const e = document.activeElement; if (!e || e === document.body) return 'body';"
                       " if (e.id) return '#' + e.id;"
                       " return e.tagName.toLowerCase() + (e.getAttribute('href') ? `[href=\"${e.getAttribute('href')}\"]` : ''); })()")

    def tab_to(self, selector: str, most: int = 30) -> None:
        """Press Tab until ``selector`` has focus (at most ``most`` times)."""
        for _ in range(most):
            self.press("Tab")
            if self.js(f"document.activeElement === document.querySelector({json.dumps(selector)})"):
                return
        raise AssertionError(f"{selector} never took focus in {most} Tabs (stopped at {self.focused()})")

    def overflow(self) -> list[str]:
        return self.js(OVERFLOW_PROBE)

    def accessibility_violations(self, impacts: tuple[str, ...] = ("serious", "critical")) -> list[dict[str, Any]]:
        """axe-core's violations of ``impacts`` on the page as it is now."""
        if not self.js("typeof window.axe === 'object'"):
            self.js(AXE.read_text(encoding="utf-8"))        # DevTools evaluation: not subject to the page's CSP
        return [v for v in self.js(AXE_RUN, timeout=60) if v["impact"] in impacts]

    def close(self) -> None:
        self.harness.send("Target.closeTarget", {"targetId": self.target})
