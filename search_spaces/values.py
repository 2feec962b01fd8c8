"""What a search space's values may be: one scalar (`Scalar`: a boolean, number or string), a number
(`Number`, never a boolean), and, for a categorical parameter, choices of one kind that do not repeat
(`choices_problem`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated

from pydantic import BeforeValidator


def _scalar(value: object) -> object:
    # Checked before the union, so a list or mapping gets one clear message rather than one per member.
    if not isinstance(value, (bool, int, float, str)):
        raise ValueError(f"must be a boolean, number or string, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {value}")
    return value


def _number(value: object) -> object:
    # pydantic's lax mode would read `true` as 1.0.
    if isinstance(value, bool):
        raise ValueError("must be a number, not a boolean")
    return value


Scalar = Annotated[bool | int | float | str, BeforeValidator(_scalar)]
Number = Annotated[float, BeforeValidator(_number)]


def kind_of(value: object) -> str:
    """A choice's kind as a space's author reads it: whole numbers and reals are both numbers."""
    if isinstance(value, bool):
        return "boolean"
    return "number" if isinstance(value, int | float) else "string"


def choices_problem(choices: Sequence[object]) -> str | None:
    """Why a parameter's `choices` cannot be searched (None when they can): a choice repeated (1 and 1.0
    too: one number), or choices of different kinds (`[4, "many", 8.5]`: one engine setting takes one
    kind of value; whole numbers and reals mix, as `[0.5, 1]` means two numbers)."""
    if len({(kind_of(c), c) for c in choices}) != len(choices):  # 1 and 1.0 are one number; True and 1 are not
        return "choices must not repeat"
    kinds = [kind_of(c) for c in choices]
    if len(set(kinds)) > 1:
        odd = next(c for c, k in zip(choices, kinds, strict=True) if k != kinds[0])
        return (f"choices must all be of one kind, but {choices[0]!r} is a {kinds[0]} and {odd!r} a "
                f"{kind_of(odd)}; quote every choice to make them strings, or write them all as numbers")
    return None
