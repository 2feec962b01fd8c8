"""Study helpers: objectives, constraints, config diffs, the results store (real SQLite)."""

from __future__ import annotations

import math

import pytest

from tracetune.errors import InputError
from tracetune.quality.probe import ProbeItem, QualityResult, Reference, _agreement
from tracetune.replay.metrics import Estimate, Summary, parse_slos
from tracetune.tuner.front import REFERENCE, BeyondGate, Candidate, decide, dominates, economics
from tracetune.tuner.objectives import constraint_values, keeps_slos, objective_value, parse_objectives
from tracetune.tuner.storage import ResultStore


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
    assert parse_objectives(None, has_slo=True) == ["ttft_p99", "capacity", "quality_loss"]
    assert parse_objectives("e2e_p50, output_tps", has_slo=False) == ["e2e_p50", "output_tps"]


@pytest.mark.parametrize(("spec", "msg"), [("speed", "unknown"), ("goodput", "needs --slo"),
                                         ("capacity", "needs --slo"),
                                             ("ttft_p99,ttft_p99", "once")])
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
    assert math.isnan(objective_value("capacity", s, q))  # not searched
    s.capacity = {"capacity_scale": 3.0, "base_rps": 1.0, "gpus": 2, "steps": []}  # CapacityResult.as_dict()
    assert objective_value("capacity", s, q) == 1.5


def test_constraints_are_negative_when_met():
    s = summary(ttft_p99=0.4)
    assert constraint_values(s, quality(0.01), parse_slos("ttft:p99<500ms"), 0.05) == pytest.approx([-0.1, -0.04])
    assert constraint_values(s, quality(0.2), parse_slos("ttft:p99<300ms"), 0.05) == pytest.approx([0.1, 0.15])
    assert constraint_values(s, None, [], None) == []


DIRS = ["minimize", "maximize", "minimize"]  # ttft_p99, capacity, quality_loss
OBJS = ["ttft_p99", "capacity", "quality_loss"]


def test_best_maximises_the_deciding_objective_on_the_front():
    trials = [Candidate(1, (0.1, 5.0, 0.0)), Candidate(2, (0.3, 9.0, 0.0))]
    d = decide(trials, Candidate(REFERENCE, (0.2, 4.0, 0.0)), OBJS, DIRS)
    assert d.best.label == 2 and d.by == "capacity" and not d.reference_is_best
    assert [c.label for c in d.front] == [1, 2]  # the reference is dominated by trial 1
    assert "trial 2 is best by capacity" in d.verdict()
    assert decide(trials, None, ["ttft_p99"], ["minimize"]).best.label == 1


def test_a_config_the_reference_dominates_is_never_recommended():
    # the quickstart case: the defaults beat trial 7 on every objective
    ref = Candidate(REFERENCE, (0.698, 134.7, 0.0))
    d = decide([Candidate(7, (1.182, 125.0, 0.157))], ref, OBJS, DIRS)
    assert d.reference_is_best and d.trials_on_front == [] and d.dominated_by_reference == [7]
    assert "no configuration beats vLLM's defaults" in d.verdict() and "Keep the defaults" in d.verdict()


def test_when_the_defaults_break_the_slo_too_nothing_is_recommended():
    # measured on a 2-core AVX-512 CPU: every trial and vLLM's defaults broke ttft:p99<2s (capacity 0)
    d = decide([], Candidate(REFERENCE, (2.736, 0.0, 0.0)), OBJS, DIRS, reference_feasible=False,
               outside_constraints=6)
    # defaults that break the SLO are no candidate: neither on the front nor best
    assert not d.reference_is_best and d.best is None and d.front == []
    assert d.verdict().startswith("no configuration meets the SLO, vLLM's defaults included (6 measured trial(s)")
    assert "Keep the defaults" not in d.verdict() and "Loosen the SLO" in d.verdict()


def test_trials_left_out_for_their_constraints_are_not_called_worse():
    ref = Candidate(REFERENCE, (0.698, 134.7, 0.0))
    d = decide([], ref, OBJS, DIRS, outside_constraints=2)
    assert d.verdict() == ("no configuration beats vLLM's defaults: 2 measured trial(s) broke the SLO or the quality "
                           "gate, and none is within them. Keep the defaults.")
    d = decide([Candidate(7, (1.182, 125.0, 0.157))], ref, OBJS, DIRS, outside_constraints=2)
    assert "no better on any, or broke the SLO or the quality gate. Keep the defaults." in d.verdict()


