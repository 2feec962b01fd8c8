"""Reading back what tracetune stored as JSON: a raw value is `object`, narrowed here.

A stored record's schema is its own dataclass: a `Codec` (pydantic underneath) writes it as
JSON-ready data and reads it back, a field an older tracetune did not store, or stored as
something else, taking its default. The helpers below narrow single raw values the same way, for
readers of JSON that is no record of tracetune's (an engine's answer, a user's file).
"""

from __future__ import annotations

import copy
import dataclasses
import typing
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Generic, Self, SupportsFloat, SupportsIndex, TypeVar, cast

from pydantic import PlainSerializer, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

Stored = Mapping[str, object]
"""A JSON object read back from storage (or a record's `as_dict()`), before it is parsed."""


def number(value: object) -> float:
    """A stored value as a float; NaN where it is missing or not a number (a result read back from JSON)."""
    if not isinstance(value, (SupportsFloat, SupportsIndex, str, bytes)):
        return float("nan")
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def whole(value: object, default: int = 0) -> int:
    """A stored count as an int; `default` where it is missing, zero or not a number."""
    if not value or not isinstance(value, (int, float, str)):
        return default
    return int(value)


def mapping(value: object) -> Stored:
    """A stored JSON object; empty where it is missing or not an object."""
    return value if isinstance(value, Mapping) else {}


def listed(value: object) -> list[object]:
    """A stored JSON array as a list; empty where it is missing or not an array."""
    return list(value) if isinstance(value, (list, tuple)) else []


def text(value: object) -> str:
    """A stored string; empty where it is missing."""
    return str(value) if value else ""


R = TypeVar("R")
S = TypeVar("S", bound=Mapping[str, object])  # a record's stored shape (a TypedDict, or a plain dict)
# Passes of dropping what an older tracetune stored differently: each drops every field pydantic
# refused, so nested records need one pass per level.
_REPAIRS = 8
_DROPPED = object()  # a list item `_without` removes


class Codec(Generic[R]):
    """One stored record's codec, from its dataclass (the schema, with its defaults and its fields'
    stored names, `Annotated[..., Field(alias=...)]`).

    `dump` writes the record as JSON-ready data (stored names; enums by value; tuples as lists),
    then what `derived` adds for readers outside Python (rates, outcomes), and leaves out the
    fields in `unset_omitted` while they are None or empty; with `order`, its keys come in that
    order (any other after them). `load` reads it back: keys it does not know (the derived ones
    among them) are ignored, numbers come from numeric strings, and a field stored as something
    its type refuses takes its default; a required field missing is a ValidationError."""

    def __init__(self, record: type[R], *, derived: Callable[[R], Mapping[str, object]] | None = None,
                 unset_omitted: tuple[str, ...] = (), order: tuple[str, ...] = ()) -> None:
        self.adapter: TypeAdapter[R] = TypeAdapter(record)
        self.derived = derived
        self.unset_omitted = unset_omitted
        self.order = order

    def dump(self, record: R) -> dict[str, object]:
        out: dict[str, object] = self.adapter.dump_python(record, mode="json", by_alias=True)
        for key in self.unset_omitted:
            if out.get(key) in (None, "", [], {}):
                out.pop(key, None)
        if self.derived is not None:
            out.update(self.derived(record))
        if self.order:
            out = {**{key: out[key] for key in self.order if key in out}, **out}
        return out

    def load(self, raw: object) -> R:
        data: object = dict(raw) if isinstance(raw, Mapping) else {}
        for _ in range(_REPAIRS):
            try:
                return self.adapter.validate_python(data)
            except ValidationError as exc:
                repaired = _without(data, [error["loc"] for error in exc.errors()])
                if repaired == data:
                    raise
                data = repaired
        return self.adapter.validate_python(data)


def rounded(digits: int) -> PlainSerializer:
    """A stored number's serializer: rounded to `digits` decimals (a whole number stays one, as
    records wrote it before they had a schema)."""
    return PlainSerializer(lambda value: round(value, digits), return_type=int | float)


