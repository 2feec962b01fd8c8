"""Reading back what tracetune stored as JSON: a raw value is `object`, narrowed here.

A typed record's `from_dict` takes a `Stored` (a JSON object as read back, or the record's own
`as_dict()`) and turns each field into its type with these helpers, which never raise on a
missing or mistyped field: an older tracetune may have stored less, or stored it differently.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import SupportsFloat, SupportsIndex

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
