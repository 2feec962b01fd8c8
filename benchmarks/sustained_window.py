"""Capacity against the length of a load level: where it converges, and where the default sits.

    .venv/bin/python benchmarks/sustained_window.py [--json benchmarks/data/sustained_window_cpu.json]
    .venv/bin/python benchmarks/sustained_window.py --report-only benchmarks/data/sustained_window_cpu.json

One configuration (vLLM's defaults, eager, the bundled model), the example trace and the quickstart's
SLO; `tune capacity` run as a user runs it, once per window: one pass of the trace per level (what
levels were before sustained capacity: 22 requests), levels of 10, 60 and 120 s (seconds only), and
the default window (30 s, 5 request lifetimes, 300 requests). Each run starts its own engine.

It prints, per window: requests per level at the capacity, the capacity with its bracket, how far
it lies from the longest window's, the levels measured and the search's time. The capacity has
converged where a longer window no longer changes it beyond the search's precision (5%).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SLO = "ttft:p99<2s,tpot:p99<100ms"
# (label, extra `tune capacity` arguments): the window lengths compared
WINDOWS = [
    ("one pass", ["--level-seconds", "0", "--level-lifetimes", "0", "--level-requests", "0"]),
    ("10 s", ["--level-seconds", "10", "--level-lifetimes", "0", "--level-requests", "0"]),
    ("default", []),
    ("60 s", ["--level-seconds", "60", "--level-lifetimes", "0", "--level-requests", "0"]),
    ("120 s", ["--level-seconds", "120", "--level-lifetimes", "0", "--level-requests", "0"]),
]


def measure(label: str, extra: list[str], trace: Path, out: Path) -> dict:
    path = out / f"{label.replace(' ', '_')}.json"
    cmd = [sys.executable, "-m", "cli", "capacity", "--trace", str(trace), "--slo", SLO, "--eager",
           "--json", str(path), "--out", str(out / label.replace(" ", "_")), *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{label}: tune capacity failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    result = json.loads(path.read_text())
    steps = result["steps"]
    at_capacity = [s for s in steps if s["scale"] == result["capacity_scale"]] or steps
    return {"window": label, "args": extra, "capacity_rps": result["capacity_rps"],
            "bracket_rps": result["bracket_rps"], "verdict": result["verdict"], "levels": len(steps),
            "requests_per_level": at_capacity[0]["planned"], "window_s": at_capacity[0].get("window_s"),
            "search_s": result["search_s"], "replay_s": result["replay_s"], "wall_s": time.perf_counter() - t0,
            "steps": [{k: s.get(k) for k in ("scale", "rps", "planned", "attainment", "last_third", "outcome",
                                              "decided_by", "duration_s", "passes")} for s in steps]}


def report(rows: list[dict]) -> None:
    longest = rows[-1]["capacity_rps"]
    print(f"{'window':<9} {'req/level':>9} {'capacity req/s':>15} {'bracket':>16} {'vs 120 s':>8} {'levels':>6} "
          f"{'search':>7}")
    for r in rows:
        low, high = r["bracket_rps"]
        bracket = f"[{low:.3g}, {'-' if high is None else f'{high:.3g}'}]"
        ratio = f"{r['capacity_rps'] / longest:.2f}x" if longest else "-"
        print(f"{r['window']:<9} {r['requests_per_level']:>9} {r['capacity_rps']:>15.3g} {bracket:>16} {ratio:>8} "
              f"{r['levels']:>6} {r['search_s'] / 60:>5.1f}m")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", type=Path, default=ROOT / "examples" / "traffic.jsonl")
    p.add_argument("--json", type=Path, help="write every run's numbers here")
    p.add_argument("--report-only", type=Path, metavar="JSON", help="print the table of an earlier run")
    args = p.parse_args()
    if args.report_only:
        report(json.loads(args.report_only.read_text())["runs"])
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, extra in WINDOWS:
            print(f"measuring: {label} ...", flush=True)
            rows.append(measure(label, extra, args.trace, Path(tmp)))
            print(f"  capacity {rows[-1]['capacity_rps']:.3g} req/s, {rows[-1]['search_s']:.0f} s", flush=True)
    report(rows)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"trace": str(args.trace), "slo": SLO, "runs": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
