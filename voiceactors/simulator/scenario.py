"""Simulator scenarios: small JSON scripts of what the "model" does on a call.

A scenario is ``{"name", "description", "steps": [...]}`` (and, for
``voiceactors replay --capture`` alone, ``conditions``: kept, never read
here); each step is an object with exactly one key (the step kind). The format is documented in
``docs/simulator.md`` and checked with JSON Schema when loaded, so a typo in
a scenario file fails at load time, not half-way through a test.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

from voiceactors.simulator.client_events import CLIENT_EVENTS
from voiceactors.simulator.refusal_errors import ANY_EVENT, OUTPUT_EVENT

__all__ = ["Scenario", "ScenarioError", "load_scenario", "scenario_names", "as_scenario", "SCENARIO_SCHEMA",
           "STEP_SCHEMAS"]

_NUM = {"type": "number", "minimum": 0}
_TOOL_CALL = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "arguments": {"type": ["object", "string"]},  # a string is sent as-is (may be malformed JSON)
        "call_id": {"type": "string", "minLength": 1},
    },
}
_MCP_CALL = {
    "type": "object",
    "required": ["server_label", "name"],
    "additionalProperties": False,
    "properties": {
        "server_label": {"type": "string", "minLength": 1},
        "name": {"type": "string", "minLength": 1},
        "arguments": {"type": ["object", "string"]},
        "output": {"type": "string"},
        # the SDK's three MCP error shapes; protocol and HTTP errors carry a numeric code
        "error": {"type": "object", "required": ["type", "message"], "additionalProperties": False,
                  "properties": {"type": {"enum": ["tool_execution_error", "protocol_error", "http_error"]},
                                 "message": {"type": "string"}, "code": {"type": "integer"}}},
        "run_s": _NUM,
    },
}
# one output item of a response (or a pause between two), in the order given: {kind: body}
_ITEM = {
    "type": "object", "minProperties": 1, "maxProperties": 1, "additionalProperties": False,
    "properties": {"message": {"type": "string", "minLength": 1}, "function_call": _TOOL_CALL,
                   "mcp_call": _MCP_CALL, "pause": _NUM},
}
_RATE_LIMITS = {
    "type": "array",
    "items": {"type": "object", "additionalProperties": False, "required": ["name"],
              "properties": {"name": {"enum": ["requests", "tokens"]}, "limit": {"type": "integer", "minimum": 0},
                             "remaining": {"type": "integer", "minimum": 0}, "reset_seconds": _NUM}},
}
_RESPONSE_ERROR = {
    "type": "object", "additionalProperties": False,
    "properties": {"type": {"type": "string"}, "code": {"type": "string"}, "message": {"type": "string"}},
}
_RESPONSE = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "text": {"type": "string"},
        "tool_calls": {"type": "array", "items": _TOOL_CALL},
        "items": {"type": "array", "items": _ITEM},
        "rate_limits": _RATE_LIMITS,
        "hold_s": _NUM,
        "delta_interval_s": _NUM,
        "background": {"type": "boolean"},
        "status": {"enum": ["completed", "failed", "incomplete"]},
        "error": _RESPONSE_ERROR,
    },
    # items say the whole order; text and tool_calls are the short form (text first)
    "not": {"anyOf": [{"required": ["items", "text"]}, {"required": ["items", "tool_calls"]}]},
    "dependentSchemas": {"error": {"required": ["status"], "properties": {"status": {"const": "failed"}}}},
}


# one schema per step kind: a step is {kind: body}
STEP_SCHEMAS: dict[str, dict[str, Any]] = {
    "user_turn": {
        "type": "object", "additionalProperties": False,
        "properties": {"text": {"type": "string"}, "duration_ms": {"type": "integer", "minimum": 0},
                       "transcript_delay_ms": {"type": "integer", "minimum": 0}},
    },
    "response": _RESPONSE,
    "wait_outputs": {
        "type": "object", "additionalProperties": False,
        "properties": {"response_create": {"type": "boolean"}, "timeout_s": _NUM},
    },
    "wait_create": {
        "type": "object", "additionalProperties": False,
        "properties": {"timeout_s": _NUM},
    },
    "barge_in": {
        "type": "object", "additionalProperties": False,
        "properties": {"after_ms": {"type": "integer", "minimum": 0}, "text": {"type": "string"},
                       "transcript_delay_ms": {"type": "integer", "minimum": 0}},
    },
    "model_response_first": {
        "type": "object", "additionalProperties": False,
        "properties": {"text": {"type": "string"}, "hold_s": _NUM, "when": {"enum": ["now", "outputs_answered"]}},
    },
    "transcript_deltas": {
        "type": "object", "additionalProperties": False,
        "properties": {
            "rate_hz": {"type": "number", "exclusiveMinimum": 0},
            "count": {"type": "integer", "minimum": 0},
            "background": {"type": "boolean"},
        },
    },
    "rate_limits": _RATE_LIMITS,
    "refuse": {
        "type": "object", "additionalProperties": False, "required": ["code"],
        "properties": {"event": {"enum": sorted(CLIENT_EVENTS.by_type) + [OUTPUT_EVENT, ANY_EVENT]},
                       "code": {"type": "string", "minLength": 1}, "times": {"type": "integer", "minimum": 1},
                       "type": {"type": "string", "minLength": 1}, "message": {"type": "string"},
                       "event_id": {"type": "boolean"}},
    },
    "session_cap": {
        "type": "object", "additionalProperties": False,
        "properties": {"at_s": _NUM, "close_after_s": _NUM, "close": {"enum": [1000, 1001]}},
    },
    "idle_timeout": {
        "type": "object", "additionalProperties": False,
        "properties": {"text": {"type": "string"}, "wait_s": _NUM},
    },
    "dtmf": {"type": "string", "pattern": "^[0-9*#A-D]+$"},
    "async_tools": {"type": "boolean"},
    "hold_ack": {"type": "boolean"},
    "slow_tool": {
        "type": "object", "additionalProperties": False, "required": ["name"],
        "properties": {"name": {"type": "string", "minLength": 1}, "run_s": _NUM, "progress_every_s": _NUM},
    },
    "close": {"enum": [1000, 1001]},
    "drop": {"const": True},
    "silence": _NUM,
    "sleep": _NUM,
    "sleep_until": _NUM,
}

SCENARIO_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["steps"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string"},
        "description": {"type": "string"},
        "conditions": {"type": "object"},
        "steps": {"type": "array", "items": {"type": "object", "minProperties": 1, "maxProperties": 1}},
    },
}

_VALIDATOR = jsonschema.Draft202012Validator(SCENARIO_SCHEMA)
_STEP_VALIDATORS = {kind: jsonschema.Draft202012Validator(schema) for kind, schema in STEP_SCHEMAS.items()}


def _check(validator: jsonschema.protocols.Validator, obj: Any, name: str, prefix: str) -> None:
    error = jsonschema.exceptions.best_match(validator.iter_errors(obj))
    if error is not None:
        where = "/".join([prefix, *(str(p) for p in error.absolute_path)]).rstrip("/")
        raise ScenarioError(f"scenario {name!r} is invalid at {where or '/'}: {error.message}")


class ScenarioError(ValueError):
    """A scenario could not be found or does not match the format."""


#: One step of a scenario: ``{kind: its argument}``, the argument checked
#: against the kind's schema when the scenario is loaded.
Step = dict[str, Any]


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    steps: tuple[Step, ...]
    #: what the call had around it, for ``voiceactors replay --capture`` (``replay/conditions.py``)
    conditions: dict[str, Any] | None = None

    @classmethod
    def from_obj(cls, obj: Any, name: str = "inline") -> "Scenario":
        if isinstance(obj, list):
            obj = {"steps": obj}
        _check(_VALIDATOR, obj, name, "")
        for index, step in enumerate(obj["steps"]):
            (kind, body), = step.items()
            if kind not in _STEP_VALIDATORS:
                raise ScenarioError(f"scenario {name!r} step {index}: unknown kind {kind!r} "
                                    f"(known: {', '.join(STEP_SCHEMAS)})")
            _check(_STEP_VALIDATORS[kind], body, name, f"/steps/{index}/{kind}")
        return cls(obj.get("name", name), obj.get("description", ""), tuple(obj["steps"]), obj.get("conditions"))


def _packaged() -> Any:
    return resources.files("voiceactors.simulator").joinpath("scenarios")


def scenario_names() -> list[str]:
    """Names of the scenarios shipped with the package."""
    return sorted(p.name[:-5] for p in _packaged().iterdir() if p.name.endswith(".json"))


def load_scenario(name_or_path: str | Path) -> Scenario:
    """A shipped scenario by name (``"single_tool"``) or a scenario file by path.
    Raises ``ScenarioError`` when missing or invalid (blocking file read: call
    it at set-up time, not from a hot async path)."""
    text = None
    label = str(name_or_path)
    if isinstance(name_or_path, str) and name_or_path in scenario_names():
        text = _packaged().joinpath(name_or_path + ".json").read_text(encoding="utf-8")
    else:
        path = Path(name_or_path)
        if not path.is_file():
            raise ScenarioError(f"no scenario named {label!r} (shipped: {', '.join(scenario_names())})")
        text = path.read_text(encoding="utf-8")
        label = path.stem
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise ScenarioError(f"scenario {label!r} is not JSON: {exc}") from None
    return Scenario.from_obj(obj, name=label)


def as_scenario(value: "Scenario | str | Path | dict[str, Any] | list[Any] | None") -> Scenario:
    """Accept a Scenario, a shipped name, a path, a scenario object or a bare step list.
    None is the empty scenario (the simulator only reacts)."""
    if value is None:
        return Scenario("empty", "no scripted steps", ())
    if isinstance(value, Scenario):
        return value
    if isinstance(value, (dict, list)):
        return Scenario.from_obj(value)
    return load_scenario(value)
