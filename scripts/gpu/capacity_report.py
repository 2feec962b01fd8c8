"""Tables and summary.json for docs/results/h200.md's capacity study, from its database (stored xz).

    .venv/bin/python scripts/gpu/capacity_report.py    # prints markdown, writes docs/results/h200/summary.json

Every number comes from the stored trials: capacity and its bracket from each configuration's capacity
search, latency at the trace's own rate from its summary, attainment per load level from its steps.
Quality cannot be measured on the 8B shape's random weights; the quality of the knobs the best
configuration uses comes from study B (real SmolLM2 weights on the same H200, `study_b.db.xz`).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from replay.capacity import bracket_rps  # noqa: E402
from report import RESULTS, ms, open_store  # noqa: E402  (scripts/gpu/report.py, this script's neighbour)
from tuner.storage import REFERENCE_RUN  # noqa: E402
from tuner.study import config_diff  # noqa: E402

STUDY = "h200-cap"
GPU_HOUR_USD = 3.5  # the hourly price of one H200 assumed for $ per 1M output tokens


def fp8_weight_quality() -> dict:
    """fp8 weights' quality loss on real weights, from study B (trial with quantization=fp8 alone)."""
    store = open_store("study_b")
    for r in store.trials("h200-b"):
        c = r["config"] or {}
        if r["status"] == "measured" and c.get("quantization") == "fp8" and \
                (c.get("speculative") or {}).get("method", "none") == "none":
            nll = r["quality"]["nll_delta_per_token"]
            return {"source": f"study B trial {r['trial_number']} (SmolLM2-135M-Instruct, real weights, same H200)",
                    "knob": "weight_bits 8 (--quantization fp8)",
                    "nll_delta_nats_per_token": nll["value"], "interval": [nll["ci_low"], nll["ci_high"]],
                    "perplexity_change": math.exp(nll["value"]) - 1}
    return {}


def main() -> None:
    store = open_store("study_cap")
    ref = store.trials(STUDY, REFERENCE_RUN)[0]
    rows = [r for r in store.trials(STUDY) if r["status"] == "measured"]
    ref_cap = ref["summary"]["capacity"]
    print("| config | differs from vLLM's defaults | capacity req/s per GPU [bracket] | x defaults [bracket] | "
          "output tok/s at capacity | $ per 1M output tokens | TTFT p50 / p99 ms at 1x | TPOT p50 / p99 ms at 1x | "
          "engine start s |")
    print("|---|---|---|---|---|---|---|---|---|")
    ref_low, ref_high = bracket_rps(ref_cap)
    # The best: the highest capacity (its bracket's low end), the lower TTFT p99 among equals.
    best = max(rows, key=lambda r: (bracket_rps(r["summary"]["capacity"])[0],
                                    -r["summary"]["latency_s"]["ttft"]["p99"]["value"]))
    for label, r in [("reference", ref)] + [(f"trial {r['trial_number']}", r) for r in rows]:
        s, cap = r["summary"], r["summary"]["capacity"]
        low, high = bracket_rps(cap)
        diff = config_diff(r["config"], ref["config"]) if r is not ref else {}
        ratio = f"{low / ref_low:.2f} [{low / ref_high:.2f}, {high / ref_low:.2f}]" if r is not ref else "1"
        usd = GPU_HOUR_USD / (cap["capacity_output_tps"] * 3600) * 1e6
        L = s["latency_s"]
        print(f"| {label} | {', '.join(f'{k}={v}' for k, v in diff.items()) or '-'} | {low:.1f} [{low:.1f}, {high:.1f}] "
              f"| {ratio} | {cap['capacity_output_tps']:.0f} | {usd:.3f} | {ms(L['ttft']['p50'])} / {ms(L['ttft']['p99'])} "
              f"| {ms(L['tpot']['p50'])} / {ms(L['tpot']['p99'])} | {r['startup_s']:.0f} |")
    print("\nAttainment (share of requests within the SLO) per load level, in the order measured (r: a repeat):\n")
    for label, r in [("reference", ref)] + [(f"trial {r['trial_number']}", r) for r in rows]:
        steps = r["summary"]["capacity"]["steps"]
        cells = [f"{st['rps']:.1f} req/s {'<=' if st['abandoned'] else ''}{st['attainment']:.0%}"
                 f"{' r' if st['repeat'] else ''} {'pass' if st['passed'] else 'fail'}" for st in steps]
        print(f"- {label}: " + " · ".join(cells))
    quality = fp8_weight_quality()
    summary = {
        "slo": ref_cap["slo"], "attainment_target": ref_cap["attainment_target"],
        "trace": "scripts/gpu/data/azure_conv_600.jsonl (Azure 2023 conversation, 300 measured requests, x4 its rate)",
        "model": "Llama-3-8B shape, random weights (--load-format dummy)",
        "default_capacity_rps": ref_low, "default_capacity_bracket_rps": [ref_low, ref_high],
        "best_capacity_rps": bracket_rps(best["summary"]["capacity"])[0],
        "best_capacity_bracket_rps": list(bracket_rps(best["summary"]["capacity"])),
        "capacity_ratio": bracket_rps(best["summary"]["capacity"])[0] / ref_low,
        "capacity_ratio_bracket": [bracket_rps(best["summary"]["capacity"])[0] / ref_high,
                                   bracket_rps(best["summary"]["capacity"])[1] / ref_low],
        "best_trial": best["trial_number"], "best_config": config_diff(best["config"], ref["config"]),
        "best_quality_loss": quality, "gpus_per_replica": best["summary"]["capacity"]["gpus"],
        "gpu_hour_usd": GPU_HOUR_USD,
    }
    (RESULTS / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"\nwrote {RESULTS / 'summary.json'}: best trial {summary['best_trial']}, "
          f"{summary['capacity_ratio']:.2f}x the defaults' capacity")


if __name__ == "__main__":
    main()
