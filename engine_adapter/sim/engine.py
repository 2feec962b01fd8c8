"""The simulated engine as an `Engine`: its config -> the argv of its server (`server.py`, run with
this Python) -> a managed process, started, checked and stopped as every engine's is."""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tracetune.engine_adapter.base import Endpoint, HTTPEngine, OnTick
from tracetune.engine_adapter.platform import Platform
from tracetune.engine_adapter.process import ServerProcess, free_port
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
    """The simulated server's argv for `config` (any platform) and the environment it needs (none)."""
    config = own(config)
    argv = [python, "-m", SERVER_MODULE, "--host", host, "--port", str(port), "--served-model-name", config.name(),
            "--max-num-seqs", str(config.max_num_seqs), "--precision", config.dtype,
            "--ttft-ms", f"{config.ttft_ms:g}", "--tpot-ms", f"{config.tpot_ms:g}", "--alpha", f"{config.alpha:g}"]
    return argv, {}


def this_machine() -> Platform:
    """The simulator runs on this machine's CPU, whatever engines are installed."""
    return Platform.CPU


class SimEngine(HTTPEngine):
    """A simulated server process managed by tracetune (`server.py`)."""

    name = "sim"
    quality_probe = True  # prompt log-probabilities, as vLLM returns them (`lm.py`)
    scoring = "prompt_logprobs"
    managed = True

    def __init__(self, run_dir: Path, *, host: str = "127.0.0.1", port: int | None = None) -> None:
        super().__init__()
        self.run_dir = Path(run_dir).resolve()
        self.host = host
        self.port = port
        self.process: ServerProcess | None = None
        self._starts = itertools.count(1)

    @property
    def log_path(self) -> Path | None:
        return self.process.log_path if self.process else None

    def log_tail(self) -> str:
        return self.process.log_tail() if self.process else ""

    def exit_code(self) -> int | None:
        return self.process.exit_code() if self.process else None

    def start(self, config: EngineConfig) -> Endpoint:
        config = own(config)
        if self.process is not None and self.process.exit_code() is None:
            raise EngineError("this simulated engine is already running; stop() it before starting another config")
        port = self.port or free_port(self.host)
        argv, extra_env = build_command(config, Platform.CPU, host=self.host, port=port)
        log_path = self.run_dir / f"engine-{next(self._starts)}-{port}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text("$ " + " ".join(argv) + "\n")
        self.process = ServerProcess(argv, env={**os.environ, **extra_env}, log_path=log_path,
                                     health_url=f"http://{self.host}:{port}/health",
                                     name=f"simulated engine (port {port})")
        self.process.start()
        self.endpoint = Endpoint(base_url=f"http://{self.host}:{port}", model=config.name())
        return self.endpoint

    def wait_healthy(self, timeout_s: float = 60.0, on_tick: OnTick | None = None) -> float:
        if self.process is None:
            raise EngineError("the simulated engine was never started")
        return self.process.wait_healthy(timeout_s, on_tick=on_tick, poll_s=0.1)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


def make_engine(run_dir: Path | None = None, *, platform: Platform | None = None,
                port: int | None = None) -> SimEngine:
    """A not yet started simulated engine logging under `run_dir` (the registry's factory)."""
    if run_dir is None:
        raise EngineError("the simulated engine needs a run directory for its log")
    return SimEngine(run_dir, port=port)
