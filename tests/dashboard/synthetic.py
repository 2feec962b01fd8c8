"""A small study database written the way the tuner writes one (Optuna study + tracetune tables),
with known numbers, for unit tests that need exact Pareto sets, SLO lines and every trial kind.
Real-engine data comes from the session mini-study (tests/conftest.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

REF_MODEL = "/models/My Model's v1; echo pwned"  # quotes, spaces and ';' in the path on purpose


def _estimate(value: float) -> dict:
    return {"value": value, "ci_low": value * 0.9, "ci_high": value * 1.1}


def summary(ttft_p99: float, output_tps: float, *, ttft_p50: float | None = None, error_rate: float = 0.0) -> dict:
    lat = {}
    for metric, base in (("ttft", ttft_p99), ("tpot", 0.05), ("itl", 0.05), ("e2e", ttft_p99 + 1.5)):
        lat[metric] = {"mean": _estimate(base * 0.6), "p50": _estimate(ttft_p50 if metric == "ttft" and ttft_p50 else base * 0.5),
                       "p90": _estimate(base * 0.9), "p99": _estimate(base)}
    return {"requests": 4, "succeeded": 4, "errors": 0, "error_rate": error_rate, "duration_s": 10.0,
            "request_throughput_rps": _estimate(0.4), "output_throughput_tps": _estimate(output_tps),
            "goodput_rps": None, "latency_s": lat, "slo_met": {},
            "engine": {"prefix_cache_hit_rate": 0.25, "prefix_cache_hits": 64.0, "prefix_cache_queries": 256.0,
                       "spec_decode_acceptance_rate": 0.6, "spec_decode_accepted_tokens": 6.0,
                       "spec_decode_draft_tokens": 10.0, "spec_decode_drafts": 4.0, "preemptions": 0.0},
            "error_examples": []}


def quality(loss: float) -> dict:
    return {"nll_delta_per_token": {"value": loss, "ci_low": loss - 0.001, "ci_high": loss + 0.001},
            "ppl_change": {"value": math.expm1(loss), "ci_low": math.expm1(loss - 0.001),
                           "ci_high": math.expm1(loss + 0.001)},
            "kld": _estimate(loss / 2), "top1_agreement": _estimate(0.9),
            "greedy_agreement": None, "exact_match": None, "accuracy": None, "n_prompts": 4}


# The reference's probe: two prompts of 4 tokens, and its noise floor (the reference against itself).
PROBE = {"items": [{"prompt_ids": [1, 2], "reference_ids": [3, 4, 5, 6], "reference_logprobs": [-0.5] * 4,
                    "expected": None, "reference_top": None} for _ in range(2)],
         "floor": {"nll": [0.002, 0.004], "kld": [0.001, 0.003], "top1": [1.0, 0.9]}}


def config(**changes) -> dict:
    base = {"model": REF_MODEL, "served_model_name": None, "dtype": None, "quantization": None, "max_num_seqs": None,
            "max_num_batched_tokens": None, "kv_cache_dtype": None,
            "speculative": {"method": "none", "num_speculative_tokens": 3, "draft_model": None,
                            "prompt_lookup_min": None, "prompt_lookup_max": None},
            "enable_prefix_caching": None, "enable_chunked_prefill": None, "enforce_eager": False, "max_model_len": None,
            "gpu_memory_utilization": None, "kv_cache_space_gib": None, "attention_backend": None, "load_format": None,
            "extra_args": [], "env": {}}
    base.update(changes)
    return base


def requests_jsonl(ttfts: list[float]) -> str:
    lines = []
    for i, ttft in enumerate(ttfts):
        lines.append(json.dumps({"index": i, "id": f"r{i}", "scheduled_s": i * 0.5, "send_s": i * 0.5 + 0.001,
                                 "lag_s": 0.001, "success": i != 3, "error": "" if i != 3 else "timeout",
                                 "ttft_s": ttft if i != 3 else None, "e2e_s": ttft + 1.0,
                                 "itl_s": [0.05, 0.06, 0.04], "prompt_tokens": 100, "output_tokens": 4,
                                 "requested_tokens": 4, "finish_reason": "length", "tpot_s": 0.05}))
    return "\n".join(lines) + "\n"


# trial number -> (kind, ttft_p99 s, output_tps, quality_loss, config changes)
TRIALS = {
    0: ("measured", 0.30, 30.0, 0.00, {"max_num_seqs": 8}),                     # front (fast, lossless)
    1: ("measured", 0.50, 45.0, 0.02, {"max_num_seqs": 32}),                    # front (more throughput)
    2: ("measured", 0.60, 25.0, 0.03, {"max_num_seqs": 4}),                     # dominated by 0 and 1
    3: ("measured", 0.90, 60.0, 0.01, {"max_num_seqs": 64}),                    # violates the TTFT SLO
    4: ("engine_failed", None, None, None, {"kv_cache_space_gib": 0.0001}),
    5: ("rejected", None, None, None, {}),
    6: ("running", None, None, None, {}),
}
SLO = "ttft:p99<800ms"


def make_study(path: Path, name: str = "synth") -> str:
    """Write the synthetic study to a SQLite file; returns its URL."""
    import optuna
    from optuna.distributions import IntDistribution
    from optuna.trial import TrialState, create_trial

    from tracetune.tuner.storage import ResultStore

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    url = f"sqlite:///{path}"
    study = optuna.create_study(study_name=name, storage=url, directions=["minimize", "maximize", "minimize"])
    study.set_user_attr("objectives", ["ttft_p99", "output_tps", "quality_loss"])
    study.set_user_attr("slos", [SLO])
    study.set_user_attr("max_quality_loss", 0.05)
    study.set_user_attr("heartbeat_s", 600)  # a trial is running while its worker beat within 20 minutes
    store = ResultStore(url)
    store.save_reference(name, config=config(), probe=PROBE, summary=summary(0.25, 20.0))
    store.save_trial(name, -1, "measured", config=config(), summary=summary(0.25, 20.0), quality=quality(0.0),
                     engine=summary(0.25, 20.0)["engine"], requests_jsonl=requests_jsonl([0.05, 0.1, 0.2, 0.25, 0.2]),
                     log_tail="INFO GPU KV cache size: 1000 tokens\n", startup_s=25.0)
    dist = {"max_num_seqs": IntDistribution(1, 128)}
    for number, (kind, ttft, tps, loss, changes) in TRIALS.items():
        cfg = config(**changes)
        params = {"max_num_seqs": changes.get("max_num_seqs", 16)}
        attrs = {"values": params, "status": kind}
        if kind == "measured":
            constraints = [ttft - 0.8, loss - 0.05]
            attrs.update(constraints=constraints, feasible=all(c <= 0 for c in constraints), config=cfg)
            study.add_trial(create_trial(state=TrialState.COMPLETE, values=[ttft, tps, loss], params=params,
                                         distributions=dist, user_attrs=attrs))
            store.save_trial(name, number, "measured", values=params, config=cfg, summary=summary(ttft, tps),
                             quality=quality(loss), engine=summary(ttft, tps)["engine"],
                             requests_jsonl=requests_jsonl([ttft * f for f in (0.2, 0.5, 0.8, 1.0, 0.9)]),
                             log_tail="INFO GPU KV cache size: 1000 tokens\n", startup_s=30.0, wall_s=60.0)
        elif kind == "engine_failed":
            attrs.update(failure_reason="engine exited at start: no memory for the KV cache", config=cfg, feasible=False)
            # the tuner reports penalty values for unmeasured trials: the dashboard must not plot them
            study.add_trial(create_trial(state=TrialState.COMPLETE, values=[99.0, 0.0, 9.0], params=params,
                                         distributions=dist, user_attrs=attrs))
            store.save_trial(name, number, "engine_failed", values=params, config=cfg,
                             failure_reason=attrs["failure_reason"], log_tail="ValueError: no memory\nexit 1\n")
        elif kind == "rejected":
            attrs.update(failure_reason="rejected before start: fp8 KV cache needs AVX-512")
            study.add_trial(create_trial(state=TrialState.FAIL, params=params, distributions=dist, user_attrs=attrs))
            store.save_trial(name, number, "rejected", values=params, failure_reason=attrs["failure_reason"])
        else:
            study.add_trial(create_trial(state=TrialState.RUNNING, params=params, distributions=dist,
                                         user_attrs={"values": params}))
            beat(url, number, seconds_ago=0.0, name=name)
    return url


def beat(url: str, number: int, *, seconds_ago: float, name: str = "synth") -> None:
    """Record trial `number`'s worker heartbeat `seconds_ago` (Optuna's table, the database's UTC clock)."""
    import datetime as dt

    import sqlalchemy

    engine = sqlalchemy.create_engine(url)
    when = dt.datetime.now(dt.UTC).replace(tzinfo=None) - dt.timedelta(seconds=seconds_ago)
    with engine.begin() as conn:
        trial_id = conn.execute(sqlalchemy.text(
            "SELECT t.trial_id FROM trials t JOIN studies s ON s.study_id = t.study_id "
            "WHERE s.study_name = :s AND t.number = :n"), {"s": name, "n": number}).scalar()
        conn.execute(sqlalchemy.text("DELETE FROM trial_heartbeats WHERE trial_id = :t"), {"t": trial_id})
        conn.execute(sqlalchemy.text("INSERT INTO trial_heartbeats (trial_id, heartbeat) VALUES (:t, :h)"),
                     {"t": trial_id, "h": when.isoformat(sep=" ")})
    engine.dispose()


