"""A fast, sound pre-check of payloads against a common subset of JSON Schema 2020-12.

jsonschema's ``Draft202012Validator.is_valid`` walks its keyword machinery for every
payload (tens of µs each); most payload schemas use a handful of keywords that a plain
Python predicate checks in a few µs. :func:`compile_check` turns a schema that uses only
those keywords into such a predicate, and answers ``None`` for any other schema.

The predicate is a *fast path*, never the verdict's only source: ``True`` means the
payload is valid (exactly as jsonschema would say), ``False`` means "ask jsonschema",
which gives the verdict and the error text. So a predicate may say ``False`` where it is
unsure (a ``Decimal``, a tuple: nothing JSON decodes to), never ``True`` wrongly.

The subset: ``type`` (a name or a list of names), ``properties``, ``required``,
``additionalProperties`` (a boolean or a schema), ``enum``, ``const``, ``minLength``,
``maxLength``, ``minimum``, ``maximum``, ``exclusiveMinimum``, ``exclusiveMaximum``,
``pattern``, ``items`` (one schema), ``minItems``, ``maxItems``, boolean schemas, and the
annotations (``title``, ``description``, ``format``...: ``format`` is an annotation
because Ferry's validators are built without a format checker, as jsonschema's default).
Anything else (``$ref``, ``allOf``, ``prefixItems``, ``if``, ``patternProperties``, an
unknown keyword...) makes the whole schema fall back to jsonschema alone.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Callable, Mapping
from typing import Any

Check = Callable[[Any], bool]

DIALECT = "https://json-schema.org/draft/2020-12/schema"

#: Keywords without effect on validity here (``format``: no format checker is used).
_ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "$comment",
        "examples",
        "default",
        "deprecated",
        "readOnly",
        "writeOnly",
        "format",
    }
)
_KNOWN = frozenset(
    {
        "$schema",
        "type",
        "properties",
        "required",
        "additionalProperties",
        "enum",
        "const",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "pattern",
        "items",
        "minItems",
        "maxItems",
    }
)
_TYPES = frozenset({"null", "boolean", "object", "array", "number", "string", "integer"})


class _Outside(Exception):
    """The schema uses something outside the subset."""


def compile_check(schema: Any) -> Check | None:
    """A predicate that is True only for instances valid against ``schema``, or None when
    ``schema`` uses anything outside the subset (then only jsonschema can judge)."""
    try:
        check = _compile(schema)
    except (_Outside, re.error, RecursionError, TypeError, ValueError):
        return None
    if check is None:
        return _always
    return check


def _always(value: Any) -> bool:
    return True


def _never(value: Any) -> bool:
    return False


def _compile(schema: Any) -> Check | None:
    """The predicate of ``schema`` (None: accepts everything)."""
    if schema is True:
        return None
    if schema is False:
        return _never
    _vet(schema)
    checks = [
        check
        for build in (_type_check, _enum_check, _const_check)
        for check in [build(schema)]
        if check is not None
    ]
    for build in (_text_check, _number_check, _array_check, _object_check):
        check = build(schema)
        if check is not None:
            checks.append(check)
    return _all(checks)


def _vet(schema: Any) -> None:
    if not isinstance(schema, Mapping):
        raise _Outside
    for keyword in schema:
        if keyword not in _KNOWN and keyword not in _ANNOTATIONS:
            raise _Outside
    if "$schema" in schema and schema["$schema"] != DIALECT:
        raise _Outside


def _all(checks: list[Check]) -> Check | None:
    """All of ``checks`` (None when there are none), chained without a loop."""
    if not checks:
        return None
    first, rest = checks[0], _all(checks[1:])
    if rest is None:
        return first
    return lambda value: first(value) and rest(value)


# --- type ---------------------------------------------------------------------------------


def _is_integer(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and value.is_integer()


def _is_number(value: Any) -> bool:
    # jsonschema takes any numbers.Number; a Decimal or a Fraction never comes out of JSON
    # decoding, so only int and float are answered (anything else: ask jsonschema).
    return isinstance(value, int | float) and not isinstance(value, bool)


_SINGLE: dict[str, Check] = {
    "string": lambda value: isinstance(value, str),
    "object": lambda value: isinstance(value, dict),
    "array": lambda value: isinstance(value, list),
    "boolean": lambda value: isinstance(value, bool),
    "null": lambda value: value is None,
    "integer": _is_integer,
    "number": _is_number,
}


def _type_check(schema: Mapping[str, Any]) -> Check | None:
    if "type" not in schema:
        return None
    types = schema["type"]
    names = [types] if isinstance(types, str) else types
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise _Outside
    if any(name not in _TYPES for name in names):
        raise _Outside  # jsonschema raises UnknownType: let it
    return _any([_SINGLE[name] for name in sorted(set(names))])


def _any(checks: list[Check]) -> Check:
    """Any of ``checks`` (none: nothing passes), chained without a loop."""
    if not checks:
        return _never
    first, rest = checks[0], checks[1:]
    if not rest:
        return first
    other = _any(rest)
    return lambda value: first(value) or other(value)


# --- enum and const -------------------------------------------------------------------------


def _equal(one: Any, two: Any) -> bool:
    """jsonschema's equality on JSON values (``True`` is not ``1``, ``1`` is ``1.0``);
    False for values JSON has no form of where jsonschema's answer could differ."""
    if one is two:
        return True
    if isinstance(one, str) or isinstance(two, str):
        return bool(one == two)
    if isinstance(one, list) and isinstance(two, list):
        return len(one) == len(two) and all(_equal(a, b) for a, b in zip(one, two, strict=True))
    if isinstance(one, dict) and isinstance(two, dict):
        return len(one) == len(two) and all(
            key in two and _equal(value, two[key]) for key, value in one.items()
        )
    if isinstance(one, bool) or isinstance(two, bool):
        return False  # `one is two` already answered True for the same boolean
    if _plain(one) and _plain(two):
        return bool(one == two)
    return False


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, int | float)


