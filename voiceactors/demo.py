"""``voiceactors demo`` and ``voiceactors serve --demo``: the whole product in
one process, no network, no key.

The demo plumbing lives here, so the server never imports the simulator:
``demo_dirs`` (a sample journal and state dir in a temp folder) and
``open_demo_simulator`` (the simulator on a loopback port, the settings
pointed at it: ``OPENAI_BASE_URL`` and a dummy standard key). ``serve --demo``
is ``server.cli_serve`` with those two as its folders and backend.

``voiceactors demo`` starts the Realtime simulator and the voice server on ephemeral loopback
ports, then plays the browser through the real HTTP API with
``httpx.AsyncClient``: mint a session, open the call at the simulator (as the
browser's WebRTC offer would), ``POST /api/voice/connect``, follow the call's
event stream, and let the simulator's ``demo`` scenario talk to the server's
call actor over the sideband — a briefing, a parallel batch of three reads, a
barge-in while a tool runs, then a clean close. It prints what happened and
exits 0 only if every tool call was answered exactly once and the server
caused no protocol error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, AsyncIterator, Iterator, TextIO

import httpx
import trio

from voiceactors import clock, logs
from voiceactors.logs import get_logger
from voiceactors.server import cli_serve, run_server, settings_from_args
from voiceactors.settings import Settings
from voiceactors.mcp.demo_source import open_demo_source
from voiceactors.journal.config import config_path
from voiceactors.simulator import Simulator
from voiceactors.simulator.phone import DEMO_CALLER, DEMO_WEBHOOK_SECRET

DEMO_OPENAI_KEY = "sk-demo-voiceactors-simulator"   # what the simulator accepts in --demo
DEMO_SCENARIO = "demo_mcp"   # the "demo" call plus a tool of the demo's MCP source (mcp/demo_source.py)
CALL_DEADLINE_S = 30.0      # the scenario itself takes about ten seconds
HTTP_TIMEOUT_S = 15.0


# serve --demo's lines are the server's (docs/operations.md)
_serve_log = get_logger(actor="server")


# --- the demo's folders and simulator (both commands) ---------------------------------

@dataclass
class DemoEnv:
    """A generated journal and state dir, and the simulator serving OpenAI's part."""

    settings: Settings
    simulator: Simulator


@contextlib.contextmanager
def demo_dirs(settings: Settings, explicit_journal: bool, explicit_state: bool) -> Iterator[Settings]:
    """A sample journal (unless one was given) and a state dir (unless one was
    given) in a temp folder removed afterwards."""
    from voiceactors.journal.sample import write_sample_journal

    with tempfile.TemporaryDirectory(prefix="voiceactors-demo-") as tmp:
        changes: dict[str, Any] = {}
        if not explicit_journal:
            changes["journal"] = write_sample_journal(Path(tmp) / "journal", days=14, today=clock.today())
            _let_the_demo_caller_in(changes["journal"])
        if not explicit_state:
            changes["state_dir"] = Path(tmp) / "state"
        yield settings.replace(**changes)


def _let_the_demo_caller_in(journal: Path) -> None:
    """The demo's sample journal takes phone calls from ``DEMO_CALLER``
    (``voiceactors phone-call --demo``; docs/phone.md)."""
    path = config_path(journal)
    data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    voice = data.setdefault("voice", {})
    voice.setdefault("phone", {"allowed_callers": [DEMO_CALLER]})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")


@contextlib.asynccontextmanager
async def open_demo_simulator(settings: Settings, scenario: Any = DEMO_SCENARIO) -> AsyncIterator[DemoEnv]:
    """Run the Realtime simulator on an ephemeral loopback port and point the
    settings at it (base URL, a dummy standard key). Any call id may join
    (``auto_calls``) and plays ``scenario``. Leaving the block stops it."""
    sim = Simulator(scenario, api_key=DEMO_OPENAI_KEY, auto_calls=True, host="127.0.0.1")
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.serve, 0)
        settings = settings.replace(openai_base_url=sim.base_url, openai_api_key_env=DEMO_OPENAI_KEY, demo=True,
                                    openai_webhook_secret_env=settings.openai_webhook_secret_env or DEMO_WEBHOOK_SECRET)
        async with contextlib.AsyncExitStack() as stack:
            if not settings.mcp_sources:   # the demo's own MCP source, unless the operator named theirs
                settings = await stack.enter_async_context(open_demo_source(settings))
            yield DemoEnv(settings=settings, simulator=sim)
        nursery.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def _simulator_backend(settings: Settings) -> AsyncIterator[Settings]:
    """``serve --demo``'s backend: the simulator, announced in one log line."""
    async with open_demo_simulator(settings) as env:
        _serve_log.info("server.demo_simulator", base_url=env.settings.openai_base_url, journal=str(env.settings.journal))
        yield env.settings


