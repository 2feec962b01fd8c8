"""The rules that turn what a study is asked into the study it runs, in one place any entry point
builds (the command line, a Python caller, a job scheduler): which engine its trials start, what
random weights allow (no quality gate, no quality objective, speculation kept off the front), the
space this platform can run (the settings given for every trial pinned, --try values checked
against it), and the API key its engines require, handed to each engine's server in the study's
own settings (`StudySettings.engine_env`), never through this process's environment.

What a rule decided that the user should read goes to `say`, one line at a time; what cannot run
is an `InputError` naming the setting, in the command line's words."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from tracetune.errors import InputError

if TYPE_CHECKING:
    from tracetune.engine_adapter.config import EngineConfig
    from tracetune.engine_adapter.kind import EngineKind, Unrunnable
    from tracetune.engine_adapter.platform import Platform
    from tracetune.search_spaces.space import Param, SearchSpace
    from tracetune.types import ParamValues

RANDOM_WEIGHTS = "random weights (--load-format dummy)"
Gate = TypeVar("Gate")  # a quality gate, however it is given


@dataclasses.dataclass(frozen=True)
class ApiKey:
    """The key a study's engines require: sent with every request (`value`) and, for a key given
    by the name of a variable, added to each engine server's environment (`env`)."""

    value: str | None = dataclasses.field(default=None, repr=False)  # never in a log or an error
    env: Mapping[str, str] = dataclasses.field(default_factory=dict, repr=False)


@dataclasses.dataclass(frozen=True)
class StudyPlan:
    """What a study was asked, as its user gave it, and the rules that resolve it."""

    engine: str | None = None  # an engine or a choice of engines by name (--engine); None: `choose_engine`
    own_space: bool = False  # a search space of the user's (--space): vLLM unless an engine is named
    objectives: str | None = None  # the objectives as asked (--objectives); None: the defaults
    max_quality_loss: str | None = None  # the quality gate as asked (--max-quality-loss)
    api_key_env: str | None = None  # the variable holding the key the engines require (--api-key-env)
    say: Callable[[str], None] = lambda line: None  # a rule's decision, in words

    def choose_engine(self, platform: Platform, stored: Mapping[str, object] | None = None) -> EngineKind:
        """The engine the study tunes: the one named; else the engine of the study resumed (its
        `stored` user attributes); else, on a CPU with no space of the user's, vLLM or llama.cpp
        trial by trial where llama.cpp is installed (vLLM alone otherwise, saying how to add it);
        else vLLM."""
        from tracetune.engine_adapter.platform import Platform
        from tracetune.engine_adapter.registry import CPU_CHOICE, DEFAULT_ENGINE, engine_kind
        from tracetune.tuner.trial_record import StudyAttr

        if self.engine is not None:
            return engine_kind(self.engine)
        rules = (stored or {}).get(StudyAttr.RULES.value)
        if isinstance(rules, Mapping) and isinstance(rules.get("engine"), str):
            return engine_kind(rules["engine"])  # a study resumes on the engines it was measured with
        if platform is not Platform.CPU or self.own_space:
            return engine_kind(DEFAULT_ENGINE)
        choice = engine_kind(CPU_CHOICE)
        lacking = [f"{kind.shown}: {why}" for kind in choice.engines if (why := kind.missing())]
        if not lacking:
            return choice
        self.say(f"engine: {engine_kind(DEFAULT_ENGINE).shown} alone; the study would compare {choice.shown} "
                 f"on this CPU, but {'; '.join(lacking)}")
        return engine_kind(DEFAULT_ENGINE)

    def quality_rules(self, gate: Gate | None, objectives: list[str], space: SearchSpace, *,
                      random_weights: bool) -> tuple[Gate | None, list[str]]:
        """The study's quality gate and objectives. Random weights have no output quality: no gate
        applies (one asked for is an error), quality_loss leaves the default objectives (asked for
        by name: an error), and a speculating space is measured but kept off the front."""
        if not random_weights:
            return gate, objectives
        self._no_gate_on_random_weights()
        objectives = self._no_quality_on_random_weights(objectives)
        self._no_speculation_on_random_weights(space)
        return None, objectives

    def _no_gate_on_random_weights(self) -> None:
        from tracetune.quality.gate import parse_gate

        if parse_gate(self.max_quality_loss) is not None:
            raise InputError(f"--max-quality-loss {self.max_quality_loss}: {RANDOM_WEIGHTS} have no output quality "
                             f"to gate; measure quality on the real weights, or leave the flag out")
        self.say(f"{RANDOM_WEIGHTS}: output quality is not measurable, so no quality gate applies")

    def _no_quality_on_random_weights(self, objectives: list[str]) -> list[str]:
        if "quality_loss" not in objectives:
            return objectives
        if self.objectives:
            raise InputError(f"--objectives {self.objectives}: {RANDOM_WEIGHTS} have no output quality to "
                             f"measure; drop quality_loss, or measure quality on the real weights")
        self.say("objectives: quality_loss left out (random weights)")
        return [o for o in objectives if o != "quality_loss"]

    def _no_speculation_on_random_weights(self, space: SearchSpace) -> None:
        """Random weights make a draft's acceptance meaningless: said when the space speculates (its
        trials are measured, flagged and kept off the front: `tuner.front.not_meaningful`)."""
        spec = space.parameters.get("speculative")
        offered = set(spec.choices or []) if spec is not None else {space.fixed.get("speculative", "none")}
        if offered - {"none"}:
            self.say(f"{RANDOM_WEIGHTS}: speculative decoding is measured but kept off the front, since how many "
                     f"draft tokens random weights accept says nothing about real traffic")

    def api_key(self, engine: EngineKind, base_config: EngineConfig, environ: Mapping[str, str]) -> ApiKey:
        """The key the study's engines require: from the variable `api_key_env` names in `environ`,
        handed to each engine's server in the variable it reads (`EngineKind.api_key_env`), so that it
        never appears in a command line, a config or the database; or one the engine settings pass
        the server themselves (`EngineKind.given_api_key`); else none."""
        if self.api_key_env:
            key = environ.get(self.api_key_env)
            if not key:
                raise InputError(f"--api-key-env {self.api_key_env}: that environment variable is not set or empty")
            names = [kind.api_key_env for kind in engine.engines if kind.api_key_env]
            if len(names) < len(engine.engines):
                raise InputError(f"--api-key-env: {engine.shown} servers take no API key")
            return ApiKey(key, {name: key for name in names})
        return ApiKey(None if engine.given_api_key is None else engine.given_api_key(base_config))

    def runnable_space(self, space: SearchSpace, engine: EngineKind, *, platform: Platform, model_dir: Path,
                       base: Mapping[str, object], tries: Sequence[ParamValues]) -> SearchSpace:
        """The space without the choices this platform can never run (said once, with the reason, not
        rejected trial after trial) and with the engine settings given for every trial (`base`)
        pinned; the values to try first (`tries`, --try) checked against it."""
        never = {} if engine.unrunnable is None else \
            engine.unrunnable(space, platform=platform, model_dir=model_dir, base=base)
        for name, choices in never.items():
            for choice, reason in choices.items():
                self.say(f"search space: {name}={choice} removed on this {platform.value} machine: {reason}")
        if never:
            space = space.without({name: list(choices) for name, choices in never.items()})
        space, pinned = space.pinned(base)
        for name in pinned:
            self.say(f"search space: {name}={base[name]} for every trial (set on the command line)")
        _check_tries(tries, space, never, platform)
        return space


