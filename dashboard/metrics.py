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
    "spec_accepted_length": "maximize",  # tokens per verification step (speculative decoding)
    "capacity_scale": "maximize",  # the load factor k at the SLO
    "usd_per_1m_output_tokens": "minimize",  # at capacity, with the study's --gpu-hour-cost
    # quality in the units quantization is judged by (quality.probe), vs the reference
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
        "spec_accepted_length": ("mean accepted length (tokens per step)", 1.0),
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
    if name in ("spec_acceptance_rate", "spec_accepted_length"):
        return _num(speculation(engine)[0 if name == "spec_acceptance_rate" else 1])
    if name in ("capacity_scale", "usd_per_1m_output_tokens"):  # capacity.step's result
        return _num((capacity.capacity_of(summary) or {}).get(name))  # the cost: added by `with_costs`
    raise InputError(f"unknown metric {name!r}; choose from {sorted(METRICS)}")


def speculation(engine: dict | None) -> tuple[float | None, float | None]:
    """(acceptance rate, mean accepted length) from a run's stored engine counters, by the engine
    adapter's own definitions (`EngineMetrics`); (None, None) where nothing was drafted."""
    import dataclasses

    from tracetune.engine_adapter.metrics import EngineMetrics

    fields = {f.name for f in dataclasses.fields(EngineMetrics)}
    counters = EngineMetrics(**{k: _num(v) for k, v in (engine or {}).items()
                                if k in fields and not math.isnan(_num(v))})
    if counters.spec_decode_draft_tokens <= 0:
        return None, None
    length = counters.spec_decode_mean_accepted_length
    return counters.spec_decode_acceptance_rate, None if math.isnan(length) else length


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
    from tracetune.capacity.step import bracket_rps

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
        if factor == 100.0:  # a change, in percent
            return f"{value * 100:+.2f}%"
        return f"{value:.4g}"
    return str(value)


def display_interval(name: str, interval: tuple[float, float] | None) -> str:
    """`[270, 330] ms`: a 95% interval in the metric's display unit ("" without one)."""
    if interval is None:
        return ""
    low, high = (display_value(name, v) for v in interval)
    unit = " ms" if low.endswith(" ms") else ""
    return f"[{low.removesuffix(' ms')}, {high.removesuffix(' ms')}]{unit}"


# The quality units every page names, in this order (quality.probe's result; the export's words).
QUALITY_UNITS = (("ppl_change", "perplexity"), ("kld", "KLD"), ("top1_agreement", "top-1"))


def quality_text(quality: dict | None) -> str:
    """A stored quality result in the one vocabulary of tables, best.json and exports, each unit with
    its 95% interval: "perplexity +2.67% [+2.45%, +2.88%] · KLD 0.0120 [0.0108, 0.0132] · top-1 0.970
    [0.960, 0.980]" ("-" when not measured)."""
    parts = []
    for name, word in QUALITY_UNITS:
        entry = (quality or {}).get(name)
        if entry:
            interval = metric_interval(name, None, quality)
            shown = f" [{_unit_value(name, interval[0])}, {_unit_value(name, interval[1])}]" if interval else ""
            parts.append(f"{word} {_unit_value(name, entry['value'])}{shown}")
    return " · ".join(parts) or "-"


def _unit_value(name: str, value: float) -> str:
    if name == "ppl_change":
        return f"{value * 100:+.2f}%"
    return f"{value:.4f}" if name == "kld" else f"{value:.3f}"


def violations(summary: dict | None, quality: dict | None, slos: list[Any], gate: Any,
               constraints: list[float]) -> list[str]:
    """Why a measured run is outside the study's constraints, one line each: failed requests, each
    SLO it breaks or whose statistic its summary lacks, the quality gate (or the quality it lacks).
    `constraints`: the tuner's stored values (one per SLO, then the gate), named when nothing else
    explains them."""
    summary = summary or {}
    out = []
    if summary.get("error_rate"):
        out.append(f"{summary.get('errors', '?')} of {summary.get('requests', '?')} requests failed "
                   f"({_num(summary['error_rate']):.1%}): a measurement of the survivors only")
    for slo in slos:
        entry = ((summary.get("latency_s") or {}).get(slo.metric) or {}).get(slo.stat)
        value = _num((entry or {}).get("value"))
        if math.isnan(value):
            out.append(f"summary lacks {slo.metric}_{slo.stat} that the SLO {slo} names (measured before the SLO "
                       f"was set, or by an older tracetune)")
        elif value > slo.threshold_s:
            out.append(f"breaks the SLO {slo}: {slo.metric} {slo.stat} {value * 1000:.0f} ms")
    if gate is not None:
        lost = gate.violation(quality)
        if math.isinf(lost):
            out.append(f"quality not measured, and the quality gate {gate} needs it")
        elif lost > 0:
            out.append(f"outside the quality gate {gate}: {quality_text(quality)}")
    if not out:
        out = [f"constraint {i + 1} = {c:.4g} (> 0 breaks it)" for i, c in enumerate(constraints) if not c <= 0]
    return out or ["marked infeasible by the tuner, with no constraint stored"]
