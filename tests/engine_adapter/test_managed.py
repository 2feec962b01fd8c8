"""The lifecycle every managed engine shares (engine_adapter/managed.py), on real processes and no model:
the simulated engine's own server for starting, retrying a start whose port was taken and stopping,
and the stand-in server of test_process.py for the checks a started server must pass."""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
from pathlib import Path

import pytest

from tracetune.engine_adapter import managed
from tracetune.engine_adapter.llamacpp.server import LlamaServer
from tracetune.engine_adapter.managed import ManagedServer
from tracetune.engine_adapter.platform import Platform
from tracetune.engine_adapter.process import ServerProcess, free_port, group_alive
from tracetune.engine_adapter.sim.config import SimConfig
from tracetune.engine_adapter.sim.engine import SimEngine
from tracetune.engine_adapter.vllm.server import VLLMServer
from tracetune.errors import EngineError, EngineStartError, EngineTimeoutError

FAKE = str(Path(__file__).parent / "fake_server.py")


@pytest.fixture
def started(monkeypatch) -> list[ServerProcess]:
    """Every server process a managed engine starts in the test, in order."""
    made: list[ServerProcess] = []

    class Recorded(ServerProcess):
        def start(self) -> None:
            super().start()
            made.append(self)

    monkeypatch.setattr(managed, "ServerProcess", Recorded)
    return made


@pytest.fixture
def taken_port():
    """A port this test holds (listening), as another program would."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_a_start_whose_port_was_taken_meanwhile_is_retried_and_stops_with_nothing_left(
        tmp_path, monkeypatch, started, taken_port):
    ports = iter([taken_port])  # the first free port is taken before the server binds it
    monkeypatch.setattr(managed, "free_port", lambda host: next(ports, None) or free_port(host))
    with SimEngine(tmp_path / "run") as engine:
        assert engine.launch(SimConfig(max_num_seqs=2), 60.0) >= 0
        served = int(engine.endpoint.base_url.rsplit(":", 1)[1])
        assert served != taken_port and engine.health() and engine.exit_code() is None
        first, second = started
        assert first.exit_code() is not None and not group_alive(first.pid)
        assert "address already in use" in (tmp_path / "run" / f"engine-1-{taken_port}.log").read_text()
        assert engine.log_path == tmp_path / "run" / f"engine-2-{served}.log" and engine.process is second
        assert engine.log_text().startswith("$ " + sys.executable) and "on port" in engine.log_tail()
    assert not engine.health() and engine.exit_code() is not None
    assert [group_alive(p.pid) for p in started] == [False, False]


def test_a_fixed_port_that_is_taken_is_not_retried(tmp_path, started, taken_port):
    engine = SimEngine(tmp_path, port=taken_port)
    with pytest.raises(EngineStartError, match=rf"simulated engine \(port {taken_port}\) exited with code 1") as info:
        engine.launch(SimConfig(), 60.0)
    assert "address already in use" in info.value.log_tail
    assert len(started) == 1 and not group_alive(started[0].pid)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"engine-1-{taken_port}.log"]


@dataclasses.dataclass(frozen=True)
class FakeSettings:
    mode: str = "healthy"  # fake_server.py's mode
    problems: tuple[str, ...] = ()  # what the started server shows it did not apply

    def name(self) -> str:
        return "fake"


class FakeServer(ManagedServer[FakeSettings]):
    """The stand-in server of test_process.py as a managed engine, with its own words."""

    shown = "fake server"
    already_running = "this fake server is already running"
    never_started = "the fake server was never started"
    started_but = "the fake server started without: "
    start_timeout_s = 1.0
    poll_s = 0.05

    def settings(self, config):
        assert isinstance(config, FakeSettings)
        return config

    def prepare(self, config):
        self.prepared = config

    def command(self, config, port, start):
        return [sys.executable, FAKE, str(port), config.mode], {}

    def headers(self, config):
        return {"X-Mode": config.mode}

    def started_problems(self, config):
        return list(config.problems)


def test_a_started_server_that_did_not_apply_its_settings_is_stopped_and_says_what(tmp_path, started):
    server = FakeServer(tmp_path)
    with pytest.raises(EngineError, match="the fake server was never started"):
        server.wait_healthy()
    assert server.log_text() == "" and server.log_path is None and server.exit_code() is None
    settings = FakeSettings(problems=("slots", "flash attention"))
    endpoint = server.start(settings)
    assert server.prepared == settings and server.config == settings
    assert endpoint.model == "fake" and endpoint.headers == {"X-Mode": "healthy"}
    with pytest.raises(EngineError, match="this fake server is already running; stop"):
        server.start(settings)
    with pytest.raises(EngineError, match="^the fake server started without: slots; flash attention") as info:
        server.wait_healthy()
    assert "fake server starting" in info.value.log_tail
    assert server.exit_code() is not None and not group_alive(started[0].pid)  # its grandchild went too
    assert server.launch(FakeSettings()) >= 0 and server.health()  # a stopped server starts again
    assert server.log_path == tmp_path / f"engine-2-{server.endpoint.base_url.rsplit(':', 1)[1]}.log"
    server.stop()
    server.stop()  # idempotent
    assert [group_alive(p.pid) for p in started] == [False, False]


def test_a_start_waits_its_engines_own_timeout_unless_told(tmp_path):
    server = FakeServer(tmp_path)
    with pytest.raises(EngineTimeoutError, match=r"fake server \(port \d+\) did not become healthy within 1s"):
        server.launch(FakeSettings(mode="never"))
    assert server.exit_code() is not None


@pytest.mark.parametrize("make", [lambda d: VLLMServer(d, platform=Platform.CPU), LlamaServer, SimEngine,
                                  FakeServer], ids=["vllm", "llamacpp", "sim", "fake"])
def test_a_relative_run_dir_is_made_absolute_for_every_managed_engine(make, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the server runs in its log folder, where "runs/x" would not exist
    assert make(Path("runs/x")).run_dir == tmp_path.resolve() / "runs" / "x"


def test_the_environment_a_server_is_made_with_reaches_each_start_and_not_its_log(tmp_path, started, monkeypatch):
    monkeypatch.delenv("STUDY_KEY", raising=False)
    server = FakeServer(tmp_path, env={"STUDY_KEY": "s3cret"})
    server.launch(FakeSettings())
    try:
        environ = Path(f"/proc/{started[0].pid}/environ").read_bytes().split(b"\0")
        assert b"STUDY_KEY=s3cret" in environ  # the server's process has it (its guard, which it inherits)
        assert "STUDY_KEY" not in os.environ and "s3cret" not in server.log_text()
    finally:
        server.stop()
