"""The voice tools (the nine over the journal, and ``journal.select``): names,
descriptions, argument schemas, effects, handlers.

One mechanism validates arguments for every tool: a JSON Schema (Draft 2020-12)
per tool, compiled once. ``prepare`` turns the model's raw argument string into
a checked dict or an error object the model can read; where the design names
an error for a field (``{"error": "invalid day"}``) that string is used,
otherwise a generic ``{"error": "invalid arguments: <reason>"}`` that never
echoes the values the model sent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, relevance

from voiceactors import safe_text
from voiceactors.mcp.client.sources import JOURNAL_TOOL_FAMILIES
from voiceactors.settings import default
# READ and WRITE are also the registry's names (the tools below and the MCP side import them from here)
from voiceactors.tool_effect import READ as READ, WRITE as WRITE, ToolEffect
from voiceactors.tools import commitment_tools, entity_tools, journal_tools, select_tool, today_tools
from voiceactors.tools.handler_context import ToolContext

Handler = Callable[[ToolContext, dict[str, Any]], dict[str, Any]]



class ArgumentError(Exception):
    """The arguments cannot be used; ``error`` is the object the model gets."""

    def __init__(self, error: dict[str, Any]):
        super().__init__(error.get("error", "invalid arguments"))
        self.error = error


@dataclass(frozen=True)
class ToolSpec:
    name: str                        # canonical dotted name, e.g. "journal.get_day"
    description: str                 # what the spoken assistant gets from it
    parameters: dict[str, Any]       # JSON Schema (type object, additionalProperties false)
    effect: ToolEffect
    handler: Handler
    errors: Mapping[str, str] = field(default_factory=dict)  # property -> design error string
    # the answer depends only on the journal, today and the arguments (never on
    # the call), so the executor may hand a fresh one to another call
    reusable: bool = False
    # argument -> selection kind: an argument the model leaves out is taken
    # from the call's current selection of that kind (select_tool.fill_from_selection)
    # before validation; the manifest lists it as optional, the schema keeps
    # it required (so without a selection the answer is what it always was)
    selection_defaults: Mapping[str, str] = field(default_factory=dict)
    # only meaningful inside a voice call (it changes the call's selection):
    # not offered where there is no call (the journal's MCP server)
    call_scoped: bool = False
    # a tool of an MCP source: its ``mcp_discovery.RemoteTool`` (None: ours, run by ``handler``)
    remote: Any = None
    # whether a call of it may be acknowledged and answered later while the
    # conversation goes on (docs/calls.md § Slow tools); None: reads and MCP
    # sources' tools may, our journal writes answer before anything is said
    defers: bool | None = None
    validator: Draft202012Validator = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.effect not in (READ, WRITE):
            raise ValueError(f"effect must be read or write: {self.effect!r}")
        Draft202012Validator.check_schema(self.parameters)
        validator = Draft202012Validator(self.parameters, format_checker=Draft202012Validator.FORMAT_CHECKER)
        object.__setattr__(self, "validator", validator)

    @property
    def may_defer(self) -> bool:
        """A slow call of it may be acknowledged and spoken later (``defers``)."""
        if self.defers is not None:
            return self.defers
        return self.effect == READ or self.remote is not None

    @property
    def underscore_name(self) -> str:
        return self.name.replace(".", "_")


# --- schema pieces --------------------------------------------------------

# An optional argument is one plain type, never ``["integer", "null"]``: type
# arrays are a portability warning in MCP clients (the MCP Inspector lists
# one per field) and some models' tool schemas refuse them. A null the model
# sends anyway means "left out" (``prepare`` drops it before validation).
_FACET = {
    "type": "string",
    "pattern": r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$",
    "description": "Optional facet (journal area) name, e.g. \"work\"; leave it out for all facets.",
}


def _object(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


def _specs() -> list[ToolSpec]:
    return [
        ToolSpec(
            name="journal.get_day",
            description=(
                "Get one day of the user's journal: the recorded segments (start time, length, "
                "summary, stream) and a summary of the day. Use for 'what did I do on ...'."
            ),
            parameters=_object({
                "day": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$", "format": "date",
                        "description": "The day, YYYY-MM-DD."},
            }, ("day",)),
            effect=READ,
            handler=journal_tools.get_day,
            errors={"day": "invalid day"},
            selection_defaults={"day": "day"},
        ),
        ToolSpec(
            name="journal.search",
            description=(
                "Full-text search of the user's journal (segment notes, entities, activities, "
                "events, todos, news). Returns matching snippets with their day and source, best first."
            ),
            parameters=_object({
                "query": {"type": "string", "minLength": 1, "maxLength": 500, "pattern": r"\S",
                          "description": "Words to search for."},
                "facet": _FACET,
                "days": {"type": "integer", "minimum": 1, "maximum": 365,
                         "description": "Only the last N days (1-365); leave it out for all time."},
                "limit": {"type": "integer", "minimum": 1, "maximum": 50,
                          "description": "Maximum results (1-50, default 10)."},
            }, ("query",)),
            effect=READ,
            handler=journal_tools.search,
            errors={"query": "query is required", "days": "invalid days"},
        ),
        ToolSpec(
            name="entities.get",
            description=(
                "Look up a person, company, project or tool the journal knows: name, type, a short "
                "profile (how each journal area describes them, how often they come up, commitments "
                "with them), tags and recent observations."
            ),
            parameters=_object({
                "entity_slug": {"type": "string", "minLength": 1, "maxLength": 200, "pattern": r"\S",
                                "description": "The entity id (e.g. \"alice_johnson\") or its name."},
            }, ("entity_slug",)),
            effect=READ,
            handler=entity_tools.get,
            selection_defaults={"entity_slug": "entity"},
        ),
        ToolSpec(
            name="entities.recent_with",
            description=(
                "Recent activities the user had with a person or organisation (meetings, calls, "
                "work sessions), newest first, up to 10."
            ),
            parameters=_object({
                "entity_slug": {"type": "string", "minLength": 1, "maxLength": 200, "pattern": r"\S",
                                "description": "The entity id or its name."},
                "days": {"type": "integer", "minimum": 1, "maximum": 365,
                         "description": "How many days back to look (1-365, default 7)."},
                "facet": _FACET,
            }, ("entity_slug",)),
            effect=READ,
            handler=entity_tools.recent_with,
            errors={"days": "invalid days"},
            selection_defaults={"entity_slug": "entity"},
        ),
        ToolSpec(
            name="commitments.list",
            description=(
                "The user's commitments (promises made by or to them): who owes what to whom, "
                "state, and the days opened and closed. Defaults to all states, 20 items."
            ),
            parameters=_object({
                "state": {"enum": ["open", "closed", "dropped"],
                          "description": "open, closed or dropped; leave it out for all."},
                "facet": _FACET,
                "limit": {"type": "integer", "minimum": 1, "maximum": 50,
                          "description": "Maximum items (1-50, default 20)."},
            }),
            effect=READ,
            handler=commitment_tools.list_commitments,
            errors={"state": "invalid state"},
        ),
        ToolSpec(
            name="commitments.complete",
            description=(
                "Mark one commitment as finished (done, sent, signed or deferred close it; dropped "
                "drops it). Only when the user clearly asks. Returns the updated commitment."
            ),
            parameters=_object({
                "commitment_id": {"type": "string", "minLength": 1, "maxLength": 128,
                                  "pattern": r"^[A-Za-z0-9_.:-]+$",
                                  "description": "The id from commitments.list."},
                "resolution": {"enum": ["done", "sent", "signed", "dropped", "deferred"],
                               "description": "How it ended."},
            }, ("commitment_id", "resolution")),
            effect=WRITE,
            handler=commitment_tools.complete,
            errors={"resolution": "invalid resolution"},
        ),
        ToolSpec(
            name="calendar.today",
            description="Today's calendar: planned events with time, title, attendees, location and prep notes.",
            parameters=_object({}),
            effect=READ,
            handler=today_tools.calendar_today,
            reusable=True,
        ),
        ToolSpec(
            name="briefing.get",
            description=(
                "Today's morning briefing as spoken text, plus its highlights (what needs attention "
                "first)."
            ),
            parameters=_object({}),
            effect=READ,
            handler=today_tools.briefing_get,
            reusable=True,
        ),
        ToolSpec(
            name="observer.start_listening",
            description=(
                "Ask the user's observer to start capturing: mode \"meeting\" for a meeting, "
                "\"voice_memo\" for a quick memo. Returns whether the request was passed on."
            ),
            parameters=_object({
                "mode": {"enum": ["meeting", "voice_memo"], "description": "meeting or voice_memo."},
            }, ("mode",)),
            effect=READ,
            handler=today_tools.start_listening,
            errors={"mode": "invalid mode"},
        ),
        ToolSpec(
            name="journal.select",
            description=(
                "Switch what this conversation is about to another day, entity, commitment or journal area, "
                "when the user asks to (\"let's talk about Alice\", \"go to March 4\"). Verifies it first; "
                "the original link stays. Do not call it just to read or compare another item."
            ),
            parameters=_object({
                "kind": {"enum": ["day", "entity", "commitment", "facet"],
                         "description": "day, entity, commitment or facet."},
                "id": {"type": "string", "minLength": 1, "maxLength": 200, "pattern": r"\S",
                       "description": "A day YYYY-MM-DD, an entity id or name, a commitment id, or a facet name."},
            }, ("kind", "id")),
            effect=READ,
            handler=select_tool.select,
            call_scoped=True,
            defers=False,     # it changes what the call is about: answered before anything is said
        ),
    ]


def _families_reserved(specs: list[ToolSpec]) -> list[ToolSpec]:
    """``specs``, once their families are exactly the names MCP sources may not take
    (``mcp.client.sources.JOURNAL_TOOL_FAMILIES``, declared below the settings that check them)."""
    families = {spec.name.split(".", 1)[0] for spec in specs}
    if families != JOURNAL_TOOL_FAMILIES:
        raise RuntimeError(f"the journal's tool families {sorted(families)} differ from "
                           f"mcp.client.sources.JOURNAL_TOOL_FAMILIES {sorted(JOURNAL_TOOL_FAMILIES)}")
    return specs


REGISTRY: dict[str, ToolSpec] = {spec.name: spec for spec in _families_reserved(_specs())}
#: The tools that stand on the journal alone (every one but the call-scoped
#: ``journal.select``): what the journal's MCP server offers.
JOURNAL_TOOLS: dict[str, ToolSpec] = {name: spec for name, spec in REGISTRY.items() if not spec.call_scoped}


def make_registry(specs: list[ToolSpec]) -> dict[str, ToolSpec]:
    """A registry (dotted name -> spec) from ``specs``, e.g. for tests."""
    return {spec.name: spec for spec in specs}


def lookup(name: str, registry: Mapping[str, ToolSpec] | None = None) -> ToolSpec | None:
    """The spec for ``name`` in its dotted (``journal.get_day``) or underscore
    (``journal_get_day``) spelling; None when unknown."""
    registry = REGISTRY if registry is None else registry
    if not isinstance(name, str):
        return None
    spec = registry.get(name)
    if spec is not None:
        return spec
    for candidate in registry.values():
        if candidate.underscore_name == name:
            return candidate
    return None


def manifest(style: str = default("tool_name_style"), registry: Mapping[str, ToolSpec] | None = None) -> list[dict[str, Any]]:
    """The ``tools`` array of an OpenAI Realtime session, names in ``style``
    (``dotted`` or ``underscore``)."""
    if style not in ("dotted", "underscore"):
        raise ValueError(f"tool name style must be dotted or underscore: {style!r}")
    registry = REGISTRY if registry is None else registry
    return [
        {
            "type": "function",
            "name": spec.name if style == "dotted" else spec.underscore_name,
            "description": spec.description,
            "parameters": _model_parameters(spec),
        }
        for spec in registry.values()
    ]


def _model_parameters(spec: ToolSpec) -> dict[str, Any]:
    """The schema the model sees: arguments the current selection can fill
    are optional there, and their descriptions say so. (Only a voice call has
    a selection: elsewhere, as over MCP, they stay required and say nothing
    of one.)"""
    if not spec.selection_defaults:
        return spec.parameters
    required = [name for name in spec.parameters.get("required", ()) if name not in spec.selection_defaults]
    properties = dict(spec.parameters["properties"])
    for name, kind in spec.selection_defaults.items():
        said = properties[name].get("description", "")
        properties[name] = {**properties[name], "description": f"{said} Leave it out for the selected {kind}.".strip()}
    return {**spec.parameters, "properties": properties, "required": required}


# --- arguments ------------------------------------------------------------

def _reject_constant(token: str) -> Any:
    raise ValueError(f"non-standard JSON constant {token}")


_ARGUMENTS = json.JSONDecoder(parse_constant=_reject_constant)


def parse_arguments(raw: Any) -> dict[str, Any]:
    """The model's argument string as a dict. An empty string means ``{}``
    (models send it for tools without parameters). ArgumentError otherwise.
    A lone surrogate an escape puts in a string is U+FFFD (``safe_text``)."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    if not isinstance(raw, (str, bytes, bytearray)):
        raise ArgumentError({"error": "arguments must be valid JSON"})
    try:
        # one decoder for every call (json.loads with an option builds one per call)
        value = _ARGUMENTS.decode(raw) if isinstance(raw, str) else json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        raise ArgumentError({"error": "arguments must be valid JSON"}) from None
    if not isinstance(value, dict):
        raise ArgumentError({"error": "arguments must be a JSON object"})
    # a JSON text inside the event's: its escapes are decoded only here
    arguments: dict[str, Any] = safe_text.decoded(raw, value)   # the same object, or its cleaned copy
    return arguments


