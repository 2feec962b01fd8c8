"""vLLM and llama.cpp side by side on one machine: each engine's defaults and a configuration of
each, measured the same way (issue #34).

For each configuration one real server is started (through its engine's `EngineKind`, as a study
starts it) and measured while it serves:
- output tokens/s with 1 and with 8 closed-loop clients (prompts from the trace, every request
  OUTPUT_TOKENS tokens), the median of 3 repeats with their range, and TPOT p50;
- capacity at the SLO: `tune capacity --endpoint` against the running server, with its bracket;
- quality against vLLM's defaults (the study's reference), by the study's own probe: the reference
  texts are sampled and scored on vLLM's defaults first, then every configuration scores them
  (llama.cpp through its own scoring path; `--no-quality` skips it).

    python benchmarks/engines.py                          # the four default rows (long: see below)
    python benchmarks/engines.py --config "llama.cpp Q4_K_M:llamacpp:weight_format=Q4_K_M,parallel_slots=8"

Results go to benchmarks/data/engines_cpu.json (--out) with the machine, date and versions.
The capacity searches take most of the time: on 2 cores (2026-12-04) vLLM's defaults' row ran 12
minutes and its capacity search was still going after 9 of them; `--no-capacity` skips the searches.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTPUT_TOKENS = 128
SLO = "ttft:p95<2s,tpot:p95<200ms"  # the quickstart's (scripts/quickstart.sh says why)
# label:engine:knob=value,... ("defaults": the engine's own defaults, as a study's reference row)
DEFAULT_CONFIGS = (
    "vLLM defaults:vllm:defaults",
    "llama.cpp defaults:llamacpp:defaults",
    "vLLM 8-bit W8A8, 16 seqs:vllm:weight_bits=8,max_num_seqs=16",
    "llama.cpp Q8_0, 8 slots:llamacpp:weight_format=Q8_0,parallel_slots=8",
)


def parse_config(text: str) -> tuple[str, str, dict[str, object] | None]:
    """'label:engine:k=v,...' -> (label, engine, values); values None for the engine's defaults."""
    label, engine, spec = text.rsplit(":", 2)
    if spec == "defaults":
        return label, engine, None
    values: dict[str, object] = {}
    for pair in spec.split(","):
        key, _, raw = pair.partition("=")
        values[key] = int(raw) if raw.lstrip("-").isdigit() else raw
    return label, engine, values


def engine_config(engine: str, values: dict[str, object] | None, model: Path, eager: bool):
    """The engine's settings for `values` (its defaults for None), made ready (GGUFs, checkpoints)."""
    from tracetune.engine_adapter.platform import detect_platform
    from tracetune.engine_adapter.registry import engine_kind

    kind = engine_kind(engine)
    fixed = {"enforce_eager": True} if eager and engine == "vllm" else {}
    assert kind.reference is not None and kind.translate is not None and kind.make_checkpoint is not None
    if values is None:
        config = kind.reference(fixed=fixed, model_dir=model)
    else:
        factory = kind.make_checkpoint
        config = kind.translate(values, fixed=fixed, platform=detect_platform(), model_dir=model,
                                make_checkpoint=lambda scheme: factory(model, scheme, print))
    return kind, kind.prepare(config, print) if kind.prepare else config


def throughput(server, prompts: list[str], clients: int, requests: int, repeats: int) -> dict:
    """Output tokens/s and TPOT p50 of `clients` closed-loop clients, measured `repeats` times:
    the median and the range of the repeats (one replay's own interval is over its seconds, and a
    closed loop of a few requests has too few of them)."""
    from tracetune.replay.metrics import summarize
    from tracetune.replay.send import replay
    from tracetune.replay.types import PreparedRequest, ReplayOptions

    todo = [PreparedRequest(index=i, id=str(i), scheduled_s=0.0, max_tokens=OUTPUT_TOKENS,
                            prompt=prompts[i % len(prompts)]) for i in range(requests)]
    options = ReplayOptions(mode="closed", concurrency=clients, warmup_requests=min(clients, 2))
    tps, tpots, failed = [], [], 0
    for _ in range(repeats):
        summary = summarize(replay(server.endpoint.base_url, server.endpoint.model, todo, options, engine=server))
        tps.append(summary.output_throughput_tps.value)
        tpot = summary.latency.get("tpot", {}).get("p50")
        tpots += [] if tpot is None else [tpot.value]
        failed += summary.requests - summary.succeeded
    return {"clients": clients, "requests": requests, "repeats": repeats, "failed": failed,
            "output_tps": _spread(tps), "tpot_p50_s": _spread(tpots) if tpots else None}


