"""The tuning study: Optuna multi-objective search over real engine configurations.

Each trial samples a config from the search space, starts the engine, replays the trace, probes
quality against the reference, stops the engine, and reports the objectives. Configs that cannot
run are data: rejected (before any engine starts) and crashed/timed-out engines end as FAIL
trials with the reason and log tail stored; SLO and quality-gate violations are constraints the
sampler sees (`constraints_func`). Everything measured goes to the study's SQL database.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any, Callable

from engine_adapter.errors import EngineError, InputError, TuneError
from engine_adapter.platform import Platform
from engine_adapter.vllm_server import VLLMConfig, VLLMServer
from replay.metrics import SLO, STATS, Summary, summarize
from replay.runner import ReplayOptions, prepare, replay
from replay.trace import Trace
from search_spaces.space import SearchSpace
from search_spaces.translate import Rejected, reference_config, to_engine_config
from tuner.quality import QualityResult, Reference, measure_candidate, measure_reference, probe_prompts
from tuner.storage import ResultStore

SAMPLERS = ("nsga2", "tpe", "gp", "random")
_METRIC_STAT = {f"{m}_{s}": (m, s) for m in ("ttft", "tpot", "itl", "e2e") for s in STATS}
OBJECTIVES: dict[str, str] = {**{name: "minimize" for name in _METRIC_STAT},
                              "output_tps": "maximize", "request_tps": "maximize", "goodput": "maximize",
                              "quality_loss": "minimize"}


def parse_objectives(spec: str | None, *, has_slo: bool) -> list[str]:
    """`ttft_p99,output_tps,quality_loss` -> names; default depends on whether SLOs were given."""
    if not spec:
        return ["ttft_p99", "goodput" if has_slo else "output_tps", "quality_loss"]
    names = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n not in OBJECTIVES]
    if unknown:
        raise InputError(f"--objectives: unknown {unknown}; choose from {sorted(OBJECTIVES)}")
    if "goodput" in names and not has_slo:
        raise InputError("--objectives goodput needs --slo (goodput counts requests meeting the SLOs)")
    if len(set(names)) != len(names):
        raise InputError("--objectives: each objective once")
    return names


def objective_value(name: str, summary: Summary, quality: QualityResult | None) -> float:
    if name in _METRIC_STAT:
        metric, stat = _METRIC_STAT[name]
        return summary.latency[metric][stat].value
    if name == "output_tps":
        return summary.output_throughput_tps.value
    if name == "request_tps":
        return summary.request_throughput_rps.value
    if name == "goodput":
        return summary.goodput_rps.value if summary.goodput_rps else 0.0
    if name == "quality_loss":
        return quality.nll_delta_per_token.value if quality else math.nan
    raise KeyError(name)


def constraint_values(summary: Summary, quality: QualityResult | None, slos: list[SLO],
                      max_quality_loss: float | None) -> list[float]:
    """<= 0 means satisfied (Optuna's convention): one per SLO, one for the quality gate."""
    out = []
    for slo in slos:
        value = summary.latency[slo.metric][slo.stat].value if slo.stat in STATS else math.nan
        out.append(value - slo.threshold_s if not math.isnan(value) else math.inf)
    if max_quality_loss is not None:
        loss = quality.nll_delta_per_token.value if quality else math.inf
        out.append(loss - max_quality_loss)
    return out


def _constraints_func(trial: Any) -> list[float]:
    return trial.user_attrs.get("constraints", [])


def make_sampler(name: str, seed: int | None, use_constraints: bool):
    import optuna

    kwargs = {"constraints_func": _constraints_func} if use_constraints else {}
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=8, **kwargs)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, **kwargs)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, **kwargs)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise InputError(f"--sampler must be one of {SAMPLERS}, got {name!r}")


@dataclasses.dataclass
class StudySettings:
    study_name: str
    storage_url: str
    trials: int
    objectives: list[str]
    slos: list[SLO]
    max_quality_loss: float | None
    sampler: str
    seed: int | None
    replay: ReplayOptions
    probe_prompts: int = 8
    probe_tokens: int = 24
    start_timeout_s: float = 900.0
    timeout_s: float | None = None
    enqueue: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def _healthy(server: VLLMServer) -> bool:
    try:
        return server.get("/health", timeout_s=10).status_code == 200
    except EngineError:
        return False


class TrialFailed(Exception):
    """Raised inside the objective so Optuna records the trial as FAIL (and the study goes on)."""


Reporter = Callable[..., None]