def add_measured_trial(url: str, ttft: float, tps: float, loss: float, max_num_seqs: int, name: str = "synth",
                       acceptance: dict | None = None, worker: str | None = None) -> int:
    """Append a measured trial the way a running tuner does (for live-refresh tests); returns its number.
    With `acceptance` (`speculation_probe`), it speculates (ngram) and its summary keeps that probe; with
    `worker`, the worker's name is kept on it (`tuner.worker_name`)."""
    import optuna
    from optuna.distributions import IntDistribution
    from optuna.trial import TrialState, create_trial

    from tracetune.tuner.storage import ResultStore

    study = optuna.load_study(study_name=name, storage=url)
    cfg = config(max_num_seqs=max_num_seqs)
    if acceptance is not None:
        cfg["speculative"] = {**cfg["speculative"], "method": "ngram", "prompt_lookup_max": 4}
    params = {"max_num_seqs": max_num_seqs}
    constraints = [ttft - 0.8, loss - 0.05]
    store = ResultStore(url)
    number = len(study.trials)
    stored = summary(ttft, tps) | ({"acceptance": acceptance} if acceptance is not None else {})
    store.save_trial(name, number, "measured", values=params, config=cfg, summary=stored,
                     quality=quality(loss), engine=summary(ttft, tps)["engine"],
                     requests_jsonl=requests_jsonl([ttft * f for f in (0.2, 0.5, 0.8, 1.0, 0.9)]), startup_s=30.0,
                     wall_s=60.0)
    study.add_trial(create_trial(state=TrialState.COMPLETE, values=[ttft, tps, loss], params=params,
                                 distributions={"max_num_seqs": IntDistribution(1, 128)},
                                 user_attrs={"values": params, "status": "measured", "constraints": constraints,
                                             "feasible": all(c <= 0 for c in constraints), "config": cfg}
                                 | ({"worker_name": worker} if worker is not None else {})))
    return number


