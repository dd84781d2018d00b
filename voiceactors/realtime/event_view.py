"""A light, read-only attribute view of a decoded server event.

The call actor acts on ~17 events per tool round; validating each with the
SDK's pydantic models was a seventh of a busy server's CPU. ``EventView``
wraps the ``json.loads`` result instead and reads like the SDK model does:
``event.type``, ``event.response.id``, ``getattr(item, "type", None)``; a
missing field reads as None, a nested object is a view, a list a tuple (of
views for its objects). Handlers written against the SDK models work on
both, as long as they read fields by attribute and treat a missing field as
None.

Whether a frame is well-formed is still the SDK models' word, checked
without building them: ``compile_checks`` turns each model's fields into
plain checks of the decoded JSON (required fields present, JSON types
exact, literals in their sets, item unions by their ``type``), at least as
strict as the models. A frame that fails them is left to the models
(``events.read_server_event``): they coerce what they can (a ``"1"`` for an
int), and what they refuse is skipped with its reason, as before. Each
model's and union's check is generated as the text of one Python function
(a ``dict.get`` and an inline test per field, literals first; an
``Optional`` and a list of checked elements inline), compiled once at
import: the checks run on every acted-on frame, and a loop that looked up
and dispatched on each field's spec was most of their cost
(``tests/test_generated_checks.py`` holds that loop as the oracle).
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Hashable
from typing import Annotated, Any, Callable, Literal, Union

from pydantic import BaseModel

__all__ = ["Check", "EventView", "compile_checks"]


class EventView:
    """Read-only attribute access to a decoded JSON object (see the module doc).
    ``hasattr`` is always true: every missing field reads as None.

    Fields are read by ``__getattribute__`` itself, not by a ``__getattr__``
    behind the normal lookup: that lookup fails for every field first, and
    raising and catching its AttributeError made each read about three times
    as dear (the protocol reads ~90 fields a tool round). Dunder names and
    the view's own attributes (``_OWN``) take the normal lookup."""

    __slots__ = ("_fields",)

    def __init__(self, fields: dict[str, Any]) -> None:
        object.__setattr__(self, "_fields", fields)

    def __getattribute__(self, name: str) -> Any:
        if name in _OWN or name[:2] == "__":     # copy, pickle and friends, and ours: not fields
            return object.__getattribute__(self, name)
        value: Any = _fields_of(self).get(name)     # a decoded JSON value, or None
        kind = type(value)
        if kind is dict:
            return EventView(value)
        if kind is list:
            return tuple(EventView(v) if type(v) is dict else v for v in value)
        return value

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("an EventView is read-only")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EventView) and other._fields == self._fields

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"EventView(type={self._fields.get('type')!r})"   # never the payload (logs)

    def to_dict(self) -> dict[str, Any]:
        """A copy of the decoded object."""
        return dict(self._fields)


#: The view's own attributes (not fields), and its slot's getter.
_OWN = frozenset({"_fields", "to_dict"})
_fields_of: Callable[[EventView], dict[str, Any]] = vars(EventView)["_fields"].__get__


Check = Callable[[object], bool]
#: A compiled field: a tuple of exact JSON types, a frozenset of literal
#: values, or a ``Check``.
Spec = tuple[type, ...] | frozenset[Any] | Check

_HASHABLE = (str, int, bool, type(None), float)
_NONE = type(None)
_SCALARS: dict[Any, tuple[type, ...]] = {str: (str,), int: (int,), float: (float, int), bool: (bool,),
                                         _NONE: (_NONE,)}


def _never(_value: object) -> bool:
    return False


def _anything(_value: object) -> bool:
    return True


def _fits(value: object, spec: Spec) -> bool:
    if spec.__class__ is tuple:
        return type(value) in spec
    if spec.__class__ is frozenset:
        return type(value) in _HASHABLE and value in spec
    assert callable(spec)
    return spec(value)


