"""How big a capacity study gets, and how fast the dashboard opens it.

    .venv/bin/python benchmarks/storage_scale.py [--trials 100] [--requests 592] [--levels 10] [--out DIR]

Writes a study the way the tuner does (Optuna study + tracetune's tables, through the same
`ResultStore` calls) with synthetic numbers of the H200 study's shape: every trial has a
trace-rate replay of `--requests` requests (about 210 output tokens each, so about 210 ITL gaps
per request) and a capacity search of `--levels` load levels of the same requests. Then prints the
database size and the time `dashboard.data.load_study` takes to open it (what the dashboard does
on its first page), and the time to read one trial's levels.

Target (capacity issue): a 100-trial capacity study under 500 MB, opened in a few seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def records(rng: np.random.Generator, n: int, scale: float) -> list:
    from tracetune.replay.types import RequestRecord

    out = []
    for i in range(n):
        tokens = int(rng.integers(20, 400))
        gaps = list(rng.gamma(2.0, 0.006, size=tokens - 1))
        ttft = float(rng.gamma(2.0, 0.05 * scale))
        out.append(RequestRecord(index=i, id=f"req-{i}", scheduled_s=i / 4.0 / scale, send_s=i / 4.0 / scale,
                                 lag_s=float(rng.uniform(0, 0.001)), success=True, error="", ttft_s=ttft,
                                 e2e_s=ttft + sum(gaps), itl_s=gaps, prompt_tokens=int(rng.integers(50, 4000)),
                                 output_tokens=tokens, requested_tokens=tokens, finish_reason="length"))
    return out


def capacity_dict(scales: list[float]) -> dict:
    steps = [{"scale": k, "rps": 4.0 * k, "output_tps": 840.0 * k, "attainment": 1.0 if k <= 8 else 0.5,
              "passed": k <= 8, "abandoned": k > 8, "requests": 592, "planned": 592, "good": 592,
              "duration_s": 148 / k, "lag_p99_s": 0.0004, "client_overloaded": False, "repeat": False, "errors": 0}
             for k in scales]
    return {"capacity_scale": 8.0, "capacity_rps": 32.0, "capacity_output_tps": 6720.0, "capacity_input_tps": 36000.0,
            "capacity_rps_per_gpu": 32.0, "bracket_scale": [8.0, 8.4], "bracket_rps": [32.0, 33.6], "gpus": 1,
            "attainment_target": 0.95, "precision": 0.05, "slo": ["ttft:p99<1000ms", "tpot:p99<50ms"],
            "unstable": False, "verdict": "ok", "base_rps": 4.0, "base_output_tps": 840.0, "search_s": 300.0,
            "replay_s": 290.0, "steps": steps}


def generate(url: str, args: argparse.Namespace) -> None:
    import optuna

    from tracetune.replay.metrics import summarize
    from tracetune.replay.types import ReplayOptions, ReplayResult
    from tracetune.tuner.storage import ResultStore

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    rng = np.random.default_rng(0)
    store = ResultStore(url)
    study = optuna.create_study(study_name="big", storage=url, directions=["minimize", "maximize", "minimize"])
    study.set_user_attr("objectives", ["ttft_p99", "capacity", "quality_loss"])
    study.set_user_attr("slos", ["ttft:p99<1000ms", "tpot:p99<50ms"])
    study.set_user_attr("platform", "cuda")
    scales = [1.0, 2.0, 4.0, 8.0, 16.0, 11.3, 9.5, 8.7, 8.4, 8.0][:args.levels]
    config = {"model": "/models/llama-8b", "max_num_seqs": 64, "speculative": {"method": "none"}}
    # A few record sets, reused across trials (each trial's blobs are stored and compressed on their
    # own, so the size is what distinct data would take; generating 600,000 records would take long).
    pool = [[records(rng, args.requests, k) for k in scales] for _ in range(3)]
    summaries = []
    for sets in pool:
        summary = summarize(ReplayResult(records=sets[0], duration_s=150.0, options=ReplayOptions())).as_dict()
        summary["capacity"] = capacity_dict(scales)
        summaries.append(summary)
    for number in range(args.trials):
        sets, summary = pool[number % 3], summaries[number % 3]
        base = sets[0]
        store.save_trial("big", number, "measured", values={"max_num_seqs": 64}, config=config, summary=summary,
                         quality={"nll_delta_per_token": {"value": 0.01, "ci_low": 0.0, "ci_high": 0.02}},
                         engine=summary["engine"], requests_jsonl="".join(r.to_json() + "\n" for r in base),
                         log_tail="log " * 500, startup_s=100.0, wall_s=400.0)
        store.save_levels("big", number, [(k, False, level) for k, level in zip(scales, sets)])
        trial = study.ask()
        trial.set_user_attr("status", "measured")
        trial.set_user_attr("feasible", True)
        trial.set_user_attr("config", config)
        study.tell(trial, [float(summary["latency_s"]["ttft"]["p99"]["value"]), 32.0 + number * 0.01, 0.01])
        if (number + 1) % 10 == 0:
            print(f"  {number + 1}/{args.trials} trials written", flush=True)
    store.save_reference("big", config=config, probe=[], summary=summary)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=100)
    p.add_argument("--requests", type=int, default=592)
    p.add_argument("--levels", type=int, default=10)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-storage")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    db = args.out / "big.db"
    db.unlink(missing_ok=True)
    url = f"sqlite:///{db}"
    t0 = time.perf_counter()
    generate(url, args)
    print(f"wrote {args.trials} trials x {args.levels} levels x {args.requests} requests in "
          f"{time.perf_counter() - t0:.0f}s")
    size_mb = db.stat().st_size / 2**20
    from tracetune.dashboard.data import load_study
    from tracetune.tuner.storage import ResultStore

    t0 = time.perf_counter()
    view = load_study(url, "big")
    opened = time.perf_counter() - t0
    t0 = time.perf_counter()
    levels = ResultStore(url).levels("big", 0)
    one = time.perf_counter() - t0
    print(json.dumps({"trials": len(view.trials), "db_mb": round(size_mb, 1),
                      "mb_per_trial": round(size_mb / args.trials, 2), "open_study_s": round(opened, 2),
                      "read_one_trials_levels_s": round(one, 3), "levels_read": len(levels)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
