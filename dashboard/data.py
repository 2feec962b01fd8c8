"""Data shaping for the dashboard and exports: plain functions over a study's storage, no Streamlit.

The dashboard only reads: the Optuna study (objectives, directions, SLOs, per-trial state and
constraints) and tracetune's result tables (config, summary, every request record, engine counters,
quality, failure reason and log tail). Everything a page shows is computed here so it can be tested
without a browser.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import warnings
from pathlib import Path
from typing import Any, Iterable, Sequence

from dashboard import capacity
from engine_adapter.errors import InputError
# The tuner's one dominance rule (also on the plotted axes), front decision and cost arithmetic.
from tuner.front import REFERENCE, Candidate, decide, dominates, economics, hypervolume
from tuner.quality import floor_estimates, floor_text
from tuner.storage import REFERENCE_RUN

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2e")
LATENCY_STATS = ("mean", "p50", "p90", "p99")
# Every metric a trial can be plotted, filtered or picked by, and which way is better. The names are
# the tuner's objective names (tuner.objectives.OBJECTIVES) so `--objectives` and `--pick` agree.
METRICS: dict[str, str] = {
    **{f"{m}_{s}": "minimize" for m in LATENCY_METRICS for s in LATENCY_STATS},
    "output_tps": "maximize", "request_tps": "maximize", "goodput": "maximize", "quality_loss": "minimize",
    "error_rate": "minimize", "prefix_cache_hit_rate": "maximize", "spec_acceptance_rate": "maximize",
    "capacity": "maximize", "capacity_scale": "maximize",  # at the SLO: req/s per GPU, and the load factor k
    "usd_per_1m_output_tokens": "minimize",  # at capacity, with the study's --gpu-hour-cost
    # quality in the units quantization is judged by (tuner.quality), vs the reference
    "kld": "minimize", "ppl_change": "minimize", "top1_agreement": "maximize",
}
# Categories of a trial in the Pareto view, in drawing order.
CATEGORIES = ("pareto", "tie", "dominated", "infeasible", "failed", "running", "duplicate")
# How an engine log shows its platform (the study does not record it yet): vLLM's KV-cache lines
# ("CPU KV cache size", "GPU KV cache usage") and its start-up line "detected platform cpu".
_PLATFORM_LINE = re.compile(r"\b(CPU|GPU) KV cache (?:size|usage)|detected platform (cpu|cuda)\b")


def metric_label(name: str) -> tuple[str, float]:
    """Axis label and the factor that turns the stored value (SI units) into the shown one."""
    if name.split("_")[0] in LATENCY_METRICS and name.split("_")[-1] in LATENCY_STATS:
        return f"{name} (ms)", 1000.0
    return {
        "output_tps": ("output_tps (tokens/s)", 1.0), "request_tps": ("request_tps (req/s)", 1.0),
        "goodput": ("goodput (req/s meeting SLOs)", 1.0), "quality_loss": ("quality_loss (nats/token vs reference)", 1.0),
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
    """One metric of a measured run from its stored summary/quality/engine dicts (NaN when absent)."""
    summary = summary or {}
    engine = engine if engine is not None else (summary.get("engine") or {})
    head, _, stat = name.partition("_")
    if head in LATENCY_METRICS and stat in LATENCY_STATS:
        try:
            return _num(summary["latency_s"][head][stat]["value"])
        except (KeyError, TypeError):
            return math.nan
    if name in ("quality_loss", "kld", "ppl_change", "top1_agreement"):
        try:
            return _num(quality["nll_delta_per_token" if name == "quality_loss" else name]["value"])
        except (KeyError, TypeError):
            return math.nan
    key = {"output_tps": "output_throughput_tps", "request_tps": "request_throughput_rps", "goodput": "goodput_rps"}
    if name in key:
        entry = summary.get(key[name])  # goodput is None when the study has no SLOs
        return _num(entry["value"]) if isinstance(entry, dict) else math.nan
    if name == "error_rate":
        return _num(summary.get("error_rate"))
    if name == "prefix_cache_hit_rate":
        return _num(engine.get("prefix_cache_hit_rate"))
    if name == "spec_acceptance_rate":
        return _num(engine.get("spec_decode_acceptance_rate"))
    if name in ("capacity", "capacity_scale", "usd_per_1m_output_tokens"):  # replay.capacity's result
        stored = capacity.capacity_of(summary) or {}
        key = {"capacity": "capacity_rps_per_gpu"}.get(name, name)  # the cost: added by `with_costs`
        return _num(stored.get(key))
    raise InputError(f"unknown metric {name!r}; choose from {sorted(METRICS)}")


def metric_interval(name: str, summary: dict | None, quality: dict | None) -> tuple[float, float] | None:
    """The 95% interval of a measured metric (capacity: its bracket per GPU, an open upper end read
    as the measured value); None for a metric measured without one."""
    summary = summary or {}
    head, _, stat = name.partition("_")
    keys = {"output_tps": "output_throughput_tps", "request_tps": "request_throughput_rps", "goodput": "goodput_rps"}
    try:
        if name == "capacity":
            return _capacity_interval(capacity.capacity_of(summary))
        if head in LATENCY_METRICS and stat in LATENCY_STATS:
            entry = summary["latency_s"][head][stat]
        elif name in ("quality_loss", "kld", "ppl_change", "top1_agreement"):
            entry = quality["nll_delta_per_token" if name == "quality_loss" else name]
        elif name in keys:
            entry = summary[keys[name]]
        else:
            return None
        low, high = _num(entry["ci_low"]), _num(entry["ci_high"])
    except (KeyError, TypeError):
        return None
    return None if math.isnan(low) or math.isnan(high) else (low, high)


def _capacity_interval(cap: dict | None) -> tuple[float, float] | None:
    from replay.capacity import bracket_rps

    if not cap:
        return None
    low, high = bracket_rps(cap)
    gpus = max(int(cap.get("gpus") or 1), 1)
    return low / gpus, (low if high is None else high) / gpus


def config_diff(config: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    """Settings where `config` differs from the reference (speculation flattened; the model path
    shown by its directory name)."""
    from tuner.study import config_diff as study_diff

    diff = study_diff(config, reference)
    if "model" in diff:
        diff["model"] = Path(str(diff["model"])).name
    return diff


def diff_text(diff: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in diff.items()) or "(same as reference)"


@dataclasses.dataclass
class TrialView:
    """One trial as the dashboard sees it."""

    number: int
    state: str                      # optuna state: COMPLETE, FAIL, RUNNING, ...
    status: str                     # measured | rejected | engine_failed | failed | unmeasurable | interrupted | running
    objective_values: dict[str, float]
    constraints: list[float]
    feasible: bool
    params: dict[str, Any]          # search-space values
    config: dict[str, Any] | None   # VLLMConfig dump
    diff: dict[str, Any]
    summary: dict[str, Any] | None = None
    quality: dict[str, Any] | None = None
    engine: dict[str, Any] | None = None
    requests_jsonl: str | None = None
    failure_reason: str | None = None
    log_tail: str | None = None
    startup_s: float | None = None
    wall_s: float | None = None
    on_front: bool = False
    beaten_by_reference: bool = False  # vLLM's defaults are at least as good on every objective
    tied: bool = False  # dominated, but only by differences inside the 95% intervals (`clearly_dominates`)

    @property
    def is_reference(self) -> bool:
        return self.number == REFERENCE_RUN

    @property
    def label(self) -> str:
        return "ref" if self.is_reference else str(self.number)

    @property
    def title(self) -> str:
        return "reference (vLLM's defaults)" if self.is_reference else f"trial {self.number}"

    @property
    def measured(self) -> bool:
        return self.status == "measured" and self.summary is not None

    @property
    def category(self) -> str:
        if self.status in ("running", "duplicate"):  # a duplicate reuses an earlier trial's result: not a failure
            return self.status
        if not self.measured or self.state != "COMPLETE":
            return "failed"
        if not self.feasible:
            return "infeasible"
        return "pareto" if self.on_front else "tie" if self.tied else "dominated"

    def metric(self, name: str) -> float:
        if name in self.objective_values and not math.isnan(self.objective_values[name]):
            return self.objective_values[name]
        if not self.measured:
            return math.nan
        return metric_value(name, self.summary, self.quality, self.engine)

    def interval(self, name: str) -> tuple[float, float] | None:
        """The metric's 95% interval (None when measured without one, or not measured)."""
        return metric_interval(name, self.summary, self.quality) if self.measured else None

    @property
    def sample_sizes(self) -> str:
        """How many requests the latencies and how many probe prompts the quality rest on."""
        parts = []
        if self.summary and self.summary.get("requests") is not None:
            parts.append(f"{self.summary['requests']} requests")
        if self.quality and self.quality.get("n_prompts"):
            parts.append(f"{self.quality['n_prompts']} probe prompts")
        return ", ".join(parts)