def test_trials_stopped_early_are_named_not_called_worse():
    """Every trial pruned (the quickstart once: two missed the SLO at 1x, one was outside the gate): no
    measured trial to call worse."""
    ref = Candidate(REFERENCE, (0.698, 134.7, 0.0))
    assert decide([], ref, OBJS, DIRS, stopped_early=3).verdict() == (
        "no configuration beats vLLM's defaults: 3 trial(s) were stopped early where they could no longer reach "
        "the front. Keep the defaults.")
    d = decide([], ref, OBJS, DIRS, outside_constraints=1, stopped_early=2)
    assert d.verdict().endswith("none is within them; 2 trial(s) were stopped early where they could no longer "
                                "reach the front. Keep the defaults.")


def test_the_reference_is_judged_by_the_trials_feasibility_rule():
    slos = parse_slos("ttft:p99<2s")
    assert keeps_slos(summary(ttft_p99=1.5), slos)
    assert not keeps_slos(summary(ttft_p99=2.7), slos)
    assert not keeps_slos(Summary.from_dict({**summary(ttft_p99=1.5).as_dict(), "error_rate": 0.1}), slos)
    assert keeps_slos(None, slos)  # not measured yet: nothing against it


def test_reference_best_on_capacity_but_a_trade_off_exists():
    ref = Candidate(REFERENCE, (0.5, 10.0, 0.0))
    d = decide([Candidate(3, (0.2, 8.0, 0.0))], ref, OBJS, DIRS)
    assert d.reference_is_best and d.trials_on_front == [3]
    assert "unless the trade-off of a front trial (3)" in d.verdict()


def test_the_verdict_names_the_best_trade_the_quality_gate_turned_down_and_its_cost():
    # the quickstart's case: 8-bit weights + fp8 KV cache, 1.09x the defaults' capacity at +13.4% perplexity
    ref = Candidate(REFERENCE, (0.70, 41.4, 0.0))
    eight_bit = BeyondGate(Candidate(0, (0.65, 45.1, 0.13)), "ppl<=+1%", "+13.4% perplexity (KLD 0.067, top-1 0.90)")
    d = decide([Candidate(2, (0.69, 42.0, 0.0))], ref, OBJS, DIRS, beyond_gate=[eight_bit])
    assert d.best.label == 2 and d.beyond_gate is eight_bit
    assert d.verdict() == ("trial 2 is best by capacity on the front (vLLM's defaults included). Outside the quality "
                           "gate (ppl<=+1%): trial 0 reaches 1.09x vLLM's defaults' capacity at +13.4% perplexity "
                           "(KLD 0.067, top-1 0.90); not recommended unless that loss is acceptable for this model "
                           "and traffic.")
    # nothing within the gate beats the defaults: said first, the turned-down trade after it
    d = decide([], ref, OBJS, DIRS, outside_constraints=1, beyond_gate=[eight_bit])
    assert d.verdict().startswith("no configuration beats vLLM's defaults: 1 measured trial(s) broke the SLO or "
                                  "the quality gate, and none is within them. Keep the defaults. Outside the quality")
    # a trade that is no better than the recommendation is not mentioned
    slower = BeyondGate(Candidate(5, (0.65, 40.0, 0.13)), "ppl<=+1%", "+13.4% perplexity")
    assert decide([], ref, OBJS, DIRS, beyond_gate=[slower]).beyond_gate is None


def test_dominance_and_ties():
    assert dominates((1, 2), (1, 1), ["minimize", "maximize"])
    assert not dominates((1, 1), (1, 1), ["minimize", "maximize"])  # equal: neither dominates
    assert dominates((1, 1), (1, math.nan), ["minimize", "maximize"])  # unmeasured is worst
    d = decide([Candidate(1, (0.2, 4.0, 0.0))], Candidate(REFERENCE, (0.2, 4.0, 0.0)), OBJS, DIRS)
    assert d.reference_is_best  # a tie goes to the defaults: a change must earn its place


def test_economics_from_a_capacity_result():
    cap = {"capacity_rps": 2.0, "capacity_output_tps": 200.0, "capacity_input_tps": 1000.0, "gpus": 2}
    e = economics(cap, gpu_hour_cost=3.6, target_rate=9.0)
    # 2 GPUs x $3.6/h = $7.2/h; 200 tok/s = 720,000 tok/h -> $10 per 1M output tokens
    assert e["usd_per_1m_output_tokens"] == pytest.approx(10.0)
    assert e["usd_per_1m_input_tokens"] == pytest.approx(2.0)
    assert e["replicas"] == 5 and e["gpus_total"] == 10  # ceil(9 / 2) replicas of 2 GPUs
    assert economics(None, gpu_hour_cost=1.0) == {}
    assert economics({"capacity_rps": 0.0, "gpus": 1}, target_rate=1.0)["replicas"] == math.inf


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
    store.save_reference("s", config={"model": "/m"}, probe=ref.as_dict(), summary=None)
    assert Reference.from_json(ResultStore(url).reference("s")["probe"]).items[0].reference_nll == 0.5


