"""Three small stored studies for the decisions that read intervals (issue 37), written the way the
tuner writes them (Optuna study + tracetune tables), in one SQLite file:

- "undecided": run without a gate (the default gate judges it on the pages); trial 0 (fp8 KV cache)
  is best by capacity with perplexity -3.78% [-13.37%, +4.86%]: its interval straddles +1%. Trial 1
  is an older result stored as NLL only (+0.44 nats/token, about +55% perplexity).
- "slo_broken": nothing met the SLO ttft:p99<2000ms, vLLM's defaults included (TTFT p99 17.8 s,
  every load failed).
- "random": measured on random weights (load_format dummy): quality stored by the probe, not
  measurable; no gate.
"""

from __future__ import annotations

import math
from pathlib import Path

from tests.dashboard.synthetic import (
    CAPACITY_SLO,
    PROBE,
    REFERENCE_CAPACITY,
    capacity,
    config,
    quality,
    requests_jsonl,
    summary,
)

# trial 0's perplexity change and 95% interval (fractions), over 4096 scored tokens
FP8 = (-0.0378, -0.1337, 0.0486)
NLL_ONLY = 0.44  # nats/token, trial 1 of "undecided" (about +55% perplexity)
REFERENCE_TTFT = 17.8  # seconds, p99, "slo_broken"'s reference (SLO: 2 s)


def straddling_quality() -> dict:
    value, low, high = FP8
    nll = {"value": math.log1p(value), "ci_low": math.log1p(low), "ci_high": math.log1p(high)}
    return {**quality(0.0), "nll_delta_per_token": nll, "ppl_change": {"value": value, "ci_low": low, "ci_high": high},
            "kld": {"value": 0.004, "ci_low": 0.002, "ci_high": 0.006},
            "top1_agreement": {"value": 0.97, "ci_low": 0.95, "ci_high": 0.99}, "n_tokens": 4096}


def nll_only_quality() -> dict:
    """A quality result as studies stored it before the probe reported perplexity, KLD and top-1."""
    return {"nll_delta_per_token": {"value": NLL_ONLY, "ci_low": NLL_ONLY - 0.04, "ci_high": NLL_ONLY + 0.04},
            "greedy_agreement": None, "exact_match": None, "accuracy": None, "n_prompts": 8}


def all_failed() -> dict:
    """A capacity search whose every load level failed the SLO."""
    return capacity(0.0, 2.5, [(1.0, 0.1, "fail"), (0.5, 0.2, "fail"), (0.25, 0.4, "fail")], high=0.25)


def _study(url: str, name: str, objectives: list[str], directions: list[str], slos: list[str], gate: str | None):
    import optuna

    study = optuna.create_study(study_name=name, storage=url, directions=directions)
    study.set_user_attr("objectives", objectives)
    study.set_user_attr("slos", slos)
    study.set_user_attr("quality_gate", gate)
    study.set_user_attr("max_quality_loss", None)
    study.set_user_attr("heartbeat_s", 30)
    return study


def _trial(study, store, name: str, number: int, *, values: list[float], run: dict, quality_result: dict | None,
           constraints: list[float], cfg: dict) -> None:
    from optuna.distributions import IntDistribution
    from optuna.trial import TrialState, create_trial

    params = {"max_num_seqs": 8 * (number + 1)}
    study.add_trial(create_trial(
        state=TrialState.COMPLETE, values=values, params=params, distributions={"max_num_seqs": IntDistribution(1, 128)},
        user_attrs={"values": params, "status": "measured", "constraints": constraints,
                    "feasible": run.get("error_rate", 0) == 0 and all(c <= 0 for c in constraints), "config": cfg}))
    store.save_trial(name, number, "measured", values=params, config=cfg, summary=run, quality=quality_result,
                     engine=run["engine"], requests_jsonl=requests_jsonl([0.1, 0.2, 0.3, 0.2, 0.1]), startup_s=30.0,
                     wall_s=90.0)


def _reference(store, name: str, cfg: dict, run: dict, probe: dict | None, quality_result: dict | None) -> None:
    store.save_reference(name, config=cfg, probe=probe, summary=run)
    store.save_trial(name, -1, "measured", config=cfg, summary=run, quality=quality_result, engine=run["engine"],
                     requests_jsonl=requests_jsonl([0.1, 0.2, 0.3, 0.2, 0.1]))


def make_interval_studies(path: Path) -> str:
    """Write "undecided", "slo_broken" and "random" to a SQLite file; returns its URL."""
    import optuna

    from tracetune.tuner.storage import ResultStore

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    url = f"sqlite:///{path}"
    store = ResultStore(url)
    objectives, directions = ["capacity", "quality_loss"], ["maximize", "minimize"]

    study = _study(url, "undecided", objectives, directions, [CAPACITY_SLO], None)
    _reference(store, "undecided", config(), {**summary(0.8, 20.0), "capacity": REFERENCE_CAPACITY}, PROBE, quality(0.0))
    fp8 = capacity(2.4, 2.5, [(1.0, 1.0, "pass"), (2.0, 0.99, "pass"), (2.8, 0.8, "fail"), (2.4, 0.97, "pass")],
                   high=2.8)
    _trial(study, store, "undecided", 0, values=[fp8["capacity_rps_per_gpu"], math.log1p(FP8[0])],
           run={**summary(0.7, 30.0), "capacity": fp8}, quality_result=straddling_quality(), constraints=[-1.3],
           cfg=config(kv_cache_dtype="fp8", max_num_seqs=8))
    four_bit = capacity(2.0, 2.5, [(1.0, 1.0, "pass"), (2.0, 0.97, "pass"), (2.4, 0.8, "fail")], high=2.4)
    _trial(study, store, "undecided", 1, values=[four_bit["capacity_rps_per_gpu"], NLL_ONLY],
           run={**summary(0.6, 30.0), "capacity": four_bit}, quality_result=nll_only_quality(), constraints=[-1.4],
           cfg=config(quantization="awq", max_num_seqs=16))

    study = _study(url, "slo_broken", objectives, directions, [CAPACITY_SLO], "ppl:+1%")
    _reference(store, "slo_broken", config(), {**summary(REFERENCE_TTFT, 5.0), "capacity": all_failed()}, PROBE,
               quality(0.0))
    for number, ttft in ((0, 12.5), (1, 9.0)):
        _trial(study, store, "slo_broken", number, values=[0.0, 0.0], run={**summary(ttft, 6.0), "capacity": all_failed()},
               quality_result=quality(0.0), constraints=[ttft - 2.0, -0.01], cfg=config(max_num_seqs=8 * (number + 1)))

    objectives, directions = ["ttft_p99", "output_tps"], ["minimize", "maximize"]
    study = _study(url, "random", objectives, directions, ["ttft:p99<800ms"], None)
    dummy = config(load_format="dummy")
    _reference(store, "random", dummy, summary(0.5, 20.0), PROBE, quality(0.0))
    for number, (ttft, tps) in enumerate(((0.3, 25.0), (0.4, 40.0))):
        _trial(study, store, "random", number, values=[ttft, tps], run=summary(ttft, tps), quality_result=quality(0.0),
               constraints=[ttft - 0.8], cfg=config(load_format="dummy", max_num_seqs=8 * (number + 1)))
    return url
