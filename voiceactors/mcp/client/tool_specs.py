"""What a source's ``tools/list`` becomes: tool specs beside the journal's.

``build_specs(source, listed, style)`` takes the listed tools as plain dicts
(the MCP wire shape: ``name``, ``description``, ``inputSchema``,
``annotations``) and returns a ``ToolSpec`` per usable tool, keyed by its
dotted name ``<source>.<tool>``, plus the tools left out and why. A tool is
left out when its name is not an MCP tool name, its manifest name is too
long, its input schema is not a JSON Schema of an object (checked against
the schema's own draft's metaschema, with patterns RE2 can run, after its
size, depth and references are found in bounds: ``schema_bounds``), it is listed twice, or two of its source's
tools spell the same in the manifest's style. The whole input schema is
kept: the model gets it and the executor validates arguments against it
(``schema_bounds.bounded``: RE2 patterns, a budget). A tool annotated
``readOnlyHint: true`` is a read; any other is a write (shielded, recorded,
never repeated). Pure and synchronous, in proportion to the listing: the
hub runs it in a worker thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from jsonschema.exceptions import SchemaError

from voiceactors.tools import schema_bounds
from voiceactors.mcp.client.sources import FUNCTION_NAME_MAX, MCP_TOOL_NAME_RE, spelled
from voiceactors.tools.handler_context import ToolContext
from voiceactors.tools.registry import READ, WRITE, ToolSpec

DESCRIPTION_MAX = 1024


@dataclass(frozen=True)
class RemoteTool:
    """Where a source tool runs: the source and the tool's own name there."""

    source: str
    tool: str
    read_only: bool


def _never_local(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    raise RuntimeError("a tool of an MCP source has no local handler")


def _schema_problem(schema: Any) -> str | None:
    if not isinstance(schema, dict):
        return "input schema is not an object"
    if schema.get("type") != "object":
        return "input schema does not describe an object"
    try:
        return schema_bounds.schema_problem(schema)
    except RecursionError:
        return "input schema nested too deeply"


def _spec(source: str, item: Mapping[str, Any]) -> ToolSpec:
    name, schema = item["name"], item["inputSchema"]
    annotations = item.get("annotations")
    read_only = isinstance(annotations, dict) and annotations.get("readOnlyHint") is True
    description = item.get("description")
    description = description if isinstance(description, str) else ""
    label = f"[{source}] "   # the model hears which source a tool (and so its answer) comes from
    spec = ToolSpec(name=f"{source}.{name}", description=(label + description)[:DESCRIPTION_MAX],
                    parameters=schema, effect=READ if read_only else WRITE, handler=_never_local,
                    remote=RemoteTool(source, name, read_only))
    # validate with the draft the schema declares, not always 2020-12; patterns on RE2, within a budget
    object.__setattr__(spec, "validator", schema_bounds.validator_of(schema))
    return spec


def build_specs(source: str, listed: Sequence[Mapping[str, Any]], style: str
                ) -> tuple[dict[str, ToolSpec], list[tuple[str, str]]]:
    """``({dotted name: spec}, [(tool name, why left out)])``."""
    specs: dict[str, ToolSpec] = {}
    left_out: list[tuple[str, str]] = []
    spellings: dict[str, str] = {}          # manifest spelling -> dotted name
    dropped_spellings: set[str] = set()
    for item in listed:
        name = item.get("name")
        if not isinstance(name, str) or not MCP_TOOL_NAME_RE.fullmatch(name):
            left_out.append((str(name)[:128], "not an MCP tool name"))
            continue
        manifest_name = spelled(source, name, style)
        if len(manifest_name) > FUNCTION_NAME_MAX:
            left_out.append((name, f"{manifest_name!r} is longer than {FUNCTION_NAME_MAX} characters"))
            continue
        problem = _schema_problem(item.get("inputSchema"))
        if problem is None:
            try:
                spec = _spec(source, item)
            except (SchemaError, ValueError, TypeError) as error:
                problem = f"invalid input schema: {str(error)[:200]}"
        if problem is not None:
            left_out.append((name, problem))
            continue
        if spec.name in specs:
            left_out.append((name, "listed twice"))
            continue
        if manifest_name in dropped_spellings:
            left_out.append((name, f"spells {manifest_name!r} like another tool of {source}"))
            continue
        other = spellings.get(manifest_name)
        if other is not None:
            del specs[other]
            dropped_spellings.add(manifest_name)
            left_out.append((other.split(".", 1)[1], f"spells {manifest_name!r} like another tool of {source}"))
            left_out.append((name, f"spells {manifest_name!r} like another tool of {source}"))
            continue
        spellings[manifest_name] = spec.name
        specs[spec.name] = spec
    return specs, left_out


def lookup(specs: Mapping[str, ToolSpec], name: str) -> ToolSpec | None:
    """The spec named ``name`` in the dotted or underscore spelling."""
    spec = specs.get(name)
    if spec is not None:
        return spec
    found = [s for s in specs.values() if s.underscore_name == name]
    return found[0] if len(found) == 1 else None
