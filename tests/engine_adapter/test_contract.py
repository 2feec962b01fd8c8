"""Every registered engine (engine_adapter.registry) against the `Engine` contract, fast: each runs a
scripted OpenAI-compatible server (tests/engine_adapter/scripted_openai.py) in place of its real
server process, through its own start, health, stream, metrics, log and stop code. The real-vLLM
variant of the same checks runs in tests/integration/test_vllm_cpu.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine_adapter.contract import check_serving, check_stopping
from tracetune.engine_adapter.registry import ENGINES, engine_kind

SCRIPTED_SERVER = str(Path(__file__).parent / "scripted_openai.py")


def _scripted_vllm(monkeypatch, tmp_path, kind):
    """tracetune starts the scripted server where it would start `python -m vllm...`."""
    def command(config, platform, *, host="127.0.0.1", port=8000, **_):
        return [sys.executable, SCRIPTED_SERVER, "--port", str(port), "--model", config.name()], {}

    monkeypatch.setattr("tracetune.engine_adapter.vllm.server.build_command", command)
    yield kind.config_model(model=tmp_path / "model")


def _scripted_openai(monkeypatch, tmp_path, kind):
    """An endpoint tracetune only measures: the scripted server is already running."""
    from tracetune.engine_adapter.process import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, SCRIPTED_SERVER, "--port", str(port), "--model", "m"])
    try:
        yield kind.config_model(base_url=f"http://127.0.0.1:{port}/v1")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# How each registered engine meets the scripted server instead of its real one (a generator of the
# config to launch with). An engine added to the registry without an entry here fails
# `test_every_registered_engine_has_a_scripted_variant`.
SCRIPTED = {"vllm": _scripted_vllm, "openai": _scripted_openai}


def test_every_registered_engine_has_a_scripted_variant():
    assert set(SCRIPTED) == set(ENGINES)


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_engine_contract_on_a_scripted_server(name, tmp_path, monkeypatch):
    kind = engine_kind(name)
    scripted = SCRIPTED[name](monkeypatch, tmp_path, kind)
    config = next(scripted)
    engine = kind.make(tmp_path / "run")
    assert engine.exit_code() is None and engine.log_tail() == ""  # nothing started yet
    try:
        startup_s = engine.launch(config, 60.0)
        assert 0 <= startup_s < 60
        check_serving(engine)
        if engine.managed:
            assert "scripted OpenAI server on port" in engine.log_tail()
        check_stopping(engine)
    finally:
        engine.stop()
        scripted.close()


def test_an_unknown_engine_is_named_with_the_known_ones():
    from tracetune.errors import InputError

    with pytest.raises(InputError, match="unknown engine 'sglang'; tracetune knows: openai, vllm"):
        engine_kind("sglang")