@dataclasses.dataclass
class StudyView:
    name: str
    storage: str
    objectives: list[str]
    directions: list[str]
    slos: list[str]
    max_quality_loss: float | None
    trials: list[TrialView]
    reference: dict[str, Any] | None    # {"config", "summary"}
    platform: str                       # the platform the study measured on (cpu | cuda | unknown)
    decision: Any = None                # tuner.front.Decision over the study objectives (reference included)
    economics: dict[str, float] = dataclasses.field(default_factory=dict)  # gpu_hour_cost, target_rate
    quality_gate: Any = None            # tuner.quality.QualityGate, shown as e.g. "kld<=0.01"
    vllm_version: str | None = None     # the vLLM the study measured with (None: a study from before it was kept)
    reference_run: TrialView | None = None  # the reference as a candidate (number REFERENCE_RUN)
    noise_floor: dict[str, Any] = dataclasses.field(default_factory=dict)  # tuner.quality.floor_estimates
    floor_text: str = ""                # the floor in one line, with the probe's size ("" without one)

    @property
    def quality_check(self) -> str:
        """The probe's self-check: lossless-by-construction trials within the floor, or too noisy."""
        from tuner.quality import self_check

        return self_check([(t.number, t.quality) for t in self.trials])

    def costs(self, summary: dict | None) -> dict[str, float]:
        """$ per 1M tokens and replicas/GPUs for the study's --gpu-hour-cost / --target-rate."""
        return economics(capacity.capacity_of(summary), **self.economics) if self.economics else {}

    def trial(self, number: int) -> TrialView:
        """A trial by number; REFERENCE_RUN: the reference's run."""
        for t in self.candidates:
            if t.number == number:
                return t
        raise InputError(f"study {self.name!r} has no trial {number}; trials: "
                         f"{[t.number for t in self.trials]}")

    @property
    def candidates(self) -> list[TrialView]:
        """The reference's run (vLLM's defaults), then every trial: what tables, Compare and Export list."""
        return ([self.reference_run] if self.reference_run is not None else []) + self.trials

    @property
    def front(self) -> list[TrialView]:
        return [t for t in self.trials if t.category == "pareto"]

    @property
    def running(self) -> bool:
        return any(t.status == "running" for t in self.trials)

    def reference_metric(self, name: str) -> float:
        """The reference run's value of a metric (its quality loss is 0 by definition)."""
        if not self.reference or not self.reference.get("summary"):
            return math.nan
        if name in ("quality_loss", "kld", "ppl_change"):
            return 0.0
        if name == "top1_agreement":
            return 1.0
        return metric_value(name, self.reference["summary"], None)


