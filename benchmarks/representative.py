"""What a load level replays, against the whole trace's truth: capacity found by replaying the
trace's first minute looped (`tune capacity`'s former default), by the parts `capacity.segments`
picks (the default now), and by the whole trace at every level, side by side with the capacity the
whole trace really has, and what each costs in replay time (the time an engine would be busy).

    .venv/bin/python benchmarks/representative.py [--trace FILE[:FORMAT]] ... [--json OUT]

The server is `benchmarks/queue_model.py`, simulated in virtual time so that the truth of a
one-hour trace takes seconds: 8 requests at once, 20 ms to the first token, 5 ms per token. Its
capacity on a trace is known exactly: the highest load k (the whole trace's arrival times divided
by k) whose whole-trace replay passes the sustained-level rules of `tune capacity` (attainment,
percentile targets, last third, queue and TTFT not rising), found by bisection to 1%. Each method
runs tune's own capacity search (`capacity.levels.LevelRunner`, default windows, repeats and
abandons) with this server in place of the HTTP client. SLO: TTFT p95 < 500 ms, 95% attainment.

Traces (default): the whole Azure 2023 conversation hour and its first 10 minutes, the Mooncake
conversation sample, and synthetic bursty traces (30 minutes of quiet Poisson arrivals at 1 req/s
with bursts of 5x, 10x and 20x that rate, in four shapes from 10-second bursts a minute apart to
minute-long ones five minutes apart; `--seeds` of each), with Azure-like lengths. The synthetic
traces are generated here, not recorded: they stress the rule where bursts decide.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path

from queue_model import QueueModel  # beside this script, on the path when it runs

from tracetune.capacity.levels import LevelRunner
from tracetune.capacity.step import CapacityOptions
from tracetune.replay.importers import read_azure, read_mooncake
from tracetune.replay.metrics import parse_slos
from tracetune.replay.types import PreparedRequest, ReplayOptions

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
SLO = "ttft:p95<500ms"
FIRST_S = 60.0  # the former default of tune capacity: the trace's first 60 seconds
SHAPES = ((30, 240), (20, 120), (60, 300), (10, 60))  # bursts: (seconds long, seconds apart on average)


def from_raw(raw) -> list[PreparedRequest]:
    rows = sorted(raw, key=lambda r: r.timestamp_s)
    t0 = rows[0].timestamp_s
    return [PreparedRequest(index=i, id=None, scheduled_s=r.timestamp_s - t0, max_tokens=max(r.output_length, 1),
                            input_tokens=float(r.input_length or 0)) for i, r in enumerate(rows)]


def load(spec: str) -> tuple[str, list[PreparedRequest]]:
    """`path[:azure|mooncake][@SECONDS]`: a public trace, optionally its first SECONDS."""
    spec, _, seconds = spec.partition("@")
    path, _, fmt = spec.partition(":")
    fmt = fmt or ("azure" if path.endswith(".csv") else "mooncake")
    reader = read_azure if fmt == "azure" else read_mooncake
    requests = from_raw(reader(Path(path)))
    if seconds:
        requests = [r for r in requests if r.scheduled_s <= float(seconds)]
    return f"{Path(path).name}{'@' + seconds + 's' if seconds else ''}", requests


def bursty(seed: int, *, minutes: float = 30, quiet_rps: float = 1.0, burst_x: float = 10,
           every_s: float = 240, burst_s: float = 30) -> tuple[str, list[PreparedRequest]]:
    """Quiet Poisson arrivals with bursts of `burst_x` times the rate, `burst_s` long, every `every_s`
    on average; output lengths log-normal around Azure conversation's (median ~130 tokens)."""
    rng = random.Random(seed)
    t, out, end = 0.0, [], minutes * 60
    bursts, b = [], rng.expovariate(1 / every_s)
    while b < end:
        bursts.append((b, b + burst_s))
        b += burst_s + rng.expovariate(1 / every_s)
    while t < end:
        rate = quiet_rps * (burst_x if any(a <= t < z for a, z in bursts) else 1)
        t += rng.expovariate(rate)
        tokens = max(1, min(int(rng.lognormvariate(math.log(130), 0.9)), 2000))
        out.append(PreparedRequest(index=len(out), id=None, scheduled_s=t, max_tokens=tokens,
                                   input_tokens=float(max(1, int(rng.lognormvariate(math.log(1000), 0.7))))))
    return f"bursty {burst_x:g}x {burst_s:g}s/{every_s:g}s #{seed}", out


