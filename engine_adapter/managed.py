"""The lifecycle every engine server tracetune runs shares, written once: start its process under
the guard (`process.ServerProcess`) with its log in `engine-{n}-{port}.log`, wait until it is
healthy, check the started server applied its settings, retry a start whose port another process
took meanwhile, stop it, and answer for its log and exit code.

An engine subclasses `ManagedServer` and fills in what is its own: its settings (`settings`), what
it needs before anything starts (`prepare`), its command (`command`), the headers its clients send
(`headers`), what its started server shows it did not apply (`started_problems`), and its words.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Generic, Protocol, Self, TypeVar

from tracetune.engine_adapter.base import Endpoint, HTTPEngine, OnTick
from tracetune.engine_adapter.process import ServerProcess, free_port
from tracetune.errors import EngineError, EngineStartError

if TYPE_CHECKING:
    from tracetune.engine_adapter.config import EngineConfig


class Named(Protocol):
    """Settings that name the model their server serves."""

    def name(self) -> str: ...


Settings = TypeVar("Settings", bound=Named)


class ManagedServer(HTTPEngine, Generic[Settings]):
    """An engine server process tracetune starts, checks and stops (one at a time)."""

    managed = True
    # Its name in its process's errors: "<shown> (port 8000) exited with code 1 ...".
    shown = "engine server"
    already_running = "this engine server is already running"
    never_started = "the engine server was never started"
    started_but = "The engine started but did not apply its settings: "  # then its started_problems
    port_taken = "address already in use"  # lower-case words of its log when another process took its port
    start_timeout_s = 600.0  # how long a start waits for health unless told
    poll_s = 0.5  # how often a start asks for health

    def __init__(self, run_dir: Path, *, host: str = "127.0.0.1", port: int | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self.run_dir = Path(run_dir).resolve()  # the server runs in its log folder: relative paths would move
        self.host = host
        self.port = port  # None: a free port at each start, and a start retried where it was taken
        # What every start adds to this process's environment (a key: never written to the log)
        self.env = dict(env or {})
        self.process: ServerProcess | None = None
        self.config: Settings | None = None
        self.starts = 0  # starts made: the next one's log is engine-{starts + 1}-{port}.log

    def settings(self, config: EngineConfig) -> Settings:
        """`config` as this engine's settings; a TypeError for another engine's."""
        raise NotImplementedError

    def prepare(self, config: Settings) -> None:
        """What must be there before anything starts (nothing unless the engine says)."""

    def command(self, config: Settings, port: int, start: int) -> tuple[list[str], dict[str, str]]:
        """The argv of start number `start` on `port`, and the environment it adds to this one's."""
        raise NotImplementedError

    def headers(self, config: Settings) -> dict[str, str]:
        """The headers every request to the started server carries (none unless the engine says)."""
        return {}

    def started_problems(self, config: Settings) -> list[str]:
        """What the started, healthy server shows it did not apply (none unless the engine says)."""
        return []

    @property
    def log_path(self) -> Path | None:
        return self.process.log_path if self.process else None

    def log_text(self) -> str:
        """Its whole log so far ("" before a start)."""
        if self.process is None or not self.process.log_path.exists():
            return ""
        return self.process.log_path.read_text(errors="replace")

    def log_tail(self) -> str:
        return self.process.log_tail() if self.process else ""

    def exit_code(self) -> int | None:
        return self.process.exit_code() if self.process else None

    def start(self, config: EngineConfig) -> Endpoint:
        settings = self.settings(config)
        if self.process is not None and self.process.exit_code() is None:
            raise EngineError(f"{self.already_running}; stop() it before starting another config")
        self.prepare(settings)
        port = self.port or free_port(self.host)
        argv, extra_env = self.command(settings, port, self.starts + 1)
        self.starts += 1
        log_path = self.run_dir / f"engine-{self.starts}-{port}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text("$ " + " ".join(argv) + "\n")
        self.config = settings
        self.process = ServerProcess(argv, env={**os.environ, **self.env, **extra_env}, log_path=log_path,
                                     health_url=f"http://{self.host}:{port}/health", name=f"{self.shown} (port {port})")
        self.process.start()
        self.endpoint = Endpoint(base_url=f"http://{self.host}:{port}", model=settings.name(),
                                 headers=self.headers(settings))
        return self.endpoint

    def wait_healthy(self, timeout_s: float | None = None, on_tick: OnTick | None = None) -> float:
        """Seconds until the started server served (`start_timeout_s` at most unless told); an EngineError,
        the server stopped, when it exits first, never serves, or serves without its settings."""
        if self.process is None or self.config is None:
            raise EngineError(self.never_started)
        timeout_s = self.start_timeout_s if timeout_s is None else timeout_s
        waited = self.process.wait_healthy(timeout_s, on_tick=on_tick, poll_s=self.poll_s)
        problems = self.started_problems(self.config)
        if problems:
            tail = self.process.log_tail()
            self.stop()
            raise EngineError(self.started_but + "; ".join(problems), log_tail=tail)
        return waited

    def launch(self, config: EngineConfig, timeout_s: float | None = None, on_tick: OnTick | None = None,
               attempts: int = 3) -> float:
        """start() + wait_healthy(), retrying on a port someone else grabbed meanwhile."""
        for attempt in range(attempts):
            self.start(config)
            try:
                return self.wait_healthy(timeout_s, on_tick=on_tick)
            except EngineStartError as exc:
                if self.port_taken not in exc.log_tail.lower() or self.port or attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
