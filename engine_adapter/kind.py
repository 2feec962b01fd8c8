"""The engine seam as types: what one engine hands the tuner, the search space, the command line,
the dashboard and the exporter (`EngineKind`), each part a typed protocol, and what every caller
reads of an engine's settings (`EngineConfig`, from `config.py`). Engines register their kind in
`engine_adapter.registry`; callers receive a kind and never name an engine's modules.

Imports stay light (no engine module, no pydantic): the registry imports this module, the engine
watchdog imports the registry, and `tune --help` reads the engines' flags."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, cast

from tracetune.engine_adapter.config import EngineConfig
from tracetune.errors import TuneError
from tracetune.types import Scalar

if TYPE_CHECKING:
    from pydantic import BaseModel

    from tracetune.engine_adapter.base import Engine
    from tracetune.engine_adapter.platform import Platform


# A line of progress for the user (e.g. "making a W8A8 checkpoint ... (once)").
Progress = Callable[[str], None]
# A bit width's scheme (e.g. "W4A16") -> the directory of a quantized checkpoint made for it.
CheckpointMaker = Callable[[str], Path]
# (model directory, scheme or derived draft name, progress) -> the cached checkpoint, made on first use.
CheckpointFactory = Callable[[Path, str, Progress], Path]
# Categorical choices a platform can never run: {parameter: {choice: reason}}.
Unrunnable = dict[str, dict[Scalar, str]]
# (config, reference) as stored JSON -> the settings where config differs, as a person reads them.
ConfigDiff = Callable[[Mapping[str, object], Mapping[str, object]], dict[str, object]]


@dataclasses.dataclass(frozen=True)
class Knob:
    """One search-space knob an engine understands: what it sets, and, for a knob its settings
    model never sees (translation consumes it), the only values it takes (None: the model checks)."""

    description: str
    values: tuple[Scalar, ...] | None = None
    # The engines that understand it, in a choice of engines (`engine_adapter.choice`): a search space
    # offers it only for them. Empty: every engine the space is for.
    engines: tuple[str, ...] = ()


# Search-space parameter name -> its knob.
Knobs = Mapping[str, Knob]

# How a flag's value is read: text, a whole number, a number, a finite number > 0, a --X/--no-X
# switch, a repeatable flag filling a list, a repeatable KEY=VALUE filling a mapping, or draft models
# (repeatable: one engine serves one, the main job searches each).
FlagValue = Literal["text", "int", "float", "positive", "toggle", "many", "pairs", "drafts"]


@dataclasses.dataclass(frozen=True)
class EngineFlag:
    """One command-line flag that sets one field of an engine's settings: the field (dotted inside a
    nested model, e.g. "speculative.method"), the flag, how its value is read and what `--help`
    shows. The command line adds one option per flag and names the flag in a settings error."""

    field: str
    flag: str
    value: FlagValue = "text"
    metavar: str | None = None
    help: str | None = None
    choices: tuple[str, ...] | None = None
    default: str | int | bool | None = None

    @property
    def dest(self) -> str:
        """The attribute argparse stores the flag's value under."""
        return self.flag.lstrip("-").replace("-", "_")


class ParamView(Protocol):
    """What an engine reads of one search-space parameter."""

    @property
    def choices(self) -> Sequence[Scalar] | None: ...

    @property
    def when(self) -> Mapping[str, Sequence[Scalar]] | None: ...


class SpaceView(Protocol):
    """What an engine reads of a search space (`search_spaces.space.SearchSpace` meets it)."""

    @property
    def fixed(self) -> Mapping[str, object]: ...

    @property
    def parameters(self) -> Mapping[str, ParamView]: ...

    @property
    def quantized_checkpoints(self) -> Mapping[int, Path]: ...


class EngineFactory(Protocol):
    """A not yet started engine that logs under `run_dir`; a server it starts gets `env` on top of
    this process's environment (the study's API key, in the variable its engine reads)."""

    def __call__(self, run_dir: Path | None = None, *, platform: Platform | None = None,
                 port: int | None = None, env: Mapping[str, str] | None = None) -> Engine: ...


