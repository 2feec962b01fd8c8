"""Declarative search spaces: YAML validated by pydantic, with conditional parameters.

    name: default
    fixed:                      # engine settings every trial gets
      enforce_eager: true
    parameters:
      weight_bits:     {choices: [16, 8, 4]}
      max_num_seqs:    {low: 4, high: 64, log: true}
      speculative:     {choices: [none, ngram]}
      num_speculative_tokens: {low: 1, high: 8, when: {speculative: [ngram, draft_model]}}
    draft_models: [/models/SmolLM2-135M, derived:layers-4]   # searched when speculative=draft_model

A parameter is categorical (`choices`: numbers, strings or booleans, of one kind, `values.py`) or
numeric (`low`/`high`, optional `log`/`step`; integers unless `float: true`). `when` makes it exist
only if earlier parameters took one of the listed values; conditions may only refer to parameters
defined above them. Parameter and fixed names are knobs of the engine the space is for: its
`EngineKind` gives the knob table (`kind.knobs`) and its reference config checks the fixed settings
(`kind.reference`); tracetune's default engine when none is given. Errors name the file, the line
and the field.

A space over a choice of engines (`--engine vllm+llamacpp`, `engine_adapter.choice`) has the knob
`engine`; each engine's own knobs then exist only where it runs:

    parameters:
      engine:       {choices: [vllm, llamacpp]}
      max_num_seqs: {choices: [8, 32], when: {engine: [vllm]}}

`draft_models` lists the draft models searched with `speculative: draft_model` (directories, or
drafts tracetune derives from the target: `derived:layers-N`); it becomes the parameter
`draft_model`, right after `speculative`, existing only when speculative is draft_model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    model_validator,
)

from tracetune.engine_adapter.choice import ENGINE  # the knob naming each trial's engine in a choice of engines
from tracetune.errors import InputError, opened_input
from tracetune.search_spaces.engines import CPU_SPACE, DEFAULT_SPACE, default_space, one_engines_part  # noqa: F401 (re-exported)
from tracetune.search_spaces.values import Number, Scalar, choices_problem
from tracetune.search_spaces.yaml_source import composed, duplicate_key, line_of, printable

if TYPE_CHECKING:
    import optuna
    import yaml

    from tracetune.engine_adapter.kind import EngineKind, Knobs


Value = bool | int | float | str  # a value a trial gives a parameter


def default_engine() -> EngineKind:
    """The engine a space is for when the caller names none: tracetune's default engine."""
    from tracetune.engine_adapter.registry import engine_kind

    return engine_kind()


class SpaceError(InputError):
    """A search-space file that cannot be used."""


class Param(BaseModel):
    model_config = ConfigDict(extra="forbid")

    choices: list[Scalar] | None = Field(None, min_length=1)
    low: Number | None = Field(None, allow_inf_nan=False)
    high: Number | None = Field(None, allow_inf_nan=False)
    log: bool = False
    step: Number | None = Field(None, gt=0, allow_inf_nan=False)
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
            if not self.float_ and self.step is not None and self.step != int(self.step):
                raise ValueError(f"an integer parameter needs an integer step, got {self.step:g} "
                                 f"(set float: true for reals)")
        elif self.choices is not None and (problem := choices_problem(self.choices)):
            raise ValueError(problem)
        for other, values in (self.when or {}).items():
            if not values:
                raise ValueError(f"when.{other} lists no values, so the parameter could never exist; "
                                 f"list the values of {other} it needs")
        return self

    def bounds(self) -> tuple[float, float]:
        """(low, high) of a numeric parameter."""
        if self.low is None or self.high is None:
            raise TypeError("a categorical parameter has no bounds")
        return self.low, self.high


