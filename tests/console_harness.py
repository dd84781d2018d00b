"""The browser tests' far side: run inside a loopback-only network namespace.

``tests/test_console_browser.py`` starts this script as
``unshare -n sh -c 'ip link set lo up && exec python tests/console_harness.py CONFIG'``
so that everything that listens or connects — the Realtime simulator, one or
more voice servers, and headless Chromium — lives where only 127.0.0.1
exists: no packet can leave the machine, and Chromium offers only loopback
ICE candidates. The test process stays outside and talks to this one over
stdin/stdout, one JSON object per line:

* out, first: ``{"harness": "ready", "servers": {name: url}, "simulator": url,
  "webrtc": bool, "log": path}``;
* in: a Chrome DevTools Protocol message (``id``, ``method``, ``params``,
  ``sessionId``) — relayed to Chromium's browser endpoint over trio-websocket;
  every CDP reply and event comes back out as a line;
* in: ``Harness.*`` methods, answered here: ``Harness.simulator`` (what the
  simulator recorded per call, and per Live session: ``live``), ``Harness.seed`` (write a call record into a
  server's state dir), ``Harness.expire`` (the simulator's call reaches the
  service's time limit: ``session_expired``), ``Harness.stop_server`` (stop
  one server: "the server gone").

stdin closing ends everything (Chromium is killed, the servers stop).
CONFIG is a JSON object ``{"tmp": dir, "servers": {name: {settings overrides}}}``;
besides Settings fields a server may name ``journal_voice`` (the ``voice`` block
of its own copy of the sample journal's config), ``env`` (set in this
process before it starts: the fake Claude CLI's mode) and ``brain_chat``
(true: its brain is the ``openai`` backend on a Chat Completions stand-in,
``chat_support.summarising``, which also summarises calls).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import trio
from trio_websocket import open_websocket_url

from chat_support import chat_app, serve_chat, summarising
from child_support import die_with_parent
from voiceactors.brain.call_summary import SUMMARY_PROMPT
from voiceactors.brain.openai_text import OpenAITextBackend
from voiceactors import clock, logs
from voiceactors.call.record import record_path
from voiceactors.demo import DEMO_OPENAI_KEY
from voiceactors.journal.sample import write_sample_journal
from voiceactors.server import run_server
from voiceactors.settings import Settings
from voiceactors.simulator import Simulator
from voiceactors.simulator.live import LIVE_SCENARIOS
from voiceactors.tools.handler_context import ToolContext
from voiceactors.tools.registry import REGISTRY

CHROMIUM = "/usr/lib/chromium/chromium"
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream", "--allow-loopback-in-peer-connection",
    "--autoplay-policy=no-user-gesture-required", "--window-size=1280,900", "--hide-scrollbars",
    "--remote-debugging-port=0",
]
CDP_MAX_MESSAGE = 64 * 1024 * 1024        # screenshots are large


class Out:
    """stdout, one JSON line per message, written whole."""

    def __init__(self) -> None:
        self.stream = trio.lowlevel.FdStream(os.dup(1))
        self.lock = trio.Lock()

    async def send(self, message: dict[str, Any]) -> None:
        async with self.lock:
            await self.stream.send_all((json.dumps(message) + "\n").encode())


async def lines_of(stream: trio.abc.ReceiveStream):
    buffer = b""
    while True:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)


def sim_report(sim: Simulator) -> dict[str, Any]:
    calls = {}
    for call_id, call in sim.calls.items():
        calls[call_id] = {
            "tool_calls": {tid: {"name": rec.name, "answered": len(call.outputs.get(tid, []))}
                           for tid, rec in call.tool_calls.items()},
            "responses": [{"id": r.id, "status": r.status, "origin": r.origin, "reason": r.reason}
                          for r in call.responses],
            "errors_sent": [e.get("error", {}).get("code") for e in call.errors_sent],
            "violations": [str(v) for v in call.violations],
            "closed": call.closed, "hangups": sim.hangups.count(call_id),
            "received_types": [e.get("type") for e in call.received],
            "session_instructions": call.session.get("instructions"),
        }
    live = {session_id: {
        "step": session.step, "steps": len(session.steps), "attaches": session.attaches,
        "outputs": {call_id: len(outputs) for call_id, outputs in session.outputs.items()},
        "issued": sorted(session.issued), "response_creates": session.response_creates,
        "received_types": [e.get("type") for e in session.received], "nonconforming": session.nonconforming,
        "closed": session.closed, "close_reason": session.close_reason, "declared": sorted(session.declared()),
    } for session_id, session in sim.live.sessions.items()}
    return {"calls": calls, "live": live}


def browser_live_scenario(journal: Path) -> list[dict[str, Any]]:
    """The Live sessions' scenario in the browser tests: a delegated search, then a write of one of the
    journal's open commitments and a search the user speaks over at once (simulator/live.py's steps)."""
    context = ToolContext(journal=journal, state_dir=journal.parent / "scenario-state", today=clock.today)
    [first, *_] = REGISTRY["commitments.list"].handler(context, {"state": "open"})["commitments"]
    return [
        {"user": "What did I write about the garden?"},
        {"delegate": [{"name": "journal_search", "arguments": {"query": "garden"}}],
         "answer": "You wrote about the garden."},
        {"user": "Mark my first commitment done, and look up the boat."},
        {"delegate": [{"name": "commitments_complete", "arguments": {"commitment_id": first["id"], "resolution": "done"}},
                      {"name": "journal_search", "arguments": {"query": "boat"}}],
         "interrupt": "Actually, never mind the boat."},
        {"assistant": "Done, and I left the boat."},
        {"usage": True},
    ]


async def webrtc_answerer(sim_base: str) -> bool:
    """Does the simulator answer a browser's preflight for a WebRTC offer?"""
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            response = await client.options(f"{sim_base}/realtime/calls", headers={
                "Origin": "http://127.0.0.1:1", "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization,content-type"})
    except httpx.HTTPError:
        return False
    return response.status_code < 300 and bool(response.headers.get("access-control-allow-origin"))