class CommandBuilder(Protocol):
    """The server argv for `config` on `platform` and the environment it needs (on top of the
    parent's); raises errors.InputError when the config cannot run there."""

    def __call__(self, config: EngineConfig, platform: Platform, *, host: str = "127.0.0.1", port: int = 8000,
                 python: str = ...) -> tuple[list[str], dict[str, str]]: ...


class Translator(Protocol):
    """Search-space values (on top of `base`, then `fixed`) -> the engine's settings for one trial;
    raises errors.Rejected with every reason the combination cannot run."""

    def __call__(self, values: Mapping[str, object], *, fixed: Mapping[str, object], platform: Platform,
                 model_dir: Path,
                 quantized_checkpoints: Mapping[int, Path] | None = None,
                 make_checkpoint: CheckpointMaker | None = None, base: Mapping[str, object] | None = None,
                 flags: frozenset[str] | None = None) -> EngineConfig: ...


class Relocator(Protocol):
    """`config` with every model path the engine reads (the model, a draft model) replaced by
    `move(path)`, and the served model name kept as measured (exports mount models elsewhere)."""

    def __call__(self, config: EngineConfig, move: Callable[[str], str]) -> EngineConfig: ...


class ReferenceConfig(Protocol):
    """The engine's own defaults under the fixed settings: the study's quality and speed reference.
    Raises pydantic's ValidationError for fixed settings the engine's settings model refuses."""

    def __call__(self, *, fixed: Mapping[str, object], model_dir: Path,
                 base: Mapping[str, object] | None = None) -> EngineConfig: ...


class UnrunnableCheck(Protocol):
    """The categorical choices of `space` that `platform` can never run, whatever the others are."""

    def __call__(self, space: SpaceView, *, platform: Platform, model_dir: Path,
                 flags: frozenset[str] | None = None, base: Mapping[str, object] | None = None) -> Unrunnable: ...


class Preparer(Protocol):
    """`config` with what it names made ready before an engine starts it (e.g. its draft model checked
    against its model, a derived one made); raises errors.InputError naming what cannot be used."""

    def __call__(self, config: EngineConfig, progress: Progress) -> EngineConfig: ...


class GivenCheck(Protocol):
    """The settings a command line gave (`given`: the fields its flags set) checked against the files and the
    machine they name, before anything is prepared or started; raises errors.InputError naming the flag."""

    def __call__(self, config: EngineConfig, given: frozenset[str]) -> None: ...


class PlatformOf(Protocol):
    """The platform an engine's servers run on here (a simulator: this machine's CPU, whatever is installed)."""

    def __call__(self) -> Platform: ...


@dataclasses.dataclass(frozen=True)
class Deployment:
    """How an export runs the engine's server (`dashboard.export`): the program a shell runs and the
    one inside its image (`EngineKind.image`), how the command builder's argv becomes that program's
    arguments, what only a measurement needed, and what the container needs."""

    program: tuple[str, ...]  # the server as a shell runs it, e.g. ("vllm", "serve")
    entrypoint: tuple[str, ...]  # the server inside the image, e.g. ("/app/llama-server",)
    launcher: int = 1  # argv items before the server's arguments (`python -m MODULE`: 3)
    positional_model: str | None = None  # a flag whose value the program takes first, positionally
    container: str = "server"  # the Kubernetes container's name
    name_flag: str = ""  # the flag naming the model clients request (e.g. "--served-model-name")
    tag: str = "{version}"  # the image tag of a release
    platform: str = "cuda"  # where the image runs the server: "cuda" (NVIDIA GPUs) or "cpu"
    health: tuple[str, ...] = ()  # the compose health check's command ("{port}": the server's port)
    shared_memory: bool = False  # workers share tensors through /dev/shm (ipc host, a memory-backed volume)
    weight_files: bool = False  # the model paths it reads are files (GGUF), not directories
    records_version: bool = False  # the study's recorded engine version (`vllm_version`) is this engine's
    measurement_env: frozenset[str] = frozenset()  # environment only measuring needed
    measurement_args: Mapping[str, int] = dataclasses.field(default_factory=dict)  # flag -> values it takes
    # What a config measured on the CPU loses in an image for another platform, removed from its stored
    # settings (a JSON dict, changed in place), with why for each (a line per setting).
    cpu_only: Callable[[dict[str, object]], list[str]] | None = None
    # How the files a config serves are made again from the model (lines for people), when tracetune made them.
    remake: Callable[[EngineConfig], list[str]] | None = None
    # The image holds everything a trial runs (the server, its tools, the engine's Python libraries), so a
    # fleet worker's image (`tracetune.fleet`) is this image with tracetune installed; else one must be named.
    runs_trials: bool = False


