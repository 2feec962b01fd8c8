"""llama.cpp's engine against a real llama-server (the cached build of scripts/install_llamacpp.sh)
on the bundled model: one server (F16, 2 slots, q8_0 K cache) shared by the contract checks, exact
token counts, its knobs as applied, its prompt cache and its reset; a setting the server does not
apply refused at start; no server left when the process that started it is SIGKILLed; and, on a
second server with a draft, speculation counted per response and probed with natural stops."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import httpx
import pytest

from tests.engine_adapter.contract import check_serving, check_stopping
from tests.integration.test_vllm_cpu import alive, descendants
from tracetune.engine_adapter.llamacpp.server import LlamaCppConfig, LlamaServer
from tracetune.engine_adapter.openai_client import new_session
from tracetune.errors import EngineError
from tracetune.replay.acceptance import measure_acceptance
from tracetune.replay.types import PreparedRequest

pytestmark = pytest.mark.integration
# ~150 tokens, sent twice: the second time its slot's cache serves all but the last.
LONG_PROMPT = " ".join(f"Item {i}: the quick brown fox jumps over the lazy dog." for i in range(12))


@pytest.fixture(scope="module")
def engine(default_model, tmp_path_factory):
    server = LlamaServer(tmp_path_factory.mktemp("llamacpp"))
    started = time.perf_counter()
    server.launch(LlamaCppConfig(model=default_model, parallel=2, cache_type_k="q8_0"), timeout_s=120)
    print(f"llama-server healthy and verified {time.perf_counter() - started:.1f} s after start")
    yield server
    server.stop()


def send(engine, **request):
    async def go():
        async with new_session(timeout_s=120.0) as session:
            return await engine.stream(session, **request)

    return asyncio.run(go())


def test_serves_the_engine_contract(engine):
    check_serving(engine)


def test_ignore_eos_gives_exact_token_counts(engine, default_model):
    from tokenizers import Tokenizer

    prompt = "Say nothing."
    tokens = len(Tokenizer.from_file(str(default_model / "tokenizer.json")).encode(prompt).ids)  # SmolLM2: no BOS
    for n in (1, 17):
        out = send(engine, prompt=prompt, max_tokens=n, ignore_eos=True)
        assert out.success, out.error
        assert (out.output_tokens, out.prompt_tokens) == (n, tokens)  # from the server's usage


def test_its_knobs_are_applied(engine):
    props = httpx.get(engine.endpoint.base_url + "/props").json()
    assert props["total_slots"] == 2 and props["model_ftype"] == "F16"
    assert "K (q8_0)" in engine.log_path.read_text()


def test_the_prompt_cache_hits_and_resets(engine):
    engine.reset_prefix_cache()
    before = engine.metrics()
    send(engine, prompt=LONG_PROMPT, max_tokens=2)
    send(engine, prompt=LONG_PROMPT, max_tokens=2)
    warm = engine.metrics().delta(before)
    assert warm.prefix_cache_queries > 2 * 140 and warm.prefix_cache_hits > 140
    engine.reset_prefix_cache()
    after_reset = engine.metrics()
    send(engine, prompt=LONG_PROMPT, max_tokens=2)
    assert engine.metrics().delta(after_reset).prefix_cache_hits == 0


def test_a_setting_the_server_does_not_apply_is_refused(default_model, tmp_path):
    # The later flag wins in llama-server: 3 slots where the config says 2.
    server = LlamaServer(tmp_path)
    config = LlamaCppConfig(model=default_model, parallel=2, extra_args=["--parallel", "3"])
    with pytest.raises(EngineError, match="parallel=2: the server has 3 slots"):
        server.launch(config, timeout_s=120)
    assert server.exit_code() is not None


def test_no_server_survives_a_killed_parent(default_model, tmp_path):
    parent_code = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from tracetune.engine_adapter.llamacpp.server import LlamaCppConfig, LlamaServer
        s = LlamaServer(Path({str(tmp_path)!r}))
        s.launch(LlamaCppConfig(model=Path({str(default_model)!r})), timeout_s=120)
        print(s.process.pid, flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    try:
        guard = int(parent.stdout.readline())
        tree = descendants(guard) | {guard}
        assert any("llama-server" in open(f"/proc/{p}/cmdline").read() for p in tree if alive(p))
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(alive(p) for p in tree) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p for p in tree if alive(p)], "llama-server outlived the killed process that started it"
    finally:
        if parent.poll() is None:
            parent.kill()


QUESTIONS = ["Name the three primary colors.", "What is the capital of France?"]


def test_drafts_are_counted_per_response_and_probed_with_natural_stops(default_model, tmp_path):
    """A real draft (the model's own Q8_0 GGUF): llama-server reports its draft tokens in each
    response's timings, and the acceptance probe tells the model's natural end from the forced length."""
    server = LlamaServer(tmp_path)
    server.launch(LlamaCppConfig(model=default_model, draft_model="derived:Q8_0", draft_max=4), timeout_s=300)
    try:
        out = send(server, messages=[{"role": "user", "content": QUESTIONS[0]}], max_tokens=48, ignore_eos=True)
        assert out.success and out.output_tokens == 48, out.error
        assert out.draft_tokens and 0 < (out.accepted_tokens or 0) <= out.draft_tokens
        requests = [PreparedRequest(index=i, id=None, scheduled_s=0.0, max_tokens=96,
                                    messages=[{"role": "user", "content": q}]) for i, q in enumerate(QUESTIONS)]
        acceptance = measure_acceptance(server, requests, timeout_s=120)
    finally:
        server.stop()
    assert acceptance.prompts == 2 and acceptance.failed == 0 and acceptance.recorded == 2
    assert acceptance.ended >= 1 and acceptance.natural.tokens < acceptance.forced.tokens == 2 * 96
    assert 0 < acceptance.natural.drafted < acceptance.forced.drafted
    assert 0 < acceptance.natural.accepted <= acceptance.forced.accepted
    assert acceptance.past_end_tokens > 0 and len(acceptance.natural.tpot_s) == 2


BURN = "import time\nend = time.monotonic() + 90\nwhile time.monotonic() < end: pass  # {tag}"


def test_a_level_on_a_busy_machine_is_marked_and_measured_again_once_quiet(engine):
    """Real competing processes: one program per core burning it (started detached, as another user's
    would be) while a capacity level runs on this llama-server. The level is marked machine busy and not
    counted; once the programs end, the level is measured again on the quiet machine and counts. The
    engine's own speed shows why: its tokens were slower on the busy machine."""
    from tracetune.capacity.levels import LevelRunner, settle
    from tracetune.capacity.step import CapacityOptions
    from tracetune.replay.client_procs import cores, engine_cores
    from tracetune.replay.machine import Watch
    from tracetune.replay.metrics import parse_slos
    from tracetune.replay.types import ReplayOptions

    tag = f"tracetune-test-burner-{os.getpid()}"
    for _ in range(cores()):
        subprocess.run(["setsid", "-f", sys.executable, "-c", BURN.format(tag=tag)], check=True)
    requests = [PreparedRequest(index=i, id=None, scheduled_s=0.5 * i, max_tokens=6,
                                prompt=f"Question {i}: what is the sea made of?") for i in range(6)]
    # A TPOT no engine meets: every level fails (abandoned at its first answer), so only the machine
    # decides whether it is counted.
    options = CapacityOptions(slos=tuple(parse_slos("tpot:p50<1ms")), level_seconds=0, level_lifetimes=0,
                              level_requests=0, max_steps=2)
    watch = Watch(engine.process_group(), engine_cores("cpu", 1), quiet_span_s=2, quiet_limit_s=30)

    def on_level(step):
        if step.machine_busy:
            subprocess.run(["pkill", "-f", tag])

    endpoint = engine.endpoint
    runner = LevelRunner(endpoint.base_url, endpoint.model, requests, ReplayOptions(), options, engine=engine,
                         before_level=lambda: settle(engine, reset_prefix_cache=True), on_level=on_level,
                         watch=watch)
    try:
        result = runner.search()
    finally:
        subprocess.run(["pkill", "-f", tag])
    print(*(s.line() for s in result.steps), result.headline(), sep="\n")
    busy, quiet = result.steps
    assert busy.machine_busy.startswith("machine busy: other work took") and not busy.passed
    assert busy.machine is not None and busy.machine["others"] > 0.5 * cores()
    assert quiet.placed_by == "busy retry" and quiet.quiet_wait_s >= 2 and quiet.machine_busy == ""
    assert result.bracket_high == 1.0  # the quiet level's failure counts; the busy one's did not
    tpot = [min(r.tpot_s for r in res.records if r.tpot_s) for _, res in runner.measured]
    assert tpot[0] > 1.5 * tpot[1], tpot  # what the busy machine did to the engine's own tokens


def test_stops(engine):
    check_stopping(engine)
