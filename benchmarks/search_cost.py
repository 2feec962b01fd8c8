"""What a capacity search costs under the classic rules and the guided ones, side by side in one run,
against servers whose true capacity is known.

    .venv/bin/python benchmarks/search_cost.py [--noise 0.03] [--seeds 3] [--quick] [--oracle] [--json OUT]

Servers: the queueing model of `benchmarks/queue_model.py` (`slots` requests at once, first come
first served, `ttft` to the first token, then `tpot` a token), simulated in virtual time, in a zoo of
configurations (slots 2-16, 20-300 ms to the first token, 5-60 ms a token). `--noise N`: each replay
runs the model with its times scaled by one factor drawn uniformly in [1 - N, 1 + N] (a machine
whose speed wanders from level to level), so repeats can disagree as on a real engine. The truth of
a configuration on a trace is the highest load whose replay passes the sustained-level rules on the
noise-free model, found by bisection to 1%.

Traces: examples/chat.jsonl (the quickstart's 60 requests, 30 s: replayed whole and looped) at the
quickstart's SLO, and a 30-minute synthetic bursty trace (`benchmarks/representative.py`: measured
by the windows that decide it) at TTFT p95 < 500 ms. Each search runs tune's own capacity search
(`capacity.levels.LevelRunner`: levels, windows, abandons, repeats) with the model in place of the
HTTP client, starting from the trace's rate as `tune capacity` does, the trace's rate measured in
full first as a study does. Reported per rule: levels, replay seconds (the time an engine is busy),
the capacity against the truth, and whether the bracket holds the truth within the precision.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics
import sys
from pathlib import Path
from typing import Any

from queue_model import QueueModel  # beside this script, on the path when it runs
from representative import bursty
from study_cost import Noisy, chat_trace

from tracetune.capacity import response
from tracetune.capacity.levels import LevelRunner
from tracetune.capacity.step import CapacityOptions
from tracetune.replay.metrics import parse_slos
from tracetune.replay.types import PreparedRequest, ReplayOptions

ROOT = Path(__file__).resolve().parents[1]
RULES = ("classic", "guided")
ZOO = [QueueModel(slots, ttft, tpot) for slots, ttft, tpot in
       ((2, 0.02, 0.005), (4, 0.05, 0.01), (8, 0.02, 0.005), (8, 0.1, 0.02), (16, 0.3, 0.06), (4, 0.2, 0.04))]


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    requests: list[PreparedRequest]
    slo: str
    precision: float
    level: dict[str, float]  # CapacityOptions' level fields


def cases(quick: bool) -> list[Case]:
    out = [Case("chat, quickstart levels", chat_trace(), "ttft:p95<2s,tpot:p95<200ms", 0.2,
                {"level_lifetimes": 2, "level_requests": 60}),
           Case("chat, default levels", chat_trace(), "ttft:p95<2s,tpot:p95<200ms", 0.05, {})]
    if not quick:
        _, requests = bursty(0, minutes=30, burst_x=10, burst_s=30, every_s=240)
        out.append(Case("bursty 10x, 30 min (windows)", requests, "ttft:p95<500ms", 0.1, {}))
    return out


def runner(case: Case, send: Any, rules: str, precision: float | None = None, confirm: bool = True) -> LevelRunner:
    options = CapacityOptions(slos=tuple(parse_slos(case.slo)), precision=precision or case.precision,
                              confirm=confirm, rules=rules, **case.level)  # type: ignore[arg-type]
    return LevelRunner("http://simulated", "model", case.requests, ReplayOptions(), options, send=send)


def truth(case: Case, model: QueueModel) -> float:
    """The highest load whose replay passes on the noise-free model, to 1%."""
    result = runner(case, model.send, "classic", precision=0.01, confirm=False).search()
    return result.capacity_scale or 0.0


def search(case: Case, model: QueueModel, rules: str, noise: float, seed: int) -> dict[str, Any]:
    r = runner(case, Noisy(model, noise, random.Random(seed)) if noise else model.send, rules)
    seed_step = r.level(1.0, abandon=False)  # a study measures the trace's rate in full first
    result = r.search(seed_steps=[seed_step])
    replay_s = sum(res.duration_s for _, res in r.measured)
    return {"k": result.capacity_scale or 0.0, "high": result.bracket_high, "levels": len(r.measured),
            "replay_s": replay_s, "unstable": result.unstable, "verdict": str(result.verdict),
            "placed": [s.placed_by for s in result.steps]}


def oracle_search(case: Case, model: QueueModel, true_k: float, noise: float, seed: int) -> dict[str, Any]:
    """A guided search whose model knows the truth: every prediction is the true capacity (none where
    it is 0). What placement alone could save; the rest is the seed level, the ends and their repeats."""
    predict = response.predict
    response.predict = lambda steps: response.Prediction(true_k, true_k, true_k) if true_k > 0 else None
    try:
        return search(case, model, "guided", noise, seed)
    finally:
        response.predict = predict


def judged(row: dict[str, Any], true_k: float, precision: float) -> dict[str, Any]:
    """The search's answer against the truth: its error, and whether its bracket holds the truth
    (within the precision either side, for the noise)."""
    k, high = row["k"], row["high"]
    row["error"] = (k / true_k - 1) if true_k else (0.0 if k == 0 else math.inf)
    top = high if high is not None else math.inf
    row["holds"] = (k == 0 and true_k == 0) or (k <= true_k * (1 + precision) and top >= true_k / (1 + precision))
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--noise", type=float, default=0.03, help="each replay's speed wanders by +-N (default 0.03)")
    ap.add_argument("--seeds", type=int, default=3, help="searches per configuration and rule (default 3)")
    ap.add_argument("--quick", action="store_true", help="the chat trace only")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--oracle", action="store_true",
                    help="also run the guided rules with a model that knows each server's truth (a bound)")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    print(f"noise +-{args.noise:.0%} per replay, {args.seeds} seeds; per configuration: levels and replay "
          f"seconds (mean), error vs truth")
    for case in cases(args.quick):
        print(f"\n{case.name} (SLO {case.slo}, precision {case.precision:.0%})")
        print(f"{'server':<22}{'truth':>7}" + "".join(f"{r + ' lv':>12}{'s':>7}{'err':>7}" for r in RULES))
        for model in ZOO:
            true_k = truth(case, model)
            line = f"{model.slots:>2} slots {model.ttft_s * 1000:>3.0f}/{model.tpot_s * 1000:>2.0f} ms   {true_k:>7.3g}"
            for rules in RULES:
                runs = [judged(search(case, model, rules, args.noise, seed), true_k, case.precision)
                        for seed in range(args.seeds)]
                rows += [{"case": case.name, "server": dataclasses.asdict(model), "truth": true_k, "rules": rules,
                          **run} for run in runs]
                worst = max(abs(x["error"]) for x in runs)
                line += (f"{statistics.mean(x['levels'] for x in runs):>12.1f}"
                         f"{statistics.mean(x['replay_s'] for x in runs):>7.0f}{worst:>7.0%}")
            if args.oracle:
                rows += [{"case": case.name, "server": dataclasses.asdict(model), "truth": true_k, "rules": "oracle",
                          **judged(oracle_search(case, model, true_k, args.noise, seed), true_k, case.precision)}
                         for seed in range(args.seeds)]
            print(line)
    summarize(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


def summarize(rows: list[dict[str, Any]]) -> None:
    print("\nover every case, configuration and seed:")
    base = {r: [x for x in rows if x["rules"] == r] for r in (*RULES, "oracle") if any(x["rules"] == r for x in rows)}
    for rules, mine in base.items():
        levels, seconds = sum(x["levels"] for x in mine), sum(x["replay_s"] for x in mine)
        holds = sum(x["holds"] for x in mine)
        print(f"  {rules:<8} levels {levels:>5} ({levels / len(mine):.1f} a search), replay {seconds:>7.0f} s; "
              f"bracket holds the truth in {holds} of {len(mine)}; unstable {sum(x['unstable'] for x in mine)}")
    classic, guided = base["classic"], base["guided"]
    lv = sum(x["levels"] for x in guided) / max(sum(x["levels"] for x in classic), 1)
    s = sum(x["replay_s"] for x in guided) / max(sum(x["replay_s"] for x in classic), 1)
    print(f"  guided / classic: levels {lv:.2f}x, replay seconds {s:.2f}x")
    if "oracle" in base:
        oracle = base["oracle"]
        lv = sum(x["levels"] for x in oracle) / max(sum(x["levels"] for x in classic), 1)
        s = sum(x["replay_s"] for x in oracle) / max(sum(x["replay_s"] for x in classic), 1)
        print(f"  oracle / classic (a model that knows the truth): levels {lv:.2f}x, replay seconds {s:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