# -- Pareto logic --------------------------------------------------------------------------------
def pareto_mask(points: Sequence[Sequence[float]], directions: Sequence[str]) -> list[bool]:
    """True for the points no other point dominates (points with a NaN are never on the front)."""
    valid = [not any(math.isnan(v) for v in p) for p in points]
    out = []
    for i, p in enumerate(points):
        if not valid[i]:
            out.append(False)
            continue
        out.append(not any(valid[j] and dominates(q, p, directions) for j, q in enumerate(points) if j != i))
    return out


def front_on(trials: Sequence[TrialView], metrics: Sequence[str]) -> list[TrialView]:
    """Feasible measured trials on the Pareto front of the given metrics (e.g. the two plotted)."""
    candidates = [t for t in trials if t.category in ("pareto", "tie", "dominated")]
    directions = [METRICS[m] for m in metrics]
    mask = pareto_mask([[t.metric(m) for m in metrics] for t in candidates], directions)
    return [t for t, on in zip(candidates, mask) if on]


def front_line(trials: Sequence[TrialView], x: str, y: str) -> tuple[list[float], list[float]]:
    """The 2-D front as a staircase through its points, sorted along x (for drawing)."""
    pts = sorted((t.metric(x), t.metric(y)) for t in front_on(trials, [x, y]))
    xs, ys = [], []
    for i, (px, py) in enumerate(pts):
        if i:
            # step: keep the previous y until the next x (the front is a staircase, not a diagonal)
            xs.append(px)
            ys.append(ys[-1])
        xs.append(px)
        ys.append(py)
    return xs, ys


# -- thresholds ----------------------------------------------------------------------------------
def thresholds(study: StudyView) -> dict[str, list[tuple[str, float]]]:
    """Lines to draw per metric: SLOs (`ttft:p99<500ms` -> ttft_p99 at 0.5 s) and the quality gate."""
    from replay.metrics import parse_slos

    out: dict[str, list[tuple[str, float]]] = {}
    for spec in study.slos:
        for slo in parse_slos(spec, flag="study SLO"):
            out.setdefault(f"{slo.metric}_{slo.stat}", []).append((f"SLO {slo}", slo.threshold_s))
    if study.max_quality_loss is not None:
        out.setdefault("quality_loss", []).append((f"quality gate {study.max_quality_loss:g}", study.max_quality_loss))
    gate = study.quality_gate
    if gate is not None and gate.unit != "nats":
        metric = {"kld": "kld", "ppl": "ppl_change", "top1": "top1_agreement"}[gate.unit]
        out.setdefault(metric, []).append((f"quality gate {gate} (beyond the noise floor)", gate.limit))
    return out


def floor_band(study: StudyView, metric: str) -> tuple[float, float] | None:
    """The range of a quality metric that the reference's own noise covers (drawn as a band): what a
    configuration measures inside it cannot be told apart from vLLM's defaults."""
    floor = study.noise_floor
    unit = {"quality_loss": "nll", "kld": "kld", "ppl_change": "ppl", "top1_agreement": "top1"}.get(metric)
    if unit not in floor:
        return None
    est = floor[unit]
    if unit == "top1":
        return min(1.0, est.low), 1.0
    return min(0.0, est.low), max(0.0, est.high)


def _gate_of(attrs: dict[str, Any]) -> Any:
    """The study's quality gate (`tuner.quality.QualityGate`): its stored spec, or the plain nats
    limit of a study made before gates had units; None without one (or one this version cannot read)."""
    from tuner.quality import parse_gate

    try:
        return parse_gate(attrs.get("quality_gate") or attrs.get("max_quality_loss"))
    except InputError:
        return None


# -- conditions (table filters and --pick) ------------------------------------------------------
_COND = re.compile(r"^\s*([a-z0-9_]+)\s*(<=|>=|==|!=|<|>)\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?\d+)?)\s*(ms|s|us)?\s*$")
_UNITS = {"ms": 1e-3, "s": 1.0, "us": 1e-6, None: 1.0}


@dataclasses.dataclass(frozen=True)
class Condition:
    metric: str
    op: str
    value: float
    text: str = dataclasses.field(default="", compare=False)  # as the user wrote it (`ttft_p99<500ms`)

    def holds(self, value: float) -> bool:
        if math.isnan(value):
            return False
        return {"<": value < self.value, "<=": value <= self.value, ">": value > self.value,
                ">=": value >= self.value, "==": value == self.value, "!=": value != self.value}[self.op]

    def __str__(self) -> str:
        return self.text or f"{self.metric}{self.op}{self.value:g}"