def speculation_probe(*, caveated: bool) -> dict:
    """A stored acceptance probe (`replay.acceptance.Acceptance.as_dict`) of 8 prompts. Caveated: 2 of
    them recorded text, 50% accepted with natural stops against 83% forced, 70% of the accepted draft
    tokens past the natural end (two caveats). Clean: every prompt recorded, 60% natural against 58%
    forced, 14% past the end."""
    from tracetune.replay.acceptance import Acceptance, Pass

    if caveated:
        natural, forced = Pass(400, 60.0, 30.0, 20.0, (0.06,) * 8), Pass(1000, 120.0, 100.0, 40.0, (0.05,) * 8)
        return Acceptance(prompts=8, recorded=2, ended=5, forced=forced, natural=natural).as_dict()
    natural, forced = Pass(600, 100.0, 60.0, 30.0, (0.05,) * 8), Pass(700, 120.0, 70.0, 36.0, (0.05,) * 8)
    return Acceptance(prompts=8, recorded=8, ended=2, forced=forced, natural=natural).as_dict()


# -- a study with capacity objectives (`tune --trace ... --slo`) ---------------------------------
CAPACITY_SLO = "ttft:p99<2000ms"


def capacity(scale: float, base_rps: float, steps: list[tuple], *, high: float | None, gpus: int = 1,
             unstable: bool = False, verdict: str = "ok") -> dict:
    """`CapacityResult.as_dict()` with known numbers; steps are (scale, attainment, kind[, "repeat"]),
    kind one of pass | fail | abandon | overload (50 requests planned per level)."""
    rows = []
    for scale_i, attainment, kind, *repeat in steps:
        rows.append({"scale": scale_i, "rps": scale_i * base_rps, "output_tps": scale_i * base_rps * 64,
                     "attainment": attainment, "passed": kind == "pass", "abandoned": kind == "abandon",
                     "requests": 30 if kind == "abandon" else 50, "planned": 50, "good": round(attainment * 50),
                     "duration_s": 20.0 / scale_i, "lag_p99_s": 0.05 if kind == "overload" else 0.002,
                     "client_overloaded": kind == "overload", "repeat": bool(repeat), "errors": 0})
    rps = scale * base_rps
    return {"capacity_scale": scale, "capacity_rps": rps, "capacity_output_tps": rps * 64,
            "capacity_input_tps": rps * 100, "capacity_rps_per_gpu": rps / gpus, "bracket_scale": [scale, high],
            "bracket_rps": [rps, None if high is None else high * base_rps], "gpus": gpus, "attainment_target": 0.95,
            "precision": 0.05, "slo": [CAPACITY_SLO], "unstable": unstable, "verdict": verdict, "base_rps": base_rps,
            "base_output_tps": base_rps * 64, "search_s": 120.0, "replay_s": 100.0, "steps": rows}