def _spread(values: list[float]) -> dict:
    return {"value": statistics.median(values), "ci_low": min(values), "ci_high": max(values), "runs": values}


def capacity(server, trace: Path, precision: float, level_args: list[str]) -> dict:
    """`tune capacity --endpoint` against the running server: the capacity and its bracket."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "capacity.json"
        cmd = [sys.executable, "-m", "tracetune", "capacity", "--endpoint", server.endpoint.base_url,
               "--served-model", server.endpoint.model, "--trace", str(trace), "--slo", SLO,
               "--precision", str(precision), *level_args, "--json", str(out), "--out", str(Path(tmp) / "run")]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if done.returncode != 0 or not out.exists():
            return {"error": (done.stderr or done.stdout)[-400:]}
        data = json.loads(out.read_text())
    keys = ("capacity_rps", "bracket_rps", "capacity_scale", "verdict", "reason")
    return {k: data[k] for k in keys if k in data} or data


def quality(server, reference):
    """The study's probe on this server against the reference texts (None: not measured)."""
    from tracetune.quality.probe import measure_candidate

    try:
        return measure_candidate(server.endpoint, reference, scoring=server.scoring).as_dict()
    except Exception as exc:  # an engine that cannot score says why; the row keeps its speed numbers
        return {"error": str(exc)[:300]}


def measure(label: str, engine: str, values, args, model: Path, prompts: list[str], probe) -> tuple[dict, object]:
    from tracetune.quality.probe import measure_reference, probe_prompts
    from tracetune.replay.trace import load_trace

    kind, config = engine_config(engine, values, model, args.eager)
    server = kind.make(args.run_dir / label.replace(" ", "_").replace(",", ""))
    row: dict = {"label": label, "engine": engine, "values": values or "defaults",
                 "config": json.loads(config.model_dump_json())}
    try:
        row["startup_s"] = server.launch(config, timeout_s=900)
        print(f"{label}: serving after {row['startup_s']:.0f} s", flush=True)
        row["throughput"] = [throughput(server, prompts, n, max(args.requests, 2 * n), args.repeats) for n in (1, 8)]
        if args.quality and probe is None and values is None and engine == "vllm":
            texts = probe_prompts(load_trace(args.trace), args.probe_prompts)
            probe = measure_reference(server.endpoint, texts, max_tokens=args.probe_tokens)
        if args.quality and probe is not None:
            row["quality"] = quality(server, probe)
        if args.capacity:
            row["capacity"] = capacity(server, args.trace, args.precision, args.level_args.split())
    finally:
        server.stop()
    print(line(row), flush=True)
    return row, probe


def _tps(row: dict, clients: int) -> str:
    for t in row.get("throughput", []):
        if t["clients"] == clients:
            e = t["output_tps"]
            return f"{e['value']:.1f} [{e['ci_low']:.1f}, {e['ci_high']:.1f}]"
    return "-"


def _quality(row: dict) -> str:
    q = row.get("quality")
    if not q:
        return "-"
    if "error" in q:
        return "not measured"
    ppl = q.get("ppl_change") or {}
    return f"ppl {ppl.get('value', 0):+.2%} [{ppl.get('ci_low', 0):+.2%}, {ppl.get('ci_high', 0):+.2%}]" if ppl else "-"


def _capacity(row: dict) -> str:
    c = row.get("capacity") or {}
    if "capacity_rps" not in c:
        return "-" if not c else "failed"
    bracket = c.get("bracket_rps") or []
    inside = f" [{bracket[0]:.2f}, {bracket[1]:.2f}]" if len(bracket) == 2 and None not in bracket else ""
    return f"{c['capacity_rps']:.2f}{inside}"