def parse_conditions(text: str | None, *, what: str = "filter") -> list[Condition]:
    """`ttft_p99<0.5 and output_tps>=15` (latencies in seconds, or with a unit: `ttft_p99<500ms`)."""
    if not text or not text.strip():
        return []
    out = []
    for part in re.split(r"\s+and\s+|\s*,\s*|\s*&&?\s*", text.strip()):
        if not part:
            continue
        m = _COND.match(part)
        if not m:
            raise InputError(f"{what}: cannot read {part!r}; write METRIC OP NUMBER, e.g. 'ttft_p99<0.5' or "
                             f"'ttft_p99<500ms and output_tps>20' (OP: < <= > >= == !=)")
        metric, op, number, unit = m.groups()
        if metric not in METRICS:
            raise InputError(f"{what}: unknown metric {metric!r} in {part!r}; choose from {sorted(METRICS)}")
        if unit and metric.split("_")[0] not in LATENCY_METRICS:
            raise InputError(f"{what}: {metric} is not a latency, so {part!r} cannot carry a time unit")
        out.append(Condition(metric, op, float(number) * _UNITS[unit], text=re.sub(r"\s+", "", part)))
    return out


def filter_trials(trials: Iterable[TrialView], conditions: Sequence[Condition], *,
                  categories: Sequence[str] | None = None) -> list[TrialView]:
    """Trials meeting every condition (a trial without a value for a metric does not meet it)."""
    out = []
    for t in trials:
        if categories is not None and t.category not in categories:
            continue
        if all(c.holds(t.metric(c.metric)) for c in conditions):
            out.append(t)
    return out


# -- tables --------------------------------------------------------------------------------------
def trial_table(study: StudyView, trials: Sequence[TrialView] | None = None) -> list[dict[str, Any]]:
    """One row per trial: number, category, status, each objective, throughput/latency extras,
    the difference from the reference, and the failure reason."""
    rows = []
    with_capacity = has_capacity(study)
    for t in (study.trials if trials is None else trials):
        row: dict[str, Any] = {"trial": t.number, "category": t.category, "status": t.status}
        for name in study.objectives:
            row[name] = t.metric(name)
        if with_capacity:
            row.setdefault("capacity", t.metric("capacity"))
            row.update(capacity.table_columns(t.summary if t.measured else None))
            row.update(cost_columns(study, t.summary if t.measured else None))
        for extra in ("ttft_p50", "e2e_p99", "output_tps", "error_rate"):
            if extra not in row:
                row[extra] = t.metric(extra)
        row["95% intervals"] = intervals_text(t, study.objectives)
        row["based on"] = t.sample_sizes
        if study.decision is not None and study.decision.dominated_by_reference:
            row["vs defaults"] = "defaults beat it on every objective" if t.beaten_by_reference else ""
        row["differs from reference"] = (diff_text(t.diff) if t.config else
                                         "sampled: " + ", ".join(f"{k}={v}" for k, v in t.params.items()))
        row["startup_s"] = t.startup_s
        row["failure"] = (t.failure_reason or "")[:200]
        rows.append(row)
    return rows


def with_costs(study: StudyView) -> None:
    """Give every capacity result of the view its $ per 1M output tokens (study's --gpu-hour-cost),
    so cost is a metric like any other: an axis, a filter, a column."""
    if "gpu_hour_cost" not in study.economics:
        return
    for summary in _summaries(study):
        cap = capacity.capacity_of(summary)
        if cap:  # a copy: the stored result stays as measured
            summary["capacity"] = {**cap, "usd_per_1m_output_tokens": study.costs(summary)["usd_per_1m_output_tokens"]}


def cost_columns(study: StudyView, summary: dict | None) -> dict[str, float]:
    """The table's cost and sizing columns (none when the study was run without the flags)."""
    names = {"usd_per_1m_output_tokens": "$/1M output tokens", "usd_per_1m_input_tokens": "$/1M input tokens",
             "replicas": "replicas", "gpus_total": f"GPUs for {study.economics.get('target_rate', 0):g} req/s"}
    columns = economics({"capacity_rps": 1.0}, **study.economics) if study.economics else {}  # which the flags give
    costs = study.costs(summary)
    return {names[key]: costs.get(key, math.nan) for key in columns}


def has_capacity(study: StudyView) -> bool:
    """Whether any run of the study (the reference included) has a capacity measurement."""
    return any(capacity.capacity_of(s) for s in _summaries(study))


def _summaries(study: StudyView) -> list[dict | None]:
    """The stored summary of every measured run: the trials', then the reference's."""
    return [t.summary for t in study.trials if t.measured] + [(study.reference or {}).get("summary")]


def sort_for_table(trials: Iterable[TrialView]) -> list[TrialView]:
    """Front first, then dominated, infeasible, failed and running; by trial number within each."""
    order = {c: i for i, c in enumerate(CATEGORIES)}
    return sorted(trials, key=lambda t: (order[t.category], t.number))


def display_url(url: str) -> str:
    """A storage URL with its password masked, for showing."""
    try:
        from tuner.storage import display_url as hide
    except ImportError:  # older storage module
        return re.sub(r"//([^:/@]*):[^@/]*@", r"//\1:***@", url)
    return hide(url)


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


def intervals_text(t: TrialView, metrics: Sequence[str]) -> str:
    """Each metric's 95% interval, for the table (capacity's is its bracket)."""
    parts = [f"{m} {display_interval(m, t.interval(m))}" for m in metrics if t.interval(m) is not None]
    return " · ".join(parts)


def flat_config(config: dict[str, Any] | None) -> dict[str, Any]:
    """A config dump with speculation flattened, for side-by-side display."""
    if not config:
        return {}
    out = {k: v for k, v in config.items() if k not in ("speculative", "env", "extra_args")}
    spec = config.get("speculative") or {}
    for k, v in spec.items():
        out[f"speculative.{k}"] = v
    out["extra_args"] = " ".join(config.get("extra_args") or []) or None
    out["env"] = ", ".join(sorted(config.get("env") or {})) or None
    return out


