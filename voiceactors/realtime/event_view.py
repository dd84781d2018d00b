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
int), and what they refuse is skipped with its reason, as before.
"""

from __future__ import annotations

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
        value = _fields_of(self).get(name)
        kind = type(value)
        if kind is dict:
            return EventView(value)
        if kind is list:
            return tuple(EventView(v) if type(v) is dict else v for v in value)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
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
_fields_of = EventView._fields.__get__   # type: ignore[attr-defined]


Check = Callable[[Any], bool]
#: A compiled field: a tuple of exact JSON types, a frozenset of literal
#: values, or a ``Check``.
Spec = tuple[type, ...] | frozenset[Any] | Check

_HASHABLE = (str, int, bool, type(None), float)
_NONE = type(None)
_SCALARS: dict[Any, tuple[type, ...]] = {str: (str,), int: (int,), float: (float, int), bool: (bool,),
                                         _NONE: (_NONE,)}


def _never(_value: Any) -> bool:
    return False


def _anything(_value: Any) -> bool:
    return True


def _fits(value: Any, spec: Spec) -> bool:
    cls = spec.__class__
    if cls is tuple:
        return type(value) in spec   # type: ignore[operator]
    if cls is frozenset:
        return type(value) in _HASHABLE and value in spec   # type: ignore[operator]
    return spec(value)   # type: ignore[operator]


class _Compiler:
    """Turns SDK model annotations into plain checks of decoded JSON that
    are at least as strict as the models (JSON types exactly: no coercion);
    an annotation it does not know checks False, so such a frame goes to
    the SDK models."""

    def __init__(self) -> None:
        self._models: dict[type[BaseModel], Check] = {}

    def annotation(self, ann: Any) -> Spec:
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
            return _list_of(self.annotation(args[0]) if args else _anything)
        if origin is dict:
            return _dict_of(self.annotation(args[1]) if len(args) == 2 else _anything)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            return self.model(ann)
        return _never

    def _union(self, members: tuple[Any, ...]) -> Spec:
        models = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
        others = [self.annotation(m) for m in members if m not in models]
        if not models and all(o.__class__ is tuple for o in others):
            return tuple(t for o in others for t in o)   # type: ignore[union-attr]
        if not models and all(o.__class__ in (tuple, frozenset) for o in others):
            values = {v for o in others if o.__class__ is frozenset for v in o}   # type: ignore[union-attr]
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
        plain_types = tuple(t for o in others if o.__class__ is tuple for t in o)   # type: ignore[union-attr]
        plain_values = frozenset(v for o in others if o.__class__ is frozenset for v in o)   # type: ignore[union-attr]
        other_checks = [o for o in others if o.__class__ not in (tuple, frozenset)]

        def check(value: Any) -> bool:
            kind_of = type(value)
            if kind_of in plain_types:
                return True
            if plain_values and kind_of in _HASHABLE and value in plain_values:
                return True
            for other in other_checks:
                if other(value):   # type: ignore[operator]
                    return True
            if kind_of is not dict:
                return False
            kind = value.get("type")
            typed = by_type.get(kind) if type(kind) is str else None
            if typed is not None and typed(value):
                return True
            for untyped_check in untyped:
                if untyped_check(value):
                    return True
            return False
        return check

    def model(self, model: type[BaseModel]) -> Check:
        known = self._models.get(model)
        if known is not None:
            return known
        fields: dict[str, Spec] = {}
        required: set[str] = set()

        def check(value: Any) -> bool:
            if type(value) is not dict or not value.keys() >= required:
                return False
            for name, item in value.items():
                spec = fields.get(name)
                if spec is None:
                    continue      # extra fields are allowed, as in the models
                cls = spec.__class__
                if cls is tuple:
                    if type(item) not in spec:   # type: ignore[operator]
                        return False
                elif cls is frozenset:
                    if type(item) not in _HASHABLE or item not in spec:   # type: ignore[operator]
                        return False
                elif not spec(item):   # type: ignore[operator]
                    return False
            return True

        self._models[model] = check      # before the fields: a model may contain itself
        for name, info in model.model_fields.items():
            key = info.alias or name
            fields[key] = self.annotation(info.annotation)
            if info.is_required():
                required.add(key)
        return check


def _list_of(element: Spec) -> Check:
    """A JSON array whose every element fits ``element`` (one loop, no
    per-element dispatch on the spec's kind: lists of items and content
    parts are checked on every acted-on frame)."""
    cls = element.__class__
    if cls is tuple:
        def of_types(value: Any) -> bool:
            if type(value) is not list:
                return False
            for x in value:
                if type(x) not in element:   # type: ignore[operator]
                    return False
            return True
        return of_types
    if cls is frozenset:
        def of_values(value: Any) -> bool:
            return type(value) is list and all(type(x) in _HASHABLE and x in element for x in value)   # type: ignore[operator]
        return of_values

    def of_checked(value: Any) -> bool:
        if type(value) is not list:
            return False
        for x in value:
            if not element(x):   # type: ignore[operator]
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