class _Compiler:
    """Turns SDK model annotations into plain checks of decoded JSON that
    are at least as strict as the models (JSON types exactly: no coercion);
    an annotation it does not know checks False, so such a frame goes to
    the SDK models."""

    def __init__(self) -> None:
        self._models: dict[type[BaseModel], Check] = {}

    def annotation(self, ann: object) -> Spec:
        if ann is Any or ann is object:
            return _anything
        scalar = _SCALARS.get(ann) if isinstance(ann, Hashable) else None
        if scalar is not None:
            return scalar
        origin, args = typing.get_origin(ann), typing.get_args(ann)
        if origin is Annotated:
            return self.annotation(args[0])
        if origin is Literal:
            return frozenset(args)
        if origin is Union or origin is types.UnionType:
            return self._union(args)
        if origin is list:
            element = self.annotation(args[0]) if args else _anything
            return _ListOf(element, _list_of(element))
        if origin is dict:
            return _dict_of(self.annotation(args[1]) if len(args) == 2 else _anything)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            return self.model(ann)
        return _never

    def _union(self, members: tuple[Any, ...]) -> Spec:
        models = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
        others = [self.annotation(m) for m in members if m not in models]
        if not models and all(o.__class__ is tuple for o in others):
            return tuple(t for o in others if o.__class__ is tuple for t in o)   # (every one is)
        if not models and all(o.__class__ in (tuple, frozenset) for o in others):
            values = {v for o in others if o.__class__ is frozenset for v in o}
            if all(o == (_NONE,) for o in others if o.__class__ is tuple):
                return frozenset(values | {None})
        by_type: dict[Any, Check] = {}
        untyped: list[Check] = []
        for model in models:
            values_ = _type_values(model)
            if values_ is None or any(v in by_type for v in values_):
                untyped.append(self.model(model))
            else:
                by_type.update({v: self.model(model) for v in values_})
        # the plain members merged: one type test, one set test, then the checks
        plain_types = tuple(t for o in others if o.__class__ is tuple for t in o)
        plain_values = frozenset(v for o in others if o.__class__ is frozenset for v in o)
        other_checks = [o for o in others if o.__class__ not in (tuple, frozenset)]
        if plain_types and not plain_values and not by_type and len(other_checks) + len(untyped) == 1:
            # ``Optional[X]`` and the like: a model's check refuses what is no object itself
            return _Either(plain_types, [*other_checks, *untyped][0])
        return _union_check(plain_types, plain_values, other_checks, by_type, untyped)

    def model(self, model: type[BaseModel]) -> Check:
        known = self._models.get(model)
        if known is not None:
            return known
        # a model may contain itself: its fields see this stand-in, which
        # calls the generated check once there is one
        generated: list[Check] = []
        self._models[model] = lambda value: generated[0](value)
        fields: dict[str, Spec] = {}
        required: set[str] = set()
        for name, info in model.model_fields.items():
            key = info.alias or name
            fields[key] = self.annotation(info.annotation)
            if info.is_required():
                required.add(key)
        generated.append(_model_check(model.__name__, fields, required))
        self._models[model] = generated[0]
        return generated[0]


# -- the generated checks: each model's and union's check is one function of
# straight-line code (one ``dict.get`` and one inline test per field), not a
# loop that looks up each field's spec and dispatches on its kind: the
# checks run on every acted-on frame (~17 a tool round)


class _Source:
    """The text and the names of one generated function."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.names: dict[str, Any] = {"_HASHABLE": _HASHABLE, "_MISSING": _MISSING}

    def name(self, value: object) -> str:
        """A name for ``value`` in the function's globals."""
        key = f"_c{len(self.names)}"
        self.names[key] = value
        return key

    def test(self, spec: Spec, var: str) -> str:
        """An expression true when ``var`` fits ``spec`` (as ``_fits`` says)."""
        if spec.__class__ is tuple:
            if len(spec) == 1:
                return f"type({var}) is {self.name(spec[0])}"
            return f"type({var}) in {self.name(spec)}"
        if spec.__class__ is frozenset:
            return f"(type({var}) in _HASHABLE and {var} in {self.name(spec)})"
        if isinstance(spec, _Either):
            return f"({self.test(spec.types, var)} or {self.test(spec.check, var)})"
        if isinstance(spec, _ListOf):
            element = spec.element
            if element.__class__ is tuple or element.__class__ is frozenset:
                return f"{self.name(spec.check)}({var})"
            return f"(type({var}) is list and all(map({self.name(element)}, {var})))"
        return f"{self.name(spec)}({var})"

    def build(self, fn: str) -> Check:
        namespace = dict(self.names)
        exec("\n".join(self.lines), namespace)   # noqa: S102 - our own text, from the SDK's annotations
        check: Check = namespace[fn]
        return check


_MISSING = object()
_COST_ORDER: dict[Any, int] = {frozenset: 0, tuple: 1}