class Offers(Protocol):
    """Whether the search space (stripped of what this platform cannot run) offers `value` for
    parameter `name`."""

    def __call__(self, name: str, value: Scalar) -> bool: ...


class PresetRule(Protocol):
    """An engine's informed first trials (`tuner.presets`) in the search space's vocabulary: each the
    knobs it changes ("max": the largest choice offered), given what the space offers and whether the
    trace's recorded outputs copy their prompts. The rest of each preset is the engine's `default_like`."""

    def __call__(self, offers: Offers, copies: bool) -> list[dict[str, Scalar]]: ...


@dataclasses.dataclass(frozen=True)
class QualityIdentity:
    """Which of an engine's stored settings its output quality depends on (`quality.identity`): the
    weights and their precision, the KV cache's precision, the attention kernels and the decoding path;
    batching, caching and scheduling knobs change when a token is computed, not which one (so does
    tensor parallelism: the same matmuls split across GPUs, another rounding order). Unknown engine
    arguments count, to be safe. `lossless`: those that cannot change the output distribution by
    construction (speculative decoding verifies every draft token against the target model).
    `unset`: values that mean the engine's default. The default is vLLM's settings."""

    settings: tuple[str, ...] = ("model", "dtype", "quantization", "kv_cache_dtype", "speculative",
                                 "attention_backend", "load_format", "extra_args")
    lossless: tuple[str, ...] = ("speculative",)
    unset: tuple[str, ...] = ("auto",)


def plain_diff(config: Mapping[str, object], reference: Mapping[str, object]) -> dict[str, object]:
    """Settings where `config` differs from `reference` (a key missing from one counts as None)."""
    return {k: v for k, v in config.items() if reference.get(k) != v}