def compare(study: StudyView, a: TrialView, b: TrialView) -> list[dict[str, Any]]:
    """Side-by-side rows, with whether they differ: status, the config fields that differ, every
    metric, then the config fields that are the same."""
    rows = [{"field": "status", "a": a.status, "b": b.status, "differs": a.status != b.status}]
    ca, cb = flat_config(a.config), flat_config(b.config)
    config_rows = [{"field": f"config.{key}", "a": "-" if ca.get(key) is None else str(ca.get(key)),
                    "b": "-" if cb.get(key) is None else str(cb.get(key)), "differs": ca.get(key) != cb.get(key)}
                   for key in dict.fromkeys([*ca, *cb])]
    rows += [r for r in config_rows if r["differs"]]
    for name in [*study.objectives, *(m for m in METRICS if m not in study.objectives)]:
        va, vb = a.metric(name), b.metric(name)
        if math.isnan(va) and math.isnan(vb):
            continue
        shown = [" ".join(filter(None, (display_value(name, v), display_interval(name, t.interval(name)))))
                 for v, t in ((va, a), (vb, b))]
        rows.append({"field": name, "a": shown[0], "b": shown[1],
                     "differs": display_value(name, va) != display_value(name, vb)})
    rows.append({"field": "based on", "a": a.sample_sizes or "-", "b": b.sample_sizes or "-",
                 "differs": a.sample_sizes != b.sample_sizes})
    ba, bb = (capacity.bracket_text(capacity.capacity_of(t.summary)) for t in (a, b))
    if ba or bb:
        rows.append({"field": "capacity bracket", "a": ba or "-", "b": bb or "-", "differs": ba != bb})
    return rows + [r for r in config_rows if not r["differs"]]


# -- how the search went ------------------------------------------------------------------------
def search_progress(study: StudyView) -> list[dict[str, Any]]:
    """Per trial, in the order run: its category, and the hypervolume of the front of the feasible
    measured trials so far with vLLM's defaults (objectives scaled to [0, 1] over every run shown,
    reference point 1.1): the share of objective space the search has covered, and when it grew."""
    runs = [t for t in study.candidates if t.category in ("pareto", "tie", "dominated")]
    if not runs or not study.objectives:
        return []
    signs = [1.0 if d == "minimize" else -1.0 for d in study.directions]
    raw = {t.number: [s * t.metric(o) for s, o in zip(signs, study.objectives)] for t in runs}
    raw = {n: v for n, v in raw.items() if not any(math.isnan(x) for x in v)}
    if not raw:
        return []
    lows = [min(v[i] for v in raw.values()) for i in range(len(signs))]
    highs = [max(v[i] for v in raw.values()) for i in range(len(signs))]
    scaled = {n: [(x - lo) / (hi - lo) if hi > lo else 0.0 for x, lo, hi in zip(v, lows, highs)]
              for n, v in raw.items()}
    seen = [scaled[REFERENCE_RUN]] if REFERENCE_RUN in scaled else []
    ref_point = [1.1] * len(signs)
    out = [{"trial": REFERENCE_RUN, "category": study.reference_run.category, "hypervolume": hypervolume(seen, ref_point)}
           ] if seen else []
    for t in sorted(study.trials, key=lambda t: t.number):
        if t.number in scaled:
            seen.append(scaled[t.number])
        out.append({"trial": t.number, "category": t.category, "hypervolume": hypervolume(seen, ref_point)})
    return out


def failure_causes(trials: Sequence[TrialView]) -> list[dict[str, Any]]:
    """Unmeasured trials grouped by cause (`tuner.front.group_failures`), the most frequent first."""
    from tuner.front import group_failures

    groups = group_failures([(t.number, t.status, (t.failure_reason or "")[:300]) for t in trials])
    return [{"status": status, "count": len(numbers), "trials": ", ".join(map(str, numbers)), "reason": reason}
            for status, reason, numbers in groups]


def param_importances(study: StudyView) -> dict[str, dict[str, float]]:
    """Per objective, how much each searched parameter moved it (Optuna's PED-ANOVA evaluator over
    the measured trials only: a failed trial's penalty values would be noise). Empty when too few
    trials were measured, or nothing varied."""
    import optuna

    measured = {t.number for t in study.trials if t.measured and t.objective_values}
    source = optuna.load_study(study_name=study.name, storage=_optuna_storage(study.storage))
    frozen = [ft for ft in source.get_trials(deepcopy=False) if ft.number in measured and ft.params]
    if len(frozen) < 4:
        return {}
    copy = optuna.create_study(directions=study.directions)
    copy.add_trials(frozen)
    out = {}
    for i, (objective, direction) in enumerate(zip(study.objectives, study.directions)):
        sign = 1.0 if direction == "minimize" else -1.0  # the evaluator asks what makes the target low
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out[objective] = optuna.importance.get_param_importances(
                    copy, evaluator=optuna.importance.PedAnovaImportanceEvaluator(),
                    target=lambda t, i=i, sign=sign: sign * t.values[i])
        except (RuntimeError, ValueError):  # every trial had the same parameter values
            continue
    return {o: v for o, v in out.items() if v}


# -- per-request data (drill-down) --------------------------------------------------------------
def request_records(trial: TrialView) -> list[dict[str, Any]]:
    if not trial.requests_jsonl:
        return []
    return [json.loads(line) for line in trial.requests_jsonl.splitlines() if line.strip()]


