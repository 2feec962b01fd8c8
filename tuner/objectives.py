"""What a trial is judged by: every metric described once (`Metric`: name, direction, label, unit,
how it is read from a measured `Run`), the objectives among them, the constraints every trial reports
(failed requests, SLOs, the quality gate), and the samplers that see them."""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from tracetune.capacity.step import CapacityResult
from tracetune.engine_adapter.metrics import EngineMetrics
from tracetune.errors import InputError
from tracetune.quality.gate import OUTSIDE, QualityGate, cost_text
from tracetune.quality.probe import QualityResult
from tracetune.replay.metrics import METRICS, SLO, STATS, Estimate, Summary

if TYPE_CHECKING:
    import optuna

SAMPLERS = ("nsga2", "tpe", "gp", "random")
DEFAULT_SAMPLER = "gp"  # measured best by benchmarks/search_efficiency.py (README, "Benchmarks")


class Direction(enum.StrEnum):
    """Which way a metric is better (a str: Optuna and the stored study read the value)."""

    MINIMIZE = "minimize"
    MAXIMIZE = "maximize"


@dataclasses.dataclass(frozen=True)
class Run:
    """A measured run as its metrics read it: the replay's summary, the quality probe's result (None:
    not measured), the engine's counters (None: the summary's own) and the capacity search's result."""

    summary: Summary
    quality: QualityResult | None = None
    engine_counters: EngineMetrics | None = None

    @property
    def engine(self) -> EngineMetrics:
        return self.engine_counters or EngineMetrics.from_dict(self.summary.engine)

    @property
    def capacity(self) -> CapacityResult | None:
        """The capacity search's result, when the run was searched."""
        cap = self.summary.capacity
        return CapacityResult.from_dict(cap) if isinstance(cap, dict) and cap.get("steps") is not None else None


class Needs(enum.StrEnum):
    """What measuring a metric takes beyond replaying the trace at its own rate."""

    SLO = "slo"              # --slo: it counts requests meeting the SLO
    CAPACITY = "capacity"    # a capacity search (levels of load) on every configuration
    PROBE = "quality probe"  # the quality probe against the reference


@dataclasses.dataclass(frozen=True)
class Metric:
    """One metric, described once: its name, which way is better, its axis label, the factor from the
    stored SI value to the shown one (1000: shown in ms; 100: a change, shown in percent), how it is
    read from a run (an `Estimate` where it is measured with a 95% interval; None: not measured), its
    short unit, how the console writes a value (None: by its scale, ms or two decimals) and what
    measuring it takes (`Needs`)."""

    name: str
    direction: Direction
    label: str
    read: Callable[[Run], Estimate | float | None]
    scale: float = 1.0
    unit: str = ""
    text: Callable[[float], str] | None = None
    needs: tuple[Needs, ...] = ()

    def shown(self, value: float) -> str:
        """A value as the console's tables and lines write it ("-" where not measured)."""
        if math.isnan(value):
            return "-"
        if self.text is not None:
            return self.text(value)
        return f"{value * 1000:.0f} ms" if self.scale == 1000.0 else f"{value:.2f}"

    def estimate(self, run: Run) -> Estimate | None:
        """The stored estimate the metric is read from (None: not measured, or not an estimate)."""
        read = self.read(run)
        return read if isinstance(read, Estimate) else None

    def value(self, run: Run) -> float:
        """The metric's value (NaN where it was not measured)."""
        read = self.read(run)
        return math.nan if read is None else read.value if isinstance(read, Estimate) else float(read)


def _latency(metric: str, stat: str) -> Metric:
    return Metric(f"{metric}_{stat}", Direction.MINIMIZE, f"{metric}_{stat} (ms)",
                  lambda run: run.summary.estimate(metric, stat), scale=1000.0)


def _capacity_per_gpu(run: Run) -> float:
    cap = run.capacity
    return cap.capacity_rps_per_gpu if cap else math.nan