def cli_serve_demo(args: argparse.Namespace) -> int:
    """``voiceactors serve --demo``: ``voiceactors serve`` on the demo's folders
    (a given ``--journal`` / ``--state-dir`` is kept) with the simulator."""
    folders = partial(demo_dirs, explicit_journal=bool(args.journal), explicit_state=bool(args.state_dir))
    return cli_serve(args, folders=folders, backend=_simulator_backend)


# --- voiceactors demo --------------------------------------------------------------

@dataclass
class DemoResult:
    """What the demo saw; ``ok`` decides the exit code."""

    call_id: str | None = None
    feed: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


class Printer:
    def __init__(self, out: TextIO) -> None:
        self.out = out

    def __call__(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)


def _redact(secret: str) -> str:
    return secret[:3] + "…" if secret else "(empty)"


async def _expect(printer: Printer, result: DemoResult, label: str, response: httpx.Response,
                  status: int) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = {}
    shown = {k: (_redact(v) if k == "ephemeral_key" else v) for k, v in body.items()} \
        if isinstance(body, dict) else body
    printer(f"  {label} → {response.status_code} {json.dumps(shown, ensure_ascii=False)}")
    if response.status_code != status:
        result.problems.append(f"{label} answered {response.status_code}, expected {status}")
    return body if isinstance(body, dict) else {}


async def _follow_feed(client: httpx.AsyncClient, call_id: str, result: DemoResult, printer: Printer,
                       connected: trio.Event) -> None:
    """Read ``/api/voice/events`` and narrate each event as it arrives."""
    async with client.stream("GET", "/api/voice/events", params={"call_id": call_id}) as response:
        connected.set()
        if response.status_code != 200:
            result.problems.append(f"GET /api/voice/events answered {response.status_code}")
            return
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            result.feed.append(event)
            _narrate(printer, event)
            if event.get("type") == "call.ended":
                return


def _narrate(printer: Printer, event: dict[str, Any]) -> None:
    kind = event.get("type")
    if kind == "transcript":
        printer(f"    {event.get('role', '?'):>9}: {event.get('text', '')}")
    elif kind == "tool.started":
        printer(f"    tool ▶ {event.get('tool')}  ({event.get('tool_call_id')})")
    elif kind in ("tool.finished", "tool.failed"):
        printer(f"    tool ◀ {event.get('tool')}  {event.get('outcome')}  {event.get('duration_ms', '?')} ms")
    elif kind == "usage":
        call = event.get("call") or {}
        cost = call.get("cost_usd")
        total = sum((call.get("tokens") or {}).values())
        printer(f"    usage: {sum((event.get('tokens') or {}).values())} tokens; the call so far {total} tokens, "
                + (f"${cost:.4f}" if isinstance(cost, (int, float)) else "cost unknown"))
    elif kind == "call.ended":
        printer(f"    call ended: {event.get('reason')}")
    else:
        printer(f"    {kind}: {json.dumps({k: v for k, v in event.items() if k != 'type'}, ensure_ascii=False)}")


def _judge(printer: Printer, result: DemoResult, sim_call: Any) -> None:
    """Check the simulator's record of the call against the sideband rules."""
    printer("")
    printer("What the simulator (standing in for OpenAI) recorded:")
    for tool_call_id, record in sim_call.tool_calls.items():
        outputs = sim_call.outputs.get(tool_call_id, [])
        preview = outputs[0][:70] + ("…" if len(outputs[0]) > 70 else "") if outputs else "-"
        printer(f"  {record.name:<20} {tool_call_id:<28} answered {len(outputs)}×  {preview}")
        if len(outputs) != 1:
            result.problems.append(f"tool call {tool_call_id} ({record.name}) answered {len(outputs)} times")
    for response in sim_call.responses:
        reason = f" ({response.reason})" if response.reason else ""
        printer(f"  response {response.id:<28} {response.origin:<11} {response.status}{reason}"
                f"  tools: {len(response.call_ids)}")
    printer(f"  response.create sent by the server: {sim_call.response_creates}")
    printer(f"  protocol errors caused: {len(sim_call.errors_sent)}"
            + (f" {sim_call.error_codes}" if sim_call.errors_sent else ""))
    if not sim_call.tool_calls:
        result.problems.append("the scenario issued no tool call")
    for error in sim_call.errors_sent:
        result.problems.append(f"protocol error: {error['error'].get('code')}: {error['error'].get('message')}")
    for violation in sim_call.violations:
        result.problems.append(f"protocol violation: {violation}")


