"""The tuning study: Optuna multi-objective search over real engine configurations.

Each trial samples a config from the search space, starts the engine, replays the trace, probes
quality against the reference, stops the engine, and reports the objectives. Configs that cannot
run are data: rejected (before any engine starts) and crashed/timed-out engines end as
*infeasible* trials with the reason and log tail stored (see `Tuner._infeasible` for why they are
not FAIL); SLO and quality-gate violations are constraints the sampler sees (`constraints_func`).
Everything measured goes to the study's SQL database.

Reliability: the study lives in an Optuna `RDBStorage` with a heartbeat, so a trial whose worker
was killed (SIGKILL included) is failed and retried with the same parameters
(`RetryHeartbeatStaleTrialCallback`). Several workers may share one study: the reference and
every configuration are claimed through a database row (`ResultStore.claim`), so nothing is
measured twice; a worker that draws a configuration already measured reuses that result.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import threading
import time
from pathlib import Path
from typing import Any, Callable

from engine_adapter.errors import EngineError, InputError, TuneError
from engine_adapter.platform import Platform, installed_vllm_version
from engine_adapter.vllm_server import VLLMConfig, VLLMServer
from replay.capacity import CapacityOptions, LevelRunner, settle
from replay.metrics import SLO, STATS, Summary, summarize
from replay.runner import ReplayOptions, ReplayResult, prepare, replay
from replay.trace import Trace
from replay import workers
from search_spaces.space import SearchSpace
from search_spaces.translate import Rejected, reference_config, to_engine_config
from tuner.quality import (QualityGate, QualityResult, Reference, lossless_by_construction, measure_candidate,
                           measure_reference, probe_prompts, quality_key)
from tuner.storage import REFERENCE_RUN, Redactor, ResultStore, normalize_url, owner_is_dead, worker_id

SAMPLERS = ("nsga2", "tpe", "gp", "random")
_METRIC_STAT = {f"{m}_{s}": (m, s) for m in ("ttft", "tpot", "itl", "e2e") for s in STATS}
OBJECTIVES: dict[str, str] = {**{name: "minimize" for name in _METRIC_STAT},
                              "output_tps": "maximize", "request_tps": "maximize", "goodput": "maximize",
                              "capacity": "maximize", "quality_loss": "minimize"}


def parse_objectives(spec: str | None, *, has_slo: bool) -> list[str]:
    """`ttft_p99,output_tps,quality_loss` -> names. Default: latency at the trace's own rate,
    capacity at the SLO (with --slo; throughput at the trace's rate without), quality loss."""
    if not spec:
        return ["ttft_p99", "capacity" if has_slo else "output_tps", "quality_loss"]
    names = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n not in OBJECTIVES]
    if unknown:
        raise InputError(f"--objectives: unknown {unknown}; choose from {sorted(OBJECTIVES)}")
    for needs_slo in ("goodput", "capacity"):
        if needs_slo in names and not has_slo:
            raise InputError(f"--objectives {needs_slo} needs --slo (it counts requests meeting the SLO), "
                             f"e.g. --slo 'ttft:p99<2s,tpot:p99<100ms'")
    if len(set(names)) != len(names):
        raise InputError("--objectives: each objective once")
    return names


def objective_value(name: str, summary: Summary | dict, quality: QualityResult | dict | None) -> float:
    """One objective from a trial's summary and quality (objects, or their stored `as_dict()`)."""
    s = summary.as_dict() if isinstance(summary, Summary) else summary
    q = quality.as_dict() if isinstance(quality, QualityResult) else quality
    if name in _METRIC_STAT:
        metric, stat = _METRIC_STAT[name]
        return s["latency_s"][metric][stat]["value"]
    if name == "output_tps":
        return s["output_throughput_tps"]["value"]
    if name == "request_tps":
        return s["request_throughput_rps"]["value"]
    if name == "goodput":
        return s["goodput_rps"]["value"] if s.get("goodput_rps") else 0.0
    if name == "capacity":  # requests/s per GPU at the SLO (replay.capacity)
        return s["capacity"]["capacity_rps_per_gpu"] if s.get("capacity") else math.nan
    if name == "quality_loss":
        return q["nll_delta_per_token"]["value"] if q else math.nan
    raise KeyError(name)


def constraint_values(summary: Summary | dict, quality: QualityResult | dict | None, slos: list[SLO],
                      max_quality_loss: QualityGate | float | None) -> list[float]:
    """<= 0 means satisfied (Optuna's convention): one per SLO, one for the quality gate."""
    s = summary.as_dict() if isinstance(summary, Summary) else summary
    q = quality.as_dict() if isinstance(quality, QualityResult) else quality
    out = []
    for slo in slos:
        value = s["latency_s"][slo.metric][slo.stat]["value"] if slo.stat in STATS else math.nan
        out.append(value - slo.threshold_s if not math.isnan(value) else math.inf)
    if max_quality_loss is not None:
        gate = max_quality_loss if isinstance(max_quality_loss, QualityGate) else QualityGate("nats", max_quality_loss)
        out.append(gate.violation(q))
    return out