# The tuner's objectives: latency at the trace's rate (the vocabulary of `replay.metrics`: METRICS x STATS),
# throughput, goodput and capacity at the SLO, quality loss. A new objective is one entry here.
OBJECTIVE_METRICS: tuple[Metric, ...] = (
    *(_latency(m, s) for m in METRICS for s in STATS),
    Metric("output_tps", Direction.MAXIMIZE, "output_tps (tokens/s)", lambda run: run.summary.output_throughput_tps,
           unit="tok/s"),
    Metric("request_tps", Direction.MAXIMIZE, "request_tps (req/s)", lambda run: run.summary.request_throughput_rps,
           unit="req/s"),
    Metric("goodput", Direction.MAXIMIZE, "goodput (req/s meeting SLOs)", lambda run: run.summary.goodput_rps,
           unit="req/s", needs=(Needs.SLO,)),
    # requests/s per GPU at the SLO (capacity.step); its interval is its bracket, not an estimate
    Metric("capacity", Direction.MAXIMIZE, "capacity (req/s per GPU at the SLO)", _capacity_per_gpu,
           unit="req/s/GPU", text=lambda v: f"{v:.3g} req/s", needs=(Needs.SLO, Needs.CAPACITY)),
    # nats per token, shown as the perplexity change it means
    Metric("quality_loss", Direction.MINIMIZE, "quality_loss (nats/token vs reference)",
           lambda run: run.quality.nll_delta_per_token if run.quality else None,
           text=lambda v: f"ppl {math.expm1(v) * 100:+.2f}%", needs=(Needs.PROBE,)),
)
OBJECTIVE_METRIC: dict[str, Metric] = {m.name: m for m in OBJECTIVE_METRICS}
OBJECTIVES: dict[str, str] = {m.name: m.direction.value for m in OBJECTIVE_METRICS}


def parse_objectives(spec: str | None, *, has_slo: bool) -> list[str]:
    """`ttft_p99,output_tps,quality_loss` -> names. Default: latency at the trace's own rate,
    capacity at the SLO (with --slo; throughput at the trace's rate without), quality loss."""
    if not spec:
        return ["ttft_p99", "capacity" if has_slo else "output_tps", "quality_loss"]
    names = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n not in OBJECTIVES]
    if unknown:
        raise InputError(f"--objectives: unknown {unknown}; choose from {sorted(OBJECTIVES)}")
    for name in names:
        if Needs.SLO in OBJECTIVE_METRIC[name].needs and not has_slo:
            raise InputError(f"--objectives {name} needs --slo (it counts requests meeting the SLO), "
                             f"e.g. --slo 'ttft:p99<2s,tpot:p99<100ms'")
    if len(set(names)) != len(names):
        raise InputError("--objectives: each objective once")
    return names


def needs(objectives: list[str], what: Needs) -> bool:
    """Whether measuring `objectives` takes `what` (a capacity search, the quality probe, an SLO)."""
    return any(what in OBJECTIVE_METRIC[o].needs for o in objectives if o in OBJECTIVE_METRIC)


def objective_estimate(name: str, summary: Summary, quality: QualityResult | None) -> Estimate | None:
    """The stored estimate an objective is read from; None where it was not measured (goodput without
    --slo, quality without a probe) or is not an estimate (capacity: its interval is its bracket)."""
    return OBJECTIVE_METRIC[name].estimate(Run(summary, quality))


def objective_value(name: str, summary: Summary, quality: QualityResult | None) -> float:
    """One objective from a trial's summary and quality (NaN where it was not measured)."""
    if name not in OBJECTIVE_METRIC:
        raise KeyError(name)
    return OBJECTIVE_METRIC[name].value(Run(summary, quality))


def constraint_values(summary: Summary, quality: QualityResult | None, slos: list[SLO],
                      max_quality_loss: QualityGate | float | None) -> list[float]:
    """<= 0 means satisfied (Optuna's convention): one per SLO, one for the quality gate."""
    out = []
    for slo in slos:
        # A summary holds every statistic its SLOs name (replay.metrics.stats_of); NaN: an older one did not.
        estimate = summary.estimate(slo.metric, slo.stat)
        value = math.nan if estimate is None else estimate.value
        out.append(value - slo.threshold_s if not math.isnan(value) else math.inf)
    if max_quality_loss is not None:
        out.append(as_gate(max_quality_loss).violation(quality.as_dict() if quality else None))
    return out


def as_gate(max_quality_loss: QualityGate | float) -> QualityGate:
    """A study's gate (a plain number: nats)."""
    return max_quality_loss if isinstance(max_quality_loss, QualityGate) else QualityGate("nats", max_quality_loss)


def outside_gate(quality: QualityResult | None, max_quality_loss: QualityGate | float | None) -> str:
    """The quality gate's words on a measured quality whose whole 95% interval lies past its limit, e.g.
    "outside the quality gate ppl<=+1% at +3.2% perplexity [+2.9%, +3.4%] (KLD ...)"; "" for one within it,
    undecided, not measured, or a study without a gate. Such a configuration is infeasible whatever
    else it measures."""
    if quality is None or max_quality_loss is None:
        return ""
    stored = quality.as_dict()
    decision = as_gate(max_quality_loss).decide(stored)
    return f"{decision.text()} at {cost_text(stored)}" if decision.word == OUTSIDE else ""


