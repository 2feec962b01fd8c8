"""Every metric a trial can be plotted, filtered, compared or picked by: its direction, label and
display unit, how it is read from a stored run (summary, quality, engine counters), and its 95%
interval."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from tracetune.capacity.step import CapacityResult
from tracetune.engine_adapter.metrics import EngineMetrics
from tracetune.errors import InputError
from tracetune.quality.gate import QualityGate
from tracetune.quality.probe import QualityResult, StoredQuality
from tracetune.replay.acceptance import stored_acceptance
from tracetune.replay.metrics import SLO, Estimate, Summary
from tracetune.tuner.objectives import OBJECTIVE_METRICS, Direction, Metric, Run


# Every metric a trial can be plotted, filtered or picked by (`tuner.objectives.Metric`): the tuner's
# objectives (`OBJECTIVE_METRICS`: a new objective is one entry there), then what the dashboard shows besides.
def _capacity_scale(run: Run) -> float | None:
    cap = run.capacity
    return (cap.capacity_scale or 0.0) if cap else None


def _cost(run: Run) -> float | None:  # added by `dashboard.data.with_costs`, from the study's --gpu-hour-cost
    cap = run.capacity
    return cap.usd_per_1m_output_tokens if cap else None


def _natural_rate(run: Run) -> float | None:
    """Draft acceptance with natural stops on the trace's prompts (`replay.acceptance`; None: no probe)."""
    acceptance = stored_acceptance(run.summary.acceptance)
    return acceptance.natural.rate if acceptance is not None else None


def _quality(name: str) -> Callable[[Run], Estimate | None]:
    return lambda run: getattr(run.quality, name) if run.quality else None


EXTRA_METRICS: tuple[Metric, ...] = (
    Metric("error_rate", Direction.MINIMIZE, "error_rate", lambda run: run.summary.error_rate),
    Metric("prefix_cache_hit_rate", Direction.MAXIMIZE, "prefix-cache hit rate",
           lambda run: run.engine.prefix_cache_hit_rate),
    Metric("spec_acceptance_rate", Direction.MAXIMIZE, "speculative acceptance rate",
           lambda run: speculation(run.engine)[0]),
    # tokens per verification step (speculative decoding)
    Metric("spec_accepted_length", Direction.MAXIMIZE, "mean accepted length (tokens per step)",
           lambda run: speculation(run.engine)[1]),
    # the acceptance probe's: stopped where the model stops, not forced to the recorded lengths as the replay is
    Metric("spec_natural_rate", Direction.MAXIMIZE, "acceptance, natural stops", _natural_rate),
    Metric("capacity_scale", Direction.MAXIMIZE, "capacity_scale (x the trace's rate at the SLO)", _capacity_scale),
    Metric("usd_per_1m_output_tokens", Direction.MINIMIZE, "$ per 1M output tokens at capacity", _cost),
    # quality in the units quantization is judged by (quality.probe), vs the reference
    Metric("kld", Direction.MINIMIZE, "KL divergence from the reference (nats/token, top-20)", _quality("kld")),
    Metric("ppl_change", Direction.MINIMIZE, "perplexity change vs reference (%)", _quality("ppl_change"),
           scale=100.0),
    Metric("top1_agreement", Direction.MAXIMIZE, "top-1 agreement with the reference", _quality("top1_agreement")),
)
METRIC: dict[str, Metric] = {m.name: m for m in (*OBJECTIVE_METRICS, *EXTRA_METRICS)}
# Which way each metric is better.
METRICS: dict[str, str] = {name: m.direction.value for name, m in METRIC.items()}


def metric_label(name: str) -> tuple[str, float]:
    """Axis label and the factor that turns the stored value (SI units) into the shown one."""
    metric = METRIC.get(name)
    return (metric.label, metric.scale) if metric else (name, 1.0)


def run_of(summary: Summary | None, quality: StoredQuality | None = None,
           engine: EngineMetrics | None = None) -> Run | None:
    """A stored run (its summary, quality and engine counters as read back) as its metrics read it;
    None without a summary. A quality result this version cannot read counts as not measured."""
    if summary is None:
        return None
    try:
        typed_quality = _quality_of(quality) if quality else None
    except (KeyError, TypeError, ValueError):
        typed_quality = None
    return Run(summary, typed_quality, engine)


def _quality_of(stored: StoredQuality) -> QualityResult | None:
    """A stored quality result as `QualityResult` (`from_dict` reads an estimate without its interval,
    an older study's, with a NaN interval, a count it lacks as 0); None without its NLL increase."""
    return QualityResult.from_dict(stored) if stored.get("nll_delta_per_token") else None


