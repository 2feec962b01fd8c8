"""The one quality decision (`QualityGate.decide`): within only when the whole 95% interval is, outside
when the whole interval is past the limit, otherwise undecided with the probe size that would decide it."""

from __future__ import annotations

import math

import pytest

from tracetune.quality.gate import OUTSIDE, UNDECIDED, WITHIN, parse_gate, with_units


def ppl_quality(value: float, low: float, high: float, n_tokens: int = 4096) -> dict:
    """A stored quality whose NLL increase (nats/token) means this perplexity change (fractions)."""
    nll = {"value": math.log1p(value), "ci_low": math.log1p(low), "ci_high": math.log1p(high)}
    return {"nll_delta_per_token": nll, "ppl_change": {"value": value, "ci_low": low, "ci_high": high},
            "n_tokens": n_tokens}


def test_a_point_inside_with_an_interval_across_the_limit_is_undecided():
    """The issue's fp8 KV-cache trial: -3.78% [-13.37%, +4.86%] against +1% is not "within"."""
    gate = parse_gate("ppl:+1%")
    decision = gate.decide(ppl_quality(-0.0378, -0.1337, 0.0486))
    assert decision.word == UNDECIDED and not decision.within
    assert gate.violation(ppl_quality(-0.0378, -0.1337, 0.0486)) > 0  # the tuner keeps it off the front too
    # the half-width must shrink to the distance from the limit: (0.0955 / 0.0484)^2 ~ 3.9 times the tokens
    assert 3.5 * 4096 < decision.tokens_to_decide < 4.3 * 4096
    text = decision.text()
    assert text.startswith("undecided against the quality gate ppl<=+1%") and "[-13.37%, +4.86%]" in text
    assert "within" not in text


def test_within_and_outside_need_the_whole_interval():
    gate = parse_gate("ppl:+1%")
    assert gate.decide(ppl_quality(0.002, -0.001, 0.009)).word == WITHIN
    assert gate.decide(ppl_quality(0.05, 0.011, 0.09)).word == OUTSIDE
    assert gate.decide(ppl_quality(0.05, 0.009, 0.09)).word == UNDECIDED
    assert gate.decide(None).word == "not measured" and gate.violation(None) == math.inf
    # top-1 agreement passes when its lower end keeps the share
    top1 = parse_gate("top1:0.9")
    assert top1.decide({"top1_agreement": {"value": 0.95, "ci_low": 0.92, "ci_high": 0.97}}).word == WITHIN
    assert top1.decide({"top1_agreement": {"value": 0.93, "ci_low": 0.88, "ci_high": 0.97}}).word == UNDECIDED
    assert top1.decide({"top1_agreement": {"value": 0.8, "ci_low": 0.7, "ci_high": 0.85}}).word == OUTSIDE


def test_lossless_by_construction_passes_and_an_undecided_size_needs_tokens():
    gate = parse_gate("ppl:+1%")
    assert gate.decide({**ppl_quality(0.0, -0.05, 0.05), "lossless": True}).word == WITHIN
    no_size = ppl_quality(0.0, -0.05, 0.05, n_tokens=0)
    assert gate.decide(no_size).word == UNDECIDED and gate.decide(no_size).tokens_to_decide is None
    assert "would decide" not in gate.decide(no_size).text()


def test_an_nll_only_study_reads_in_perplexity():
    """An older study stored the NLL increase alone: +0.44 nats/token is about +55% perplexity."""
    from tracetune.quality.gate import cost_text, units_text

    old = {"nll_delta_per_token": {"value": 0.44, "ci_low": 0.40, "ci_high": 0.48}, "n_prompts": 8}
    converted = with_units(old)
    assert converted["ppl_change"]["value"] == pytest.approx(math.expm1(0.44))
    assert "ppl_change" not in old  # the stored dict is not changed
    assert cost_text(old).startswith("+55.3% perplexity [+49.2%, +61.6%]")
    assert units_text(old) == "ppl +55.3%"
    assert parse_gate("ppl:+1%").decide(old).word == OUTSIDE
