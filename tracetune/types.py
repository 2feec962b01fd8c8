"""The one alias for data whose shape tracetune does not know.

`Json` is an arbitrary JSON value: a user's YAML file as loaded, an engine config dumped to
JSON, a row read back from storage before it is parsed into a typed record. Known shapes get
real types (dataclasses, TypedDicts, pydantic models); only genuinely arbitrary data is `Json`.
"""

from typing import Any

Json = Any
"""An arbitrary JSON value (dict, list, str, int, float, bool or None), e.g. a user's YAML or an engine config."""

JsonDict = dict[str, Json]
"""A JSON object with arbitrary values, e.g. a user's YAML mapping or an engine config dumped to JSON."""

Scalar = str | int | float | bool | None
"""One value as YAML or the command line gives it: a search-space choice or one engine setting."""

ParamValues = dict[str, Scalar]
"""Search-space parameter name -> the value one trial takes (what optuna suggests or a user tries)."""

__all__ = ["Json", "JsonDict", "ParamValues", "Scalar"]
