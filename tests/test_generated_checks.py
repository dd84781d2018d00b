"""The generated checks (``event_view.compile_checks``: one function of
straight-line code per model and union) answer as the checks they replaced
did (a loop over each object's fields that looked up and dispatched on each
field's spec): the same accept or refuse, for every server event's check,
on the acted-on events, the benchmark round's frames, and mutations of both."""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Hashable
from typing import Annotated, Any, Callable, Literal, Union

from hypothesis import given, settings as hsettings, strategies as st
from pydantic import BaseModel

from benchmarks import round_cpu
from tests.test_realtime_events import ACTED_ON, NEAR_VALUES, json_values, mutated
from voiceactors.realtime import events
from voiceactors.realtime.event_view import compile_checks


# --- the reference: the checks as they were before generation (event_view.py
# at 43fba4b), kept here unchanged as the oracle

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


def reference_checks(models: dict[str, type[BaseModel]]) -> dict[str, Check]:
    compiler = _Compiler()
    return {type_: compiler.model(model) for type_, model in models.items()}


REFERENCE = reference_checks(events.SERVER_EVENTS.by_type)
GENERATED = events.SERVER_CHECKS
ROUND = [json.loads(raw) for raw in round_cpu.round_frames(0)]


def _same_answer_from_every_check(obj: Any) -> None:
    for type_, check in GENERATED.items():
        assert check(obj) is REFERENCE[type_](obj), (type_, obj)


def test_every_server_event_has_a_generated_check_and_a_fresh_compile_is_the_same():
    assert GENERATED.keys() == REFERENCE.keys() == events.SERVER_EVENTS.by_type.keys()
    again = compile_checks(events.SERVER_EVENTS.by_type)
    for obj in ACTED_ON + ROUND:
        assert all(again[t](obj) is GENERATED[t](obj) for t in GENERATED)


def test_the_acted_on_events_and_the_rounds_frames_are_accepted_by_both():
    for obj in ACTED_ON + ROUND:
        assert GENERATED[obj["type"]](obj) and REFERENCE[obj["type"]](obj), obj["type"]
        _same_answer_from_every_check(obj)


@hsettings(max_examples=1500, deadline=None)
@given(mutated(ACTED_ON + ROUND, most=3))
def test_mutated_events_get_the_same_answer_from_every_check(obj):
    _same_answer_from_every_check(obj)


def _field_names(model: type[BaseModel]) -> list[str]:
    return [info.alias or name for name, info in model.model_fields.items()]


@st.composite
def any_event(draw):
    """Any server event type, some of its model's fields with near or arbitrary values."""
    type_ = draw(st.sampled_from(sorted(events.SERVER_EVENTS.by_type)))
    names = _field_names(events.SERVER_EVENTS.by_type[type_])
    chosen = draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names)))
    obj = {name: json.loads(json.dumps(draw(st.sampled_from(NEAR_VALUES) | json_values))) for name in chosen}
    obj["type"] = type_
    return obj


@hsettings(max_examples=1500, deadline=None)
@given(any_event())
def test_every_event_type_with_arbitrary_fields_gets_the_same_answer_from_every_check(obj):
    _same_answer_from_every_check(obj)


def test_a_check_that_refuses_on_a_literal_refuses_before_walking_nested_content():
    """Ordering is only a speed-up: an object whose literal field is wrong and
    whose nested content is wrong too is refused by both, whichever is seen first."""
    item = {"type": "message", "role": "nobody", "content": [{"type": 5}]}
    obj = {"type": "conversation.item.added", "event_id": "e", "item": item}
    assert GENERATED["conversation.item.added"](obj) is REFERENCE["conversation.item.added"](obj) is False
