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
SCRIPTED_LLAMACPP = str(Path(__file__).parent / "scripted_llamacpp.py")


def _scripted_vllm(monkeypatch, tmp_path, kind):
    """tracetune starts the scripted server where it would start `python -m vllm...`."""
    def command(config, platform, *, host="127.0.0.1", port=8000, **_):
        return [sys.executable, SCRIPTED_SERVER, "--port", str(port), "--model", config.name()], {}

    monkeypatch.setattr("tracetune.engine_adapter.vllm.server.build_command", command)
    yield kind.config_model(model=tmp_path / "model")


def _scripted_llamacpp(monkeypatch, tmp_path, kind):
    """tracetune starts the scripted llama-server where it would start bin/llama-server, with a
    GGUF file already there (nothing to make, no build needed)."""
    def command(config, platform, *, host="127.0.0.1", port=8000, **_):
        return [sys.executable, SCRIPTED_LLAMACPP, "--port", str(port), "--alias", config.name(), "--parallel", "2"], {}

    monkeypatch.setattr("tracetune.engine_adapter.llamacpp.server.build_command", command)
    monkeypatch.setattr("tracetune.engine_adapter.llamacpp.server.llamacpp_dir", lambda: tmp_path)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    yield kind.config_model(model=tmp_path / "model", gguf=gguf, parallel=2)


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


def _sim(monkeypatch, tmp_path, kind):
    """The simulated engine is scripted already: its own server runs (no model, no build)."""
    yield kind.config_model(max_num_seqs=2)


# How each registered engine meets the scripted server instead of its real one (a generator of the
# config to launch with). An engine added to the registry without an entry here fails
# `test_every_registered_engine_has_a_scripted_variant`.
SCRIPTED = {"vllm": _scripted_vllm, "llamacpp": _scripted_llamacpp, "openai": _scripted_openai, "sim": _sim}


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
            assert "scripted" in engine.log_tail() and f"on port {engine.endpoint.base_url.rsplit(':', 1)[1]}" \
                in engine.log_tail()
        check_stopping(engine)
    finally:
        engine.stop()
        scripted.close()


def test_an_unknown_engine_is_named_with_the_known_ones():
    from tracetune.errors import InputError

    with pytest.raises(InputError, match="unknown engine 'sglang'; tracetune knows: llamacpp, openai, sim, vllm"):
        engine_kind("sglang")