@dataclasses.dataclass(frozen=True)
class EngineKind:
    """One engine: its settings model, how to make one, and, for engines tracetune starts itself,
    the command a configuration runs (for `tune engine command` and exports). Tunable engines also
    give their knob table, the translation of search-space values, their reference config and the
    choices a platform can never run; the others are measured as they are.

    What the command line reads of it: `flags` (its settings as flags), `check_given` (the flags
    given, checked against what they name), `prepare` (a config made ready: draft models),
    `check_drafts` and `make_checkpoint` (the main job's drafts and quantized checkpoints),
    `api_key_env` and `given_api_key` (the key its server requires). What the dashboard and exports
    read: `config_diff`, `image`, `image_version` and `deployment`."""

    name: str
    config_model: type[BaseModel]
    make: EngineFactory
    command: CommandBuilder | None = None
    translate: Translator | None = None
    reference: ReferenceConfig | None = None
    unrunnable: UnrunnableCheck | None = None
    knobs: Knobs = dataclasses.field(default_factory=dict)
    relocate: Relocator | None = None
    label: str = ""  # as the user reads it ("vLLM"); default: `name`
    flags: tuple[EngineFlag, ...] = ()
    prepare: Preparer | None = None
    check_given: GivenCheck | None = None
    check_drafts: Callable[[Path, Iterable[str | Path]], None] | None = None
    make_checkpoint: CheckpointFactory | None = None
    # The environment variable the engine's server reads its required API key from (vLLM: VLLM_API_KEY).
    api_key_env: str | None = None
    # The API key a config already hands the server (e.g. in its extra arguments), which requests must send.
    given_api_key: Callable[[EngineConfig], str | None] | None = None
    config_diff: ConfigDiff = plain_diff
    image: str | None = None  # the container image repository exports run, e.g. "vllm/vllm-openai"
    image_version: str | None = None  # the engine release an exported image runs when a study names none
    deployment: Deployment | None = None  # how exports run its server (None: `image` and `command` alone)
    # Why the engine cannot run on this machine (e.g. its server is not installed, with how to install
    # it), or None when it can; unset: it always can.
    available: Callable[[], str | None] | None = None
    # Whether its servers load the model (False: a simulator; the command line then prepares no model and
    # the model is a name). The platform its servers run on where the engine decides it (unset: the
    # installed vLLM's, `platform.detect_platform`). The search space the main job searches for it when
    # --space names none (unset: tracetune's own, `search_spaces.engines.default_space`).
    loads_model: bool = True
    runs_on: PlatformOf | None = None
    default_space: Path | None = None
    # The requests one server decodes together under a config (vLLM: max_num_seqs, llama-server: its
    # slots); None where the config leaves it to a default the engine does not state. Unset: unknown.
    slots: Callable[[EngineConfig], int | None] | None = None
    # Whether its speed depends on this machine's cores, so that a level other work took them from is
    # marked busy (`replay.machine`); False for a simulator, whose clock is its model's.
    watch_machine: bool = True
    quality: QualityIdentity = QualityIdentity()  # the settings its output quality depends on
    # Its own defaults as search-space values ("max": the largest choice offered), and its informed
    # first trials (`tuner.presets`; unset: none).
    default_like: Mapping[str, Scalar] = dataclasses.field(default_factory=dict)
    presets: PresetRule | None = None

    @property
    def tunable(self) -> bool:
        return self.translate is not None

    @property
    def shown(self) -> str:
        """The engine's name as the user reads it."""
        return self.label or self.name

    @property
    def engines(self) -> tuple[EngineKind, ...]:
        """The engines it runs: itself (a choice of engines, `engine_adapter.choice`: each it chooses from)."""
        return (self,)

    @property
    def defaults_label(self) -> str:
        """The study's reference as the user reads it: its first engine's own defaults ("vLLM's defaults",
        "llama.cpp's defaults"; a label's note in parentheses left out: "simulated engine's defaults")."""
        return f"{self.engines[0].shown.split(' (')[0]}'s defaults"

    def missing(self) -> str | None:
        """Why the engine cannot run on this machine (`available`), or None when it can."""
        return None if self.available is None else self.available()

    def platform(self) -> Platform:
        """The platform its servers run on here (`runs_on`, else the installed vLLM's)."""
        if self.runs_on is not None:
            return self.runs_on()
        from tracetune.engine_adapter.platform import detect_platform

        return detect_platform()

    def of(self, config: EngineConfig) -> EngineKind:
        """The engine that runs `config` (itself; a choice of engines names the one chosen)."""
        return self

    def load_config(self, data: Mapping[str, object]) -> EngineConfig:
        """Stored settings read back as this engine's settings model."""
        return cast("EngineConfig", self.config_model.model_validate(data))

    def slots_of(self, data: Mapping[str, object]) -> int | None:
        """The slots (`slots`) of a stored config, by the engine that runs it; None where not known."""
        try:
            config = self.load_config(data)
        except (ValueError, TuneError):  # not this engine's settings (pydantic's error is a ValueError)
            return None
        kind = self.of(config)
        return kind.slots(config) if kind.slots is not None else None