def feasible(error_rate: float, constraints: list[float]) -> bool:
    """A measured run keeps within the study's constraints: no failed request, each constraint <= 0."""
    return error_rate == 0 and all(c <= 0 for c in constraints)


def keeps_slos(summary: Summary | None, slos: list[SLO]) -> bool:
    """A run judged by the rule that makes a trial feasible, the quality gate aside: no failed request
    and every SLO kept (the reference's rule, its quality loss being 0; a trial's at the trace's rate
    before its capacity search). True while not measured."""
    if summary is None:
        return True
    return feasible(summary.error_rate or 0.0, constraint_values(summary, None, slos, None))


# Violation given to a trial whose engine could not serve: every constraint at once. (A finite
# number: GPSampler fits a model to constraint values, and inf would break it.)
FAILED_VIOLATION = 1.0


def constraint_names(slos: list[SLO], max_quality_loss: QualityGate | float | None) -> list[str]:
    """The constraints every trial reports to the sampler, in order: the share of requests that
    failed (1.0 when the engine could not start, crashed or timed out, or the config was
    rejected), then one per SLO, then the quality gate."""
    return ["failed_requests"] + [f"slo {s}" for s in slos] + (["quality_gate"] if max_quality_loss is not None else [])


def sampler_constraints(trial: optuna.trial.FrozenTrial, n_constraints: int) -> list[float]:
    """The constraint values stored on a finished trial (<= 0 feasible)."""
    from tracetune.tuner.trial_record import Attr, TrialRecord

    stored = trial.user_attrs.get(Attr.SAMPLER_CONSTRAINTS)
    if stored is not None:
        return list(stored)
    user = list(TrialRecord.of(trial).constraints or [])  # a measured trial from an older tracetune
    return ([0.0] + user + [FAILED_VIOLATION] * n_constraints)[:n_constraints]


def _has_set_constraint() -> bool:
    import optuna

    return hasattr(optuna.trial.Trial, "set_constraint")


def set_constraints(trial: optuna.Trial, names: list[str], values: list[float]) -> None:
    """Record a trial's constraints where its sampler reads them: `Trial.set_constraint` on
    Optuna >= 5 (`constraints_func` is deprecated there), a user attribute that the
    `constraints_func` of `make_sampler` returns on Optuna 4."""
    from tracetune.tuner.trial_record import Attr

    trial.set_user_attr(Attr.SAMPLER_CONSTRAINTS.value, list(values))
    if _has_set_constraint():
        for name, value in zip(names, values):
            trial.set_constraint(name, value)


def startup_trials(space_size: float) -> int:
    """Trials a model-based sampler proposes at random before it models the results: Optuna's 10 on a
    large space, fewer on a small one (a 48-configuration space: 3), where the informed first trials
    (the reference, presets) already spread the start."""
    return 10 if space_size >= 160 else max(2, math.ceil(space_size / 16))


def make_sampler(name: str, seed: int | None, n_constraints: int = 1, *, n_startup: int = 10):
    """An Optuna sampler that sees every trial's constraints, so infeasible trials (failed
    engines, failed requests, violated SLOs) steer the search away instead of being dropped.
    `n_startup`: random trials before TPE or GP model the results (`startup_trials`); NSGA-II's first
    generation is as large, at least 4."""
    import optuna

    def constraints(trial: optuna.trial.FrozenTrial) -> list[float]:
        return sampler_constraints(trial, n_constraints)

    func = None if _has_set_constraint() else constraints
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, min(8, n_startup)),
                                             constraints_func=func)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup, constraints_func=func)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=n_startup, constraints_func=func)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise InputError(f"--sampler must be one of {SAMPLERS}, got {name!r}")


def penalty_values(study: optuna.Study, objectives: list[str], reference_values: list[float] | None) -> list[float]:
    """Objective values reported for a trial that produced no measurement: the worst value
    measured so far in the study (the reference's included) for each minimised objective, 0 for
    maximised ones (an engine that does not serve delivers no throughput)."""
    import optuna

    from tracetune.tuner.storage import Status
    from tracetune.tuner.trial_record import TrialRecord

    measured = [t.values for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
                if TrialRecord.of(t).status == Status.MEASURED and t.values]
    if reference_values:
        measured.append(reference_values)
    out = []
    for i, name in enumerate(objectives):
        if OBJECTIVES[name] == "maximize":
            out.append(0.0)
        else:
            seen = [v[i] for v in measured if i < len(v) and math.isfinite(v[i])]
            out.append(max(seen + [0.0]))
    return out