def canonical_arguments(raw: Any) -> str:
    """A stable spelling of the arguments (sorted keys, no spaces) so that two
    identical calls compare equal; the raw text when it is not valid JSON."""
    try:
        value = parse_arguments(raw)
    except ArgumentError:
        return canonical_unparsed(raw)
    return canonical_parsed(value)


def canonical_parsed(value: dict[str, Any]) -> str:
    """``canonical_arguments`` of arguments already parsed (``parse_arguments``)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_unparsed(raw: Any) -> str:
    """``canonical_arguments`` of arguments that did not parse."""
    return raw if isinstance(raw, str) else repr(raw)


def _properties(error: ValidationError, args: dict[str, Any]) -> list[str]:
    """The top-level properties an error is about."""
    if error.validator == "required" and not error.path:
        return [p for p in error.validator_value if p not in args]
    if error.path:
        return [str(error.path[0])]
    return []


def _field_name(path: Any) -> str:
    """``where.city`` / ``tags[1]``: where in the arguments the error is (names, never values)."""
    name = ""
    for step in path:
        name += f"[{step}]" if isinstance(step, int) else (f".{step}" if name else str(step))
    return name or "arguments"


def _reason(error: ValidationError, spec: ToolSpec) -> str:
    where = _field_name(error.path)
    schema = error.schema
    if error.validator == "additionalProperties":
        props = schema.get("properties", {}) if isinstance(schema, dict) else {}
        if not error.path and not props:
            return "this tool takes no arguments"
        place = f" in {where}" if error.path else ""
        return f"unexpected property{place} (allowed: {', '.join(props)})"
    if error.validator == "required":
        missing = [p for p in error.validator_value if p not in error.instance]
        prefix = f"{where}." if error.path else ""
        return f"{', '.join(prefix + p for p in missing)} is required"
    if error.validator == "type" and not error.path:
        return "arguments must be a JSON object"
    name = where
    if error.validator == "type":
        kinds = schema.get("type")
        kinds = kinds if isinstance(kinds, list) else [kinds]
        return f"{name} must be {' or '.join(k for k in kinds)}"
    if error.validator in ("minimum", "maximum"):
        return f"{name} must be between {schema.get('minimum')} and {schema.get('maximum')}"
    if error.validator == "enum":
        return f"{name} must be one of {', '.join('null' if v is None else str(v) for v in schema['enum'])}"
    if error.validator == "minLength":
        return f"{name} must not be empty"
    if error.validator in ("pattern", "format"):
        return f"{name} has the wrong format"
    if error.validator == "maxLength":
        return f"{name} is longer than {schema.get('maxLength')} characters"
    return f"{name} is not valid"


def validate(spec: ToolSpec, args: dict[str, Any]) -> dict[str, Any] | None:
    """None when ``args`` fit the tool's schema, else the error object."""
    errors = sorted(spec.validator.iter_errors(args), key=relevance, reverse=True)  # most relevant first
    if not errors:
        return None
    for error in errors:  # a design-named error wins, whichever field it is
        for prop in _properties(error, args):
            if prop in spec.errors:
                return {"error": spec.errors[prop]}
    return {"error": f"invalid arguments: {_reason(errors[0], spec)}"}


def without_nulls(spec: ToolSpec, args: dict[str, Any]) -> dict[str, Any]:
    """``args`` less the optional arguments sent as null: a null means "left
    out" (the schemas publish one plain type per argument, see ``_FACET``)."""
    required = set(spec.parameters.get("required", ()))
    if not any(value is None and name not in required for name, value in args.items()):
        return args
    return {name: value for name, value in args.items() if value is not None or name in required}


def prepare(spec: ToolSpec, raw: Any) -> dict[str, Any]:
    """Parse and validate the raw argument string; ArgumentError on failure."""
    args = without_nulls(spec, parse_arguments(raw))
    error = validate(spec, args)
    if error is not None:
        raise ArgumentError(error)
    return args
