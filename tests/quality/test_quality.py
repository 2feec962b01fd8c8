"""Quality in the units users judge by, and the noise floor, on scripted log-probabilities: the
KL divergence from top-k maps, per-prompt units, and the verdict of a lossless candidate (inside the
reference's own noise) against a lossy one (outside it)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tracetune.quality.probe import ProbeItem, Reference, item_stats, kl_top_k, summarize_quality


def logs(probs: dict[str, float]) -> dict[str, float]:
    return {t: math.log(p) for t, p in probs.items()}


def test_kl_of_identical_distributions_is_zero_and_of_known_ones_is_exact():
    p = logs({"1": 0.7, "2": 0.2, "3": 0.1})
    assert kl_top_k(p, p) == pytest.approx(0.0, abs=1e-12)
    q = logs({"1": 0.5, "2": 0.3, "3": 0.2})
    exact = sum(a * math.log(a / b) for a, b in ((0.7, 0.5), (0.2, 0.3), (0.1, 0.2)))
    assert kl_top_k(p, q) == pytest.approx(exact, rel=1e-9)
    # Mass outside the top-k is one more outcome: P keeps 0.1 unlisted, Q 0.3.
    p_rest, q_rest = logs({"1": 0.9}), logs({"1": 0.7})
    assert kl_top_k(p_rest, q_rest) == pytest.approx(0.9 * math.log(0.9 / 0.7) + 0.1 * math.log(0.1 / 0.3))
    # A token of P's top-k that Q does not list gets at most Q's smallest listed probability.
    assert kl_top_k(logs({"1": 0.5, "2": 0.5}), logs({"1": 0.98})) > kl_top_k(logs({"1": 0.5, "2": 0.5}),
                                                                               logs({"1": 0.5, "2": 0.48}))


def item(rng, n=16):
    tops = []
    for _ in range(n):
        raw = rng.dirichlet(np.ones(5) * 0.3)
        tops.append({str(t): math.log(max(p, 1e-9)) for t, p in enumerate(raw)})
    ids = [int(max(t, key=t.get)) for t in tops]
    return ProbeItem(prompt_ids=[0], reference_ids=ids, reference_logprobs=[t[str(i)] for t, i in zip(tops, ids)],
                     reference_top=tops)


def perturbed(it: ProbeItem, scale: float, rng) -> tuple[list[float], list[dict[str, float]]]:
    """The item's distributions with log-noise of `scale`, renormalised: what a candidate returns."""
    tops = []
    for top in it.reference_top:
        noisy = {t: v + rng.normal(0, scale) for t, v in top.items()}
        norm = math.log(sum(math.exp(v) for v in noisy.values()))
        tops.append({t: v - norm for t, v in noisy.items()})
    return [t[str(i)] for t, i in zip(tops, it.reference_ids)], tops


