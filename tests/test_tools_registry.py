"""The tool registry: names, manifest, one validation mechanism, error objects."""

from __future__ import annotations

import json

import pytest

from voiceactors.tools import REGISTRY, ArgumentError, lookup, manifest, prepare
from voiceactors.tools.registry import ToolSpec

NAMES = [
    "journal.get_day", "journal.search", "entities.get", "entities.recent_with", "commitments.list",
    "commitments.complete", "calendar.today", "briefing.get", "observer.start_listening", "journal.select",
]


def test_ten_tools_only_complete_writes():
    assert list(REGISTRY) == NAMES
    assert [n for n, s in REGISTRY.items() if s.effect == "write"] == ["commitments.complete"]
    for spec in REGISTRY.values():
        assert spec.parameters["type"] == "object"
        assert spec.parameters["additionalProperties"] is False
        assert spec.description and callable(spec.handler)


@pytest.mark.parametrize("style,expected", [("dotted", NAMES), ("underscore", [n.replace(".", "_") for n in NAMES])])
def test_manifest(style, expected):
    tools = manifest(style)
    assert [t["name"] for t in tools] == expected
    assert all(set(t) == {"type", "name", "description", "parameters"} and t["type"] == "function" for t in tools)
    json.dumps(tools)   # serialisable as a session.update payload
    with pytest.raises(ValueError):
        manifest("camel")


def test_lookup_accepts_both_spellings():
    assert lookup("entities.recent_with") is REGISTRY["entities.recent_with"]
    assert lookup("entities_recent_with") is REGISTRY["entities.recent_with"]
    assert lookup("entities.recent-with") is None
    assert lookup("nope") is None


@pytest.mark.parametrize("tool,raw,error", [
    ("journal.get_day", '{"day": "2026-02-30"}', "invalid day"),
    ("journal.get_day", '{"day": "27/03/2026"}', "invalid day"),
    ("journal.get_day", "{}", "invalid day"),
    ("journal.search", "{}", "query is required"),
    ("journal.search", '{"query": "   "}', "query is required"),
    ("journal.search", '{"query": 5}', "query is required"),
    ("journal.search", '{"query": "x", "days": 0}', "invalid days"),
    ("entities.recent_with", '{"entity_slug": "a", "days": 366}', "invalid days"),
    ("entities.recent_with", '{"entity_slug": "a", "days": "7"}', "invalid days"),
    ("commitments.list", '{"state": "pending"}', "invalid state"),
    ("commitments.complete", '{"commitment_id": "abc", "resolution": "finished"}', "invalid resolution"),
    ("commitments.complete", '{"commitment_id": "abc"}', "invalid resolution"),
    ("observer.start_listening", '{"mode": "dictation"}', "invalid mode"),
    ("observer.start_listening", "{}", "invalid mode"),
    ("journal.get_day", "{nope", "arguments must be valid JSON"),
    ("journal.get_day", "NaN", "arguments must be valid JSON"),
    ("journal.get_day", '"2026-03-27"', "arguments must be a JSON object"),
    ("journal.get_day", "[]", "arguments must be a JSON object"),
])
def test_design_error_objects(tool, raw, error):
    with pytest.raises(ArgumentError) as info:
        prepare(REGISTRY[tool], raw)
    assert info.value.error == {"error": error}


@pytest.mark.parametrize("tool,raw,reason", [
    ("journal.search", '{"query": "x", "limit": 51}', "limit must be between 1 and 50"),
    ("commitments.list", '{"limit": 0}', "limit must be between 1 and 50"),
    ("journal.search", '{"query": "x", "facet": "../etc"}', "facet has the wrong format"),
    ("entities.get", "{}", "entity_slug is required"),
    ("calendar.today", '{"when": "SECRET-VALUE"}', "this tool takes no arguments"),
    ("journal.get_day", '{"day": "2026-03-27", "SECRET-KEY": 1}', "unexpected property (allowed: day)"),
])
def test_generic_errors_never_echo_values(tool, raw, reason):
    with pytest.raises(ArgumentError) as info:
        prepare(REGISTRY[tool], raw)
    assert info.value.error == {"error": f"invalid arguments: {reason}"}
    assert "SECRET" not in info.value.error["error"]