def _check_tries(enqueue: Sequence[ParamValues], space: SearchSpace, never: Unrunnable, platform: Platform) -> None:
    """An InputError for a --try value the space (as this platform runs it) does not offer."""
    unknown = sorted({k for params in enqueue for k in params} - set(space.parameters))
    if unknown:
        raise InputError(f"--try names {unknown}, which are not parameters of the search space {space.name!r}")
    for params in enqueue:
        for name, value in params.items():
            choices = space.parameters[name].choices
            if choices is not None and value not in choices:
                why = never.get(name, {}).get(value)
                where = f" on this {platform.value} machine ({why})" if why else f"; choose from {choices}"
                raise InputError(f"--try {name}={value!r}: not a choice of the search space {space.name!r}{where}")
            if choices is None and (why := _off_range(space.parameters[name], value)):
                raise InputError(f"--try {name}={value!r}: {why} of the search space {space.name!r}")


def _off_range(param: Param, value: object) -> str | None:
    """Why `value` is not a value numeric parameter `param` can take (None when it is one)."""
    import math

    assert param.low is not None and param.high is not None  # a parameter without choices has a range
    kind = "a number" if param.float_ else "a whole number"
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or (not param.float_ and value != int(value)):
        return f"expected {kind}, as in the range [{param.low:g}, {param.high:g}]"
    if not param.low <= value <= param.high:
        return f"outside the range [{param.low:g}, {param.high:g}]"
    if param.step and not math.isclose((value - param.low) / param.step, round((value - param.low) / param.step),
                                       abs_tol=1e-9):
        return f"not on the steps of {param.step:g} from {param.low:g} in the range [{param.low:g}, {param.high:g}]"
    return None