def cdf(values: Iterable[float | None]) -> tuple[list[float], list[float]]:
    """Empirical CDF: sorted values and the fraction of values <= each."""
    xs = sorted(v for v in values if v is not None and not math.isnan(v))
    n = len(xs)
    return xs, [(i + 1) / n for i in range(n)]


def latency_cdfs(records: Sequence[dict[str, Any]]) -> dict[str, tuple[list[float], list[float]]]:
    """TTFT, ITL (pooled gaps) and E2E CDFs of the successful requests, in seconds."""
    ok = [r for r in records if r.get("success")]
    return {
        "ttft": cdf(r.get("ttft_s") for r in ok),
        "itl": cdf(g for r in ok for g in (r.get("itl_s") or [])),
        "e2e": cdf(r.get("e2e_s") for r in ok),
    }


def timeline(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per request: send time since replay start, TTFT and E2E latency, success, error."""
    return [{"index": r.get("index"), "send_s": r.get("send_s"), "ttft_s": r.get("ttft_s"), "e2e_s": r.get("e2e_s"),
             "lag_s": r.get("lag_s"), "success": bool(r.get("success")), "output_tokens": r.get("output_tokens"),
             "error": r.get("error") or ""} for r in sorted(records, key=lambda r: r.get("send_s") or 0.0)]


def engine_counters(trial: TrialView) -> dict[str, float | None]:
    """The engine's own counters over the measured phase, with the two rates people look at."""
    engine = trial.engine or (trial.summary or {}).get("engine") or {}

    def get(key: str) -> float | None:
        value = engine.get(key)
        return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)

    return {
        "prefix_cache_hit_rate": get("prefix_cache_hit_rate"),
        "prefix_cache_hits": get("prefix_cache_hits"), "prefix_cache_queries": get("prefix_cache_queries"),
        "spec_decode_acceptance_rate": get("spec_decode_acceptance_rate"),
        "spec_decode_accepted_tokens": get("spec_decode_accepted_tokens"),
        "spec_decode_draft_tokens": get("spec_decode_draft_tokens"),
        "preemptions": get("preemptions"),
        "prompt_tokens": get("prompt_tokens"), "generation_tokens": get("generation_tokens"),
    }


# -- loading -------------------------------------------------------------------------------------
def default_storage(root: Path | None = None) -> str | None:
    """The study database of the most recent `tune --trace` run under ./runs (None when none)."""
    root = Path.cwd() if root is None else root
    dbs = sorted((root / "runs").glob("*/study.db"), key=lambda p: p.stat().st_mtime, reverse=True)
    return f"sqlite:///{dbs[0].resolve()}" if dbs else None


_SQLITE_HEADER = b"SQLite format 3\x00"


def storage_url(given: str | None) -> str:
    """The study database a user named: a URL, a plain path to a study.db, or (None) the newest
    runs/*/study.db here; checked it can be opened (`check_storage`)."""
    url = given or default_storage()
    if url is None:
        raise InputError("no --storage given and no runs/*/study.db here; run `tune --trace FILE` first or "
                         "pass --storage URL (e.g. sqlite:///runs/traffic/study.db)")
    if "://" not in url:  # a plain path to a SQLite file
        if not Path(url).is_file():
            raise InputError(f"--storage {url}: no such file; give the study.db a `tune --trace` run wrote "
                             f"(runs/STUDY/study.db) or a database URL (sqlite:///PATH, postgresql://USER@HOST/DB)")
        url = f"sqlite:///{Path(url).resolve()}"
    check_storage(url)
    return url


def check_storage(url: str) -> None:
    """Refuse, with one line that says what to do, a storage that cannot hold a study: a SQLite URL
    whose file does not exist (opening it would create an empty database) or is not a database, a
    URL SQLAlchemy cannot read, a database server that does not answer."""
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):].split("?", 1)[0]
        if path and path != ":memory:" and not Path(path).is_file():
            raise InputError(f"--storage {url}: no such database file {path!r}; run `tune --trace FILE` first "
                             f"(it writes runs/STUDY/study.db) or give the URL of an existing study database")
        if path and path != ":memory:" and Path(path).stat().st_size and not _is_sqlite(Path(path)):
            raise InputError(f"--storage {url}: {path!r} is not a SQLite database; give the study.db a "
                             f"`tune --trace` run wrote (runs/STUDY/study.db)")
    _connect_once(url)