def study(noise_floor: float, candidate: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    reference = Reference(items=[item(rng) for _ in range(24)])
    floor = [r for it in reference.items for r in item_stats(it, *perturbed(it, noise_floor, rng))]
    reference.floor = {k: [r[k] for r in floor] for k in ("nll", "kld", "top1")}
    rows = [r for it in reference.items for r in item_stats(it, *perturbed(it, candidate, rng))]
    units = {k: [r[k] for r in rows] for k in ("nll", "kld", "top1")}
    n = len(rows)
    return summarize_quality(reference, units, [1.0] * n, [1.0] * n, [])


def test_a_candidate_with_only_the_platforms_noise_is_within_the_floor():
    result = study(noise_floor=0.05, candidate=0.05)
    assert result.within_floor is True
    assert result.beyond_floor["kld"].low <= 0 <= result.beyond_floor["kld"].high
    assert result.kld.value > 0  # the raw KL divergence is not zero: the floor is what tells it apart
    assert result.top_k == 20 and result.n_prompts == 24


def test_an_excess_over_the_floor_too_small_to_matter_is_within_it():
    """A floor pass that drew no noise and a candidate that drew a little (one server, its batch
    compositions varying with timing): beyond the floor by a clear but negligible KLD, within it."""
    result = study(noise_floor=0.0, candidate=0.02)
    assert result.beyond_floor["kld"].low > 0 and result.beyond_floor["kld"].high < 1e-3
    assert result.within_floor is True


def test_a_lossy_candidate_is_outside_the_floor_in_every_unit():
    result = study(noise_floor=0.05, candidate=0.6)
    assert result.within_floor is False
    assert result.beyond_floor["kld"].low > 0 and result.kld.low > 0.02
    assert result.top1_agreement.value < 0.95
    assert result.ppl_change.value == pytest.approx(math.expm1(result.nll_delta_per_token.value))
    d = result.as_dict()
    assert d["kld"]["value"] == result.kld.value and d["within_floor"] is False and d["beyond_floor"]["nll"]


def test_a_reference_stored_before_the_floor_still_reads_and_reports_no_floor():
    old = [{"prompt_ids": [1], "reference_ids": [2], "reference_logprobs": [-0.5], "expected": None}]
    reference = Reference.from_json(old)
    assert reference.floor is None and reference.items[0].reference_top is None
    stats = item_stats(reference.items[0], [-0.7], [])
    assert stats == [{"nll": pytest.approx(0.2)}]
    result = summarize_quality(reference, {"nll": [0.2]}, [1.0], [1.0], [])
    assert result.kld is None and result.within_floor is None and result.beyond_floor is None
    assert Reference.from_json(Reference(items=reference.items, floor={"nll": [0.0]}).as_dict()).floor == {"nll": [0.0]}


@pytest.mark.parametrize("text,unit,limit,shown", [
    ("0.05", "nats", 0.05, "nats<=0.05"), ("nats:0.05", "nats", 0.05, "nats<=0.05"),
    ("kld:0.01", "kld", 0.01, "kld<=0.01"), ("ppl:+1%", "ppl", 0.01, "ppl<=+1%"), ("PPL:2.5%", "ppl", 0.025, "ppl<=+2.5%"),
    ("top1:0.99", "top1", 0.99, "top1>=0.99"),
])
def test_the_gate_reads_every_unit(text, unit, limit, shown):
    from tracetune.quality.gate import parse_gate

    gate = parse_gate(text)
    assert (gate.unit, gate.limit, str(gate)) == (unit, pytest.approx(limit), shown)


def test_the_default_gate_is_one_percent_perplexity_and_none_turns_it_off():
    from tracetune.cli.main import _build_parser
    from tracetune.quality.gate import DEFAULT_GATE, parse_gate

    assert str(parse_gate(DEFAULT_GATE)) == "ppl<=+1%"
    assert parse_gate("none") is None and parse_gate(" None ") is None
    assert f"default {DEFAULT_GATE}" in " ".join(_build_parser().format_help().split())


@pytest.mark.parametrize("bad", ["kld:", "ppl:1", "top1:1.5", "bits:3", "nats:-1", "x"])
def test_a_bad_gate_names_the_flag_and_the_units(bad):
    from tracetune.errors import InputError
    from tracetune.quality.gate import parse_gate

    with pytest.raises(InputError, match=r"--max-quality-loss: cannot read .*kld:0.01.*ppl:\+1%.*top1:0.99"):
        parse_gate(bad)


def test_the_gate_judges_beyond_the_floor_in_its_unit():
    """The lossless candidate passes a strict gate in every unit; the lossy one fails them."""
    from tracetune.quality.gate import parse_gate

    lossless, lossy = study(0.05, 0.05).as_dict(), study(0.05, 0.6).as_dict()
    for spec in ("kld:0.005", "ppl:+1%", "nats:0.01"):
        gate = parse_gate(spec)
        assert gate.violation(lossless) <= 0 < gate.violation(lossy), spec
    top1 = parse_gate("top1:0.9")
    # top-1 is judged by its interval's lower end: the whole interval must keep the share
    assert top1.violation(lossy) == pytest.approx(0.9 - lossy["top1_agreement"]["ci_low"])
    # Without a floor (an older study) the raw value is judged; an unmeasured unit never passes.
    raw = {"nll_delta_per_token": {"value": 0.02, "low": 0.01, "high": 0.03}, "kld": None}
    assert parse_gate("0.05").violation(raw) == pytest.approx(-0.03)
    assert parse_gate("kld:0.01").violation(raw) == math.inf and parse_gate("0.05").violation(None) == math.inf


def test_the_quality_key_ignores_batching_knobs_and_keeps_what_changes_tokens():
    from tracetune.quality.probe import quality_key

    base = {"model": "/cache/a/SmolLM2", "dtype": None, "quantization": None, "kv_cache_dtype": None,
            "speculative": {"method": None}, "max_num_seqs": 8, "enable_prefix_caching": True,
            "enable_chunked_prefill": None, "max_num_batched_tokens": None, "env": {"X": "1"}}
    same = {**base, "model": "/elsewhere/SmolLM2", "max_num_seqs": 64, "enable_prefix_caching": False,
            "max_num_batched_tokens": 2048, "env": {}}
    assert quality_key(base) == quality_key(same)
    for change in ({"kv_cache_dtype": "fp8"}, {"model": "/cache/SmolLM2-W8A8"}, {"quantization": "fp8"},
                   {"speculative": {"method": "ngram", "num_speculative_tokens": 3}}, {"dtype": "float32"}):
        assert quality_key({**base, **change}) != quality_key(base), change


def test_a_stored_quality_result_reads_back_whole():
    from tracetune.quality.probe import QualityResult

    result = study(0.05, 0.6)
    result.reused_from, result.key = 3, "quality:abc"
    assert QualityResult.from_dict(result.as_dict()).as_dict() == result.as_dict()


def test_probe_prompts_span_the_traces_length_mix_not_only_its_start():
    from tracetune.quality.probe import probe_prompts
    from tracetune.replay.trace import Trace, TraceRecord

    # 40 short chats first, then 10 long documents: the first 8 prompts would all be short.
    records = [TraceRecord(timestamp=i, prompt=f"hi {i}", output_length=4) for i in range(40)]
    records += [TraceRecord(timestamp=40 + i, prompt="doc " * (200 + 10 * i), output_length=4) for i in range(10)]
    records.append(TraceRecord(timestamp=60, prompt="hi 3", output_length=4))  # a repeat: once
    chosen = probe_prompts(Trace(source="t", records=records), 8)
    lengths = sorted(len(text) for text, _ in chosen)
    assert len(chosen) == 8 and len({t for t, _ in chosen}) == 8
    assert lengths[0] == min(len(r.prompt) for r in records) and lengths[-1] == max(len(r.prompt) for r in records)
    assert sum(length > 100 for length in lengths) >= 2  # the long tail is probed
    assert [t for t, _ in chosen] == sorted((t for t, _ in chosen), key=lambda t: [r.prompt for r in records].index(t))
    few = probe_prompts(Trace(source="t", records=records[:3]), 8)  # fewer prompts than texts: repeated
    assert [t for t, _ in few] == ["hi 0", "hi 1", "hi 2"] * 2 + ["hi 0", "hi 1"]


def test_a_gate_reads_back_from_its_stored_spec():
    from tracetune.quality.gate import parse_gate

    for text in ("0.05", "kld:0.01", "ppl:+2.5%", "top1:0.99"):
        gate = parse_gate(text)
        assert parse_gate(gate.spec) == gate


def test_only_batching_and_speculation_differences_are_lossless_by_construction():
    from tracetune.quality.probe import lossless_by_construction

    ref = {"model": "/cache/SmolLM2", "dtype": None, "quantization": None, "kv_cache_dtype": None,
           "speculative": {"method": None}, "max_num_seqs": 256}
    assert lossless_by_construction({**ref, "max_num_seqs": 8, "model": "/other/SmolLM2"}, ref)
    assert lossless_by_construction({**ref, "speculative": {"method": "ngram", "num_speculative_tokens": 3}}, ref)
    for lossy in ({"kv_cache_dtype": "fp8"}, {"model": "/cache/SmolLM2-W8A8"}, {"dtype": "float32"},
                  {"quantization": "fp8"}):
        assert not lossless_by_construction({**ref, **lossy}, ref), lossy


def test_a_lossless_config_measured_beyond_the_floor_blames_the_probe_not_the_config():
    """Scripted logprobs where the platform's noise changed between the floor pass and the candidate's
    (the floor pass saw none): a lossless config comes out beyond the floor. The verdict names the
    probe, the gate does not reject the config, the self-check says so; a lossy config is still judged."""
    import dataclasses

    from tracetune.quality.gate import parse_gate, self_check, verdict

    noisy = study(noise_floor=0.0, candidate=0.3)
    assert noisy.within_floor is False
    lossless = dataclasses.replace(noisy, lossless=True)
    assert lossless.probe_noisy and not noisy.probe_noisy
    d, lossy = lossless.as_dict(), noisy.as_dict()
    assert d["probe_noisy"] is True and verdict(d).startswith("probe too noisy")
    assert verdict(lossy) == "beyond noise floor"
    gate = parse_gate("kld:0.001")
    assert gate.violation(d) <= 0 < gate.violation(lossy)
    assert "too noisy" in self_check([(0, d), (1, lossy)]) and "trial(s) 0 " in self_check([(0, d), (1, lossy)])
    clean = dataclasses.replace(study(0.05, 0.05), lossless=True).as_dict()
    assert verdict(clean) == "within noise floor"
    assert self_check([(2, clean), (3, {**clean, "reused_from": 2})]) == \
        "quality self-check passed: lossless-by-construction trial(s) 2 within the noise floor"
    assert self_check([(1, lossy)]) == ""  # nothing lossless measured: no check to report


def test_the_floor_reads_from_a_stored_reference_probe_with_its_size():
    from tracetune.quality.gate import floor_estimates, floor_text

    rng = np.random.default_rng(1)
    reference = Reference(items=[item(rng) for _ in range(6)])
    floor = [r for it in reference.items for r in item_stats(it, *perturbed(it, 0.05, rng))]
    reference.floor = {k: [r[k] for r in floor] for k in ("nll", "kld", "top1")}
    est = floor_estimates(reference.as_dict())
    assert est["kld"].value == pytest.approx(np.mean(reference.floor["kld"])) and est["kld"].low <= est["kld"].high
    assert est["ppl"].value == pytest.approx(math.expm1(est["nll"].value))
    text = floor_text(reference.as_dict())
    assert text.startswith("noise floor (the reference against itself, 6 texts, 96 tokens): KLD ")
    old = [{"prompt_ids": [1], "reference_ids": [2], "reference_logprobs": [-0.5], "expected": None}]
    assert floor_estimates(old) == {} and floor_text(old) == "" and floor_text(None) == ""


def test_auto_is_the_default_for_quality_and_for_losslessness():
    """The default space's kv_cache_dtype 'auto' is vLLM's default, which the reference leaves unset: the
    same quality key, and lossless by construction (measured on the quickstart, where 16-bit trials were
    not recognised as lossless before)."""
    from tracetune.quality.probe import lossless_by_construction, quality_key

    ref = {"model": "/m/SmolLM2", "dtype": None, "kv_cache_dtype": None, "load_format": None,
           "speculative": {"method": "none", "num_speculative_tokens": 3}}
    trial = {**ref, "dtype": "auto", "kv_cache_dtype": "auto", "speculative": {"method": "none", "num_speculative_tokens": 5}}
    assert quality_key(trial) == quality_key(ref) and lossless_by_construction(trial, ref)
    assert quality_key({**ref, "kv_cache_dtype": "fp8"}) != quality_key(ref)
