"""Checking what an MCP source sends (its tools' schemas, and arguments
against them) within bounds, away from the trio thread.

A source's schema is the source's to write, and JSON Schema leaves room for
work out of all proportion to its size: a ``pattern`` such as ``^(a+)+$``
makes Python's backtracking ``re`` run for seconds on 27 characters (and it
holds the GIL throughout, so a worker thread alone would not free the trio
thread), and ``anyOf`` through ``$ref`` doubles the work at each level.
Three rules bound it:

* At discovery a schema is refused unless its shape keeps every check in
  proportion (``shape_problem``: its size and depth, references within the
  document) and its patterns are ones RE2 can run (``schema_problem``).
* Patterns run on RE2 (``google-re2``), which matches in linear time: the
  validator classes here check ``pattern``, ``patternProperties`` and
  ``additionalProperties`` with it (a schema that combines
  ``patternProperties`` with ``unevaluatedProperties``, which jsonschema
  would match with ``re``, is refused).
* Every keyword evaluated while checking arguments spends one step of a
  ``Budget`` (steps and a deadline); past either, the check stops with
  ``TooCostly``. The caller may stop it too (``Budget.stop``), so an
  abandoned check ends at its next step.
* ``check_arguments`` runs a check of short arguments on the trio thread
  within a small budget (about a millisecond), and any other, or one past
  that, in a worker thread under the whole budget (``check_in_thread``),
  stopped when the awaiting task is cancelled. The hub runs discovery's
  checks in a worker thread.
"""

from __future__ import annotations

import functools
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, TypeVar

import re2
from jsonschema import FormatChecker, validators
from jsonschema.exceptions import ValidationError, best_match
from jsonschema.protocols import Validator

from voiceactors import storage

T = TypeVar("T")

ARGUMENT_STEPS = 100_000        # keywords evaluated to check one call's arguments, at most
ARGUMENT_CHECK_S = 1.0
INLINE_STEPS = 2_000            # a check this short runs on the caller's thread (about 1 ms)...
INLINE_ARGUMENTS = 1024         # ...when the arguments are this short (characters of JSON)
SCHEMA_NODES = 5_000            # values in one tool's input schema, at most
SCHEMA_DEPTH = 32               # and how deep


class TooCostly(Exception):
    """A check ran out of its budget (or was stopped) before it finished."""


@dataclass
class Budget:
    steps: int
    seconds: float
    stopped: bool = False
    deadline: float = field(default=0.0, init=False)

    def start(self) -> None:
        self.deadline = time.monotonic() + self.seconds

    def stop(self) -> None:
        self.stopped = True

    def spend(self) -> None:
        self.steps -= 1
        if self.steps < 0 or self.stopped or time.monotonic() > self.deadline:
            raise TooCostly("schema check over its budget")


_budget: ContextVar[Budget | None] = ContextVar("schema_budget", default=None)


def _spend() -> None:
    budget = _budget.get()
    if budget is not None:
        budget.spend()


def run_within(budget: Budget, check: Callable[..., T], *args: Any) -> T:
    """``check(*args)`` with every keyword spending ``budget`` (TooCostly past it)."""
    budget.start()
    token = _budget.set(budget)
    try:
        return check(*args)
    except RecursionError:
        raise TooCostly("schema nested too deeply") from None
    finally:
        _budget.reset(token)


async def check_arguments(raw_chars: int, check: Callable[..., T], *args: Any) -> T:
    """``check(*args)`` of a call's arguments (``raw_chars`` long as JSON):
    first on this thread within ``INLINE_STEPS`` when they are short (a
    worker thread's hop costs more than most checks), else, or past that, in
    a worker thread with the whole budget. TooCostly past it."""
    if raw_chars <= INLINE_ARGUMENTS:
        try:
            return run_within(Budget(INLINE_STEPS, ARGUMENT_CHECK_S), check, *args)
        except TooCostly:
            pass    # more than a moment's work: again, away from the trio thread
    return await check_in_thread(Budget(ARGUMENT_STEPS, ARGUMENT_CHECK_S), check, *args)


async def check_in_thread(budget: Budget, check: Callable[..., T], *args: Any) -> T:
    """``run_within`` in a worker thread; a cancelled caller stops the check."""
    try:
        return await storage.run_sync(run_within, budget, check, *args)
    finally:
        budget.stop()


@functools.lru_cache(maxsize=512)
def _compiled(pattern: str) -> Any:
    return re2.compile(pattern)


def _search(pattern: str, text: str) -> bool:
    return _compiled(pattern).search(text) is not None


# --- keywords matched with RE2 ---------------------------------------------------------


def _pattern(validator: Validator, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"does not match the pattern {pattern[:64]!r}")


