"""A capacity study ranked against the reference, on the simulated engine's live servers (the study loop:
its table, pareto.json and best.json, the economics, never a best the reference dominates). Capacity on
a real engine is tests/integration/test_capacity_vllm.py's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tracetune.tuner.storage import ResultStore

pytestmark = pytest.mark.slow
# A request every 0.1 s of 8-16 tokens at 20 ms a token: each lives about 0.3 s, so 2 slots hold about
# 0.7x the trace's rate and the reference's 8 about 2x (every token 5% slower per other request).
TRACE = [{"timestamp": round(i * 0.1, 3), "prompt": f"Question {i}: what is a queue?", "output_length": 8 + i % 9}
         for i in range(30)]
SLO = "ttft:p95<500ms"


def test_capacity_study_ranks_against_the_reference(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(line) + "\n" for line in TRACE))
    tries = [json.dumps({"max_num_seqs": seqs, "precision": "bf16"}) for seqs in (2, 32)]
    args = ["--trace", str(trace), "--engine", "sim", "--sim-tpot-ms", "20", "--trials", "2", "--study", "cap",
            "--run-dir", str(tmp_path), "--slo", SLO, "--precision", "0.2", "--probe-prompts", "2",
            "--probe-tokens", "8", "--sampler", "random", "--gpu-hour-cost", "2", "--target-rate", "50",
            "--no-prune", "--level-seconds", "2", "--level-requests", "20", "--level-lifetimes", "1",
            "--search-rules", "classic", "--try", tries[0], "--try", tries[1]]
    res = subprocess.run([sys.executable, "-m", "tracetune", *args], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "COLUMNS": "200"})
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-3000:]
    store = ResultStore(f"sqlite:///{tmp_path / 'study.db'}")
    rows = store.trials("cap")
    assert len(rows) == 2 and all(r["status"] == "measured" for r in rows)
    reference = store.reference("cap")
    for summary in [reference["summary"]] + [r["summary"] for r in rows]:
        cap = summary["capacity"]
        assert cap["steps"] and cap["steps"][0]["scale"] == 1.0
    # 2 slots queue requests that live 0.3 s and arrive 0.1 s apart: a lower capacity than the reference's 8
    two = next(r for r in rows if r["config"]["max_num_seqs"] == 2)
    assert two["summary"]["capacity"]["capacity_scale"] < reference["summary"]["capacity"]["capacity_scale"]
    pareto = json.loads((tmp_path / "pareto.json").read_text())
    assert pareto["objectives"] == ["ttft_p99", "capacity", "quality_loss"]
    best = json.loads((tmp_path / "best.json").read_text())
    assert best["trial"] != two["trial_number"]  # never a config the defaults beat
    assert "Pareto front of study cap" in res.stdout and "verdict:" in res.stdout and "req/s" in res.stdout
    assert best["capacity"]["bracket_rps"][0] == best["capacity"]["capacity_rps"]
    assert best["economics"]["usd_per_1m_output_tokens"] > 0 and best["economics"]["gpus_total"] >= 1
    # 2 slots hold less, so they are on the front only by what they are better at: the TTFT p99 at the
    # trace's own rate.
    on_front = {row["trial"]: row["values"] for row in pareto["trials"]}
    if two["trial_number"] in on_front:
        others = [v["ttft_p99"] for trial, v in on_front.items() if trial != two["trial_number"]]
        others.append(reference["summary"]["latency_s"]["ttft"]["p99"]["value"])
        assert on_front[two["trial_number"]]["ttft_p99"] < min(others), (on_front, others)
