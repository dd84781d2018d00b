"""``voiceactors simulate``: the Realtime simulator on its own, until Ctrl-C."""

from __future__ import annotations

from typing import Any

import trio

from voiceactors.simulator.http import open_listeners
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