# Violation given to a trial whose engine could not serve: every constraint at once. (A finite
# number: GPSampler fits a model to constraint values, and inf would break it.)
FAILED_VIOLATION = 1.0


def constraint_names(slos: list[SLO], max_quality_loss: QualityGate | float | None) -> list[str]:
    """The constraints every trial reports to the sampler, in order: the share of requests that
    failed (1.0 when the engine could not start, crashed or timed out, or the config was
    rejected), then one per SLO, then the quality gate."""
    return ["failed_requests"] + [f"slo {s}" for s in slos] + (["quality_gate"] if max_quality_loss is not None else [])


def sampler_constraints(trial: Any, n_constraints: int) -> list[float]:
    """The constraint values stored on a finished trial (<= 0 feasible)."""
    stored = trial.user_attrs.get("sampler_constraints")
    if stored is not None:
        return list(stored)
    user = list(trial.user_attrs.get("constraints", []))  # a measured trial from an older tracetune
    return ([0.0] + user + [FAILED_VIOLATION] * n_constraints)[:n_constraints]


def _has_set_constraint() -> bool:
    import optuna

    return hasattr(optuna.trial.Trial, "set_constraint")


def set_constraints(trial: Any, names: list[str], values: list[float]) -> None:
    """Record a trial's constraints where its sampler reads them: `Trial.set_constraint` on
    Optuna >= 5 (`constraints_func` is deprecated there), a user attribute that the
    `constraints_func` of `make_sampler` returns on Optuna 4."""
    trial.set_user_attr("sampler_constraints", list(values))
    if _has_set_constraint():
        for name, value in zip(names, values):
            trial.set_constraint(name, value)


def make_sampler(name: str, seed: int | None, n_constraints: int = 1):
    """An Optuna sampler that sees every trial's constraints, so infeasible trials (failed
    engines, failed requests, violated SLOs) steer the search away instead of being dropped."""
    import optuna

    kwargs = {} if _has_set_constraint() else {
        "constraints_func": lambda trial: sampler_constraints(trial, n_constraints)}
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
    max_quality_loss: QualityGate | float | None  # a float: nats (the plain-number form)
    sampler: str
    seed: int | None
    replay: ReplayOptions
    capacity: CapacityOptions | None = None  # search each config's capacity at the SLO
    client_procs: int | None = None  # replay client processes; None: enough for the rate, within free cores
    # --gpu-hour-cost / --target-rate, kept with the study so the dashboard and exports show them
    economics: dict[str, float] = dataclasses.field(default_factory=dict)
    probe_prompts: int = 16  # why 16 x 32: README, "Quality"
    probe_tokens: int = 32
    start_timeout_s: float = 900.0
    timeout_s: float | None = None
    enqueue: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # A worker refreshes its running trial's (and claim's) heartbeat every `heartbeat_s`; one silent
    # for 2 x heartbeat_s is considered dead: its trial is failed and retried, its claim taken over.
    heartbeat_s: int = 30
    engine_port: int | None = None  # fixed port for this worker's engines (default: a free one)
    secrets: list[str] = dataclasses.field(default_factory=list, repr=False)  # never stored
    api_key: str | None = dataclasses.field(default=None, repr=False)  # sent to our own engines

    @property
    def grace_s(self) -> int:
        return 2 * self.heartbeat_s

    @property
    def n_user_constraints(self) -> int:
        return len(self.slos) + (self.max_quality_loss is not None)

    @property
    def constraint_names(self) -> list[str]:
        return constraint_names(self.slos, self.max_quality_loss)


def make_storage(url: str, heartbeat_s: int):
    """Optuna's RDBStorage with the heartbeat on: a RUNNING trial whose worker stops beating for
    2 x `heartbeat_s` is failed and re-queued (WAITING, same parameters) up to twice."""
    import warnings

    import optuna

    url = normalize_url(url)
    engine_kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if url.startswith("sqlite"):
        engine_kwargs = {"connect_args": {"timeout": 60}}
    import random

    from sqlalchemy.exc import SQLAlchemyError

    for attempt in range(6):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(
                    url, engine_kwargs=engine_kwargs, heartbeat_interval=heartbeat_s, grace_period=2 * heartbeat_s,
                    heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=2))
        except SQLAlchemyError:
            # Workers starting together on a new database race to create Optuna's tables; the
            # loser sees "already exists" and simply connects again.
            if attempt == 5:
                raise
            time.sleep(0.2 + random.random())