# The reference: 4.0 req/s per GPU at the SLO, bracket [4.0, 4.2] req/s.
REFERENCE_CAPACITY = capacity(1.6, 2.5, [(1.0, 1.0, "pass"), (2.0, 0.6, "fail"), (1.41, 1.0, "pass"),
                                         (1.68, 0.9, "fail"), (1.6, 0.97, "pass"), (1.6, 0.96, "pass", "repeat")],
                              high=1.68)
# study name -> trial number -> (ttft_p99 s, capacity dict, quality_loss); the reference is (0.8 s, 4.0, 0.0)
CAPACITY_STUDIES = {
    "cap": {
        0: (0.6, capacity(2.0, 3.0, [(1.0, 1.0, "pass"), (2.0, 0.98, "pass"), (4.0, 0.4, "abandon"),
                                     (2.83, 0.8, "fail"), (2.38, 0.9, "fail"), (2.0, 0.97, "pass", "repeat")],
                          high=2.38), 0.01),                               # front, best by capacity (6.0)
        1: (0.5, capacity(1.2, 2.5, [(1.0, 1.0, "pass"), (2.0, 0.5, "abandon"), (1.2, 0.96, "pass")],
                          high=2.0), 0.0),                                 # front (faster than the defaults)
        2: (1.0, capacity(1.56, 2.5, [(1.0, 1.0, "pass"), (2.0, 0.7, "fail"), (1.56, 0.95, "pass")],
                           high=2.0), 0.0),                                # only the reference dominates it
        3: (0.4, capacity(2.0, 2.5, [(1.0, 1.0, "pass"), (2.0, 0.96, "pass"), (4.0, 0.3, "abandon"),
                                     (2.83, 0.6, "abandon"), (2.38, 0.95, "pass"), (2.38, 0.9, "fail", "repeat")],
                          high=2.38, gpus=2, unstable=True), 0.03),        # unstable, 2 GPUs: 2.5 per GPU
        4: (0.45, capacity(2.0, 2.5, [(1.0, 1.0, "pass"), (2.0, 0.99, "pass"), (4.0, 0.2, "overload")],
                           high=None, verdict="client_overloaded"), 0.04),  # client-limited (a lower bound)
    },
    "cap_defaults": {  # vLLM's defaults beat every trial on every objective
        0: (0.9, capacity(1.4, 2.5, [(1.0, 1.0, "pass"), (2.0, 0.5, "fail"), (1.4, 0.95, "pass")], high=2.0), 0.01),
        1: (1.2, capacity(0.8, 2.5, [(1.0, 0.7, "fail"), (0.5, 1.0, "pass"), (0.8, 0.96, "pass")], high=1.0), 0.0),
    },
}


