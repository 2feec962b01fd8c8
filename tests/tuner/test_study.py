"""Study helpers: objectives, constraints, config diffs, the results store (real SQLite)."""

from __future__ import annotations

import math

import pytest

from engine_adapter.errors import InputError
from replay.metrics import Estimate, Summary, parse_slos
from tuner.quality import QualityResult, Reference, ProbeItem, _agreement
from tuner.run import _pick_best
from tuner.storage import ResultStore
from tuner.study import config_diff, constraint_values, objective_value, parse_objectives


def est(v):
    return Estimate(v, v, v)


def summary(ttft_p99=0.4, tps=100.0, goodput=None):
    latency = {m: {s: est(0.1) for s in ("mean", "p50", "p90", "p99")} for m in ("ttft", "tpot", "itl", "e2e")}
    latency["ttft"]["p99"] = est(ttft_p99)
    return Summary(requests=10, succeeded=10, errors=0, error_rate=0.0, duration_s=10.0,
                   request_throughput_rps=est(1.0), output_throughput_tps=est(tps), latency=latency,
                   schedule_lag={}, goodput_rps=None if goodput is None else est(goodput))


def quality(loss):
    return QualityResult(nll_delta_per_token=est(loss), greedy_agreement=est(1.0), exact_match=1.0, accuracy=None,
                         n_prompts=4)


def test_default_objectives_follow_slo_presence():
    assert parse_objectives(None, has_slo=False) == ["ttft_p99", "output_tps", "quality_loss"]
    assert parse_objectives(None, has_slo=True) == ["ttft_p99", "goodput", "quality_loss"]
    assert parse_objectives("e2e_p50, output_tps", has_slo=False) == ["e2e_p50", "output_tps"]


@pytest.mark.parametrize(("spec", "msg"), [("speed", "unknown"), ("goodput", "needs --slo"), ("ttft_p99,ttft_p99", "once")])
def test_bad_objectives(spec, msg):
    with pytest.raises(InputError, match=msg):
        parse_objectives(spec, has_slo=False)


def test_objective_values():
    s, q = summary(ttft_p99=0.25, tps=321.0, goodput=2.5), quality(0.03)
    assert objective_value("ttft_p99", s, q) == 0.25
    assert objective_value("output_tps", s, q) == 321.0
    assert objective_value("goodput", s, q) == 2.5
    assert objective_value("quality_loss", s, q) == 0.03
    assert math.isnan(objective_value("quality_loss", s, None))


def test_constraints_are_negative_when_met():
    s = summary(ttft_p99=0.4)
    assert constraint_values(s, quality(0.01), parse_slos("ttft:p99<500ms"), 0.05) == pytest.approx([-0.1, -0.04])
    assert constraint_values(s, quality(0.2), parse_slos("ttft:p99<300ms"), 0.05) == pytest.approx([0.1, 0.15])
    assert constraint_values(s, None, [], None) == []


def test_config_diff_flattens_speculation():
    ref = {"model": "/m", "enforce_eager": True, "max_num_seqs": None, "speculative": {"method": "none"}}
    cand = {"model": "/m", "enforce_eager": True, "max_num_seqs": 16,
            "speculative": {"method": "ngram", "num_speculative_tokens": 4}}
    assert config_diff(cand, ref) == {"max_num_seqs": 16, "speculative": "ngram", "num_speculative_tokens": 4}
    assert config_diff(ref, ref) == {}


def test_pick_best_maximises_the_throughput_objective():
    rows = [{"trial": 1, "values": {"ttft_p99": 0.1, "output_tps": 50}},
            {"trial": 2, "values": {"ttft_p99": 0.3, "output_tps": 90}}]
    assert _pick_best(rows, ["ttft_p99", "output_tps"])["trial"] == 2
    assert _pick_best(rows, ["ttft_p99"])["trial"] == 1


def test_agreement_is_prefix_share():
    assert _agreement([1, 2, 3, 4], [1, 2, 3, 4]) == 1.0
    assert _agreement([1, 2, 9, 4], [1, 2, 3, 4]) == 0.5
    assert _agreement([], []) == 1.0