def metric_value(name: str, run: Run | None) -> float:
    """One metric of a measured run (NaN when absent), read as the tuner reads it (`tuner.objectives.Metric`)."""
    if name not in METRIC:
        raise InputError(f"unknown metric {name!r}; choose from {sorted(METRICS)}")
    return METRIC[name].value(run) if run is not None else math.nan


def speculation(engine: EngineMetrics | None) -> tuple[float | None, float | None]:
    """(acceptance rate, mean accepted length) from a run's engine counters, by the engine adapter's
    own definitions (`EngineMetrics`); (None, None) where nothing was drafted."""
    if engine is None or engine.spec_decode_draft_tokens <= 0:
        return None, None
    length = engine.spec_decode_mean_accepted_length
    return engine.spec_decode_acceptance_rate, None if math.isnan(length) else length


def metric_interval(name: str, run: Run | None) -> tuple[float, float] | None:
    """The 95% interval of a measured metric (capacity: its bracket per GPU, an open upper end read
    as the measured value); None for a metric measured without one."""
    if run is None or name not in METRIC:
        return None
    if name == "capacity":
        return _capacity_interval(run.capacity)
    estimate = METRIC[name].estimate(run)
    if estimate is None or math.isnan(estimate.low) or math.isnan(estimate.high):
        return None
    return estimate.low, estimate.high


def _capacity_interval(cap: CapacityResult | None) -> tuple[float, float] | None:
    if cap is None:
        return None
    low, high = cap.bracket_rps()
    gpus = max(cap.gpus, 1)
    return low / gpus, (low if high is None else high) / gpus


def display_value(name: str, value: float | str | None) -> str:
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


def quality_text(quality: StoredQuality | None) -> str:
    """A stored quality result in the one vocabulary of tables, best.json and exports, each unit with
    its 95% interval: "perplexity +2.67% [+2.45%, +2.88%] · KLD 0.0120 [0.0108, 0.0132] · top-1 0.970
    [0.960, 0.980]" ("-" when not measured)."""
    parts = []
    for name, word in QUALITY_UNITS:
        entry = (quality or {}).get(name)
        if entry:
            est = Estimate.from_dict(entry)
            shown = "" if math.isnan(est.low) or math.isnan(est.high) else \
                f" [{_unit_value(name, est.low)}, {_unit_value(name, est.high)}]"
            parts.append(f"{word} {_unit_value(name, est.value)}{shown}")
    return " · ".join(parts) or "-"


def _unit_value(name: str, value: float) -> str:
    if name == "ppl_change":
        return f"{value * 100:+.2f}%"
    return f"{value:.4f}" if name == "kld" else f"{value:.3f}"


def violations(summary: Summary | None, quality: StoredQuality | None, slos: Sequence[SLO], gate: QualityGate | None,
               constraints: list[float]) -> list[str]:
    """Why a measured run is outside the study's constraints, one line each: failed requests, each
    SLO it breaks or whose statistic its summary lacks, the quality gate (or the quality it lacks).
    `constraints`: the tuner's stored values (one per SLO, then the gate), named when nothing else
    explains them."""
    out = []
    if summary is not None and summary.error_rate:
        out.append(f"{summary.errors} of {summary.requests} requests failed "
                   f"({summary.error_rate:.1%}): a measurement of the survivors only")
    for slo in slos:
        estimate = summary.estimate(slo.metric, slo.stat) if summary is not None else None
        value = math.nan if estimate is None else estimate.value
        if math.isnan(value):
            out.append(f"summary lacks {slo.metric}_{slo.stat} that the SLO {slo} names (measured before the SLO "
                       f"was set, or by an older tracetune)")
        elif value > slo.threshold_s:
            out.append(f"breaks the SLO {slo}: {slo.metric} {slo.stat} {value * 1000:.0f} ms")
    if gate is not None:
        decision = gate.decide(quality)  # the gate reads the interval: outside, or undecided
        if decision.measured is None:
            out.append(f"quality not measured, and the quality gate {gate} needs it")
        elif not decision.within:
            out.append(f"{decision.text()}" + (f": {quality_text(quality)}" if decision.word == "outside" else ""))
    if not out:
        out = [f"constraint {i + 1} = {c:.4g} (> 0 breaks it)" for i, c in enumerate(constraints) if not c <= 0]
    return out or ["marked infeasible by the tuner, with no constraint stored"]