class _Either:
    """A union of plain types and one check (``Optional[X]``): a check that
    generated code inlines as ``type(v) in types or check(v)``."""

    __slots__ = ("types", "check")

    def __init__(self, types: tuple[type, ...], check: Spec) -> None:
        self.types, self.check = types, check

    def __call__(self, value: object) -> bool:
        return type(value) in self.types or _fits(value, self.check)


def _model_check(model: str, fields: dict[str, Spec], required: set[str]) -> Check:
    """A model's check: a JSON object with every required field, each known
    field present of its spec (extra fields are allowed, as in the models)."""
    src = _Source()
    req = src.name(frozenset(required))
    src.lines += [f"def check_{_ident(model)}(value):",
                  f"    if type(value) is not dict or not value.keys() >= {req}:",
                  "        return False",
                  "    get = value.get"]
    # literals first, then plain types, nested checks last: the members of a
    # union that share a ``type`` (three kinds of ``message`` item) refuse
    # on their ``role`` before their content is walked (order cannot change
    # the answer: every field must fit, and a test has no effect)
    for key, spec in sorted(fields.items(), key=lambda field: _COST_ORDER.get(field[1].__class__, 2)):
        src.lines += [f"    v = get({key!r}, _MISSING)",
                      f"    if v is not _MISSING and not {src.test(spec, 'v')}:",
                      "        return False"]
    src.lines.append("    return True")
    return src.build(f"check_{_ident(model)}")


def _union_check(plain_types: tuple[type, ...], plain_values: frozenset[Any], other_checks: list[Spec],
                 by_type: dict[Any, Check], untyped: list[Check]) -> Check:
    """A union's check: its plain members (one type test, one set test, the
    other checks), then an object's member by its ``type``, then the
    members that have no type of their own."""
    src = _Source()
    src.lines += ["def check_union(value):", "    kind_of = type(value)"]
    if plain_types:
        src.lines += [f"    if kind_of in {src.name(plain_types)}:", "        return True"]
    if plain_values:
        src.lines += [f"    if kind_of in _HASHABLE and value in {src.name(plain_values)}:", "        return True"]
    for other in other_checks:
        src.lines += [f"    if {src.test(other, 'value')}:", "        return True"]
    src.lines += ["    if kind_of is not dict:", "        return False"]
    if by_type:
        src.lines += ["    kind = value.get('type')",
                      f"    typed = {src.name(by_type)}.get(kind) if type(kind) is str else None",
                      "    if typed is not None and typed(value):", "        return True"]
    for check in untyped:
        src.lines += [f"    if {src.name(check)}(value):", "        return True"]
    src.lines.append("    return False")
    return src.build("check_union")


def _ident(name: str) -> str:
    return re.sub(r"\W", "_", name)


class _ListOf:
    """A list check and the spec of its elements (generated code inlines
    the loop over checked elements)."""

    __slots__ = ("element", "check")

    def __init__(self, element: Spec, check: Check) -> None:
        self.element, self.check = element, check

    def __call__(self, value: object) -> bool:
        return self.check(value)


def _list_of(element: Spec) -> Check:
    """A JSON array whose every element fits ``element`` (one loop, no
    per-element dispatch on the spec's kind: lists of items and content
    parts are checked on every acted-on frame)."""
    if element.__class__ is tuple:
        element_types = element

        def of_types(value: object) -> bool:
            if type(value) is not list:
                return False
            for x in value:
                if type(x) not in element_types:
                    return False
            return True
        return of_types
    if element.__class__ is frozenset:
        element_values = element

        def of_values(value: object) -> bool:
            return type(value) is list and all(type(x) in _HASHABLE and x in element_values for x in value)
        return of_values
    assert callable(element)
    element_check = element

    def of_checked(value: object) -> bool:
        if type(value) is not list:
            return False
        for x in value:
            if not element_check(x):
                return False
        return True
    return of_checked


def _dict_of(item: Spec) -> Check:
    """A JSON object with string keys whose every value fits ``item``."""
    return lambda v: type(v) is dict and all(type(k) is str and _fits(x, item) for k, x in v.items())


def _type_values(model: type[BaseModel]) -> tuple[Any, ...] | None:
    info = model.model_fields.get("type")
    if info is None or typing.get_origin(info.annotation) is not Literal:
        return None
    return typing.get_args(info.annotation)


def compile_checks(models: dict[str, type[BaseModel]]) -> dict[str, Check]:
    """One check per event type, from its SDK model."""
    compiler = _Compiler()
    return {type_: compiler.model(model) for type_, model in models.items()}