async def run_demo(settings: Settings, out: TextIO = sys.stdout) -> DemoResult:
    """Run the demo on ``settings`` (journal and state dir already prepared)."""
    printer = Printer(out)
    result = DemoResult()
    async with open_demo_simulator(settings, DEMO_SCENARIO) as env:
        sim = env.simulator
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(partial(run_server, env.settings, shutdown_trigger=stop.wait))
            base = binds[0]
            printer(f"voiceactors demo — server {base}, simulator {sim.base_url}, journal {env.settings.journal}")
            headers = {"Authorization": f"Bearer {settings.api_token}"} if settings.api_token else {}
            try:
                async with httpx.AsyncClient(base_url=base, timeout=HTTP_TIMEOUT_S, headers=headers) as client:
                    await _drive(client, sim, result, printer)
            finally:
                stop.set()
    printer("")
    if result.ok:
        tools = sum(1 for e in result.feed if e.get("type") in ("tool.finished", "tool.failed"))
        printer(f"OK — every tool call was answered exactly once ({tools} seen by the client feed); "
                "no protocol error.")
    else:
        printer("FAILED:")
        for problem in result.problems:
            printer(f"  - {problem}")
    return result


async def _drive(client: httpx.AsyncClient, sim: Any, result: DemoResult, printer: Printer) -> None:
    printer("")
    printer("1. The browser asks for a session")
    body = await _expect(printer, result, "POST /api/voice/session", await client.post("/api/voice/session"), 200)
    key = body.get("ephemeral_key", "")
    if sim.client_secret_requests:
        session = sim.client_secret_requests[-1]["body"].get("session", {})
        printer(f"     minted for model {session.get('model')} with {len(session.get('tools', []))} tools and a "
                f"{len(session.get('instructions', ''))}-character instruction")
    if not key:
        return

    printer("2. The browser opens its WebRTC call at the simulator with the ephemeral key")
    offer = await client.post(f"{sim.base_url}/realtime/calls", content=b"v=0\r\n",
                              headers={"Authorization": f"Bearer {key}", "Content-Type": "application/sdp"})
    call_id = offer.headers.get("location", "").rstrip("/").rsplit("/", 1)[-1]
    printer(f"  POST /v1/realtime/calls → {offer.status_code}, call {call_id or '?'}")
    if offer.status_code != 201 or not call_id:
        result.problems.append(f"the simulator did not open a call ({offer.status_code})")
        return
    result.call_id = call_id

    printer("3. The browser hands the call to the server")
    await _expect(printer, result, "POST /api/voice/connect",
                  await client.post("/api/voice/connect", json={"call_id": call_id}), 200)
    status = await client.get("/api/voice/status")
    await _expect(printer, result, "GET /api/voice/status", status, 200)

    printer(f"4. The call (scenario \"{DEMO_SCENARIO}\"), as the client feed reports it")
    sim_call = sim.calls[call_id]
    with trio.move_on_after(CALL_DEADLINE_S) as deadline:
        async with trio.open_nursery() as nursery:
            connected = trio.Event()
            nursery.start_soon(_follow_feed, client, call_id, result, printer, connected)
            await connected.wait()
            await sim_call.wait_until(lambda c: c.closed and c.connection is None)
            # the feed's last event (call.ended) follows the close; give it a moment
            with trio.move_on_after(2.0):
                await _wait_feed_end(result)
            nursery.cancel_scope.cancel()
    if deadline.cancelled_caught:
        result.problems.append(f"the call did not finish within {CALL_DEADLINE_S:g} s")
    _judge(printer, result, sim_call)

    printer("")
    printer("5. After the call")
    with trio.move_on_after(5.0):
        while True:
            data = (await client.get("/api/voice/status")).json()
            if data.get("active_sessions") == 0:
                break
            await trio.sleep(0.05)
    await _expect(printer, result, "GET /api/voice/status", await client.get("/api/voice/status"), 200)


async def _wait_feed_end(result: DemoResult) -> None:
    while not any(e.get("type") == "call.ended" for e in result.feed):
        await trio.sleep(0.02)


def cli_demo(args: argparse.Namespace) -> int:
    """``voiceactors demo``: exit 0 when the scripted call went by the rules."""
    try:
        settings = settings_from_args(args).replace(demo=True)
        if getattr(args, "today", None):
            clock.pin(args.today)
    except ValueError as error:
        print(f"voiceactors: {error}", file=sys.stderr)
        return 2
    # The account on stdout is the demo's output; logs go to stderr, warnings only
    # unless a format was asked for.
    level = "info" if getattr(args, "log_format", None) else "warning"
    logs.configure(settings.log_format if getattr(args, "log_format", None) else "console", level)
    settings = settings.replace(host="127.0.0.1", port=getattr(args, "port", None) or 0)
    with demo_dirs(settings, bool(getattr(args, "journal", None)), bool(getattr(args, "state_dir", None))) as ready:
        result = trio.run(run_demo, ready)
    return 0 if result.ok else 1
