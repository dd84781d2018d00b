"""``voiceactors simulate``: the Realtime simulator on its own, until Ctrl-C."""

from __future__ import annotations

import os
from typing import Any

import httpx
import trio

from voiceactors.simulator.http import open_listeners
from voiceactors.simulator.phone import DEMO_CALLER, DEMO_WEBHOOK_SECRET
from voiceactors.simulator.scenario import ScenarioError, load_scenario, scenario_names
from voiceactors.simulator.service import Simulator


def cli_simulate(args: Any) -> int:
    """``voiceactors simulate --host H --port P [--scenario NAME]``: serve until Ctrl-C.
    Any call id may join (``auto_calls``); any non-``ek_`` bearer key is accepted."""
    from voiceactors import logs

    logs.configure("console")
    try:
        scenario = load_scenario(args.scenario) if args.scenario else None
    except ScenarioError as exc:
        print(f"error: {exc}")
        return 2
    sim = Simulator(scenario, api_key=None, auto_calls=True, host=args.host)

    async def main() -> int:
        try:
            listeners, sim.port = await open_listeners(args.host, args.port)
        except OSError as exc:
            print(f"error: cannot listen on {args.host}:{args.port}: {exc}")
            return 1
        print(f"Realtime simulator on {sim.base_url} "
              f"(scenario: {sim.scenario.name}; shipped: {', '.join(scenario_names())})", flush=True)
        await sim.serve_listeners(listeners, sim.port)
        return 0

    try:
        return trio.run(main)
    except KeyboardInterrupt:
        return 0


PHONE_CALL_POLL_S = 0.5
#: the simulator's standard key in ``serve --demo`` (demo.DEMO_OPENAI_KEY; the simulator may not import the demo)
DEMO_KEY = "sk-demo-voiceactors-simulator"


def cli_phone_call(args: Any) -> int:
    """``voiceactors phone-call --from +1555… [--demo]``: place a phone call
    through the simulator a running server talks to (its
    ``OPENAI_BASE_URL``, read from the server's console configuration unless
    ``--simulator`` names it), which posts the signed webhook to the server;
    then press ``--dtmf`` keys once the call is joined and print what became
    of it. Offline: the simulator plays the call."""
    server = args.server.rstrip("/")
    secret = args.secret or os.environ.get("OPENAI_WEBHOOK_SECRET") or (DEMO_WEBHOOK_SECRET if args.demo else None)
    caller = None if args.withheld else (args.from_number or (DEMO_CALLER if args.demo else None))
    key = args.key or os.environ.get("OPENAI_API_KEY") or DEMO_KEY
    if not secret:
        print("error: no webhook secret: --secret, OPENAI_WEBHOOK_SECRET, or --demo")
        return 2
    if caller is None and not args.withheld:
        print("error: who calls? --from +15551234567, --withheld, or --demo")
        return 2
    headers = []
    for header in args.header or ():
        name, _, value = header.partition(":")
        if not name.strip() or not value.strip():
            print(f"error: --header {header!r} is not 'Name: value'")
            return 2
        headers.append([name.strip(), value.strip()])

    async def main() -> int:
        token = args.token or os.environ.get("VOICEACTORS_API_TOKEN")
        async with httpx.AsyncClient(timeout=30) as client:
            simulator = args.simulator
            if simulator is None:
                config = await client.get(f"{server}/api/voice/console-config",
                                          headers={"Authorization": f"Bearer {token}"} if token else {})
                config.raise_for_status()
                simulator = config.json()["realtime_base_url"]
            control = f"{simulator.rstrip('/')}/simulator/phone-calls"
            auth = {"Authorization": f"Bearer {key}"}
            placed = await client.post(control, headers=auth, json={
                "server": server, "secret": secret, "from": caller, "asserted": args.asserted,
                "headers": headers, "scenario": args.scenario})
            if placed.status_code != 200:
                print(f"error: the simulator at {simulator} answered {placed.status_code}: {placed.text[:300]}")
                return 1
            call_id, webhook = placed.json()["call_id"], placed.json()["webhook"]
            print(f"call {call_id} from {caller or 'a withheld number'}: the webhook was answered "
                  f"{webhook['status']} {webhook['answer']}", flush=True)
            view: dict[str, Any] = {}
            pressed = not args.dtmf
            with trio.move_on_after(args.timeout):
                while not view.get("ended"):
                    await trio.sleep(PHONE_CALL_POLL_S)
                    view = (await client.get(f"{control}/{call_id}", headers=auth)).json()
                    if not pressed and view.get("accepted"):
                        await trio.sleep(args.dtmf_after)
                        view = (await client.post(f"{control}/{call_id}/dtmf", headers=auth,
                                                  json={"keys": args.dtmf})).json()
                        print(f"pressed {args.dtmf}", flush=True)
                        pressed = True
            for line in view.get("said", ()):
                print(f"  assistant: {line}")
            ending = ("rejected with SIP " + str(view["rejected_with"]) if view.get("rejected_with")
                      else "transferred to " + view["referred_to"] if view.get("referred_to")
                      else "ended" if view.get("ended") else f"still live after {args.timeout:g} s")
            print(f"tool calls: {', '.join(view.get('tool_calls', ())) or 'none'}; the call {ending}")
            return 0 if webhook["status"] == 200 else 1

    try:
        return trio.run(main)
    except httpx.HTTPError as exc:
        print(f"error: {type(exc).__name__}: {exc}")
        return 1
    except KeyboardInterrupt:
        return 130