def test_result_store_round_trip_on_sqlite(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    store = ResultStore(url)
    store.save_trial("s", 0, "measured", values={"max_num_seqs": 4}, config={"model": "/m"},
                     summary={"requests": 3}, quality={"n_prompts": 2}, engine={"preemptions": 0},
                     requests_jsonl='{"index": 0}\n', log_tail="ok", startup_s=30.0, wall_s=60.0)
    store.save_trial("s", 1, "engine_failed", values={"max_num_seqs": 8}, failure_reason="exit 1", log_tail="boom")
    store.save_trial("other", 0, "rejected", failure_reason="no")
    # A second process (e.g. a dashboard or another worker) sees the same rows.
    rows = ResultStore(url).trials("s")
    assert [(r["trial_number"], r["status"]) for r in rows] == [(0, "measured"), (1, "engine_failed")]
    assert rows[0]["summary"] == {"requests": 3} and rows[0]["requests_jsonl"] == '{"index": 0}\n'
    assert rows[1]["failure_reason"] == "exit 1" and rows[1]["summary"] is None
    store.save_trial("s", 1, "measured", summary={"requests": 5})  # a retried trial replaces its row
    assert ResultStore(url).trials("s")[1]["status"] == "measured"
    ref = Reference(items=[ProbeItem(prompt_ids=[1, 2], reference_ids=[3], reference_logprobs=[-0.5])])
    store.save_reference("s", config={"model": "/m"}, probe=ref.to_json(), summary=None)
    assert Reference.from_json(ResultStore(url).reference("s")["probe"]).items[0].reference_nll == 0.5


def test_objective_and_constraint_values_from_stored_dicts_match_the_objects():
    s, q = summary(ttft_p99=0.25, tps=321.0, goodput=2.5), quality(0.03)
    for name in ("ttft_p99", "output_tps", "goodput", "quality_loss", "e2e_p50"):
        assert objective_value(name, s.as_dict(), q.as_dict()) == objective_value(name, s, q)
    slos = parse_slos("ttft:p99<300ms")
    assert constraint_values(s.as_dict(), q.as_dict(), slos, 0.05) == constraint_values(s, q, slos, 0.05)


def test_config_key_ignores_the_workers_own_environment_and_model_location():
    from tuner.study import config_key

    a = {"model": "/home/a/.cache/tracetune/models/ckpt-W8A8-1234", "max_num_seqs": 8,
         "env": {"VLLM_CPU_OMP_THREADS_BIND": "0"}, "extra_args": []}
    b = {**a, "model": "/srv/cache/models/ckpt-W8A8-1234", "env": {"CUDA_VISIBLE_DEVICES": "3"}}
    assert config_key(a) == config_key(b)
    assert config_key(a) != config_key({**a, "max_num_seqs": 16})
    assert config_key(a) != config_key({**a, "extra_args": ["--seed=1"]})


def test_secret_values_and_redaction():
    from tuner.storage import Redactor, display_url, normalize_url, secret_values

    found = secret_values(env={"HF_TOKEN": "hf_abcdef123", "VLLM_CPU_OMP_THREADS_BIND": "0-1"},
                          process_env={"OPENAI_API_KEY": "sk-proc-secret", "SSH_AUTH_SOCK": "/tmp/x", "HOME": "/root",
                                       "MONKEY": "not-a-secret"},
                          args=["--api-key", "sk-arg-secret", "--hf-token=hf_flagtoken", "--seed", "123456"],
                          urls=["postgresql://tuner:pw-db-secret@db:5432/tt"])
    assert set(found) == {"hf_abcdef123", "sk-proc-secret", "sk-arg-secret", "hf_flagtoken", "pw-db-secret"}
    redact = Redactor(found)
    assert redact({"env": {"HF_TOKEN": "hf_abcdef123"}, "log": ["api_key=sk-arg-secret ok"]}) == \
        {"env": {"HF_TOKEN": "***"}, "log": ["api_key=*** ok"]}
    assert "pw-db-secret" not in display_url("postgresql://tuner:pw-db-secret@db:5432/tt")
    assert normalize_url("sqlite:///x.db") == "sqlite:///x.db"
    assert normalize_url("postgresql://u@h/db").startswith("postgresql+psycop")
