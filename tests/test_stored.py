"""The stored-record codec (`tracetune.stored.Record`): what a record writes, and how what an older
tracetune wrote reads back."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from typing import Annotated

import pytest
from pydantic import Field, ValidationError

from tracetune.stored import Record


class Kind(enum.StrEnum):
    A = "a"
    B = "b"


@dataclasses.dataclass(frozen=True)
class Inner(Record[dict[str, object]]):
    n: int = 0
    xs: tuple[float, ...] = ()


@dataclasses.dataclass
class Outer(Record[dict[str, object]]):
    name: str
    low: Annotated[float, Field(alias="ci_low")] = math.nan
    kind: Kind = Kind.A
    inner: Inner = Inner()
    ratio: list[float | None] | None = None
    note: str = ""
    counts: dict[str, int | float] | None = None

    unset_omitted = ("note", "ratio", "counts")

    def derived(self) -> dict[str, object]:
        return {"twice": self.inner.n * 2}


def test_a_record_writes_its_stored_names_enum_values_lists_and_what_it_derives():
    record = Outer("x", 0.5, Kind.B, Inner(3, (0.1, 0.2)), [0.9, None], "n")
    stored = record.as_dict()
    assert stored == {"name": "x", "ci_low": 0.5, "kind": "b", "inner": {"n": 3, "xs": [0.1, 0.2]},
                      "ratio": [0.9, None], "note": "n", "twice": 6}
    assert Outer.from_dict(json.loads(json.dumps(stored))) == record


def test_fields_stored_only_while_set_are_left_out_unset():
    assert "note" not in Outer("x").as_dict() and "ratio" not in Outer("x").as_dict()


def test_what_an_older_tracetune_stored_differently_takes_its_default():
    old = {"name": "x", "ci_low": "0.25", "kind": "gone", "inner": {"n": "many", "xs": [0.1, "?", 0.3]},
           "ratio": [0.5, None, 2.0], "counts": {"cpus": 2, "busy": "lots"}, "unknown": 1, "twice": 99}
    back = Outer.from_dict(old)
    assert back == Outer("x", 0.25, Kind.A, Inner(0, (0.1, 0.3)), [0.5, None, 2.0], counts={"cpus": 2})
    assert old["inner"] == {"n": "many", "xs": [0.1, "?", 0.3]}  # the stored value itself is untouched


def test_a_missing_field_takes_its_default_and_a_missing_required_one_is_an_error():
    assert Inner.from_dict(None) == Inner() and Inner.from_dict({}) == Inner()
    with pytest.raises(ValidationError, match="name"):
        Outer.from_dict({"ci_low": 1.0})


@dataclasses.dataclass(frozen=True)
class Leaf(Record[dict[str, object]]):
    n: int = 0

    def derived(self) -> dict[str, object]:
        return {"odd": self.n % 2 == 1}


@dataclasses.dataclass
class Tree(Record[dict[str, object]]):
    leaves: list[Leaf] = dataclasses.field(default_factory=list)
    top: Leaf = Leaf()
    name: str = ""

    stored_order = ("name", "size", "top")

    def derived(self) -> dict[str, object]:
        return {"size": len(self.leaves)}


def test_nested_records_write_what_they_derive_and_keys_come_in_the_stored_order():
    stored = Tree([Leaf(1), Leaf(2)], Leaf(3), "t").as_dict()
    assert list(stored) == ["name", "size", "top", "leaves"]  # the order named, then the rest
    assert stored["leaves"] == [{"n": 1, "odd": True}, {"n": 2, "odd": False}]
    assert stored["top"] == {"n": 3, "odd": True}
    assert Tree.from_dict(json.loads(json.dumps(stored))) == Tree([Leaf(1), Leaf(2)], Leaf(3), "t")
