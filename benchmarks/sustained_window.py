"""Capacity against the length of a load level: where it converges, and where the default sits.

    .venv/bin/python benchmarks/sustained_window.py [--json benchmarks/data/sustained_window_cpu.json]
    .venv/bin/python benchmarks/sustained_window.py --report-only benchmarks/data/sustained_window_cpu.json

One configuration (vLLM's defaults, eager, the bundled model), the example trace and the quickstart's
SLO (or --slo); `tune capacity` run as a user runs it, once per window: one pass of the trace per level (what
levels were before sustained capacity: 22 requests), levels of 10, 60 and 120 s (seconds only), the
default window (30 s, 5 request lifetimes, 100 requests) and the default with 300 requests. Each run
starts its own engine. `--only` measures some windows and merges them into the --json file.

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
SLO = "ttft:p95<2s,tpot:p95<100ms"  # the quickstart's
# (label, extra `tune capacity` arguments): the window lengths compared
WINDOWS = [
    ("one pass", ["--level-seconds", "0", "--level-lifetimes", "0", "--level-requests", "0"]),
    ("10 s", ["--level-seconds", "10", "--level-lifetimes", "0", "--level-requests", "0"]),
    ("default", []),
    ("300 req", ["--level-requests", "300"]),
    ("60 s", ["--level-seconds", "60", "--level-lifetimes", "0", "--level-requests", "0"]),
    ("120 s", ["--level-seconds", "120", "--level-lifetimes", "0", "--level-requests", "0"]),
]


def measure(label: str, extra: list[str], trace: Path, out: Path, slo: str) -> dict:
    path = out / f"{label.replace(' ', '_')}.json"
    cmd = [sys.executable, "-m", "tracetune", "capacity", "--trace", str(trace), "--slo", slo, "--eager",
           "--json", str(path), "--out", str(out / label.replace(" ", "_")), *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{label}: tune capacity failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return row(label, extra, json.loads(path.read_text()), time.perf_counter() - t0)


def row(label: str, extra: list[str], result: dict, wall_s: float) -> dict:
    """A window's numbers from `tune capacity --json`'s result."""
    steps = result["steps"]
    at_capacity = [s for s in steps if s["scale"] == result["capacity_scale"]] or steps
    return {"window": label, "args": extra, "capacity_rps": result["capacity_rps"],
            "bracket_rps": result["bracket_rps"], "verdict": result["verdict"], "levels": len(steps),
            "requests_per_level": at_capacity[0]["planned"], "window_s": at_capacity[0].get("window_s"),
            "search_s": result["search_s"], "replay_s": result["replay_s"], "wall_s": wall_s,
            "steps": [{k: s.get(k) for k in ("scale", "rps", "planned", "attainment", "last_third", "outcome",
                                              "decided_by", "duration_s", "passes")} for s in steps]}


def report(rows: list[dict]) -> None:
    """One line a window, shortest first; each capacity against the longest window's."""
    rows = sorted(rows, key=lambda r: r["window_s"] or 0)
    longest = rows[-1]["capacity_rps"]
    print(f"{'window':<9} {'req/level':>9} {'s/level':>7} {'capacity req/s':>14} {'bracket':>14} "
          f"{'vs ' + rows[-1]['window']:>10} {'levels':>6} {'search':>6}")
    for r in rows:
        low, high = r["bracket_rps"]
        bracket = f"[{low:.3g}, {'-' if high is None else f'{high:.3g}'}]"
        ratio = f"{r['capacity_rps'] / longest:.2f}x" if longest else "-"
        print(f"{r['window']:<9} {r['requests_per_level']:>9} {r['window_s'] or 0:>7.3g} {r['capacity_rps']:>14.3g} "
              f"{bracket:>14} {ratio:>10} {r['levels']:>6} {r['search_s'] / 60:>5.1f}m")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", type=Path, default=ROOT / "examples" / "traffic.jsonl")
    p.add_argument("--json", type=Path, help="write every run's numbers here")
    p.add_argument("--slo", default=SLO, help=f"the SLO (default: the quickstart's, {SLO!r})")
    p.add_argument("--report-only", type=Path, metavar="JSON", help="print the table of an earlier run")
    p.add_argument("--only", metavar="LABELS", help="comma-separated windows to measure, e.g. 'default,60 s'")
    args = p.parse_args()
    if args.report_only:
        report(json.loads(args.report_only.read_text())["runs"])
        return 0
    wanted = [w.strip() for w in args.only.split(",")] if args.only else [label for label, _ in WINDOWS]
    unknown = set(wanted) - {label for label, _ in WINDOWS}
    if unknown:
        p.error(f"--only: unknown windows {sorted(unknown)}; choose from {[label for label, _ in WINDOWS]}")
    rows = []
    if args.json and args.json.exists():  # earlier windows stay, measured ones are replaced
        rows = [r for r in json.loads(args.json.read_text())["runs"] if r["window"] not in wanted]
    with tempfile.TemporaryDirectory() as tmp:
        for label, extra in [(label, extra) for label, extra in WINDOWS if label in wanted]:
            print(f"measuring: {label} ...", flush=True)
            rows.append(measure(label, extra, args.trace, Path(tmp), args.slo))
            print(f"  capacity {rows[-1]['capacity_rps']:.3g} req/s, {rows[-1]['search_s']:.0f} s", flush=True)
            if args.json:  # after every window: an interrupted run keeps what it measured
                args.json.parent.mkdir(parents=True, exist_ok=True)
                shown = str(args.trace.relative_to(ROOT)) if args.trace.is_relative_to(ROOT) else str(args.trace)
                args.json.write_text(json.dumps({"trace": shown, "slo": args.slo, "runs": rows}, indent=2))
    report(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