def _pattern_properties(validator: Validator, patterns: dict[str, Any], instance: Any, schema: Any
                        ) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Validator, additional: Any, instance: Any, schema: Any
                           ) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    declared = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extra = [key for key in instance
             if key not in declared and not any(_search(pattern, key) for pattern in patterns)]
    if validator.is_type(additional, "object"):
        for key in extra:
            yield from validator.descend(instance[key], additional, path=key)
    elif additional is False and extra:
        yield ValidationError(f"additional properties are not allowed ({len(extra)} unexpected)")


_RE2_KEYWORDS: dict[str, Callable[..., Any]] = {
    "pattern": _pattern, "patternProperties": _pattern_properties, "additionalProperties": _additional_properties,
}


def _spending(keyword: Callable[..., Any]) -> Callable[..., Any]:
    def checked(validator: Validator, value: Any, instance: Any, schema: Any) -> Any:
        _spend()
        return keyword(validator, value, instance, schema)
    return checked


@functools.cache
def bounded(cls: type[Validator]) -> type[Validator]:
    """``cls`` with RE2 patterns and every keyword spending the current budget."""
    keywords = {name: _RE2_KEYWORDS.get(name, fn) for name, fn in cls.VALIDATORS.items()}
    extended: type[Validator] = validators.extend(cls, {name: _spending(fn) for name, fn in keywords.items()})
    return extended


def _re2_regex(instance: object) -> bool:
    if isinstance(instance, str):
        re2.compile(instance)
    return True


#: The formats of a metaschema check: every known format, ``regex`` meaning
#: "RE2 can run it" (the metaschemas mark ``pattern`` and ``patternProperties``
#: keys with it).
SCHEMA_FORMATS = FormatChecker()
SCHEMA_FORMATS.checks("regex", raises=(re2.error, TypeError))(_re2_regex)


def schema_problem(schema: dict[str, Any]) -> str | None:
    """Why ``schema`` cannot be used, or None: its shape first (``shape_problem``:
    what keeps the checks below and every later validation in proportion), then
    its own draft's metaschema, with RE2 for its patterns."""
    problem = shape_problem(schema)
    if problem is not None:
        return problem
    cls = validators.validator_for(schema)
    meta = validators.validator_for(cls.META_SCHEMA, default=cls)
    error = best_match(meta(cls.META_SCHEMA, format_checker=SCHEMA_FORMATS).iter_errors(schema))
    if error is None:
        return None
    if error.validator == "format":
        return f"invalid input schema: a pattern that linear-time matching cannot run ({str(error.instance)[:80]!r})"
    return f"invalid input schema: {error.message[:200]}"


def shape_problem(schema: dict[str, Any]) -> str | None:
    """At most ``SCHEMA_NODES`` values, ``SCHEMA_DEPTH`` deep (a metaschema
    check costs about 0.1 ms a value); ``$schema`` only at the top (a nested
    one would switch validation to jsonschema's own classes, ``re`` and no
    budget); ``$ref`` / ``$dynamicRef`` only within the document; not
    ``patternProperties`` with ``unevaluatedProperties``. Names of properties
    count as keys here, which only ever refuses more."""
    stack: list[tuple[Any, int]] = [(schema, 0)]
    nodes = 0
    keys: set[str] = set()
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if nodes > SCHEMA_NODES or depth > SCHEMA_DEPTH:
            return f"input schema larger than {SCHEMA_NODES} values or deeper than {SCHEMA_DEPTH}"
        if isinstance(node, dict):
            if depth > 0 and "$schema" in node:
                return "invalid input schema: $schema inside the schema is not supported"
            for keyword in ("$ref", "$dynamicRef"):
                ref = node.get(keyword)
                if isinstance(ref, str) and not ref.startswith("#"):
                    return f"invalid input schema: {keyword} outside the schema is not supported"
            keys.update(key for key in node if isinstance(key, str))
            stack.extend((value, depth + 1) for value in node.values())
        elif isinstance(node, list):
            stack.extend((value, depth + 1) for value in node)
    if "patternProperties" in keys and "unevaluatedProperties" in keys:
        return "invalid input schema: patternProperties with unevaluatedProperties is not supported"
    return None


def validator_of(schema: dict[str, Any]) -> Validator:
    """The validator of a source tool's arguments: its draft's, ``bounded``.
    The top ``$schema`` is left out of the copy it checks with, so that a
    ``$ref`` back to the top stays in the bounded class (jsonschema picks
    a schema's class by its ``$schema``)."""
    cls = validators.validator_for(schema)
    checked = {key: value for key, value in schema.items() if key != "$schema"}
    validator: Validator = bounded(cls)(checked, format_checker=cls.FORMAT_CHECKER)
    return validator