class Record(Generic[S]):
    """A stored record (a dataclass) with its `Codec`: `as_dict()` writes it (typed as `S`, the
    stored shape), `from_dict(raw)` reads it back. A record adds what readers outside Python need
    beside its fields by overriding `derived`, names the fields stored only while set in
    `unset_omitted`, and the order of its stored keys in `stored_order` (where it is not its
    fields' then its derived keys'). A field holding records (one, or a list of them) is stored as
    each one's `as_dict()`, what they derive included."""

    unset_omitted: ClassVar[tuple[str, ...]] = ()
    stored_order: ClassVar[tuple[str, ...]] = ()
    _codecs: ClassVar[dict[type, Codec[Any]]] = {}

    def derived(self) -> Mapping[str, object]:
        """What `as_dict` adds beside the fields (derived again when read back, never read)."""
        return {}

    def _with_nested(self) -> dict[str, object]:
        """`derived()`, and every field holding records written as their own `as_dict()`."""
        out = dict(self.derived())
        for name, key in _stored_names(type(self)).items():
            value = getattr(self, name)
            if isinstance(value, Record):
                out[key] = value.as_dict()
            elif isinstance(value, (list, tuple)) and value and all(isinstance(v, Record) for v in value):
                out[key] = [v.as_dict() for v in value]
        return out

    @classmethod
    def codec(cls) -> Codec[Self]:
        """The record's codec, made once its class is complete (its annotations resolvable)."""
        found = Record._codecs.get(cls)
        if found is None:
            found = Record._codecs[cls] = Codec(cls, derived=lambda record: record._with_nested(),
                                                unset_omitted=cls.unset_omitted, order=cls.stored_order)
        return cast("Codec[Self]", found)

    def as_dict(self) -> S:
        return cast(S, self.codec().dump(self))

    @classmethod
    def from_dict(cls, raw: object) -> Self:
        return cls.codec().load(raw)


_STORED_NAMES: dict[type, dict[str, str]] = {}


def _stored_names(record: type) -> dict[str, str]:
    """Each field of a record's dataclass and the key it is stored under (its alias, or its name)."""
    found = _STORED_NAMES.get(record)
    if found is None:
        hints = typing.get_type_hints(record, include_extras=True)
        found = {}
        for field in dataclasses.fields(record):
            infos = [m for m in getattr(hints.get(field.name), "__metadata__", ()) if isinstance(m, FieldInfo)]
            if any(info.exclude for info in infos):
                continue
            found[field.name] = next((info.alias for info in infos if info.alias), field.name)
        _STORED_NAMES[record] = found
    return found


def _without(data: object, locations: list[tuple[int | str, ...]]) -> object:
    """`data` (a copy) without the values at `locations` (pydantic's error locations): each the
    deepest stored value its location reaches (a location may go on past it, into the type a union
    tried)."""
    out = copy.deepcopy(data)
    for location in locations:
        parent, key = _reached(out, location)
        if isinstance(parent, dict):
            del parent[key]
        elif isinstance(parent, list) and isinstance(key, int):
            parent[key] = _DROPPED  # kept in place: the other locations' indices still hold
    return _pruned(out)


def _reached(data: object, location: tuple[int | str, ...]) -> tuple[object, int | str]:
    """The container and key of the deepest stored value `location` reaches, where the rest of it
    names the types a union tried; (None, "") where the value is not stored (a field missing, or
    dropped already for another location)."""
    parent: object = None
    key: int | str = ""
    value = data
    for step in location:
        if isinstance(value, dict):
            if step not in value:
                return None, ""
            parent, key, value = value, step, value[step]
        elif isinstance(value, list):
            if not (isinstance(step, int) and 0 <= step < len(value)) or value[step] is _DROPPED:
                return None, ""
            parent, key, value = value, step, value[step]
        else:
            break
    return parent, key


def _pruned(value: object) -> object:
    """`value` without the list items `_without` marked dropped."""
    if isinstance(value, dict):
        return {k: _pruned(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_pruned(v) for v in value if v is not _DROPPED]
    return value
