"""Harness ceiling: how much load tracetune's replay client can offer before it, not the server,
is what a measurement measures, side by side with vLLM's own benchmark client (vllm.benchmarks.serve,
from the installed vLLM) on the same server and the same schedule, in one run.

    .venv/bin/python benchmarks/harness_ceiling.py [--rates 800,1600,3200,4800] [--seconds 4]
        [--tokens 32] [--client-procs 1,2,4] [--server-procs 1]

The server is benchmarks/zero_latency_server.py: it answers every request at once, as vLLM streams
(chunked, one event per token), so what is left is the client. Clients run as users run them (`tune
replay --endpoint ...`, `python -m vllm.benchmarks.serve`), pinned to their own cores with the
server on the others (on 2 cores: one each). Schedule: evenly spaced arrivals at each offered rate
(tracetune replays an evenly spaced trace; vLLM's client runs with --burstiness inf), every
request asks for --tokens output tokens with ignore_eos.

Per client and rate it prints what a user of that client sees: the achieved rate (completed /
duration), TTFT p99 at the client, schedule lag p99 as tracetune reports it (vLLM's client does not
report lag) and as the server saw it for both clients (arrival i against an evenly spaced schedule;
this includes the server's own jitter), and failed requests. A client *holds* a rate when it
achieves >= 97% of it with no failures and a TTFT p99 <= 10 ms (the server answers in microseconds:
more is time the request spent queued in the client), and, where the client reports its schedule
lag, a lag p99 <= 2 ms. Then the highest rate each client holds and their ratio, and the scaling
of tracetune's --client-procs (where the machine has the cores). Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

from tracetune.engine_adapter.process import free_port  # noqa: E402

LAG_LIMIT_S = 0.002
TTFT_LIMIT_S = 0.010
HOLD_SHARE = 0.97


def cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def start_server(tokens: int, tmp: Path, cpus: list[int], procs: int) -> tuple[subprocess.Popen, int, Path]:
    port = free_port()
    arrivals = tmp / f"arrivals-{port}.txt"
    proc = subprocess.Popen(["taskset", "-c", ",".join(map(str, cpus)), sys.executable,
                             str(ROOT / "benchmarks" / "zero_latency_server.py"), str(port), str(arrivals),
                             str(tokens), str(procs)], stdout=subprocess.DEVNULL)
    import httpx
    for _ in range(200):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc, port, arrivals
        except httpx.HTTPError:
            time.sleep(0.05)
    raise RuntimeError("zero-latency server did not start")


def stop_server(proc: subprocess.Popen, arrivals: Path) -> np.ndarray:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    values: list[float] = []
    for path in [arrivals, *arrivals.parent.glob(arrivals.name + ".*")]:
        if path.exists():
            values += [float(x) for x in path.read_text().split()]
            path.unlink()
    return np.array(sorted(values))


def server_lag_p99(arrivals: np.ndarray, rate: float, n: int) -> float:
    """p99 of arrival lateness against an evenly spaced schedule, anchored on the request that
    arrived earliest relative to it (so no lag is negative and a late first request shifts nothing).
    vLLM's client sends one unscheduled test request first: extra leading arrivals are skipped."""
    if len(arrivals) < 2:
        return float("nan")
    a = arrivals[max(len(arrivals) - n, 0):]
    offset = a - np.arange(len(a)) / rate
    return float(np.percentile(offset - offset.min(), 99))


def write_trace(path: Path, rate: float, n: int, tokens: int) -> None:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"timestamp": i / rate, "prompt": "hello world", "output_length": tokens}) + "\n")