def _const_check(schema: Mapping[str, Any]) -> Check | None:
    if "const" not in schema:
        return None
    expected = schema["const"]
    return lambda value: _equal(value, expected)


def _enum_check(schema: Mapping[str, Any]) -> Check | None:
    if "enum" not in schema:
        return None
    options = schema["enum"]
    if not isinstance(options, list):
        raise _Outside
    if all(isinstance(option, str) for option in options):
        texts = frozenset(options)
        return lambda value: isinstance(value, str) and value in texts
    choices = tuple(options)
    return lambda value: any(_equal(value, choice) for choice in choices)


# --- strings, numbers, arrays, objects ------------------------------------------------------


def _count(schema: Mapping[str, Any], keyword: str) -> int | None:
    value = schema.get(keyword)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Outside
    if isinstance(value, float) and not value.is_integer():
        raise _Outside
    return int(value)


def _bound(schema: Mapping[str, Any], keyword: str) -> int | float | None:
    value = schema.get(keyword)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Outside
    return value


def _sizes(schema: Mapping[str, Any], least: str, most: str) -> tuple[int, int | None] | None:
    """``schema``'s size bounds (``minLength`` and ``maxLength``, ``minItems`` and
    ``maxItems``): the least (0 when unset) and the most; None when it sets neither."""
    shortest, longest = _count(schema, least), _count(schema, most)
    if shortest is None and longest is None:
        return None
    return (shortest if shortest is not None else 0, longest)


def _sized(
    kind: type[str] | type[list[Any]], sizes: tuple[int, int | None] | None, rest: Check | None
) -> Check | None:
    """The check of the values of ``kind`` (``str``, ``list``): the size within ``sizes``,
    then ``rest``; other values pass (their type is checked apart). None: nothing to check."""
    if sizes is None and rest is None:
        return None
    low, high = sizes or (0, None)

    def sized(value: Any) -> bool:
        if not isinstance(value, kind):
            return True
        size = len(value)
        if size < low or (high is not None and size > high):
            return False
        return rest is None or rest(value)

    return sized


def _text_check(schema: Mapping[str, Any]) -> Check | None:
    sizes = _sizes(schema, "minLength", "maxLength")
    pattern = schema.get("pattern")
    if pattern is not None and not isinstance(pattern, str):
        raise _Outside
    search = re.compile(pattern).search if pattern is not None else None
    return _sized(str, sizes, None if search is None else lambda value: search(value) is not None)


def _number_check(schema: Mapping[str, Any]) -> Check | None:
    low, high = _bound(schema, "minimum"), _bound(schema, "maximum")
    above, below = _bound(schema, "exclusiveMinimum"), _bound(schema, "exclusiveMaximum")
    if low is None and high is None and above is None and below is None:
        return None

    def number(value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, numbers.Number):
            return True
        if not isinstance(value, int | float):
            return False  # a Decimal: ask jsonschema
        if low is not None and value < low:
            return False
        if high is not None and value > high:
            return False
        if above is not None and value <= above:
            return False
        return below is None or value < below

    return number


def _array_check(schema: Mapping[str, Any]) -> Check | None:
    sizes = _sizes(schema, "minItems", "maxItems")
    item = _compile(schema["items"]) if "items" in schema else None
    return _sized(list, sizes, None if item is None else lambda value: all(map(item, value)))


def _object_parts(
    schema: Mapping[str, Any],
) -> tuple[tuple[str, ...], frozenset[str], dict[str, Check], bool, Check | None]:
    """Required names, declared names, checks by name, closed?, the check of the rest."""
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(n, str) for n in required):
        raise _Outside
    properties = schema.get("properties", {})
    if not isinstance(properties, Mapping) or not all(isinstance(n, str) for n in properties):
        raise _Outside
    checked = {name: c for name, sub in properties.items() if (c := _compile(sub)) is not None}
    rest = schema.get("additionalProperties", True)
    closed = rest is False
    return (
        tuple(dict.fromkeys(required)),
        frozenset(properties),
        checked,
        closed,
        None if closed else _compile(rest),
    )


def _object_check(schema: Mapping[str, Any]) -> Check | None:
    names, known, checked, closed, extra = _object_parts(schema)
    if not names and not checked and not closed and extra is None:
        return None
    get = checked.get

    def member_fits(key: str, member: Any) -> bool:
        check = get(key)
        if check is not None:
            return check(member)
        if key in known:
            return True
        return not closed and (extra is None or extra(member))

    needed = frozenset(names)

    def obj(value: Any) -> bool:
        if not isinstance(value, dict):
            return True
        return value.keys() >= needed and all(map(member_fits, value.keys(), value.values()))

    return obj