def config_key(config_json: dict[str, Any]) -> str:
    """Identity of a configuration across workers and hosts: the engine config without the
    worker's own environment (CPU binding, visible GPUs) and with the model named by its
    directory (checkpoint caches live in different places on different hosts)."""
    ident = {k: v for k, v in config_json.items() if k != "env"}
    ident["model"] = Path(str(config_json.get("model", ""))).name
    return "config:" + hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:40]


class _Beat:
    """Refreshes a claim's heartbeat from a thread while the owner measures."""

    def __init__(self, store: ResultStore, study_name: str, key: str, owner: str, every_s: float) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(store, study_name, key, owner, every_s), daemon=True)

    def _run(self, store, study_name, key, owner, every_s) -> None:
        while not self._stop.wait(every_s):
            try:
                store.touch_claim(study_name, key, owner)
            except Exception:  # a database blip: the next beat tries again
                pass

    def __enter__(self) -> _Beat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _healthy(server: VLLMServer) -> bool:
    try:
        return server.get("/health", timeout_s=10).status_code == 200
    except EngineError:
        return False


COUNTED = ("measured", "engine_failed", "failed", "unmeasurable")  # statuses that count toward --trials


def client_overload_reason(summary: Summary) -> str:
    """Why a trial is unmeasurable when its replay measured the client, not the engine."""
    lag = summary.schedule_lag.get("p99", 0.0) if summary.schedule_lag else 0.0
    return (f"unmeasurable: the replay client could not keep the trace's schedule (lag p99 {lag * 1000:.0f} ms "
            f"> {summary.lag_bound_s * 1000:.0f} ms, {summary.client_errors} client-side failures) even with every "
            f"core the engine leaves; this is not the engine's failure. Run the client on a machine with more "
            f"free cores (--client-procs N) or replay a slower part of the trace")


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
        self.redact = Redactor(settings.secrets + ([settings.api_key] if settings.api_key else []))
        self.store = ResultStore(settings.storage_url, redact=self.redact)
        self.requests = prepare(trace, settings.replay, synthesizer)
        self.reference: Reference | None = None
        self.reference_config: VLLMConfig | None = None
        self.reference_values: list[float] | None = None
        self.reference_capacity: float | None = None  # the reference's capacity level k
        self.worker = worker_id()
        self._quality_known: dict[str, tuple[int, dict[str, Any]]] = {}  # quality key -> (trial, quality)
        self.headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}

    # -- one engine run: start, replay, probe, stop ------------------------------------------
    def _measure(self, config: VLLMConfig, label: str, *, with_quality: bool, start: float = 1.0) -> dict[str, Any]:
        server = VLLMServer(self.run_dir / label, platform=self.platform, port=self.s.engine_port)
        out: dict[str, Any] = {}
        phase = "start"
        try:
            self.report("engine_starting", label=label)
            out["startup_s"] = server.launch(config, self.s.start_timeout_s)
            if self.headers:
                server.endpoint = dataclasses.replace(server.endpoint, headers=self.headers)
            self.report("engine_ready", label=label, startup_s=out["startup_s"])
            phase = "replay"
            server.reset_prefix_cache()
            if self.s.capacity is None:
                result, out["summary"] = self._trace_rate_replay(server, label, self._engine_cores(config))
            else:
                runner = self._level_runner(server, label, start, self._engine_cores(config))
                result = self._trace_rate_level(runner, server, out)
                phase = "capacity search"
                capacity = runner.search(seed_steps=out.pop("seed_steps"), gpus=config.gpus())
                if runner.results[1.0] is not result:  # the trace's rate was measured again (client lag)
                    result = runner.results[1.0]
                    out["summary"] = summarize(result, self.s.slos)
                out["summary"].capacity = capacity.as_dict()
                out["levels"] = [(step.scale, step.repeat, res.records) for step, res in runner.measured]
                self.report("capacity_done", label=label, capacity=capacity)
            out["requests_jsonl"] = "".join(r.to_json() + "\n" for r in result.records)
            self._require_served(server, phase, out["summary"])
            if with_quality:
                phase = "quality probe"
                out["quality"] = self._quality(server, config, label)
        except EngineError as exc:
            if phase != "start":
                self._check_alive(server, phase, cause=exc)
            raise
        finally:
            out["log_tail"] = server.process.log_tail() if server.process else ""
            server.stop()
        return out

    def _quality(self, server: VLLMServer, config: VLLMConfig, label: str) -> QualityResult:
        """The probe on this server, or the stored result of a configuration with the same quality
        key (weights, precisions, kernels, decoding path: `tuner.quality.quality_key`)."""
        config_json = json.loads(config.model_dump_json())
        key = quality_key(config_json)
        lossless = self.reference_config is not None and lossless_by_construction(
            config_json, json.loads(self.reference_config.model_dump_json()))
        if self.reference is not None and label != "reference":
            known = self._quality_known.get(key) or next(
                ((n, q) for n, c, q in self.store.measured_qualities(self.s.study_name) if quality_key(c) == key), None)
            if known is not None:
                number, stored = known
                self.report("quality_reused", label=label, trial=number)
                return dataclasses.replace(QualityResult.from_dict(stored), reused_from=number, lossless=lossless)
        self.report("quality", label=label)
        if self.reference is None:
            prompts = probe_prompts(self.trace, self.s.probe_prompts)
            self.reference = measure_reference(server.endpoint, prompts, max_tokens=self.s.probe_tokens)
        quality = dataclasses.replace(measure_candidate(server.endpoint, self.reference), key=key, lossless=lossless)
        if quality.probe_noisy:
            self.report("probe_noisy", label=label, kld=quality.kld, beyond=quality.beyond_floor)
        if label.startswith("trial-"):
            self._quality_known[key] = (int(label.split("-")[1]), quality.as_dict())
        return quality

    def _engine_cores(self, config: VLLMConfig) -> int:
        return workers.engine_cores(self.platform.value, config.gpus())

    def _trace_rate_replay(self, server: VLLMServer, label: str, engine_cores: int) -> tuple[ReplayResult, Summary]:
        """The trace at its own rate. A replay whose client could not keep the schedule (its
        summary says client_overloaded) measured the client: it is sent again by twice as many
        client processes while the machine has the cores; what is still overloaded then is
        reported as unmeasurable by `_measured`, never as the engine's failure."""
        n_warm = min(self.s.replay.warmup_requests, len(self.requests))
        procs = self.s.client_procs or workers.auto_client_procs(self.requests[n_warm:], engine_cores)
        while True:
            result = replay(server.endpoint.base_url, server.endpoint.model, self.requests, self.s.replay,
                            engine=server, headers=self.headers or None, on_progress=self.on_replay_progress,
                            client_procs=procs)
            summary = summarize(result, self.s.slos)
            more = workers.more_client_procs(procs, engine_cores)
            if not summary.client_overloaded or more <= procs:
                return result, summary
            self.report("client_overloaded", label=label, procs=more, lag_p99_s=summary.schedule_lag.get("p99", 0.0))
            settle(server, reset_prefix_cache=True)
            procs = more

    def _level_runner(self, server: VLLMServer, label: str, start_scale: float, engine_cores: int) -> LevelRunner:
        """Load levels on this running engine; each starts drained with an empty prefix cache."""
        n_warm = min(self.s.replay.warmup_requests, len(self.requests))
        options = dataclasses.replace(self.s.capacity, start_scale=start_scale)
        return LevelRunner(server.endpoint.base_url, server.endpoint.model, self.requests[n_warm:], self.s.replay,
                           options, warmup=self.requests[:n_warm], engine=server, headers=self.headers or None,
                           before_level=lambda: settle(server, reset_prefix_cache=True),
                           on_progress=self.on_replay_progress, client_procs=self.s.client_procs,
                           engine_cores=engine_cores,
                           on_level=lambda step: self.report("capacity_step", label=label, step=step))

    def _trace_rate_level(self, runner: LevelRunner, server: VLLMServer, out: dict[str, Any]) -> ReplayResult:
        """The trace at its own rate, replayed in full (never abandoned): the latency objectives
        come from it, and it is the capacity search's first level."""
        step = runner.level(1.0, abandon=False)
        result = runner.results[1.0]
        out["summary"] = summarize(result, self.s.slos)
        out["seed_steps"] = [step]
        self._require_served(server, "replay", out["summary"])
        return result

    def _require_served(self, server: VLLMServer, phase: str, summary: Summary) -> None:
        """The engine is alive and answered at least one request of the replay."""
        self._check_alive(server, phase)
        if summary.succeeded == 0:
            raise EngineError(f"every request failed, e.g. {summary.error_examples[:1]}",
                              log_tail=server.process.log_tail())

    @property
    def capacity_start(self) -> float:
        """Where a trial's capacity search starts: the reference's capacity (most configurations
        land near it, so the bracket closes in a few levels), else the trace's own rate."""
        if self.s.capacity is None or not self.reference_capacity:
            return 1.0
        return min(max(self.reference_capacity, self.s.capacity.min_scale), self.s.capacity.max_scale)

    @staticmethod
    def _check_alive(server: VLLMServer, phase: str, cause: Exception | None = None) -> None:
        """Name a dead engine as the reason (an error seen by the client is only its symptom)."""
        code = server.process.exit_code()
        if code is not None or not _healthy(server):
            why = f" (the client saw: {str(cause).splitlines()[0][:300]})" if cause else ""
            raise EngineError(f"the engine crashed during the {phase}" + (f", exit code {code}" if code is not None
                                                                           else ", /health no longer answers") + why,
                              exit_code=code, log_tail=server.process.log_tail()) from cause

    def _claim_or_wait(self, key: str, trial_number: int, what: str) -> dict[str, Any] | None:
        """None once this worker owns `key`; the finished claim row when another worker (or an
        earlier trial) has measured it. Waits while a live worker is still measuring it."""
        announced = False
        while True:
            holder = self.store.claim(self.s.study_name, key, owner=self.worker, trial_number=trial_number,
                                      stale_after_s=self.s.grace_s)
            if holder is None or holder["state"] == "done":
                return holder
            if not announced:
                self.report("waiting", what=what, owner=holder["owner"], trial=holder["trial_number"])
                announced = True
            time.sleep(min(2.0, self.s.heartbeat_s / 2))

    def ensure_reference(self) -> None:
        """Measure the unquantized reference once per study (reused on resume, and by every other
        worker: the first one claims it, the others wait for its row)."""
        self.reference_config = reference_config(fixed=self.space.fixed, model_dir=self.model_dir, base=self.base)
        stored = self.store.reference(self.s.study_name)
        if stored is None:
            holder = self._claim_or_wait("reference", REFERENCE_RUN, "the reference")
            stored = self.store.reference(self.s.study_name)
            if stored is None and holder is not None:
                raise TuneError("the reference claim is marked done but no reference is stored; "
                                "delete the study's tracetune_claims row 'reference' and run again")
        if stored is not None:
            self.reference = Reference.from_json(stored["probe"])
            if stored.get("summary"):
                self._set_reference_values(stored["summary"])
            self.report("reference_reused")
            return
        self.report("reference_start", config=self.reference_config)
        try:
            with _Beat(self.store, self.s.study_name, "reference", self.worker, self.s.heartbeat_s):
                measured = self._measure(self.reference_config, "reference", with_quality=True)
        except BaseException:
            self.store.release_claim(self.s.study_name, "reference", self.worker)
            raise
        self.store.save_reference(self.s.study_name, config=json.loads(self.reference_config.model_dump_json()),
                                  probe=self.reference.to_json(), summary=measured["summary"].as_dict())
        summary = measured["summary"]
        self.store.save_trial(self.s.study_name, REFERENCE_RUN, "measured", config=json.loads(
            self.reference_config.model_dump_json()), summary=summary.as_dict(), quality=measured["quality"].as_dict(),
            engine=summary.engine, requests_jsonl=measured["requests_jsonl"], log_tail=measured["log_tail"],
            startup_s=measured["startup_s"])
        self.store.save_levels(self.s.study_name, REFERENCE_RUN, measured.get("levels", []))
        self.store.finish_claim(self.s.study_name, "reference", self.worker, REFERENCE_RUN)
        self._set_reference_values(measured["summary"].as_dict())
        self.report("reference_done", summary=measured["summary"], quality=measured["quality"])

    def _set_reference_values(self, summary: dict[str, Any]) -> None:
        """The reference as a candidate: its objective values (quality loss 0 by definition) and
        its capacity level, where trials start their capacity search."""
        self.reference_values = [objective_value(n, summary, None) if n != "quality_loss" else 0.0
                                 for n in self.s.objectives]
        self.reference_capacity = (summary.get("capacity") or {}).get("capacity_scale") or None

    # -- the Optuna objective ------------------------------------------------------------------
    def objective(self, trial: Any) -> list[float]:
        t0 = time.perf_counter()
        values = self.space.sample(trial)
        trial.set_user_attr("values", values)
        trial.set_user_attr("worker", self.worker)
        try:
            config = to_engine_config(values, fixed=self.space.fixed, platform=self.platform,
                                      model_dir=self.model_dir, quantized_checkpoints=self.space.quantized_checkpoints,
                                      make_checkpoint=self.make_checkpoint, base=self.base)
        except Rejected as exc:
            return self._infeasible(trial, "rejected", f"rejected before start: {exc}", values=values, t0=t0)
        except TuneError as exc:  # e.g. the quantized checkpoint could not be made
            return self._infeasible(trial, "failed", f"could not prepare this config: {exc}", values=values, t0=t0)
        config_json = self.redact(json.loads(config.model_dump_json()))
        trial.set_user_attr("config", config_json)
        key = config_key(config_json)
        holder = self._claim_or_wait(key, trial.number, f"trial {trial.number}'s configuration")
        if holder is not None:
            return self._reuse(trial, holder["trial_number"], values=values, config=config_json, t0=t0)
        try:
            with _Beat(self.store, self.s.study_name, key, self.worker, self.s.heartbeat_s):
                result = self._measured(trial, config, config_json, values, t0)
        except BaseException:
            # Interrupted (Ctrl-C, SIGTERM) or a bug: the configuration is free for the next worker.
            self.store.release_claim(self.s.study_name, key, self.worker)
            raise
        self.store.finish_claim(self.s.study_name, key, self.worker, trial.number)
        return result

    def _measured(self, trial: Any, config: VLLMConfig, config_json: dict, values: dict, t0: float) -> list[float]:
        self.report("trial_start", number=trial.number, values=values, config=config)
        try:
            measured = self._measure(config, f"trial-{trial.number:04d}", with_quality=True,
                                     start=self.capacity_start)
        except EngineError as exc:
            return self._infeasible(trial, "engine_failed", exc.reason, values=values, config=config_json,
                                    log_tail=exc.log_tail, t0=t0)
        summary: Summary = measured["summary"]
        quality: QualityResult = measured["quality"]
        objectives = [objective_value(name, summary, quality) for name in self.s.objectives]
        constraints = constraint_values(summary, quality, self.s.slos, self.s.max_quality_loss)
        wall = time.perf_counter() - t0
        # A replay that measured its client is stored with everything it saw, under its own status.
        status, reason = ("unmeasurable", client_overload_reason(summary)) if summary.client_overloaded else \
            ("measured", None)
        self.store.save_trial(self.s.study_name, trial.number, status, values=values, config=config_json,
                              summary=summary.as_dict(), quality=quality.as_dict(), engine=summary.engine,
                              requests_jsonl=measured["requests_jsonl"], log_tail=measured["log_tail"],
                              startup_s=measured["startup_s"], wall_s=wall, failure_reason=reason)
        self.store.save_levels(self.s.study_name, trial.number, measured.get("levels", []))
        if any(math.isnan(v) for v in objectives):
            return self._infeasible(trial, "failed", "an objective could not be measured (NaN)", values=values,
                                    config=config_json, t0=t0, saved=True)
        if status == "unmeasurable":
            return self._infeasible(trial, status, reason, values=values, config=config_json, t0=t0, saved=True)
        self._set_measured(trial, objectives, constraints, summary.error_rate, summary.error_examples)
        self.report("trial_done", number=trial.number, objectives=dict(zip(self.s.objectives, objectives)),
                    constraints=constraints, summary=summary, quality=quality, wall_s=wall,
                    startup_s=measured["startup_s"])
        return objectives

    def _set_measured(self, trial: Any, objectives: list[float], constraints: list[float], error_rate: float,
                      error_examples: list[str]) -> None:
        trial.set_user_attr("constraints", constraints)
        set_constraints(trial, self.s.constraint_names, [error_rate] + constraints)
        trial.set_user_attr("feasible", error_rate == 0 and all(c <= 0 for c in constraints))
        trial.set_user_attr("status", "measured")
        if error_rate > 0:
            # Failed requests (e.g. timed out) make the measurement biased toward the survivors:
            # kept, but infeasible, with the reason.
            trial.set_user_attr("failure_reason", self.redact(
                f"{error_rate:.0%} of requests failed, e.g. {error_examples[:1]}"))

    def _reuse(self, trial: Any, original: int, *, values: dict, config: dict, t0: float) -> list[float]:
        """This configuration was already measured (by this or another worker): report the same
        result to the sampler without starting an engine. Not counted toward --trials."""
        rows = self.store.trials(self.s.study_name, original)
        row = rows[0] if rows else None
        note = f"same configuration as trial {original}: its result is reused, nothing was measured again"
        trial.set_user_attr("duplicate_of", original)
        if row is None or row["status"] != "measured" or row["summary"] is None:
            reason = (row or {}).get("failure_reason") or "no stored result"
            return self._infeasible(trial, "duplicate", f"{note} ({(row or {}).get('status')}: {reason})"[:2000],
                                    values=values, config=config, t0=t0)
        summary, quality = row["summary"], row["quality"]
        objectives = [objective_value(name, summary, quality) for name in self.s.objectives]
        if any(math.isnan(v) for v in objectives):
            return self._infeasible(trial, "duplicate", f"{note} (an objective was NaN)", values=values,
                                    config=config, t0=t0)
        constraints = constraint_values(summary, quality, self.s.slos, self.s.max_quality_loss)
        self._set_measured(trial, objectives, constraints, summary.get("error_rate", 0.0),
                           summary.get("error_examples", []))
        trial.set_user_attr("status", "duplicate")
        trial.set_user_attr("feasible", False)  # the original is the one on the front
        self.store.save_trial(self.s.study_name, trial.number, "duplicate", values=values, config=config,
                              failure_reason=note, wall_s=time.perf_counter() - t0)
        self.report("duplicate", number=trial.number, original=original)
        return objectives

    def penalty_values(self, study: Any) -> list[float]:
        """Objective values reported for a trial that produced no measurement: the worst value
        measured so far in the study (reference included) for each minimised objective, 0 for
        maximised ones (an engine that does not serve delivers no throughput)."""
        import optuna

        measured = [t.values for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
                    if t.user_attrs.get("status") == "measured" and t.values]
        if self.reference_values:
            measured.append(self.reference_values)
        out = []
        for i, name in enumerate(self.s.objectives):
            if OBJECTIVES[name] == "maximize":
                out.append(0.0)
            else:
                seen = [v[i] for v in measured if i < len(v) and math.isfinite(v[i])]
                out.append(max(seen + [0.0]))
        return out

    def _infeasible(self, trial: Any, status: str, reason: str, *, values: dict, config: dict | None = None,
                    log_tail: str = "", t0: float, saved: bool = False) -> list[float]:
        """End a trial that produced no usable measurement (rejected config, engine failed to
        start / crashed / timed out, every request failed, duplicate of such a trial).

        Why not an Optuna FAIL: NSGA-II, TPE and GP drop FAIL trials, so the sampler would keep
        proposing configurations that cannot run. Instead the trial is COMPLETE with penalty
        values (`penalty_values`: worst measured so far, zero throughput) and a positive value
        for every constraint (`set_constraints`); NSGA-II ranks such a trial below every
        feasible one, TPE puts it in its "bad" group, GP models its feasibility, so the search
        moves away from it. The Pareto front only takes measured, feasible trials. The
        tracetune status ("rejected", "engine_failed", "failed", "unmeasurable", "duplicate"), the reason and the
        log tail stay in the trial's user attributes and in the results table.
        """
        reason = self.redact(reason)
        trial.set_user_attr("status", status)
        trial.set_user_attr("failure_reason", reason)
        trial.set_user_attr("feasible", False)
        trial.set_user_attr("constraints", [FAILED_VIOLATION] * self.s.n_user_constraints)
        set_constraints(trial, self.s.constraint_names, [FAILED_VIOLATION] * (1 + self.s.n_user_constraints))
        if log_tail:
            trial.set_user_attr("log_tail", self.redact(log_tail[-4000:]))
        if not saved:
            self.store.save_trial(self.s.study_name, trial.number, status, values=values, config=config,
                                  failure_reason=reason, log_tail=log_tail, wall_s=time.perf_counter() - t0)
        if status != "duplicate":
            self.report("trial_failed", number=trial.number, status=status, reason=reason)
        else:
            self.report("duplicate", number=trial.number, original=trial.user_attrs.get("duplicate_of"),
                        reason=reason)
        return self.penalty_values(trial.study)

    # -- the study ---------------------------------------------------------------------------
    def _check_space_matches(self, study: Any) -> None:
        """Optuna cannot resume a study whose categorical choices changed (e.g. another --space, or
        choices this platform cannot run removed on another kind of machine): say so up front."""
        for name, before in _stored_choices(study).items():
            param = self.space.parameters.get(name)
            if param is None or param.choices is None:
                continue
            if tuple(param.choices) != before:
                raise InputError(
                    f"study {self.s.study_name!r} was created with {name} choices {list(before)}, this search space "
                    f"has {list(param.choices)} (another --space, or choices this machine cannot run were removed). "
                    f"Resume it with the same space on the same kind of machine, or start a new --study")

    def run(self):
        import optuna

        # Failed trials are reported by tracetune itself; optuna would add a traceback per trial.
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        directions = [OBJECTIVES[name] for name in self.s.objectives]
        storage = make_storage(self.s.storage_url, self.s.heartbeat_s)
        study = optuna.create_study(
            study_name=self.s.study_name, storage=storage, directions=directions,
            sampler=make_sampler(self.s.sampler, self.s.seed, 1 + self.s.n_user_constraints), load_if_exists=True)
        if [d.name.lower() for d in study.directions] != directions:
            raise InputError(f"study {self.s.study_name!r} exists with objectives in other directions; "
                             f"use another --study name or the same --objectives")
        stored = study.user_attrs.get("objectives")
        if stored is None:
            study.set_user_attr("objectives", self.s.objectives)
            study.set_user_attr("slos", [str(s) for s in self.s.slos])
            gate = self.s.max_quality_loss
            if isinstance(gate, QualityGate):
                study.set_user_attr("quality_gate", gate.spec)
                # The nats limit is drawn on the quality_loss axis (nats per token) by the dashboard.
                study.set_user_attr("max_quality_loss", gate.limit if gate.unit == "nats" else None)
            else:
                study.set_user_attr("max_quality_loss", gate)
            study.set_user_attr("platform", self.platform.value)
            study.set_user_attr("vllm_version", installed_vllm_version())
            study.set_user_attr("heartbeat_s", self.s.heartbeat_s)  # silent for twice this: its worker is gone
        elif stored != self.s.objectives:
            raise InputError(f"study {self.s.study_name!r} was created with objectives {stored}; "
                             f"resume it with the same --objectives or pick a new --study")
        self._check_space_matches(study)
        for key, value in self.s.economics.items():
            study.set_user_attr(key, value)
        # Configurations the user asked to try first (e.g. today's production config); ones the
        # study already has are skipped, so a resumed or second worker does not add them again.
        for params in self.s.enqueue:
            study.enqueue_trial(params, skip_if_exists=True)
        self.recover(study)
        self.report("study", name=self.s.study_name, done=counted(study),
                    remaining=max(self.s.trials - counted(study), 0))
        if counted(study) < self.s.trials:
            self.ensure_reference()
        deadline = None if self.s.timeout_s is None else time.monotonic() + self.s.timeout_s
        # Rejected and duplicate configurations cost no engine time and do not count toward
        # --trials (capped, so a space the platform mostly cannot run still ends).
        max_skipped = skipped(study) + 10 * self.s.trials
        waiting_announced = False
        while counted(study) < self.s.trials and skipped(study) < max_skipped:
            if deadline is not None and time.monotonic() > deadline:
                self.report("timeout", limit_s=self.s.timeout_s, done=counted(study), trials=self.s.trials)
                break
            self.recover(study)
            if counted(study) + running(study) >= self.s.trials:
                # Other workers are measuring the last trials: wait for them (or for their
                # heartbeat to go stale, which re-queues their trial for us).
                if not waiting_announced:
                    self.report("waiting", what="the last trials of other workers", owner="", trial=None)
                    waiting_announced = True
                time.sleep(min(2.0, self.s.heartbeat_s / 2))
                continue
            try:
                study.optimize(self.objective, n_trials=1)
            except KeyboardInterrupt:
                self._requeue_interrupted(study)
                raise
        return study

    def recover(self, study: Any) -> list[int]:
        """Fail the RUNNING trials of dead workers and re-queue them (same parameters): workers on
        this host whose process is gone at once, any other after its heartbeat's grace period.
        Returns the numbers of the trials failed here."""
        import optuna

        TrialState = optuna.trial.TrialState
        storage = study._storage
        callback = storage.get_heartbeat_stale_trial_callback()
        failed = []
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            owner = t.user_attrs.get("worker")
            if owner and owner != self.worker and owner_is_dead(owner):
                try:
                    if storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL):
                        failed.append(t.number)
                        if callback is not None:
                            callback(study, storage.get_trial(t._trial_id))
                except optuna.exceptions.UpdateFinishedTrialError:
                    pass  # another worker got there first
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
        if failed:
            self.report("recovered", trials=failed)
        return failed

    def _requeue_interrupted(self, study: Any) -> None:
        """A Ctrl-C'd (or SIGTERMed) trial is FAIL in Optuna: queue it again, with the same
        parameters, so the next run measures it. Interruptions are not the configuration's
        fault, so unlike dead workers' trials these are re-queued every time."""
        import warnings

        import optuna

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            requeue = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=None)
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,)):
            if t.user_attrs.get("worker") == self.worker and "status" not in t.user_attrs:
                requeue(study, t)