def test_objective_and_constraint_values_from_stored_dicts_match_the_objects():
    from tracetune.quality.probe import QualityResult
    from tracetune.replay.metrics import Summary

    s, q = summary(ttft_p99=0.25, tps=321.0, goodput=2.5), quality(0.03)
    stored_s, stored_q = Summary.from_dict(s.as_dict()), QualityResult.from_dict(q.as_dict())
    for name in ("ttft_p99", "output_tps", "goodput", "quality_loss", "e2e_p50"):
        assert objective_value(name, stored_s, stored_q) == objective_value(name, s, q)
    slos = parse_slos("ttft:p99<300ms")
    assert constraint_values(stored_s, stored_q, slos, 0.05) == constraint_values(s, q, slos, 0.05)


def test_config_key_ignores_the_workers_own_environment_and_model_location():
    from tracetune.tuner.coordination import config_key

    a = {"model": "/home/a/.cache/tracetune/models/ckpt-W8A8-1234", "max_num_seqs": 8,
         "env": {"VLLM_CPU_OMP_THREADS_BIND": "0"}, "extra_args": []}
    b = {**a, "model": "/srv/cache/models/ckpt-W8A8-1234", "env": {"CUDA_VISIBLE_DEVICES": "3"}}
    assert config_key(a) == config_key(b)
    assert config_key(a) != config_key({**a, "max_num_seqs": 16})
    assert config_key(a) != config_key({**a, "extra_args": ["--seed=1"]})


def test_secret_values_and_redaction():
    from tracetune.tuner.secrets import Redactor, display_url, secret_values
    from tracetune.tuner.storage import normalize_url

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


def test_request_records_are_stored_compressed_and_read_back(tmp_path):
    import sqlalchemy

    url = f"sqlite:///{tmp_path / 'study.db'}"
    store = ResultStore(url)
    jsonl = "".join(f'{{"index": {i}, "itl_s": [0.0123, 0.0456, 0.0789]}}\n' for i in range(500))
    store.save_trial("s", 0, "measured", requests_jsonl=jsonl)
    assert store.trials("s")[0]["requests_jsonl"] == jsonl
    with sqlalchemy.create_engine(url).connect() as conn:
        raw = conn.execute(sqlalchemy.text("select requests_jsonl from tracetune_trial_results")).scalar()
    assert raw.startswith("zlib+b64:") and len(raw) < len(jsonl) / 5


def test_levels_round_trip_as_columns(tmp_path):
    from tracetune.replay.types import RequestRecord

    def rec(i, ok=True):
        return RequestRecord(index=i, id=None, scheduled_s=i * 0.5, send_s=i * 0.5, lag_s=0.001, success=ok,
                             error="" if ok else "HTTP 500: boom", ttft_s=0.2 if ok else None, e2e_s=1.0,
                             itl_s=[0.1] * (i % 3), prompt_tokens=10, output_tokens=4 if ok else None,
                             requested_tokens=4, finish_reason="length")

    store = ResultStore(f"sqlite:///{tmp_path / 'study.db'}")
    store.save_levels("s", -1, [(1.0, False, [rec(0), rec(1), rec(2, ok=False)]), (2.0, True, [rec(3)])])
    levels = store.levels("s", -1)
    assert [(lv["scale"], lv["repeat"]) for lv in levels] == [(1.0, False), (2.0, True)]
    first = levels[0]
    assert list(first["index"]) == [0, 1, 2] and list(first["success"]) == [True, True, False]
    assert math.isnan(first["ttft_s"][2]) and first["ttft_s"][0] == pytest.approx(0.2)
    assert list(first["itl_count"]) == [0, 1, 2] and len(first["itl_s"]) == 3
    assert list(first["error"]) == ["", "", "HTTP 500: boom"]
    assert store.levels("s", 5) == []


