"""``journal.select``: the one local tool that changes call state.

The handler only verifies (``voiceactors.linked_context.resolve.verify``, in the executor's
worker thread like every read) and answers ``{"selected": <reference>}``; the
call's protocol applies that answer to the call's current selection
(``call/call_context.py``) when, and only when, the model gets it. A failed,
ambiguous or cancelled lookup answers an error and changes nothing.

``fill_from_selection`` is how the other tools default "this day / this
person" to the current selection: an argument a spec names in
``selection_defaults`` that the model left out is taken from the selection
when it is of that kind (docs/tools.md § The current selection).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from voiceactors.linked_context import references as context
from voiceactors.linked_context.resolve import verify
from voiceactors.tools.handler_context import ToolContext

if TYPE_CHECKING:
    from voiceactors.tools.registry import ToolSpec

NOT_FOUND = {"error": "not found"}
UNREADABLE = {"error": "journal unreadable; the selection is unchanged"}

_NAV = {"day": "today/journal/{id}", "entity": "entity/{id}", "commitment": "commitment/{id}",
        "facet": "facet/{id}"}


def nav_target(ref: context.Reference) -> str:
    return _NAV[ref.kind].format(id=ref.id)


def select(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Verify the item to select; the call applies ``selected``."""
    kind, ident = str(args.get("kind", "")), str(args.get("id", ""))
    found = verify(ctx.journal, kind, ident)
    if isinstance(found, context.Reference):
        return {"selected": found.view(), "_nav_target": nav_target(found)}
    if found.reason == context.AMBIGUOUS:
        return {"error": "ambiguous: several entities match; ask which one, or select by id",
                "candidates": [ref.view() for ref in found.candidates]}
    if found.reason == context.UNREADABLE:
        return dict(UNREADABLE)
    return dict(NOT_FOUND)


def fill_from_selection(spec: "ToolSpec", args: dict[str, Any], selection: Any) -> dict[str, Any]:
    """``args`` with the spec's open arguments taken from ``selection`` (a
    ``Reference`` or None). Arguments the model gave always win."""
    defaults: Mapping[str, str] = spec.selection_defaults
    if not defaults or not isinstance(selection, context.Reference):
        return args
    filled = dict(args)
    for name, kind in defaults.items():
        if filled.get(name) is None and selection.kind == kind:
            filled[name] = selection.id
    return filled
