"""The rules that turn what a study is asked into the study it runs, in one place any entry point
builds (the command line, a Python caller, a job scheduler): which engine its trials start, what
random weights allow (no quality gate, no quality objective, speculation kept off the front), and
the API key its engines require, handed to each engine's server in the study's own settings
(`StudySettings.engine_env`), never through this process's environment.

What a rule decided that the user should read goes to `say`, one line at a time; what cannot run
is an `InputError` naming the setting, in the command line's words."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypeVar

from tracetune.errors import InputError

if TYPE_CHECKING:
    from tracetune.engine_adapter.config import EngineConfig
    from tracetune.engine_adapter.kind import EngineKind
    from tracetune.engine_adapter.platform import Platform
    from tracetune.search_spaces.space import SearchSpace

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

