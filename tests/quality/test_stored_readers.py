"""Typed readers of stored JSON (issue #33) read what older versions stored."""

import math

from tracetune.dashboard.metrics import quality_text, run_of
from tracetune.quality.gate import cost_text, units_text
from tracetune.quality.probe import QualityResult
from tracetune.replay.metrics import SLO, Estimate, Summary
from tracetune.stored import listed, mapping, number, whole
from tracetune.tuner.front import economics, slo_breach


def test_stored_helpers_narrow_without_raising():
    assert number("2.5") == 2.5 and math.isnan(number(None)) and math.isnan(number("x")) and math.isnan(number([1]))
    assert whole(None) == 0 and whole(None, 1) == 1 and whole(3.7) == 3 and whole("4") == 4 and whole([2]) == 0
    assert mapping([1]) == {} and mapping({"a": 1}) == {"a": 1}
    assert listed(None) == [] and listed((1, 2)) == [1, 2] and listed("ab") == []


def test_quality_round_trip_and_an_older_subset():
    stored = QualityResult(nll_delta_per_token=Estimate(0.01, 0.0, 0.02), greedy_agreement=None, exact_match=None,
                           accuracy=None, n_prompts=8, kld=Estimate(0.003, 0.002, 0.004), n_tokens=512,
                           top_k=5, key="quality:x", lossless=False, within_floor=True,
                           beyond_floor={"nll": Estimate(0.005, -0.01, 0.02)}).as_dict()
    assert QualityResult.from_dict(stored).as_dict() == stored
    # An early study: NLL only, without its interval, no counts, top_k or floor.
    old = QualityResult.from_dict({"nll_delta_per_token": {"value": 0.02}, "n_prompts": 4})
    assert old.nll_delta_per_token.value == 0.02 and math.isnan(old.nll_delta_per_token.low)
    assert (old.n_tokens, old.top_k, old.kld, old.beyond_floor, old.within_floor) == (0, 0, None, None, None)
    # In perplexity too, as every page reads it (gate.with_units), and in the table's words.
    assert units_text({"nll_delta_per_token": {"value": 0.02, "ci_low": 0.01, "ci_high": 0.03}}) == "ppl +2.0%"
    assert cost_text({"nll_delta_per_token": {"value": 0.0, "ci_low": 0.0, "ci_high": 0.0},
                      "kld": {"value": 0.5}}) == "+0.0% perplexity [+0.0%, +0.0%] (KLD 0.500)"
    assert quality_text({"kld": {"value": 0.012}}) == "KLD 0.0120"


def test_a_quality_without_its_nll_counts_as_not_measured():
    summary = Summary.from_dict({"requests": 2, "succeeded": 2})
    run = run_of(summary, {"kld": {"value": 0.1, "ci_low": 0.0, "ci_high": 0.2}})
    assert run is not None and run.quality is None


def test_stored_summary_breach_and_economics():
    stored = {"latency_s": {"ttft": {"p95": {"value": 3.0, "ci_low": 2.0, "ci_high": 4.0}}},
              "error_rate": 0.5, "errors": 1, "requests": 2,
              "capacity": {"steps": [{"passed": False}, {"passed": False}], "gpus": 2, "capacity_rps": 1.0,
                           "capacity_output_tps": 100.0}}
    text = slo_breach(stored, [SLO("ttft", "p95", 2.0)])
    assert text == "TTFT p95 3 s against 2 s, 1 of 2 requests failed, every load failed"
    assert slo_breach(None, [SLO("ttft", "p95", 2.0)]) == ""
    costs = economics(stored["capacity"], gpu_hour_cost=3.6, target_rate=3.0)
    assert costs["usd_per_1m_output_tokens"] == 3.6 * 2 / (100.0 * 3600) * 1e6
    assert costs["replicas"] == 3 and costs["gpus_total"] == 6
    assert math.isinf(costs["usd_per_1m_input_tokens"])  # no input rate stored


def test_a_stored_quality_keeps_its_keys_in_order_and_a_reference_reads_both_its_shapes():
    from tracetune.quality.probe import ProbeItem, Reference

    stored = QualityResult(Estimate(0.01, 0.0, 0.02), None, None, None, 8, beyond_floor={}, lossless=True,
                           within_floor=False, scorer="forced_tokens").as_dict()
    assert list(stored) == ["nll_delta_per_token", "greedy_agreement", "exact_match", "accuracy", "n_prompts", "kld",
                            "top1_agreement", "ppl_change", "beyond_floor", "within_floor", "top_k", "n_tokens",
                            "reused_from", "key", "lossless", "probe_noisy", "scorer"]
    assert stored["beyond_floor"] is None and stored["probe_noisy"] is True and stored["scorer"] == "forced_tokens"
    assert QualityResult.from_dict({**stored, "n_prompts": "many"}).n_prompts == 0  # stored as no number
    item = ProbeItem(prompt_ids=[1], reference_ids=[2], reference_logprobs=[-0.5], scored_from=1)
    written = Reference(items=[item], floor={"nll": [0.0]}).as_dict()
    assert list(written) == ["items", "floor"] and list(written["items"][0]) == [
        "prompt_ids", "reference_ids", "reference_logprobs", "expected", "reference_top", "scored_from"]
    assert Reference.from_json(written).items == [item] and Reference.from_json(written["items"]).floor is None