class Tuner:
    """Runs one study; `report(event, **fields)` receives progress for display."""

    def __init__(self, settings: StudySettings, *, trace: Trace, space: SearchSpace, model_dir: Path,
                 platform: Platform, run_dir: Path, base: dict[str, Any] | None = None,
                 make_checkpoint: Callable[[str], Path] | None = None, synthesizer: Any = None,
                 report: Reporter = lambda event, **fields: None, on_replay_progress=None) -> None:
        self.s = settings
        self.trace = trace
        self.space = space
        self.model_dir = model_dir
        self.platform = platform
        self.run_dir = run_dir
        self.base = base or {}
        self.make_checkpoint = make_checkpoint
        self.report = report
        self.on_replay_progress = on_replay_progress
        self.store = ResultStore(settings.storage_url)
        self.requests = prepare(trace, settings.replay, synthesizer)
        self.reference: Reference | None = None
        self.reference_config: VLLMConfig | None = None

    # -- one engine run: start, replay, probe, stop ------------------------------------------
    def _measure(self, config: VLLMConfig, label: str, *, with_quality: bool) -> dict[str, Any]:
        server = VLLMServer(self.run_dir / label, platform=self.platform)
        out: dict[str, Any] = {}
        try:
            self.report("engine_starting", label=label)
            out["startup_s"] = server.launch(config, self.s.start_timeout_s)
            self.report("engine_ready", label=label, startup_s=out["startup_s"])
            server.reset_prefix_cache()
            result = replay(server.endpoint.base_url, server.endpoint.model, self.requests, self.s.replay,
                            engine=server, on_progress=self.on_replay_progress)
            out["summary"] = summarize(result, self.s.slos)
            out["requests_jsonl"] = "".join(r.to_json() + "\n" for r in result.records)
            if server.process.exit_code() is not None or not _healthy(server):
                raise EngineError("the engine crashed during the replay", exit_code=server.process.exit_code(),
                                  log_tail=server.process.log_tail())
            if out["summary"].succeeded == 0:
                raise EngineError(f"every request failed, e.g. {out['summary'].error_examples[:1]}",
                                  log_tail=server.process.log_tail())
            if with_quality:
                self.report("quality", label=label)
                if self.reference is None:
                    prompts = probe_prompts(self.trace, self.s.probe_prompts)
                    self.reference = measure_reference(server.endpoint, prompts, max_tokens=self.s.probe_tokens)
                    out["reference"] = self.reference
                out["quality"] = measure_candidate(server.endpoint, self.reference)
        finally:
            out["log_tail"] = server.process.log_tail() if server.process else ""
            server.stop()
        return out

    def ensure_reference(self) -> None:
        """Measure the unquantized reference once per study (reused on resume)."""
        self.reference_config = reference_config(fixed=self.space.fixed, model_dir=self.model_dir, base=self.base)
        stored = self.store.reference(self.s.study_name)
        if stored is not None:
            self.reference = Reference.from_json(stored["probe"])
            self.report("reference_reused")
            return
        self.report("reference_start", config=self.reference_config)
        measured = self._measure(self.reference_config, "reference", with_quality=True)
        self.store.save_reference(self.s.study_name, config=json.loads(self.reference_config.model_dump_json()),
                                  probe=self.reference.to_json(), summary=measured["summary"].as_dict())
        self.report("reference_done", summary=measured["summary"], quality=measured["quality"])

    # -- the Optuna objective ------------------------------------------------------------------
    def objective(self, trial: Any) -> list[float]:
        t0 = time.perf_counter()
        values = self.space.sample(trial)
        trial.set_user_attr("values", values)
        try:
            config = to_engine_config(values, fixed=self.space.fixed, platform=self.platform,
                                      model_dir=self.model_dir, quantized_checkpoints=self.space.quantized_checkpoints,
                                      make_checkpoint=self.make_checkpoint, base=self.base)
        except Rejected as exc:
            return self._fail(trial, "rejected", f"rejected before start: {exc}", values=values, t0=t0)
        except TuneError as exc:  # e.g. the quantized checkpoint could not be made
            return self._fail(trial, "failed", f"could not prepare this config: {exc}", values=values, t0=t0)
        config_json = json.loads(config.model_dump_json())
        trial.set_user_attr("config", config_json)
        self.report("trial_start", number=trial.number, values=values, config=config)
        try:
            measured = self._measure(config, f"trial-{trial.number:04d}", with_quality=True)
        except EngineError as exc:
            return self._fail(trial, "engine_failed", exc.reason, values=values, config=config_json,
                              log_tail=exc.log_tail, t0=t0)
        summary: Summary = measured["summary"]
        quality: QualityResult = measured["quality"]
        objectives = [objective_value(name, summary, quality) for name in self.s.objectives]
        constraints = constraint_values(summary, quality, self.s.slos, self.s.max_quality_loss)
        trial.set_user_attr("constraints", constraints)
        trial.set_user_attr("feasible", all(c <= 0 for c in constraints))
        trial.set_user_attr("status", "measured")
        wall = time.perf_counter() - t0
        self.store.save_trial(self.s.study_name, trial.number, "measured", values=values, config=config_json,
                              summary=summary.as_dict(), quality=quality.as_dict(), engine=summary.engine,
                              requests_jsonl=measured["requests_jsonl"], log_tail=measured["log_tail"],
                              startup_s=measured["startup_s"], wall_s=wall)
        self.report("trial_done", number=trial.number, objectives=dict(zip(self.s.objectives, objectives)),
                    constraints=constraints, summary=summary, quality=quality, wall_s=wall,
                    startup_s=measured["startup_s"])
        if any(math.isnan(v) for v in objectives):
            return self._fail(trial, "failed", "an objective could not be measured (NaN)", values=values,
                              config=config_json, t0=t0, saved=True)
        return objectives

    def _fail(self, trial: Any, status: str, reason: str, *, values: dict, config: dict | None = None,
              log_tail: str = "", t0: float, saved: bool = False) -> list[float]:
        trial.set_user_attr("status", status)
        trial.set_user_attr("failure_reason", reason)
        if log_tail:
            trial.set_user_attr("log_tail", log_tail[-4000:])
        if not saved:
            self.store.save_trial(self.s.study_name, trial.number, status, values=values, config=config,
                                  failure_reason=reason, log_tail=log_tail, wall_s=time.perf_counter() - t0)
        self.report("trial_failed", number=trial.number, status=status, reason=reason)
        raise TrialFailed(reason)

    # -- the study ---------------------------------------------------------------------------
    def run(self):
        import optuna

        # Failed trials are reported by tracetune itself; optuna would add a traceback per trial.
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        use_constraints = bool(self.s.slos) or self.s.max_quality_loss is not None
        directions = [OBJECTIVES[name] for name in self.s.objectives]
        study = optuna.create_study(
            study_name=self.s.study_name, storage=self.s.storage_url, directions=directions,
            sampler=make_sampler(self.s.sampler, self.s.seed, use_constraints), load_if_exists=True)
        if [d.name.lower() for d in study.directions] != directions:
            raise InputError(f"study {self.s.study_name!r} exists with objectives in other directions; "
                             f"use another --study name or the same --objectives")
        stored = study.user_attrs.get("objectives")
        if stored is None:
            study.set_user_attr("objectives", self.s.objectives)
            study.set_user_attr("slos", [str(s) for s in self.s.slos])
            study.set_user_attr("max_quality_loss", self.s.max_quality_loss)
        elif stored != self.s.objectives:
            raise InputError(f"study {self.s.study_name!r} was created with objectives {stored}; "
                             f"resume it with the same --objectives or pick a new --study")
        # Rejected combinations cost no engine time and do not count toward --trials (capped, so a
        # space the platform mostly cannot run still ends).
        def counted() -> int:
            # Interrupted trials (Ctrl-C, a killed tuner) have no status and are run again.
            return sum(1 for t in study.trials
                       if t.state.is_finished() and t.user_attrs.get("status") in ("measured", "engine_failed", "failed"))

        def rejected() -> int:
            return sum(1 for t in study.trials if t.user_attrs.get("status") == "rejected")

        if not study.trials:
            # Configurations the user asked to try first (e.g. today's production config).
            for params in self.s.enqueue:
                study.enqueue_trial(params, skip_if_exists=True)
        self.report("study", name=self.s.study_name, done=counted(), remaining=max(self.s.trials - counted(), 0))
        if counted() < self.s.trials:
            self.ensure_reference()
        deadline = None if self.s.timeout_s is None else time.monotonic() + self.s.timeout_s
        max_rejected = rejected() + 10 * self.s.trials
        while counted() < self.s.trials and rejected() < max_rejected:
            if deadline is not None and time.monotonic() > deadline:
                self.report("timeout")
                break
            study.optimize(self.objective, n_trials=1, catch=(TrialFailed,))
        return study


def pareto_trials(study: Any) -> list[Any]:
    """Feasible, completed trials on the Pareto front."""
    try:
        front = study.best_trials
    except ValueError:
        return []
    return [t for t in front if t.user_attrs.get("feasible", True)]


def config_diff(config: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    """Settings where `config` differs from the reference (nested speculative flattened)."""
    def flat(c: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in c.items() if k not in ("speculative", "env", "extra_args")}
        spec = c.get("speculative") or {}
        out["speculative"] = spec.get("method", "none")
        if spec.get("method", "none") != "none":
            out["num_speculative_tokens"] = spec.get("num_speculative_tokens")
        return out
    a, b = flat(config), flat(reference)
    return {k: v for k, v in a.items() if b.get(k) != v}