def _is_sqlite(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(len(_SQLITE_HEADER)) == _SQLITE_HEADER


def _connect_once(url: str) -> None:
    """Open and close one connection, so a bad URL or a server that does not answer is one clear
    error here, not a traceback from deep inside the first query."""
    import sqlalchemy
    from sqlalchemy import exc

    shown = display_url(url)
    try:
        engine = sqlalchemy.create_engine(_normalize(url), **_engine_kwargs(_normalize(url)))
    except (exc.ArgumentError, exc.NoSuchModuleError, ValueError):
        raise InputError(f"--storage {shown}: not a database URL SQLAlchemy can read; write sqlite:///PATH, a "
                         f"path to a study.db, or postgresql://USER@HOST/DB") from None
    try:
        with engine.connect():
            pass
    except exc.DBAPIError as error:
        reason = str(error.orig).strip().splitlines()[0] if error.orig else type(error).__name__
        raise InputError(f"--storage {shown}: cannot open the database: {display_url(reason)}; check that it "
                         f"runs and the URL (host, port, user, database name) is right") from None
    finally:
        engine.dispose()


def _engine_kwargs(url: str) -> dict[str, Any]:
    """SQLite waits for a writer's lock; a server that does not answer fails within 10 s."""
    if url.startswith("sqlite"):
        return {"connect_args": {"timeout": 30}}
    if url.startswith("postgresql"):
        return {"pool_pre_ping": True, "connect_args": {"connect_timeout": 10}}
    return {"pool_pre_ping": True}


def _normalize(url: str) -> str:
    try:
        from tuner.storage import normalize_url
    except ImportError:  # older storage module
        return url
    return normalize_url(url)


def _optuna_storage(url: str):
    """A plain RDBStorage (no heartbeat: the dashboard never touches a trial's state)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    url = _normalize(url)
    return optuna.storages.RDBStorage(url, engine_kwargs=_engine_kwargs(url))


def study_names(url: str) -> list[str]:
    import optuna

    check_storage(url)
    summaries = optuna.get_all_study_summaries(storage=_optuna_storage(url), include_best_trial=False)
    return sorted(s.study_name for s in summaries)


def resolve_study(url: str, name: str | None) -> str:
    names = study_names(url)
    if not names:
        raise InputError(f"--storage {url} holds no study yet; run `tune --trace FILE --storage {url}` first")
    if name is None:
        if len(names) > 1:
            raise InputError(f"--storage {url} holds several studies {names}; choose one with --study NAME")
        return names[0]
    if name not in names:
        raise InputError(f"--study {name!r} is not in {url}; studies there: {names}")
    return name


def _platform_of(study_attrs: dict, rows: Iterable[dict]) -> str:
    if study_attrs.get("platform"):
        return str(study_attrs["platform"])
    for row in rows:
        m = _PLATFORM_LINE.search(row.get("log_tail") or "")
        if m:
            return {"CPU": "cpu", "GPU": "cuda"}[m.group(1)] if m.group(1) else m.group(2)
    return "unknown"


def load_study(url: str, name: str | None = None) -> StudyView:
    """Everything the dashboard shows about one study, read from its storage (never written)."""
    import optuna

    name = resolve_study(url, name)
    storage = _optuna_storage(url)
    study = optuna.load_study(study_name=name, storage=storage)
    rows, reference = _read_results(storage.engine, name)
    ref_config = reference["config"] if reference else {}
    attrs = study.user_attrs
    silent = _silent_for(storage.engine, name)
    grace = 2 * float(attrs.get("heartbeat_s") or 30)
    directions = [d.name.lower() for d in study.directions]
    objectives = list(attrs.get("objectives") or [f"objective_{i}" for i in range(len(directions))])
    trials = []
    for ft in study.get_trials(deepcopy=False):
        row = rows.get(ft.number, {})
        ua = ft.user_attrs
        state = ft.state.name
        status = ua.get("status") or row.get("status")
        reason = row.get("failure_reason") or ua.get("failure_reason")
        if state == "RUNNING" and silent.get(ft.number, 0.0) > grace:
            status = "interrupted"
            reason = (f"interrupted: its worker stopped sending heartbeats {silent[ft.number]:.0f} s ago (stopped or "
                      f"crashed); resuming the study runs it again")
        elif state == "RUNNING" or state == "WAITING":
            status = "running"
        elif status is None:
            status = "interrupted"
        # Trials without a measurement may be COMPLETE with penalty values for the sampler: never show those.
        values = dict(zip(objectives, ft.values)) if ft.values and state == "COMPLETE" and status == "measured" else {}
        config = row.get("config") or ua.get("config")
        if status == "interrupted" and not reason:
            reason = "interrupted: the tuner stopped during this trial (it is run again on resume)"
        constraints = list(ua.get("constraints") or [])
        trials.append(TrialView(
            number=ft.number, state=state, status=status, objective_values=values, constraints=constraints,
            feasible=bool(ua.get("feasible", all(c <= 0 for c in constraints))), params=dict(ua.get("values") or ft.params),
            config=config, diff=config_diff(config, ref_config) if config and ref_config else {},
            summary=row.get("summary"), quality=row.get("quality"), engine=row.get("engine"),
            requests_jsonl=row.get("requests_jsonl"), failure_reason=reason,
            log_tail=row.get("log_tail") or ua.get("log_tail"), startup_s=row.get("startup_s"), wall_s=row.get("wall_s")))
    view = StudyView(name=name, storage=url, objectives=objectives, directions=directions,
                     slos=list(attrs.get("slos") or []), max_quality_loss=attrs.get("max_quality_loss"),
                     trials=trials, reference=reference and {"config": reference["config"], "summary": reference["summary"]},
                     platform=_platform_of(attrs, rows.values()),
                     economics={k: float(attrs[k]) for k in ("gpu_hour_cost", "target_rate") if attrs.get(k)},
                     quality_gate=_gate_of(attrs), vllm_version=attrs.get("vllm_version"), noise_floor=floor_estimates(reference and reference.get("probe")),
                     floor_text=floor_text(reference and reference.get("probe")))
    view.reference_run = _reference_run(view, rows.get(REFERENCE_RUN), ref_config)
    with_costs(view)
    mark_front(view)
    return view


def _reference_run(study: StudyView, row: dict[str, Any] | None, config: dict[str, Any]) -> TrialView | None:
    """The reference as a candidate: its stored run (a study from before the run was stored: the
    reference's config and summary alone), with its objective values as the tuner counts them."""
    if not study.reference or not study.reference.get("summary"):
        return None
    row = row or {}
    summary = row.get("summary") or study.reference["summary"]
    values = {o: study.reference_metric(o) for o in study.objectives if o in METRICS}
    return TrialView(number=REFERENCE_RUN, state="COMPLETE", status="measured", objective_values=values,
                     constraints=[], feasible=True, params={}, config=row.get("config") or config, diff={},
                     summary=summary, quality=row.get("quality"), engine=row.get("engine"),
                     requests_jsonl=row.get("requests_jsonl"), log_tail=row.get("log_tail"),
                     startup_s=row.get("startup_s"), wall_s=row.get("wall_s"))


def _silent_for(engine: Any, name: str) -> dict[int, float]:
    """Seconds since each RUNNING trial's worker last sent its heartbeat (Optuna's heartbeat table,
    on the database's own clock); trials without one are left out."""
    from sqlalchemy import func, inspect, select, text

    if "trial_heartbeats" not in set(inspect(engine).get_table_names()):
        return {}
    query = text("SELECT t.number, h.heartbeat FROM trials t JOIN trial_heartbeats h ON h.trial_id = t.trial_id "
                 "JOIN studies s ON s.study_id = t.study_id WHERE s.study_name = :name AND t.state = 'RUNNING'")
    with engine.connect() as conn:
        now = conn.execute(select(func.now())).scalar()
        beats = conn.execute(query, {"name": name}).all()
    now = _as_datetime(now)
    return {number: (now - _as_datetime(beat)).total_seconds() for number, beat in beats}


def _as_datetime(value: Any) -> Any:
    """A timestamp as a naive datetime (SQLite hands back text)."""
    import datetime as dt

    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    return value.replace(tzinfo=None)


def _read_results(engine: Any, name: str) -> tuple[dict[int, dict[str, Any]], dict[str, Any] | None]:
    """tracetune's rows for a study, read with plain SELECTs (tuner.storage's ResultStore would
    create missing tables: the dashboard never writes)."""
    from sqlalchemy import inspect, select

    from tuner.storage import references, trial_results, unpack_records

    def decoded(row: Any, fields: Iterable[str]) -> dict[str, Any]:
        item = dict(row)
        for field in fields:
            raw = item.pop(f"{field}_json", None)
            item[field] = json.loads(raw) if raw else None
        return item

    tables = set(inspect(engine).get_table_names())
    rows: dict[int, dict[str, Any]] = {}
    reference = None
    with engine.connect() as conn:
        if trial_results.name in tables:
            query = select(trial_results).where(trial_results.c.study_name == name)
            for row in conn.execute(query).mappings():
                item = decoded(row, ("values", "config", "summary", "quality", "engine"))
                item["requests_jsonl"] = unpack_records(item.get("requests_jsonl"))
                rows[item["trial_number"]] = item
        if references.name in tables:
            row = conn.execute(select(references).where(references.c.study_name == name)).mappings().first()
            if row is not None:
                reference = decoded(row, ("config", "probe", "summary"))
    return rows, reference


def reference_values(study: StudyView) -> tuple[float, ...] | None:
    """The reference's values of the study objectives, as the tuner counts them (None: no reference yet)."""
    if not study.reference or not study.reference.get("summary"):
        return None
    values = tuple(study.reference_metric(o) if o in METRICS else math.nan for o in study.objectives)
    return None if all(math.isnan(v) for v in values) else values


def mark_front(study: StudyView) -> None:
    """Set `on_front` for the feasible measured trials on the study's Pareto front, with vLLM's
    defaults (the reference) competing like a trial: `tuner.front.decide`, the tuner's own rule."""
    candidates = [t for t in study.trials if t.measured and t.state == "COMPLETE" and t.feasible]
    for t in study.trials:
        t.on_front = t.beaten_by_reference = False
    if not study.directions:
        return
    points = [Candidate(t.number, tuple(t.objective_values.get(o, math.nan) for o in study.objectives))
              for t in candidates]
    ref = reference_values(study)
    study.decision = decide(points, None if ref is None else Candidate(REFERENCE, ref), study.objectives,
                            study.directions)
    on_front = set(study.decision.trials_on_front)
    beaten = set(study.decision.dominated_by_reference)
    for t in candidates:
        t.on_front, t.beaten_by_reference = t.number in on_front, t.number in beaten
    if study.reference_run is not None:
        study.reference_run.on_front = any(c.label == REFERENCE for c in study.decision.front)
    pool = candidates + ([study.reference_run] if study.reference_run is not None else [])
    for t in pool:
        t.tied = not t.on_front and not any(
            clearly_dominates(other, t, study.objectives, study.directions) for other in pool if other is not t)


def clearly_dominates(a: TrialView, b: TrialView, objectives: Sequence[str], directions: Sequence[str]) -> bool:
    """`a` dominates `b`, and on at least one objective their 95% intervals do not overlap (a metric
    without an interval counts as its value). Otherwise the difference is inside the measurement's
    uncertainty: `b` is shown as tied with the front, not as dominated."""
    va, vb = [a.metric(o) for o in objectives], [b.metric(o) for o in objectives]
    if not dominates(va, vb, directions):
        return False
    for o, d, x, y in zip(objectives, directions, va, vb):
        (_, a_high), (b_low, _) = _ordered(a.interval(o) or (x, x), d), _ordered(b.interval(o) or (y, y), d)
        if a_high < b_low:
            return True
    return False


def _ordered(interval: tuple[float, float], direction: str) -> tuple[float, float]:
    """An interval as (best, worst) end of `direction`'s scale, negated for maximize (smaller is better)."""
    low, high = interval
    return (low, high) if direction == "minimize" else (-high, -low)