CHROMIUM_START_S = 20.0     # real time (the harness runs on trio's real clock), per try
CHROMIUM_TRIES = 2          # on a loaded machine a start can miss its 20 s once


class Chromium:
    """The browser process, forked from the harness's main thread so that it
    dies with the harness (``die_with_parent``), in its own process group so
    that ``kill`` also reaches its renderers and helpers."""

    def __init__(self, tmp: Path, attempt: int) -> None:
        self.profile = tmp / f"chromium-profile-{attempt}"
        self.profile.mkdir(parents=True, exist_ok=True)
        self.log = tmp / f"chromium-{attempt}.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent())

    async def endpoint(self) -> str:
        port_file = self.profile / "DevToolsActivePort"
        with trio.fail_after(CHROMIUM_START_S):
            while not (port_file.exists() and len(port_file.read_text().splitlines()) >= 2):
                if self.process.poll() is not None:
                    raise RuntimeError(f"chromium exited {self.process.returncode}; see {self.log}")
                await trio.sleep(0.05)
        port, path = port_file.read_text().splitlines()[:2]
        return f"ws://127.0.0.1:{port}{path}"

    async def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)     # its own group: the browser and its children
        await trio.to_thread.run_sync(self.process.wait)


async def start_chromium(tmp: Path) -> tuple[Chromium, str]:
    """A started browser and its DevTools endpoint; a start that fails or
    misses its time is killed (with its children) and tried once more."""
    for attempt in range(1, CHROMIUM_TRIES + 1):
        chromium = Chromium(tmp, attempt)
        try:
            return chromium, await chromium.endpoint()
        except (trio.TooSlowError, RuntimeError) as failed:
            with trio.CancelScope(shield=True):
                await chromium.kill()
            print(f"chromium start {attempt} failed: {failed!r}", file=sys.stderr, flush=True)
            if attempt == CHROMIUM_TRIES:
                raise
        except BaseException:
            with trio.CancelScope(shield=True):
                await chromium.kill()
            raise
    raise AssertionError("unreachable")


