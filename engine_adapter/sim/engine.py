"""The simulated engine as an `Engine`: its config -> the argv of its server (`server.py`, run with
this Python) -> a managed process, started, checked and stopped as every engine's is."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from tracetune.engine_adapter.managed import ManagedServer
from tracetune.engine_adapter.platform import Platform
from tracetune.engine_adapter.sim.config import SimConfig
from tracetune.errors import EngineError

if TYPE_CHECKING:
    from tracetune.engine_adapter.config import EngineConfig

SERVER_MODULE = "tracetune.engine_adapter.sim.server"


def own(config: EngineConfig) -> SimConfig:
    """`config` as the simulator's settings; a TypeError for another engine's (a caller bug)."""
    if not isinstance(config, SimConfig):
        raise TypeError(f"the simulated engine was handed {type(config).__name__}, another engine's settings")
    return config


def build_command(config: EngineConfig, platform: Platform, *, host: str = "127.0.0.1", port: int = 8000,
                  python: str = sys.executable) -> tuple[list[str], dict[str, str]]:
    """The simulated server's argv for `config` (any platform) and the environment it is given."""
    config = own(config)
    argv = [python, "-m", SERVER_MODULE, "--host", host, "--port", str(port), "--served-model-name", config.name(),
            "--max-num-seqs", str(config.max_num_seqs), "--precision", config.dtype,
            "--ttft-ms", f"{config.ttft_ms:g}", "--tpot-ms", f"{config.tpot_ms:g}", "--alpha", f"{config.alpha:g}",
            *config.extra_args]
    return argv, dict(config.env)


def this_machine() -> Platform:
    """The simulator runs on this machine's CPU, whatever engines are installed."""
    return Platform.CPU


class SimEngine(ManagedServer[SimConfig]):
    """A simulated server process managed by tracetune (`server.py`)."""

    name = "sim"
    quality_probe = True  # prompt log-probabilities, as vLLM returns them (`lm.py`)
    scoring = "prompt_logprobs"
    shown = "simulated engine"
    already_running = "this simulated engine is already running"
    never_started = "the simulated engine was never started"
    port_taken = "address already in use"  # aiohttp's words when its port is taken
    start_timeout_s = 60.0
    poll_s = 0.1

    def settings(self, config: EngineConfig) -> SimConfig:
        return own(config)

    def command(self, config: SimConfig, port: int, start: int) -> tuple[list[str], dict[str, str]]:
        return build_command(config, Platform.CPU, host=self.host, port=port)


def make_engine(run_dir: Path | None = None, *, platform: Platform | None = None,
                port: int | None = None, env: Mapping[str, str] | None = None) -> SimEngine:
    """A not yet started simulated engine logging under `run_dir` (the registry's factory)."""
    if run_dir is None:
        raise EngineError("the simulated engine needs a run directory for its log")
    return SimEngine(run_dir, port=port, env=env)