def line(row: dict) -> str:
    return (f"  {row['label']:<34} 1 client {_tps(row, 1):>20} tok/s  8 clients {_tps(row, 8):>20} tok/s  "
            f"capacity {_capacity(row)} req/s  {_quality(row)}")


def table(rows: list[dict]) -> str:
    """Side by side, with each row's 8-client tok/s and capacity as a ratio to vLLM's defaults."""
    ref = next((r for r in rows if r["engine"] == "vllm" and r["values"] == "defaults"), None)

    def ratio(row: dict, read) -> str:
        a, b = read(row), read(ref) if ref else None
        return f"{a / b:.2f}x" if a and b else "-"

    def tps8(row: dict) -> float | None:
        return next((t["output_tps"]["value"] for t in row.get("throughput", []) if t["clients"] == 8), None)

    def cap(row: dict) -> float | None:
        return (row.get("capacity") or {}).get("capacity_rps")

    lines = []
    for row in rows:
        lines += [f"{row['label']}",
                  f"  output tok/s, 1 client : {_tps(row, 1)}",
                  f"  output tok/s, 8 clients: {_tps(row, 8)}  ({ratio(row, tps8)} vLLM's defaults)",
                  f"  capacity at {SLO}: {_capacity(row)} req/s  ({ratio(row, cap)})",
                  f"  quality vs vLLM's defaults: {_quality(row)}"]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", action="append", metavar="LABEL:ENGINE:K=V,...",
                   help="a configuration to measure (repeatable; default: the four rows in DEFAULT_CONFIGS)")
    p.add_argument("--trace", type=Path, default=ROOT / "examples" / "chat.jsonl")
    p.add_argument("--requests", type=int, default=16, help="requests per throughput measurement (at least)")
    p.add_argument("--repeats", type=int, default=3, help="throughput measurements per load (median, range)")
    p.add_argument("--precision", type=float, default=0.1, help="capacity bracket precision")
    p.add_argument("--level-args", default="", metavar="ARGS",
                   help="more `tune capacity` options for the load levels, e.g. the quickstart's "
                        "'--level-requests 60 --level-lifetimes 3'")
    p.add_argument("--eager", action=argparse.BooleanOptionalAction, default=True,
                   help="vLLM in eager mode, as the quickstart runs it (default on)")
    p.add_argument("--quality", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--capacity", action=argparse.BooleanOptionalAction, default=True,
                   help="capacity at the SLO (--no-capacity: tok/s and quality only, minutes less)")
    p.add_argument("--probe-prompts", type=int, default=16)
    p.add_argument("--probe-tokens", type=int, default=256)
    p.add_argument("--run-dir", type=Path, default=ROOT / "runs" / "engines")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "data" / "engines_cpu.json")
    args = p.parse_args()

    from tracetune.engine_adapter.models import prepare_default_model
    from tracetune.replay.trace import load_trace

    model = prepare_default_model(print)
    prompts = [r.prompt for r in load_trace(args.trace).records if r.prompt]
    configs = [parse_config(c) for c in (args.config or DEFAULT_CONFIGS)]
    rows, probe = [], None
    for label, engine, values in configs:
        row, probe = measure(label, engine, values, args, model, prompts, probe)
        rows.append(row)
    print(table(rows))
    args.out.write_text(json.dumps({
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {"cpu": _cpu_name(), "cores": len(os.sched_getaffinity(0)), "python": platform.python_version()},
        "trace": str(args.trace.relative_to(ROOT)) if args.trace.is_relative_to(ROOT) else str(args.trace),
        "slo": SLO, "precision": args.precision, "level_args": args.level_args, "output_tokens": OUTPUT_TOKENS,
        "vllm_eager": args.eager, "model": model.name,
        "rows": rows}, indent=2))
    print(f"wrote {args.out}")
    return 0


def _cpu_name() -> str:
    for text in Path("/proc/cpuinfo").read_text().splitlines():
        if text.startswith("model name"):
            return text.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


if __name__ == "__main__":
    raise SystemExit(main())