def make_capacity_studies(path: Path) -> str:
    """Write the studies of CAPACITY_STUDIES (objectives ttft_p99, capacity, quality_loss; one SLO) and a
    trial whose engine failed to each; returns the database URL."""
    import optuna
    from optuna.distributions import IntDistribution
    from optuna.trial import TrialState, create_trial

    from tracetune.tuner.storage import ResultStore

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    url = f"sqlite:///{path}"
    store = ResultStore(url)
    dist = {"max_num_seqs": IntDistribution(1, 128)}
    for name, trials in CAPACITY_STUDIES.items():
        study = optuna.create_study(study_name=name, storage=url, directions=["minimize", "maximize", "minimize"])
        study.set_user_attr("objectives", ["ttft_p99", "capacity", "quality_loss"])
        study.set_user_attr("slos", [CAPACITY_SLO])
        study.set_user_attr("max_quality_loss", 0.05)
        if name == "cap":  # tune ... --gpu-hour-cost 2.5 --target-rate 40
            study.set_user_attr("gpu_hour_cost", 2.5)
            study.set_user_attr("target_rate", 40.0)
        store.save_reference(name, config=config(), probe=[], summary={**summary(0.8, 20.0), "capacity": REFERENCE_CAPACITY})
        for number, (ttft, cap, loss) in trials.items():
            params = {"max_num_seqs": 8 * (number + 1)}
            cfg = config(**params)
            constraints = [ttft - 2.0, loss - 0.05]
            study.add_trial(create_trial(
                state=TrialState.COMPLETE, values=[ttft, cap["capacity_rps_per_gpu"], loss], params=params,
                distributions=dist, user_attrs={"values": params, "status": "measured", "constraints": constraints,
                                                "feasible": all(c <= 0 for c in constraints), "config": cfg}))
            store.save_trial(name, number, "measured", values=params, config=cfg,
                             summary={**summary(ttft, 30.0), "capacity": cap}, quality=quality(loss),
                             engine=summary(ttft, 30.0)["engine"],
                             requests_jsonl=requests_jsonl([ttft * f for f in (0.2, 0.5, 0.8, 1.0, 0.9)]),
                             startup_s=30.0, wall_s=200.0)
        failed = len(trials)
        attrs = {"values": {"max_num_seqs": 1}, "status": "engine_failed", "feasible": False,
                 "failure_reason": "engine exited at start: no memory for the KV cache", "config": config()}
        study.add_trial(create_trial(state=TrialState.FAIL, params={"max_num_seqs": 1}, distributions=dist,
                                     user_attrs=attrs))
        store.save_trial(name, failed, "engine_failed", values={"max_num_seqs": 1}, config=config(),
                         failure_reason=attrs["failure_reason"])
    return url


# -- decisions: quality gate, ties, stale and queued trials (`make_decision_studies`) -------------
def exact(value: float) -> dict:
    """An estimate with a zero-width interval (every request good, or too few to spread)."""
    return {"value": value, "ci_low": value, "ci_high": value}