def run_tracetune(port: int, rate: float, n: int, tokens: int, tmp: Path, cpus: list[int], procs: int) -> dict:
    trace, out = tmp / f"trace-{rate:g}.jsonl", tmp / f"tt-{port}"
    write_trace(trace, rate, n, tokens)
    cmd = ["taskset", "-c", ",".join(map(str, cpus)), sys.executable, "-m", "tracetune", "replay",
           "--trace", str(trace), "--endpoint", f"http://127.0.0.1:{port}", "--served-model", "zero",
           "--warmup", "0", "--request-timeout", "60", "--client-procs", str(procs), "--out", str(out)]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "COLUMNS": "200"})
    if done.returncode != 0:
        raise RuntimeError(f"tune replay failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    s = json.loads((out / "summary.json").read_text())["summary"]
    return {"wall_s": time.perf_counter() - t0, "achieved": s["request_throughput_rps"]["value"],
            "ttft_p99": s["latency_s"]["ttft"]["p99"]["value"],
            "client_lag_p99": s["schedule_lag_s"].get("p99", float("nan")),
            "failed": s["errors"] + s.get("client_errors", 0), "overloaded": s.get("client_overloaded")}


def run_vllm_bench(port: int, rate: float, n: int, tokens: int, tmp: Path, tokenizer: str, cpus: list[int]) -> dict:
    dataset = tmp / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": "hello world", "output_tokens": tokens}) + "\n" for _ in range(n)))
    result = tmp / f"vllm-{port}.json"
    code = ("import argparse, sys\nfrom vllm.benchmarks import serve\n"
            "p = argparse.ArgumentParser(); serve.add_cli_args(p)\nserve.main(p.parse_args(sys.argv[1:]))\n")
    cmd = ["taskset", "-c", ",".join(map(str, cpus)), sys.executable, "-c", code,
           "--base-url", f"http://127.0.0.1:{port}", "--model", "zero", "--tokenizer", tokenizer,
           "--dataset-name", "custom", "--dataset-path", str(dataset), "--num-prompts", str(n),
           "--custom-output-len", str(tokens), "--skip-chat-template", "--disable-shuffle",
           "--request-rate", str(rate), "--burstiness", "inf", "--disable-tqdm", "--ignore-eos",
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "99",
           "--save-result", "--result-dir", str(tmp), "--result-filename", result.name]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"vllm bench failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    r = json.loads(result.read_text())
    return {"achieved": r["request_throughput"], "ttft_p99": r["p99_ttft_ms"] / 1000,
            "client_lag_p99": float("nan"), "failed": r.get("failed", n - r["completed"]), "overloaded": None}


def holds(row: dict, rate: float) -> bool:
    lag = row["client_lag_p99"]
    lag_ok = math.isnan(lag) or lag <= LAG_LIMIT_S  # NaN: the client does not report its lag
    return row["failed"] == 0 and row["achieved"] >= HOLD_SHARE * rate and row["ttft_p99"] <= TTFT_LIMIT_S and lag_ok


def measure(client: str, rate: float, args, tmp: Path, tokenizer: str, procs: int = 1) -> dict:
    all_cpus = cores()
    server_cpus = all_cpus[-args.server_cores:] if len(all_cpus) > 1 else all_cpus
    client_cpus = [c for c in all_cpus if c not in server_cpus][:procs] or all_cpus
    n = max(int(rate * args.seconds), 50)
    proc, port, arrivals_path = start_server(args.tokens, tmp, server_cpus, args.server_procs)
    try:
        if client == "tracetune":
            row = run_tracetune(port, rate, n, args.tokens, tmp, client_cpus, procs)
        else:
            row = run_vllm_bench(port, rate, n, args.tokens, tmp, tokenizer, client_cpus[:1])
    finally:
        arrivals = stop_server(proc, arrivals_path)
    row["server_lag_p99"] = server_lag_p99(arrivals, rate, n)
    return row


def line(client: str, rate: float, row: dict) -> str:
    return (f"{client:22s} offered {rate:7.0f}/s  achieved {row['achieved']:7.0f}/s  "
            f"TTFT p99 {row['ttft_p99'] * 1000:8.1f} ms  lag p99 {row['server_lag_p99'] * 1000:7.2f} ms (server)"
            f" {row['client_lag_p99'] * 1000:7.2f} ms (client)  failed {row['failed']:5d}"
            + ("  [client overloaded]" if row.get("overloaded") else "") + ("  holds" if holds(row, rate) else "")
            + (f"  ({row['wall_s']:.0f} s)" if "wall_s" in row else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="800,1600,2400,3200,4000,4800")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--client-procs", default="1",
                        help="tracetune process counts for the scaling curve, e.g. 1,2,4")
    parser.add_argument("--scaling-rates", default="", help="rates for the scaling curve (default: --rates)")
    parser.add_argument("--server-procs", type=int, default=1, help="server processes (SO_REUSEPORT)")
    parser.add_argument("--server-cores", type=int, default=1, help="cores kept for the server (the last ones)")
    parser.add_argument("--skip-vllm", action="store_true", help="tracetune only (no vLLM installed)")
    args = parser.parse_args()

    from tracetune.engine_adapter.models import prepare_default_model
    tokenizer = "" if args.skip_vllm else str(prepare_default_model())
    rates = [float(r) for r in args.rates.split(",")]
    print(f"{len(cores())} cores; server on {args.server_cores} ({args.server_procs} process(es)); "
          f"{args.tokens} output tokens a request; {args.seconds:g} s per rate", flush=True)
    best: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for rate in rates:
            for client in ("tracetune", "vllm-bench")[:1 if args.skip_vllm else 2]:
                row = measure(client, rate, args, tmp, tokenizer)
                print(line(client, rate, row), flush=True)
                if holds(row, rate):
                    best[client] = max(best.get(client, 0.0), rate)
        print(f"\nhighest rate held (>= {HOLD_SHARE:.0%} achieved, no failures, "
              f"TTFT p99 <= {TTFT_LIMIT_S * 1000:.0f} ms, "
              f"reported lag p99 <= {LAG_LIMIT_S * 1000:.0f} ms), one client process on one core:")
        for client in ("tracetune", "vllm-bench"):
            print(f"  {client:11s}: {best.get(client, 0.0):.0f} req/s")
        if best.get("vllm-bench"):
            print(f"  ratio      : {best.get('tracetune', 0.0) / best['vllm-bench']:.2f}x")
        procs_list = [int(p) for p in args.client_procs.split(",")]
        if procs_list != [1]:
            scaling_rates = [float(r) for r in (args.scaling_rates or args.rates).split(",")]
            print("\nscaling of tune replay --client-procs N (highest rate held):")
            for procs in procs_list:
                held = 0.0
                for rate in scaling_rates:
                    row = measure("tracetune", rate, args, tmp, tokenizer, procs)
                    print("  " + line(f"tracetune x{procs}", rate, row), flush=True)
                    if holds(row, rate):
                        held = max(held, rate)
                print(f"  --client-procs {procs}: {held:.0f} req/s", flush=True)


if __name__ == "__main__":
    main()