async def main(config: dict[str, Any]) -> None:
    tmp = Path(config["tmp"])
    log_path = tmp / "server.log"
    logs.configure("json", "info", stream=open(log_path, "a", buffering=1))
    journal = write_sample_journal(tmp / "journal", days=7, today=clock.today())
    out = Out()
    sim = Simulator("demo", api_key=DEMO_OPENAI_KEY, auto_calls=True, host="127.0.0.1")
    LIVE_SCENARIOS["browser_live"] = browser_live_scenario(journal)    # every server's journal is a copy of this one
    sim.live.scenario = "browser_live"
    async with trio.open_nursery() as outer:
        await outer.start(sim.serve, 0)
        chat_url = await serve_chat(outer, chat_app(summarising(SUMMARY_PROMPT), []))   # a brain's model
        async with trio.open_nursery() as nursery:
            servers, stops, state_dirs = await start_servers(nursery, config, journal, sim, chat_url)
            chromium, endpoint = await start_chromium(tmp)
            try:
                async with open_websocket_url(endpoint, max_message_size=CDP_MAX_MESSAGE) as ws:
                    await out.send({"harness": "ready", "servers": servers, "simulator": sim.base_url,
                                    "webrtc": await webrtc_answerer(sim.base_url), "log": str(log_path)})
                    async with trio.open_nursery() as relay:
                        relay.start_soon(from_browser, ws, out)
                        await from_tests(ws, out, sim, stops, state_dirs)
                        relay.cancel_scope.cancel()
            finally:
                with trio.CancelScope(shield=True):
                    await chromium.kill()
                for stop in stops.values():
                    stop.set()
        outer.cancel_scope.cancel()


async def start_servers(nursery: trio.Nursery, config: dict[str, Any], journal: Path, sim: Simulator,
                        chat_url: str):
    tmp = Path(config["tmp"])
    servers: dict[str, str] = {}
    stops: dict[str, trio.Event] = {}
    state_dirs: dict[str, Path] = {}
    for name, overrides in config["servers"].items():
        overrides = dict(overrides)
        state_dirs[name] = tmp / f"state-{name}"
        key = overrides.pop("openai_api_key_env", DEMO_OPENAI_KEY)
        brain_chat = overrides.pop("brain_chat", False)
        os.environ.update(overrides.pop("env", {}))
        own_journal = Path(shutil.copytree(journal, tmp / f"journal-{name}"))   # a brain writes into its journal
        voice = overrides.pop("journal_voice", None)
        if voice is not None:
            config_path = own_journal / "config" / "journal.json"
            data = json.loads(config_path.read_text())
            data["voice"] = voice
            config_path.write_text(json.dumps(data))
        settings = Settings(journal=own_journal, state_dir=state_dirs[name], port=0, demo=True,
                            openai_base_url=sim.base_url, openai_api_key_env=key,
                            shutdown_deadline_s=3.0, close_deadline_s=1.0).replace(**overrides)
        stops[name] = trio.Event()
        brain = OpenAITextBackend(settings.replace(openai_base_url=chat_url)) if brain_chat else None
        [servers[name]] = await nursery.start(
            lambda task_status, s=settings, e=stops[name], b=brain: run_server(s, shutdown_trigger=e.wait,
                                                                              brain_backend=b,
                                                                              task_status=task_status))
    return servers, stops, state_dirs


async def from_browser(ws: Any, out: Out) -> None:
    while True:
        await out.send(json.loads(await ws.get_message()))


async def from_tests(ws: Any, out: Out, sim: Simulator, stops: dict[str, trio.Event],
                     state_dirs: dict[str, Path]) -> None:
    async for message in lines_of(trio.lowlevel.FdStream(os.dup(0))):
        method = message.get("method", "")
        if not method.startswith("Harness."):
            await ws.send_message(json.dumps(message))
            continue
        reply: dict[str, Any] = {"id": message["id"], "result": {}}
        params = message.get("params", {})
        if method == "Harness.simulator":
            reply["result"] = sim_report(sim)
        elif method == "Harness.seed":
            path = record_path(state_dirs[params["server"]], params["call_id"])
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(line) + "\n" for line in params["lines"]))
        elif method == "Harness.expire":
            await sim.expire_session(params["call_id"])     # the service's own time limit, now
        elif method == "Harness.stop_server":
            stops[params["server"]].set()
        else:
            reply = {"id": message["id"], "error": {"message": f"unknown {method}"}}
        await out.send(reply)


if __name__ == "__main__":
    trio.run(main, json.loads(sys.argv[1]))