def test_stored_levels_are_judged_again_under_another_slo(tmp_path):
    """A level read back as request records gets the verdict its records give under any SLO: the
    same attainment as the live judge for the SLO it was searched at, a lower one for a tighter SLO."""
    from tracetune.capacity.step import level_verdict
    from tracetune.replay.metrics import parse_slos
    from tracetune.replay.types import RequestRecord
    from tracetune.tuner.storage import records_of_level

    def rec(i, ttft, gap):  # 5 output tokens: TPOT = the gap between them
        return RequestRecord(index=i, id=None, scheduled_s=i * 0.1, send_s=i * 0.1 + 0.002, lag_s=0.002, success=i != 9,
                             error="" if i != 9 else "HTTP 500", ttft_s=ttft, e2e_s=ttft + 4 * gap, itl_s=[gap] * 4,
                             prompt_tokens=100, output_tokens=5, requested_tokens=5, finish_reason="length")

    records = [rec(i, 0.1 + 0.05 * i, 0.01 + 0.002 * i) for i in range(10)]
    store = ResultStore(f"sqlite:///{tmp_path / 'study.db'}")
    store.save_levels("s", 0, [(1.0, False, records)])
    back = records_of_level(store.levels("s", 0)[0])
    assert [r.index for r in back] == list(range(10)) and back[3].itl_s == pytest.approx([0.016] * 4, abs=1e-4)
    assert back[2].tpot_s == pytest.approx(records[2].tpot_s, rel=1e-5) and not back[9].success
    chat, tight = parse_slos("ttft:p95<1s,tpot:p95<50ms"), parse_slos("ttft:p95<250ms,tpot:p95<20ms")
    # p95 hits the error
    assert level_verdict(back, 10, chat, 0.9) == level_verdict(records, 10, chat, 0.9) == (9, False)
    assert level_verdict(back, 10, tight, 0.2) == (3, False)  # 3 requests under 250 ms and 20 ms
    # stopped early: 4 of 10 good, the missing 6 missed (p95 too)
    assert level_verdict(back[:4], 10, chat, 0.3) == (4, False)


def test_failures_group_by_cause_when_only_their_numbers_differ():
    from tracetune.tuner.front import group_failures

    causes = group_failures([
        (1, "rejected", "max_num_batched_tokens (512) is below max_model_len (2048) without chunked prefill"),
        (2, "engine_failed", "engine exited at start: no memory for the KV cache"),
        (3, "rejected", "max_num_batched_tokens (1024) is below max_model_len (2048) without chunked prefill"),
        (4, "rejected", "max_num_batched_tokens (256) is below max_model_len (2048) without chunked prefill")])
    assert [(status, numbers) for status, _, numbers in causes] == [("rejected", [1, 3, 4]), ("engine_failed", [2])]
    assert causes[0][1].startswith("max_num_batched_tokens (512)")  # shown by its first trial's reason,
    assert causes[0][1].endswith("(trial 1's; the others differ in their numbers)")  # said to be its
    assert causes[1][1] == "engine exited at start: no memory for the KV cache"  # alone: as it is


def test_hypervolume_is_exact_on_known_fronts():
    from tracetune.tuner.front import hypervolume

    assert hypervolume([[0.0, 0.0]], [1.0, 1.0]) == 1.0
    assert hypervolume([[0.0, 0.5], [0.5, 0.0]], [1.0, 1.0]) == pytest.approx(0.75)
    assert hypervolume([[0.5, 0.5, 0.5]], [1.0, 1.0, 1.0]) == pytest.approx(0.125)
    assert hypervolume([[2.0, 0.0]], [1.0, 1.0]) == 0.0  # outside the reference point: nothing


def test_one_secret_policy_for_what_is_stored_and_what_is_exported():
    """The tuner scrubs exactly the argument values an export leaves out: a flag named like a credential
    (by words: --tokenizer is not one) and a token-shaped argument."""
    from tracetune.tuner.secrets import is_secret, secret_values, strip_secret_args

    args = ["--tokenizer", "/models/tok", "--api-key", "sk-arg-secret1", "hf_abcdefgh123", "--max-num-batched-tokens",
            "204800"]
    dropped: list[str] = []
    assert strip_secret_args(args, dropped) == ["--tokenizer", "/models/tok", "--max-num-batched-tokens", "204800"]
    assert dropped == ["--api-key", "(a token-shaped argument)"]
    assert set(secret_values(args=args)) == {"sk-arg-secret1", "hf_abcdefgh123"}
    assert is_secret("HF_TOKEN") and is_secret("INNOCENT", "sk-live-0123456789") and not is_secret("MONKEY", "banana")