class SearchSpace(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = "space"
    description: str | None = None
    fixed: dict[str, object] = Field(default_factory=dict, description="Engine settings every trial gets.")
    parameters: dict[str, Param] = Field(min_length=1)
    quantized_checkpoints: dict[int, Path] = Field(
        default_factory=dict, description="Your own quantized checkpoint per weight_bits value.")

    @model_validator(mode="before")
    @classmethod
    def _draft_models(cls, data: object) -> object:
        """`draft_models: [...]` as the parameter `draft_model` (see the module's docstring)."""
        if not isinstance(data, dict) or "draft_models" not in data:
            return data
        data = dict(data)
        drafts = data.pop("draft_models")
        if not isinstance(drafts, list) or not drafts or not all(isinstance(d, str) and d for d in drafts):
            raise ValueError("draft_models must be a list of draft model directories or derived drafts "
                             "(e.g. [derived:layers-4])")
        params, fixed = data.get("parameters"), data.get("fixed") or {}
        if not isinstance(params, dict):
            return data  # the missing parameters section gets its own message
        if "draft_model" in params or "draft_model" in fixed:
            raise ValueError("draft models are named twice: give them under draft_models or as the "
                             "draft_model parameter, not both")
        spec = params.get("speculative")
        choices = spec.get("choices") if isinstance(spec, dict) else None
        offered = fixed.get("speculative") == "draft_model" or (isinstance(choices, list) and "draft_model" in choices)
        if not offered:
            raise ValueError("draft_models are only used when speculative can be draft_model: add draft_model "
                             "to the choices of the 'speculative' parameter")
        data["parameters"] = _with_draft_parameter(params, drafts)
        return data

    # The knob table the space was checked against (validation context "knobs"; else the default engine's).
    _knobs: Knobs = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _names_and_conditions(self, info: ValidationInfo) -> SearchSpace:
        knobs = (info.context or {}).get("knobs")
        self._knobs = default_engine().knobs if knobs is None else knobs
        seen: dict[str, Param] = {}
        for name, param in self.parameters.items():
            if name not in self._knobs:
                raise ValueError(f"parameter {name!r} is not a tunable knob; known: {sorted(self._knobs)}")
            if name in self.fixed:
                raise ValueError(f"{name!r} is both fixed and searched")
            allowed = self._knobs[name].values
            if param.choices is not None and allowed is not None \
                    and (off := [c for c in param.choices if c not in allowed]):
                raise ValueError(f"{name}.choices: {off} {'is' if len(off) == 1 else 'are'} not among the knob's "
                                 f"values {list(allowed)}")
            for other, values in (param.when or {}).items():
                if other not in seen:
                    raise ValueError(f"{name}.when refers to {other!r}, which must be a parameter defined above it")
                target = seen[other]
                if target.choices is not None:
                    missing = [v for v in values if v not in target.choices]
                    if missing:
                        raise ValueError(f"{name}.when: {other} never takes {missing}; "
                                         f"its choices are {target.choices}")
            seen[name] = param
        for name in self.fixed:
            if name not in self._knobs:
                raise ValueError(f"fixed setting {name!r} is not an engine knob; known: {sorted(self._knobs)}")
        self._check_engines()
        return self

    def _check_engines(self) -> None:
        """In a space over a choice of engines (a knob `engine`), each parameter exists only for the
        engines that understand it (`Knob.engines`): `when: {engine: [...]}` says which."""
        offered = self.engines()
        for name, param in self.parameters.items():
            knob = self._knobs[name]
            exists_for = [e for e in (param.when or {}).get(ENGINE, offered) if e in offered]
            if not knob.engines or not (strangers := [e for e in exists_for if e not in knob.engines]):
                continue
            raise ValueError(f"{name!r} is a knob of {' and '.join(knob.engines)} only, but exists for engine "
                             f"{' and '.join(map(str, strangers))}: give it when: {{{ENGINE}: "
                             f"[{', '.join(e for e in knob.engines if e in offered)}]}}")

    def engines(self) -> list[Value]:
        """The engines the space offers: its `engine` parameter's choices, else the fixed engine, else the
        first of the choice it is for; [] for a space over one engine."""
        if ENGINE not in self._knobs:
            return []
        if ENGINE in self.parameters:
            return list(self.parameters[ENGINE].choices or [])
        known = [v for v in self._knobs[ENGINE].values or [] if v is not None]
        if ENGINE in self.fixed:  # an engine the choice does not know is named once validation ends
            return [cast("Value", self.fixed[ENGINE])] if self.fixed[ENGINE] in known else []
        return known[:1]

    @classmethod
    def for_knobs(cls, data: Mapping[str, object], knobs: Knobs | None = None) -> SearchSpace:
        """`data` validated as a space over `knobs` (None: the default engine's knob table)."""
        return cls.model_validate(data, context={"knobs": knobs})

    def active(self, name: str, values: Mapping[str, object]) -> bool:
        """Whether parameter `name` exists given the values chosen so far."""
        when = self.parameters[name].when or {}
        return all(values.get(other) in allowed for other, allowed in when.items())

    def without(self, drop: Mapping[str, Sequence[object]]) -> SearchSpace:
        """This space minus some categorical choices (conditions follow; a parameter whose
        condition can no longer hold is removed)."""
        params: dict[str, dict[str, object]] = {}
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
        emptied = [name for name, data in params.items() if data.get("choices") == []]
        if emptied:
            raise SpaceError(f"search space {self.name!r}: no choice of {emptied[0]!r} is left once "
                             f"{drop[emptied[0]]} are removed; give it a choice this machine can run")
        return SearchSpace.for_knobs({**self.model_dump(exclude={"parameters"}), "parameters": params}, self._knobs)

    def with_drafts(self, drafts: list[str]) -> SearchSpace:
        """This space searching also the draft models `drafts` (`tune --draft-model`): speculative
        gains the choice draft_model (a space without it gets speculative in [none, draft_model]),
        a draft length conditioned on speculative exists for it too, and the drafts join the
        draft_model parameter."""
        if not drafts:
            return self
        if "draft_model" in self.fixed:
            raise SpaceError(f"search space {self.name!r} fixes draft_model={self.fixed['draft_model']}, so "
                             f"--draft-model cannot add drafts to it; list them under draft_models instead")
        params = {n: p.model_dump(by_alias=True, exclude_none=True) for n, p in self.parameters.items()}
        if self.fixed.get("speculative") != "draft_model":
            spec = params.setdefault("speculative", {"choices": ["none"]})
            if "choices" not in spec:
                raise SpaceError(f"search space {self.name!r}: speculative is numeric, so --draft-model cannot join it")
            spec["choices"] = [*spec["choices"], *(["draft_model"] if "draft_model" not in spec["choices"] else [])]
            for data in params.values():
                when = data.get("when") or {}
                if "speculative" in when and "draft_model" not in when["speculative"] \
                        and set(when["speculative"]) - {"none"}:
                    when["speculative"] = [*when["speculative"], "draft_model"]
        known = params.pop("draft_model", {}).get("choices", [])
        ordered = _with_draft_parameter(params, [*known, *(d for d in drafts if d not in known)])
        try:
            return SearchSpace.for_knobs({**self.model_dump(exclude={"parameters"}), "parameters": ordered},
                                         self._knobs)
        except ValidationError as exc:
            raise SpaceError(f"search space {self.name!r} with --draft-model {' '.join(drafts)}: "
                             f"{exc.errors()[0]['msg']}") from None

    def draft_models(self) -> list[str]:
        """Every draft model the space can give a trial (fixed, or choices of draft_model)."""
        if "draft_model" in self.fixed:
            return [str(self.fixed["draft_model"])]
        param = self.parameters.get("draft_model")
        return [str(c) for c in param.choices or []] if param is not None else []

    def pinned(self, settings: Mapping[str, object]) -> tuple[SearchSpace, list[str]]:
        """This space without the parameters that `settings` (engine flags the user gave) already
        set: they hold for every trial. A parameter conditioned on a pinned one stays when the
        pinned value meets its condition, else it goes too. Returns the space and the names pinned."""
        names = [n for n in self.parameters if n in settings]
        if not names:
            return self, []
        params: dict[str, dict[str, object]] = {}
        for name, p in self.parameters.items():
            if name in names:
                continue
            data = p.model_dump(by_alias=True, exclude_none=True)
            when = dict(p.when or {})
            if any(settings[other] not in allowed for other, allowed in when.items() if other in names):
                continue
            when = {other: allowed for other, allowed in when.items() if other not in names}
            if any(other not in params for other in when):
                continue
            data.pop("when", None)
            if when:
                data["when"] = when
            params[name] = data
        if not params:
            raise SpaceError(f"search space {self.name!r}: the engine flags given ({', '.join(names)}) set every "
                             f"parameter, so there is nothing left to search; drop a flag or widen the space")
        space = SearchSpace.for_knobs({**self.model_dump(exclude={"parameters"}), "parameters": params}, self._knobs)
        return space, names

    def sample(self, trial: optuna.trial.BaseTrial) -> dict[str, Value | None]:
        """Suggest values through an Optuna trial (define-by-run, conditions respected)."""
        values: dict[str, Value | None] = {}
        for name, p in self.parameters.items():
            if not self.active(name, values):
                continue
            if p.choices is not None:
                values[name] = trial.suggest_categorical(name, p.choices)
            elif p.float_:
                values[name] = trial.suggest_float(name, *p.bounds(), log=p.log, step=p.step)
            else:
                low, high = p.bounds()
                values[name] = trial.suggest_int(name, int(low), int(high), log=p.log,
                                                 step=int(p.step) if p.step else 1)
        return values

    def size(self) -> float:
        """How many distinct configurations the space holds (conditions respected; inf with a real-valued
        parameter)."""
        def options(p: Param) -> float:
            if p.choices is not None:
                return len(p.choices)
            if p.float_:
                return math.inf
            low, high = (int(b) for b in p.bounds())
            return (high - low) // int(p.step or 1) + 1 if not p.log else high - low + 1

        # The values conditions look at so far -> configurations.
        counts: dict[tuple[tuple[str, Value], ...], float] = {(): 1.0}
        watched = {other for p in self.parameters.values() for other in (p.when or {})}
        for name, p in self.parameters.items():
            grown: dict[tuple[tuple[str, Value], ...], float] = {}
            for key, n in counts.items():
                values = dict(key)
                if not self.active(name, values):
                    grown[key] = grown.get(key, 0.0) + n
                elif name in watched and p.choices is not None:
                    for choice in p.choices:
                        k = tuple(sorted({**values, name: choice}.items(), key=lambda kv: kv[0]))
                        grown[k] = grown.get(k, 0.0) + n
                else:
                    grown[key] = grown.get(key, 0.0) + n * options(p)
            counts = grown
        return sum(counts.values())

    def grid(self) -> list[dict[str, Value]]:
        """Every combination (numeric parameters need a step; log ones are refused)."""
        points: list[dict[str, Value]] = [{}]
        for name, p in self.parameters.items():
            options: list[Value]
            if p.choices is not None:
                options = list(p.choices)
            elif p.step is not None:
                low, high = p.bounds()
                n = int(round((high - low) / p.step)) + 1
                reals = [low + i * p.step for i in range(n)]
                options = list(reals) if p.float_ else [int(o) for o in reals]
            else:
                raise SpaceError(f"parameter {name!r} has no step, so it has no grid")
            grown: list[dict[str, Value]] = []
            for point in points:
                if self.active(name, point):
                    grown.extend({**point, name: o} for o in options)
                else:
                    grown.append(point)
            points = grown
        return points


def _one_of(values: Sequence[object]) -> str:
    """'16, 8 or 4'."""
    *head, last = map(str, values)
    return f"{', '.join(head)} or {last}" if head else last


def _fixed_problem(space: SearchSpace, kind: EngineKind) -> tuple[str, str] | None:
    """(field, message) for the first fixed setting the engine refuses, or None: a value outside a
    knob's own values, else what the engine's settings model says of its reference config (each
    engine of a choice: of the fixed settings it understands)."""
    for name, value in space.fixed.items():
        allowed = kind.knobs[name].values
        if allowed is not None and value not in allowed:
            return name, f"must be {_one_of(allowed)}, got {value!r}"
    for engine in kind.engines:
        if engine.reference is None:
            continue
        try:
            engine.reference(fixed={k: v for k, v in space.fixed.items() if k in engine.knobs}, model_dir=Path("model"))
        except ValidationError as exc:
            err = exc.errors()[0]
            return ".".join(str(p) for p in err["loc"]), err["msg"]
    return None


def load_space(path: str | Path, kind: EngineKind | None = None) -> SearchSpace:
    """Load and validate a search-space YAML file for engine `kind` (None: the default engine);
    errors name file, line and field."""
    import yaml

    path = Path(path)
    kind = kind or default_engine()
    with opened_input(path, "search-space file", SpaceError) as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise SpaceError(f"{path}:{line}: not valid UTF-8 (byte {exc.start}); save the file as UTF-8") from None
    try:
        root = composed(text)
        data = yaml.safe_load(text)  # no alias is left to expand (`composed` refuses them)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            line = mark.line + 1
        elif isinstance(getattr(exc, "position", None), int):  # a ReaderError: a character YAML does not allow
            line = text.count("\n", 0, exc.position) + 1
        else:
            line = 1
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpaceError(printable(f"{path}:{line}: not valid YAML ({problem})")) from None
    except RecursionError:
        raise SpaceError(f"{path}:1: not valid YAML (nested too deeply)") from None
    if not isinstance(data, dict):
        raise SpaceError(f"{path}:1: a search space must be a mapping with a 'parameters' section")
    duplicate = duplicate_key(root)
    if duplicate:
        raise SpaceError(printable(f"{path}:{duplicate}"))
    try:
        space = SearchSpace.for_knobs(one_engines_part(data, kind), kind.knobs)
    except ValueError as exc:  # pydantic's ValidationError, or a space over engines without this one
        if isinstance(exc, ValidationError):
            raise _located(exc, path, root, data) from None
        raise SpaceError(f"{path}:{line_of(root, ('parameters', ENGINE)) or 1}: {exc}") from None
    # Fixed settings are checked now, not when the first trial builds its engine config.
    problem = _fixed_problem(space, kind)
    if problem:
        field, message = problem
        line = (field and line_of(root, ("fixed", field.split(".")[0]))) or line_of(root, ("fixed",)) or 1
        raise SpaceError(printable(f"{path}:{line}: field '{'fixed.' + field if field else 'fixed'}': {message}"))
    return space


def _located(exc: ValidationError, path: Path, root: yaml.Node | None, data: dict[str, object]) -> SpaceError:
    """A validation error as the file's line and field."""
    err = exc.errors()[0]
    loc = tuple(err["loc"])
    params = data.get("parameters")
    if not loc and isinstance(params, dict):
        # A cross-parameter rule failed: point at the first parameter its message names.
        named = [n for n in params if f"{n}." in err["msg"] or repr(n) in err["msg"]]
        loc = ("parameters", named[0]) if named else loc
    line = line_of(root, loc) or 1
    field = ".".join(str(p) for p in loc) or "(space)"
    return SpaceError(printable(f"{path}:{line}: field '{field}': {err['msg']}"))


def _with_draft_parameter(params: Mapping[str, dict[str, object]],
                          drafts: Sequence[Scalar]) -> dict[str, dict[str, object]]:
    """`params` (raw parameter definitions) with the parameter draft_model choosing among `drafts`:
    right after speculative and existing only when it is draft_model, or first when the space has no
    speculative parameter (it is fixed)."""
    draft: dict[str, object] = {"choices": list(drafts)}
    if "speculative" not in params:
        return {"draft_model": draft, **params}
    ordered: dict[str, dict[str, object]] = {}
    for name, param in params.items():
        ordered[name] = param
        if name == "speculative":
            ordered["draft_model"] = {**draft, "when": {"speculative": ["draft_model"]}}
    return ordered
