"""The toy engine: its settings (`ToyConfig`), its knobs and flags, its server (the simulated engine's
server program, started under its own command line), and its `EngineKind`, registered under the
name "toy" for as long as a test holds it (`register`)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tracetune.engine_adapter.config import EngineConfig
from tracetune.engine_adapter.kind import EngineFlag, EngineKind, Knob
from tracetune.engine_adapter.managed import ManagedServer
from tracetune.engine_adapter.platform import Platform
from tracetune.errors import Rejected

NAME = "toy"
SPACE = Path(__file__).parent / "space.yaml"
SERVER = "tracetune.engine_adapter.sim.server"  # a server program with a known queue and a known loss


class ToyConfig(BaseModel):
    """Everything a user can set on the toy engine; the defaults are its reference."""

    model_config = ConfigDict(extra="forbid")

    engine: Literal["toy"] = NAME
    model: Path = Path(NAME)
    slots: int = Field(4, ge=1, le=64, description="requests served at once")
    fast: bool = Field(False, description="twice as fast, at a known quality loss")

    def name(self) -> str:
        return Path(self.model).name

    def gpus(self) -> int:
        return 1

    def speculation(self) -> str:
        return "none"


def command(config: EngineConfig, platform: Platform, *, host: str = "127.0.0.1", port: int = 8000,
            python: str = sys.executable) -> tuple[list[str], dict[str, str]]:
    assert isinstance(config, ToyConfig)
    return [python, "-m", SERVER, "--host", host, "--port", str(port), "--served-model-name", config.name(),
            "--max-num-seqs", str(config.slots), "--precision", "fp8" if config.fast else "bf16",
            "--ttft-ms", "20", "--tpot-ms", "4"], {}


class ToyServer(ManagedServer[ToyConfig]):
    name = NAME
    quality_probe = True  # the server program returns prompt log-probabilities
    scoring = "prompt_logprobs"
    shown = "toy server"
    start_timeout_s = 60.0
    poll_s = 0.1

    def settings(self, config: EngineConfig) -> ToyConfig:
        assert isinstance(config, ToyConfig)
        return config

    def command(self, config: ToyConfig, port: int, start: int) -> tuple[list[str], dict[str, str]]:
        return command(config, Platform.CPU, host=self.host, port=port)


def make(run_dir: Path | None = None, *, platform: Platform | None = None, port: int | None = None,
         env: Mapping[str, str] | None = None) -> ToyServer:
    assert run_dir is not None
    return ToyServer(run_dir, port=port, env=env)


def translate(values: Mapping[str, object], *, fixed: Mapping[str, object], model_dir: Path,
              base: Mapping[str, object] | None = None, **_: object) -> ToyConfig:
    settings = {k: v for layer in (base or {}, fixed, values) for k, v in layer.items() if k != "engine"}
    try:
        return ToyConfig.model_validate({**settings, "model": model_dir})
    except ValidationError as exc:
        raise Rejected([str(e["msg"]) for e in exc.errors()]) from None


def reference(*, fixed: Mapping[str, object], model_dir: Path, base: Mapping[str, object] | None = None) -> ToyConfig:
    return ToyConfig(model=model_dir)


def kind() -> EngineKind:
    return EngineKind(NAME, ToyConfig, make, command, translate=translate, reference=reference,
                      unrunnable=lambda space, **_: {}, label="Toy engine", loads_model=False,
                      knobs={"slots": Knob("requests served at once"), "fast": Knob("twice as fast, lossy")},
                      flags=(EngineFlag("slots", "--toy-slots", "int", "N", "toy engine: requests at once"),),
                      runs_on=lambda: Platform.CPU, default_space=SPACE, watch_machine=False,
                      slots=lambda config: config.slots if isinstance(config, ToyConfig) else None)
