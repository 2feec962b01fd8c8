"""Every metric a trial can be plotted, filtered, compared or picked by: its direction, label and
display unit, how it is read from a stored run (summary, quality, engine counters), and its 95%
interval."""

from __future__ import annotations

import math
from typing import Any

from tracetune.dashboard import capacity
from tracetune.errors import InputError
from tracetune.tuner.objectives import OBJECTIVES, objective_estimate, objective_value

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2e")
LATENCY_STATS = ("mean", "p50", "p90", "p99")
# Every metric a trial can be plotted, filtered or picked by, and which way is better: the tuner's
# objectives (tuner.objectives.OBJECTIVES: a new objective is one entry there), then what the
# dashboard shows besides.
METRICS: dict[str, str] = {
    **OBJECTIVES,
    "error_rate": "minimize", "prefix_cache_hit_rate": "maximize", "spec_acceptance_rate": "maximize",
    "capacity_scale": "maximize",  # the load factor k at the SLO
    "usd_per_1m_output_tokens": "minimize",  # at capacity, with the study's --gpu-hour-cost
    # quality in the units quantization is judged by (tuner.quality), vs the reference
    "kld": "minimize", "ppl_change": "minimize", "top1_agreement": "maximize",
}


def metric_label(name: str) -> tuple[str, float]:
    """Axis label and the factor that turns the stored value (SI units) into the shown one."""
    if name.split("_")[0] in LATENCY_METRICS and name.split("_")[-1] in LATENCY_STATS:
        return f"{name} (ms)", 1000.0
    return {
        "output_tps": ("output_tps (tokens/s)", 1.0), "request_tps": ("request_tps (req/s)", 1.0),
        "goodput": ("goodput (req/s meeting SLOs)", 1.0),
        "quality_loss": ("quality_loss (nats/token vs reference)", 1.0),
        "error_rate": ("error_rate", 1.0), "prefix_cache_hit_rate": ("prefix-cache hit rate", 1.0),
        "spec_acceptance_rate": ("speculative acceptance rate", 1.0),
        "capacity": ("capacity (req/s per GPU at the SLO)", 1.0),
        "capacity_scale": ("capacity_scale (x the trace's rate at the SLO)", 1.0),
        "usd_per_1m_output_tokens": ("$ per 1M output tokens at capacity", 1.0),
        "kld": ("KL divergence from the reference (nats/token, top-20)", 1.0),
        "ppl_change": ("perplexity change vs reference (%)", 100.0),
        "top1_agreement": ("top-1 agreement with the reference", 1.0),
    }.get(name, (name, 1.0))


def _num(value: Any) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    return out


def metric_value(name: str, summary: dict | None, quality: dict | None, engine: dict | None = None) -> float:
    """One metric of a measured run from its stored summary/quality/engine dicts (NaN when absent):
    an objective as the tuner reads it (`tuner.objectives.objective_value`), or one of the extras."""
    summary = summary or {}
    if name in OBJECTIVES:
        try:
            return _num(objective_value(name, summary, quality))
        except (KeyError, TypeError):
            return math.nan
    engine = engine if engine is not None else (summary.get("engine") or {})
    if name in ("kld", "ppl_change", "top1_agreement"):
        try:
            return _num(quality[name]["value"])
        except (KeyError, TypeError):
            return math.nan
    if name == "error_rate":
        return _num(summary.get("error_rate"))
    if name == "prefix_cache_hit_rate":
        return _num(engine.get("prefix_cache_hit_rate"))
    if name == "spec_acceptance_rate":
        return _num(engine.get("spec_decode_acceptance_rate"))
    if name in ("capacity_scale", "usd_per_1m_output_tokens"):  # replay.capacity's result
        return _num((capacity.capacity_of(summary) or {}).get(name))  # the cost: added by `with_costs`
    raise InputError(f"unknown metric {name!r}; choose from {sorted(METRICS)}")


def metric_interval(name: str, summary: dict | None, quality: dict | None) -> tuple[float, float] | None:
    """The 95% interval of a measured metric (capacity: its bracket per GPU, an open upper end read
    as the measured value); None for a metric measured without one."""
    summary = summary or {}
    try:
        if name == "capacity":
            return _capacity_interval(capacity.capacity_of(summary))
        if name in OBJECTIVES:  # read as the tuner reads it
            entry = objective_estimate(name, summary, quality)
        elif name in ("kld", "ppl_change", "top1_agreement"):
            entry = quality[name]
        else:
            return None
        low, high = _num(entry["ci_low"]), _num(entry["ci_high"])
    except (KeyError, TypeError):
        return None
    return None if math.isnan(low) or math.isnan(high) else (low, high)


def _capacity_interval(cap: dict | None) -> tuple[float, float] | None:
    from tracetune.replay.capacity import bracket_rps

    if not cap:
        return None
    low, high = bracket_rps(cap)
    gpus = max(int(cap.get("gpus") or 1), 1)
    return low / gpus, (low if high is None else high) / gpus


def display_value(name: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        _, factor = metric_label(name)
        if factor == 1000.0:
            return f"{value * 1000:.0f} ms"
        return f"{value:.4g}"
    return str(value)


def display_interval(name: str, interval: tuple[float, float] | None) -> str:
    """`[270, 330] ms`: a 95% interval in the metric's display unit ("" without one)."""
    if interval is None:
        return ""
    low, high = (display_value(name, v) for v in interval)
    unit = " ms" if low.endswith(" ms") else ""
    return f"[{low.removesuffix(' ms')}, {high.removesuffix(' ms')}]{unit}"
