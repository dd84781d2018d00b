"""A local stand-in for the OpenAI Realtime service (``docs/simulator.md``).

Not part of the product: the server never imports it (``tests/test_layering.py``
checks). Tests, benchmarks, ``voiceactors demo`` / ``serve --demo``
(``voiceactors/demo.py``) and ``voiceactors simulate`` run it.

Modules: ``service`` (the ``Simulator``: REST routes, the sideband upgrade,
its calls), ``call`` (one call's protocol and records), ``http`` (the h11
HTTP and websocket layer), ``scenario`` (scenario files, shipped ones in
``scenarios/``), ``webrtc`` (a browser call's peer, optional aiortc),
``client_events`` (validating what a client sends), ``conformance`` (events
held to the SDK's types exactly), ``tool_source`` (a slow MCP tool source
beside it), ``cli``.
"""

from voiceactors.simulator.call import ResponseRecord, SimCall, ToolCallRecord
from voiceactors.simulator.command import cli_simulate
from voiceactors.simulator.scenario import Scenario, ScenarioError, load_scenario, scenario_names
from voiceactors.simulator.service import Simulator

__all__ = [
    "Simulator",
    "SimCall",
    "ToolCallRecord",
    "ResponseRecord",
    "Scenario",
    "ScenarioError",
    "load_scenario",
    "scenario_names",
    "cli_simulate",
]