def test_valid_arguments_pass_unchanged():
    assert prepare(REGISTRY["journal.search"], '{"query": "x", "days": 30, "limit": 5}') == {
        "query": "x", "days": 30, "limit": 5}
    assert prepare(REGISTRY["calendar.today"], "") == {}       # empty string means no arguments


def test_an_optional_null_is_taken_as_left_out():
    # the schemas publish one plain type per argument; a model may still send null
    assert prepare(REGISTRY["journal.search"], '{"query": "x", "facet": null, "days": null, "limit": 5}') == {
        "query": "x", "limit": 5}
    assert prepare(REGISTRY["commitments.list"], '{"state": null}') == {}
    with pytest.raises(ArgumentError) as refused:          # a required one is not optional for being null
        prepare(REGISTRY["journal.search"], '{"query": null}')
    assert refused.value.error == {"error": "query is required"}


def _type_arrays(schema, where=""):
    found = []
    if isinstance(schema, dict):
        if isinstance(schema.get("type"), list):
            found.append(where or "(root)")
        for key, value in schema.items():
            found += _type_arrays(value, f"{where}.{key}" if where else key)
    elif isinstance(schema, list):
        for i, value in enumerate(schema):
            found += _type_arrays(value, f"{where}[{i}]")
    return found


def test_no_schema_writes_a_field_as_a_type_array():
    """Nullable fields were ``"type": ["integer", "null"]``: seven portability
    warnings in the MCP Inspector, and a shape some models' tool schemas refuse."""
    found = {spec.name: _type_arrays(spec.parameters) for spec in REGISTRY.values()}
    found.update({f"manifest:{t['name']}": _type_arrays(t["parameters"]) for t in manifest()})
    assert {name: where for name, where in found.items() if where} == {}


def test_leave_it_out_is_said_only_where_a_selection_fills_it():
    """``journal.get_day`` and ``entities.*`` said "leave it out for the
    selected day/entity" while the schema (the one MCP clients get) marked the
    field required; over MCP, where there is no selection, leaving it out
    answers ``invalid day``."""
    to_model = {t["name"]: t["parameters"] for t in manifest()}
    for name, field, kind in (("journal.get_day", "day", "day"), ("entities.get", "entity_slug", "entity"),
                              ("entities.recent_with", "entity_slug", "entity")):
        published = REGISTRY[name].parameters             # what MCP clients get
        assert field in published["required"]
        assert "leave it out" not in published["properties"][field]["description"].lower()
        model = to_model[name]                            # what a voice call's model gets
        assert field not in model["required"]
        assert model["properties"][field]["description"].endswith(f"Leave it out for the selected {kind}.")
    with pytest.raises(ArgumentError) as refused:
        prepare(REGISTRY["journal.get_day"], "{}")
    assert refused.value.error == {"error": "invalid day"}    # required, as the published schema says


NESTED = ToolSpec(
    name="src.nested", description="a remote tool with a nested schema", effect="read",
    handler=lambda ctx, args: {},
    parameters={"type": "object", "additionalProperties": False, "required": ["where"],
                "properties": {
                    "where": {"type": "object", "additionalProperties": False, "required": ["city"],
                              "properties": {"city": {"type": "string", "minLength": 1},
                                             "days": {"type": "integer", "minimum": 1, "maximum": 7}}},
                    "tags": {"type": "array", "items": {"type": "string"}}}})


@pytest.mark.parametrize("raw,reason", [
    ('{"where": {"city": "Oslo", "SECRET": 1}}', "unexpected property in where (allowed: city, days)"),
    ('{"where": {}}', "where.city is required"),
    ('{"where": {"city": "Oslo", "days": 9}}', "where.days must be between 1 and 7"),
    ('{"where": {"city": "SECRET", "days": "3"}}', "where.days must be integer"),
    ('{"where": {"city": ""}}', "where.city must not be empty"),
    ('{"where": {"city": "Oslo"}, "tags": ["a", 5]}', "tags[1] must be string"),
    ('{"where": "SECRET"}', "where must be object"),
])
def test_nested_schema_errors_name_the_nested_field(raw, reason):
    with pytest.raises(ArgumentError) as info:
        prepare(NESTED, raw)
    assert info.value.error == {"error": f"invalid arguments: {reason}"}
    assert "SECRET" not in info.value.error["error"]