def counted(study: Any) -> int:
    """Trials that count toward --trials: measured or failed with a reason. Interrupted trials
    (Ctrl-C, a killed worker) have no status and are run again."""
    return sum(1 for t in study.get_trials(deepcopy=False)
               if t.state.is_finished() and t.user_attrs.get("status") in COUNTED)


def skipped(study: Any) -> int:
    return sum(1 for t in study.get_trials(deepcopy=False) if t.user_attrs.get("status") in ("rejected", "duplicate"))


def running(study: Any) -> int:
    import optuna

    return len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)))


def _stored_choices(study: Any) -> dict[str, tuple]:
    """Categorical choices each parameter had in the study's earlier trials."""
    import optuna

    out: dict[str, tuple] = {}
    for t in study.get_trials(deepcopy=False):
        for name, dist in t.distributions.items():
            if isinstance(dist, optuna.distributions.CategoricalDistribution):
                out.setdefault(name, tuple(dist.choices))
    return out


def pareto_trials(study: Any) -> list[Any]:
    """Measured, feasible trials on the Pareto front (infeasible trials never dominate them)."""
    try:
        front = study.best_trials
    except ValueError:
        return []
    return [t for t in front if t.user_attrs.get("feasible", True) and t.user_attrs.get("status", "measured") == "measured"]


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