# trial -> (ttft_p99 s, output_tps, quality_loss nats): 0 and 2 differ by 16.07 vs 16.06 tokens/s with
# zero-width intervals (a tie); 1 buys throughput at +13.4% perplexity; 3's summary lacks the p99 the
# SLO names; 4 was RUNNING when its worker died days ago; 5 is queued (WAITING).
DECISION_TRIALS = {0: (0.30, 16.07, 0.0), 1: (0.50, 45.0, math.log1p(0.134)), 2: (0.30, 16.06, 0.0),
                   3: (None, 30.0, 0.0)}


def _decision_trial(study, store, name: str, number: int, gate) -> None:
    from optuna.distributions import IntDistribution
    from optuna.trial import TrialState, create_trial

    from tracetune.tuner.objectives import constraint_values

    ttft, tps, loss = DECISION_TRIALS[number]
    params = {"max_num_seqs": 8 * (number + 1)}
    result = summary(ttft or 0.3, tps)
    result["output_throughput_tps"] = exact(tps)
    if ttft is None:
        del result["latency_s"]["ttft"]["p99"]
    from tracetune.dashboard.metrics import run_of
    from tracetune.replay.metrics import Summary, parse_slos

    run = run_of(Summary.from_dict(result), quality(loss))  # as the dashboard reads the stored run back
    constraints = constraint_values(run.summary, run.quality, parse_slos(SLO, flag="--slo"), gate)
    values = [math.inf if ttft is None else ttft, tps, loss]  # what Optuna keeps of a missing value
    study.add_trial(create_trial(
        state=TrialState.COMPLETE, values=values, params=params,
        distributions={"max_num_seqs": IntDistribution(1, 128)},
        user_attrs={"values": params, "status": "measured", "constraints": constraints,
                    "feasible": all(c <= 0 for c in constraints), "config": config(**params)}))
    store.save_trial(name, number, "measured", values=params, config=config(**params), summary=result,
                     quality=quality(loss), engine=result["engine"], requests_jsonl=requests_jsonl([0.1] * 5),
                     startup_s=30.0, wall_s=60.0)


def make_decision_studies(path: Path) -> str:
    """Two studies of DECISION_TRIALS in one SQLite file: "nogate" (run with --max-quality-loss none)
    and "gated" (the default gate, ppl:+1%); returns the URL."""
    import optuna
    from optuna.distributions import IntDistribution
    from optuna.trial import TrialState, create_trial

    from tracetune.quality.gate import DEFAULT_GATE, parse_gate
    from tracetune.tuner.storage import ResultStore

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    url = f"sqlite:///{path}"
    store = ResultStore(url)
    for name, gate in (("nogate", None), ("gated", parse_gate(DEFAULT_GATE))):
        study = optuna.create_study(study_name=name, storage=url, directions=["minimize", "maximize", "minimize"])
        study.set_user_attr("objectives", ["ttft_p99", "output_tps", "quality_loss"])
        study.set_user_attr("slos", [SLO])
        study.set_user_attr("quality_gate", gate.spec if gate else None)
        study.set_user_attr("max_quality_loss", None)
        study.set_user_attr("heartbeat_s", 30)
        reference = summary(0.8, 10.0)
        store.save_reference(name, config=config(), probe=PROBE, summary=reference)
        store.save_trial(name, -1, "measured", config=config(), summary=reference, quality=quality(0.0),
                         engine=reference["engine"], requests_jsonl=requests_jsonl([0.1] * 5))
        for number in DECISION_TRIALS:
            _decision_trial(study, store, name, number, gate)
        dist = {"max_num_seqs": IntDistribution(1, 128)}
        study.add_trial(create_trial(state=TrialState.RUNNING, params={"max_num_seqs": 3}, distributions=dist,
                                     user_attrs={"values": {"max_num_seqs": 3}}))
        beat(url, 4, seconds_ago=3 * 86400, name=name)
        study.enqueue_trial({"max_num_seqs": 5})
    return url
