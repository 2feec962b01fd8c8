"""Declarative search spaces: YAML validated by pydantic, with conditional parameters.

    name: default
    fixed:                      # engine settings every trial gets
      enforce_eager: true
    parameters:
      weight_bits:     {choices: [16, 8, 4]}
      max_num_seqs:    {low: 4, high: 64, log: true}
      speculative:     {choices: [none, ngram]}
      num_speculative_tokens: {low: 1, high: 8, when: {speculative: [ngram, draft_model]}}

A parameter is categorical (`choices`) or numeric (`low`/`high`, optional `log`/`step`; integers
unless `float: true`). `when` makes it exist only if earlier parameters took one of the listed
values; conditions may only refer to parameters defined above them. Parameter names are engine
knobs (see KNOBS); errors name the file, the line and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from engine_adapter.errors import InputError

Scalar = Union[bool, int, float, str]

# Search-space parameter -> what it sets. `weight_bits` is translated per platform by
# search_spaces.translate; the rest are VLLMConfig fields (speculative.* nested).
KNOBS = {
    "weight_bits": "weight quantization bits (16 = unquantized)",
    "max_num_seqs": "max sequences per batch",
    "max_num_batched_tokens": "max tokens per scheduler step",
    "kv_cache_dtype": "KV-cache precision (auto, fp8, ...)",
    "speculative": "speculative decoding method (none, ngram, draft_model)",
    "num_speculative_tokens": "draft length",
    "prompt_lookup_max": "ngram: longest n-gram matched",
    "enable_prefix_caching": "prefix caching on/off",
    "enable_chunked_prefill": "chunked prefill on/off",
    "enforce_eager": "eager (no compilation/graphs) vs compiled",
    "dtype": "activation/weight dtype",
    "gpu_memory_utilization": "fraction of device memory",
    "kv_cache_space_gib": "explicit KV-cache size",
    "max_model_len": "context length",
    "attention_backend": "GPU attention backend",
}


class SpaceError(InputError):
    """A search-space file that cannot be used."""


class Param(BaseModel):
    model_config = ConfigDict(extra="forbid")

    choices: list[Scalar] | None = Field(None, min_length=1)
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = Field(None, gt=0)
    float_: bool = Field(False, alias="float")
    when: dict[str, list[Scalar]] | None = None
    description: str | None = None

    @model_validator(mode="after")
    def _shape(self) -> Param:
        numeric = self.low is not None or self.high is not None
        if (self.choices is not None) == numeric:
            raise ValueError("give either choices, or low and high")
        if numeric:
            if self.low is None or self.high is None:
                raise ValueError("a numeric parameter needs both low and high")
            if self.low > self.high:
                raise ValueError(f"`low <= high` must hold, but got (low={self.low:g}, high={self.high:g})")
            if self.log and self.low <= 0:
                raise ValueError(f"a log-scaled parameter needs low > 0, got {self.low:g}")
            if self.log and self.step is not None:
                raise ValueError("log and step cannot be combined")
            if not self.float_ and (self.low != int(self.low) or self.high != int(self.high)):
                raise ValueError("an integer parameter needs integer low/high (set float: true for reals)")
        elif len(set(map(repr, self.choices))) != len(self.choices):
            raise ValueError("choices must not repeat")
        return self


class SearchSpace(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = "space"
    description: str | None = None
    fixed: dict[str, Any] = Field(default_factory=dict, description="Engine settings every trial gets.")
    parameters: dict[str, Param] = Field(min_length=1)
    quantized_checkpoints: dict[int, Path] = Field(
        default_factory=dict, description="Your own quantized checkpoint per weight_bits value.")

    @model_validator(mode="after")
    def _names_and_conditions(self) -> SearchSpace:
        seen: dict[str, Param] = {}
        for name, param in self.parameters.items():
            if name not in KNOBS:
                raise ValueError(f"parameter {name!r} is not a tunable knob; known: {sorted(KNOBS)}")
            if name in self.fixed:
                raise ValueError(f"{name!r} is both fixed and searched")
            for other, values in (param.when or {}).items():
                if other not in seen:
                    raise ValueError(f"{name}.when refers to {other!r}, which must be a parameter defined above it")
                target = seen[other]
                if target.choices is not None:
                    missing = [v for v in values if v not in target.choices]
                    if missing:
                        raise ValueError(f"{name}.when: {other} never takes {missing}; its choices are {target.choices}")
            seen[name] = param
        for name in self.fixed:
            if name not in KNOBS and name not in ("speculative_method",):
                raise ValueError(f"fixed setting {name!r} is not an engine knob; known: {sorted(KNOBS)}")
        return self

    def active(self, name: str, values: dict[str, Any]) -> bool:
        """Whether parameter `name` exists given the values chosen so far."""
        when = self.parameters[name].when or {}
        return all(values.get(other) in allowed for other, allowed in when.items())

    def without(self, drop: dict[str, list[Any]]) -> SearchSpace:
        """This space minus some categorical choices (conditions follow; a parameter whose
        condition can no longer hold is removed)."""
        params: dict[str, Any] = {}
        for name, p in self.parameters.items():
            data = p.model_dump(by_alias=True, exclude_none=True)
            if p.choices is not None and name in drop:
                data["choices"] = [c for c in p.choices if c not in drop[name]]
            if p.when:
                when = {other: [v for v in values if v not in drop.get(other, [])] for other, values in p.when.items()}
                if any(not values or other not in params for other, values in when.items()):
                    continue
                data["when"] = when
            params[name] = data
        return SearchSpace.model_validate({**self.model_dump(exclude={"parameters"}), "parameters": params})

    def sample(self, trial: Any) -> dict[str, Any]:
        """Suggest values through an Optuna trial (define-by-run, conditions respected)."""
        values: dict[str, Any] = {}
        for name, p in self.parameters.items():
            if not self.active(name, values):
                continue
            if p.choices is not None:
                values[name] = trial.suggest_categorical(name, p.choices)
            elif p.float_:
                values[name] = trial.suggest_float(name, p.low, p.high, log=p.log, step=p.step)
            else:
                values[name] = trial.suggest_int(name, int(p.low), int(p.high), log=p.log,
                                                 step=int(p.step) if p.step else 1)
        return values

    def grid(self) -> list[dict[str, Any]]:
        """Every combination (numeric parameters need a step; log ones are refused)."""
        points: list[dict[str, Any]] = [{}]
        for name, p in self.parameters.items():
            if p.choices is not None:
                options = list(p.choices)
            elif p.step is not None:
                n = int(round((p.high - p.low) / p.step)) + 1
                options = [p.low + i * p.step for i in range(n)]
                options = options if p.float_ else [int(o) for o in options]
            else:
                raise SpaceError(f"parameter {name!r} has no step, so it has no grid")
            grown = []
            for point in points:
                if self.active(name, point):
                    grown.extend({**point, name: o} for o in options)
                else:
                    grown.append(point)
            points = grown
        return points


def _line_of(root: Any, loc: tuple) -> int | None:
    """Line (1-based) of the YAML node at `loc` (pydantic error location), best effort."""
    import yaml

    node, line = root, None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if str(k.value) == str(key):
                    line, node = k.start_mark.line + 1, v
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def load_space(path: str | Path) -> SearchSpace:
    """Load and validate a search-space YAML file; errors name file, line and field."""
    import yaml

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpaceError(f"{path}: no such search-space file") from None
    except UnicodeDecodeError as exc:
        raise SpaceError(f"{path}: not valid UTF-8 (byte {exc.start})") from None
    try:
        root = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise SpaceError(f"{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(data, dict):
        raise SpaceError(f"{path}:1: a search space must be a mapping with a 'parameters' section")
    try:
        return SearchSpace.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err["loc"])
        if not loc and isinstance(data.get("parameters"), dict):
            # A cross-parameter rule failed: point at the first parameter its message names.
            named = [n for n in data["parameters"] if f"{n}." in err["msg"] or repr(n) in err["msg"]]
            loc = ("parameters", named[0]) if named else loc
        line = _line_of(root, loc) or 1
        field = ".".join(str(p) for p in loc) or "(space)"
        raise SpaceError(f"{path}:{line}: field '{field}': {err['msg']}") from None


DEFAULT_SPACE = Path(__file__).resolve().parent / "default.yaml"