def spiky(seed: int = 7) -> list[dict]:
    """A 10-minute trace of 1,500 requests arriving in clumps (1 to ~20 at one instant), its minutes
    holding 20 to 632 of them; short outputs (median ~20 tokens). Native trace lines, text prompts."""
    rng, times = random.Random(seed), []
    for minute, n in enumerate((63, 20, 150, 90, 632, 110, 40, 200, 130, 65)):
        while n > 0:
            clump = min(n, max(1, int(rng.expovariate(1 / 5))))
            times += [minute * 60 + rng.uniform(0, 60)] * clump
            n -= clump
    return [{"timestamp": round(t, 3), "prompt": "def f(x):",
             "output_length": max(1, min(int(rng.lognormvariate(3.0, 1.0)), 500))} for t in sorted(times)]


def runner(requests, model: QueueModel, *, representative: bool, precision: float = 0.05,
           confirm: bool = True) -> LevelRunner:
    options = CapacityOptions(slos=tuple(parse_slos(SLO)), precision=precision, confirm=confirm,
                              whole_trace=not representative)
    return LevelRunner("http://simulated", "model", requests, ReplayOptions(), options, send=model.send)


def truth(requests, model: QueueModel) -> float:
    """The highest load whose whole-trace replay passes, to 1%."""
    result = runner(requests, model, representative=False, precision=0.01, confirm=False).search()
    return result.capacity_scale or 0.0


def measure(name: str, requests: list[PreparedRequest], model: QueueModel) -> dict:
    whole_k = truth(requests, model)
    first = [r for r in requests if r.scheduled_s <= FIRST_S]
    methods = {"first 60 s, looped": runner(first, model, representative=False),
               "parts (default)": runner(requests, model, representative=True),
               "whole trace": runner(requests, model, representative=False)}
    rows = {}
    for label, r in methods.items():
        result = r.search()
        # k is defined on the whole trace: a search on the first minute reports k of that minute's rate.
        rate = r.base_rates[0] * (result.capacity_scale or 0.0)
        k = rate / runner(requests, model, representative=True).base_rates[0]
        replayed = [res.duration_s for _, res in r.measured]  # the simulated replays' wall time
        rows[label] = {"k": k, "ratio": k / whole_k if whole_k else math.nan, "levels": len(replayed),
                       "replay_s_per_level": sum(replayed) / max(len(replayed), 1), "replay_s": sum(replayed),
                       "verdict": result.verdict, "unstable": result.unstable}
    span = requests[-1].scheduled_s - requests[0].scheduled_s
    return {"trace": name, "requests": len(requests), "span_s": span, "truth_k": whole_k, "methods": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", action="append", help="path[:azure|mooncake][@SECONDS] (repeatable)")
    ap.add_argument("--seeds", type=int, default=2, help="synthetic bursty traces per burst size (default 2)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--write-spiky", type=Path, metavar="FILE",
                    help="write the 10-minute clumped trace of the live run (docs/capacity.md) and exit")
    args = ap.parse_args()
    if args.write_spiky:
        args.write_spiky.write_text("".join(json.dumps(line) + "\n" for line in spiky()))
        return 0
    model = QueueModel()
    traces = [load(t) for t in args.trace] if args.trace else [
        load(str(SHARED / "azure2023_conv_hour.csv")), load(str(SHARED / "azure2023_conv_hour.csv") + "@600"),
        load(str(SHARED / "mooncake_conversation.jsonl"))]
    if not args.trace:
        traces += [bursty(seed, burst_x=x, burst_s=length, every_s=every) for x in (5, 10, 20)
                   for seed in range(args.seeds) for length, every in SHAPES]
    results = []
    print(f"server: {model.slots} at once, {model.ttft_s * 1000:g} ms to the first token, "
          f"{model.tpot_s * 1000:g} ms a token; SLO {SLO} at 95%")
    print(f"{'trace':<28}{'method':<20}{'k':>7}{'vs truth':>9}{'levels':>7}{'s/level':>9}{'total s':>9}")
    for name, requests in traces:
        row = measure(name, requests, model)
        results.append(row)
        print(f"{name[:27]:<28}{'truth (whole)':<20}{row['truth_k']:>7.3g}")
        for label, m in row["methods"].items():
            print(f"{'':<28}{label:<20}{m['k']:>7.3g}{m['ratio']:>8.2f}x{m['levels']:>7}"
                  f"{m['replay_s_per_level']:>9.0f}{m['replay_s']:>9.0f}")
    summarize(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def summarize(results: list[dict]) -> None:
    """Per method: how many capacities fell within 15% of the truth, the worst miss, replay time."""
    print("\nover the traces with a capacity above 0:")
    for label in results[0]["methods"]:
        rows = [r["methods"][label] for r in results if r["truth_k"] > 0]
        errors = [abs(m["ratio"] - 1) for m in rows]
        within = sum(e <= 0.15 for e in errors)
        print(f"  {label:<20} within 15% of the truth: {within} of {len(rows)}; worst {max(errors):.0%}; "
              f"replay s per level, median {sorted(m['replay_s_per_level'] for m in rows)[len(rows) // 2]:.0f}")


if __name__ == "__main__":
    sys.exit(main())
