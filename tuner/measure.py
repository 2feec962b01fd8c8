"""One engine run of a configuration: start it, replay the trace (at its own rate, or the capacity
search), probe its quality against the reference, stop it; the engine's failures named by phase."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tracetune.capacity.levels import LevelRunner, machine_watch, settle
from tracetune.engine_adapter.base import Engine
from tracetune.engine_adapter.platform import Platform
from tracetune.engine_adapter.registry import EngineKind
from tracetune.errors import EngineError, TuneError
from tracetune.quality.probe import (
    QualityResult,
    Reference,
    lossless_by_construction,
    measure_candidate,
    measure_reference,
    probe_prompts,
    quality_key,
)
from tracetune.replay import client_procs
from tracetune.replay.acceptance import measure_acceptance, probe_requests
from tracetune.replay.metrics import Summary, summarize
from tracetune.replay.send import prepare, replay
from tracetune.replay.trace import Trace
from tracetune.replay.types import ReplayResult
from tracetune.tuner.front import REFERENCE
from tracetune.tuner.objectives import keeps_slos, outside_gate
from tracetune.tuner.reporter import NullReporter, Reporter
from tracetune.tuner.runner import Measurement, PruneAt, QualityProbe
from tracetune.tuner.settings import StudySettings
from tracetune.tuner.trial_cost import CostClock

if TYPE_CHECKING:
    from tracetune.capacity.step import Step
    from tracetune.engine_adapter.base import Endpoint
    from tracetune.engine_adapter.kind import EngineConfig
    from tracetune.replay.send import PromptSynthesizer
    from tracetune.tuner.runner import Level


# Why a trial outside the quality gate is measured at the trace's rate only (`EngineRunner._outside_gate`).
GATE_STOP = "it cannot be on the front whatever its capacity, so its capacity is not searched beyond the trace's rate"
QUALITY_SKIPPED = ("quality not probed: it missed the study's SLOs at the trace's rate, so no quality "
                   "could put it on the front")


def client_overload_reason(summary: Summary) -> str:
    """Why a trial is unmeasurable when its replay measured the client, not the engine."""
    lag = summary.schedule_lag.get("p99", 0.0) if summary.schedule_lag else 0.0
    return (f"unmeasurable: the replay client could not keep the trace's schedule (lag p99 {lag * 1000:.0f} ms "
            f"> {summary.lag_bound_s * 1000:.0f} ms, {summary.client_errors} client-side failures) even with every "
            f"core the engine leaves; this is not the engine's failure. Run the client on a machine with more "
            f"free cores (--client-procs N) or replay a slower part of the trace")


def machine_busy_reason(summary: Summary) -> str:
    """Why a trial is unmeasurable when other work on this machine took its engine's cores, or ""
    when it did not (its capacity search's verdict, `capacity.search`)."""
    from tracetune.capacity.result import CapacityResult, Verdict

    if not summary.capacity or summary.capacity.get("verdict") != Verdict.MACHINE_BUSY:
        return ""
    return (f"unmeasurable: {CapacityResult.from_dict(summary.capacity).headline()}; this is not the "
            f"configuration's failure. Stop the other work on this machine (or measure on a quiet one) "
            f"and resume the study")


def _endpoint(server: Engine) -> Endpoint:
    """Where a started engine serves."""
    assert server.endpoint is not None, "the engine has started"
    return server.endpoint


@dataclasses.dataclass
class _Run:
    """What one engine run has measured so far (`EngineRunner.measure` builds its `Measurement` from it)."""

    label: str
    probe: QualityProbe | None
    phase: str = "start"  # what the engine was doing: named when it fails
    startup_s: float = 0.0
    result: ReplayResult | None = None  # the trace-rate replay
    summary: Summary | None = None
    quality: QualityResult | None = None
    quality_skipped: str = ""  # why the probe asked for was not run (`EngineRunner._probe_if_it_counts`)
    reference: Reference | None = None
    levels: tuple[Level, ...] = ()
    log_tail: str = ""
    clock: CostClock = dataclasses.field(default_factory=CostClock)  # where its wall time went

    def measurement(self) -> Measurement:
        assert self.summary is not None and self.result is not None, "a run that returns has replayed"
        return Measurement(summary=self.summary, quality=self.quality, startup_s=self.startup_s,
                           requests_jsonl="".join(r.to_json() + "\n" for r in self.result.records),
                           log_tail=self.log_tail, levels=self.levels, reference=self.reference,
                           quality_skipped=self.quality_skipped)


class EngineRunner:
    """The `TrialRunner` that measures on a real engine: start it (the study's engine kind, in the
    run directory), replay the trace at its rate or search its capacity, probe its quality, stop it."""

    def __init__(self, settings: StudySettings, *, trace: Trace, engine: EngineKind, platform: Platform,
                 run_dir: Path, reporter: Reporter | None = None, synthesizer: PromptSynthesizer | None = None,
                 on_replay_progress: Callable[[int, int, int], None] | None = None) -> None:
        self.settings = settings
        self.trace = trace
        self.engine = engine
        self.platform = platform
        self.run_dir = run_dir
        self.reporter = reporter if reporter is not None else NullReporter()
        self.on_replay_progress = on_replay_progress or self.reporter.replay_progress
        self.requests = prepare(trace, settings.replay, synthesizer)
        self.headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}

    def measure(self, config: EngineConfig, label: str, *, probe: QualityProbe | None, start: float = 1.0,
                prune: PruneAt | None = None) -> Measurement:
        """One engine run of `config` (`TrialRunner.measure`); an `EngineError` names the phase it failed in."""
        server = self.engine.make(self.run_dir / label, platform=self.platform, port=self.settings.engine_port,
                                  env=self.settings.engine_env)
        run = _Run(label=label, probe=probe)
        try:
            with run.clock.part("start_s"):
                self._start(server, config, run)
            with run.clock.part("measure_s"):
                self._replay_and_probe(server, config, run, start, prune)
        except EngineError as exc:
            if run.phase != "start":
                self._check_alive(server, run.phase, cause=exc)
            raise
        finally:
            run.log_tail = server.log_tail()
            with run.clock.part("stop_s"):
                server.stop()
        if run.summary is not None:
            run.summary.cost = run.clock.as_dict()
        return run.measurement()

    def _start(self, server: Engine, config: EngineConfig, run: _Run) -> None:
        self.reporter.on_engine_starting(label=run.label)
        run.startup_s = server.launch(config, self.settings.start_timeout_s)
        if self.headers:
            server.endpoint = dataclasses.replace(_endpoint(server), headers=self.headers)
        self.reporter.on_engine_ready(label=run.label, startup_s=run.startup_s)

    def _replay_and_probe(self, server: Engine, config: EngineConfig, run: _Run, start: float,
                          prune: PruneAt | None) -> None:
        run.phase = "replay"
        server.reset_prefix_cache()
        if self.settings.capacity is None:
            run.result, run.summary = self._trace_rate_replay(server, run.label, self._engine_cores(config))
        else:
            self._capacity_search(server, config, run, start, prune)
        assert run.summary is not None
        self._require_served(server, run.phase, run.summary)
        self._probe_if_it_counts(server, config, run)
        self._acceptance(server, config, run)

    def _capacity_search(self, server: Engine, config: EngineConfig, run: _Run, start: float,
                         prune: PruneAt | None) -> None:
        """The trace's rate, the quality probe (before the search: an early stop weighs the trial's
        other objectives), then the capacity search from `start`; none beyond the trace's rate for a
        trial outside the quality gate (`_outside_gate`)."""
        runner = self._level_runner(server, run.label, start, self._engine_cores(config))
        seed = self._trace_rate_level(runner, server, run)
        self._probe_if_it_counts(server, config, run, counted=not seed.not_counted)
        run.phase = "capacity search"
        assert run.summary is not None
        prune_at = self._prune_at(run, seed, prune, config.gpus(), runner.base_rates[0])
        capacity = runner.search(seed_steps=[seed], gpus=config.gpus(), prune_at=prune_at,
                                 seeds_only=bool(self._outside_gate(run)))
        if runner.results[1.0] is not run.result:  # the trace's rate was measured again (client lag)
            run.result = runner.results[1.0]
            run.summary = summarize(runner.results[1.0], self.settings.slos)
        run.summary.capacity = capacity.as_dict()
        run.levels = tuple((step.scale, step.repeat, res.records) for step, res in runner.measured)
        self.reporter.on_capacity_done(label=run.label, capacity=capacity)

    def _prune_at(self, run: _Run, seed: Step, prune: PruneAt | None, gpus: int, base_rps: float) -> float | None:
        """Where the capacity search stops early (`capacity.search`'s prune): a trial's from `prune`
        (`tuner.incumbents.prune_rival`). The reference, where it missed the study's SLOs at the
        trace's rate, is infeasible as any trial that did, so it is measured the same way: where it
        also fails 1x (a marginal fail repeated first), its search stops there, its capacity the
        bracket [0, 1x]. Not where that level measured the client or a busy machine: it is measured
        again first. `tune capacity`, and a study under --no-prune, search below 1x."""
        assert run.summary is not None
        if run.label != REFERENCE:
            return prune(run.summary, run.quality, gpus, base_rps) if prune is not None else None
        if self.settings.prune and not (seed.not_counted or seed.machine_busy) and self._missed_slos(run.summary):
            return 1.0
        return None

    def _missed_slos(self, summary: Summary) -> bool:
        """The run missed the study's SLOs (or failed requests) at the trace's rate, and measured the
        engine, not the client: infeasible whatever else it measures."""
        return not summary.client_overloaded and not keeps_slos(summary, self.settings.slos)

    def _probe_if_it_counts(self, server: Engine, config: EngineConfig, run: _Run, *, counted: bool = True) -> None:
        """The quality probe (once), unless its result cannot change the trial's standing: a trial
        (not the reference, whose texts the others are scored against) that already failed requests
        or missed the study's SLOs at the trace's rate is infeasible whatever its quality, so it is never
        on the front, and its search stops there (`tuner.incumbents.prune_rival`). On llama.cpp the
        probe is a request per scored token (minutes on a CPU); a stored result of the same quality
        key costs nothing and is still used. A replay that measured the client or a busy machine
        (`counted` False) skips nothing: it is measured again. `--no-prune` probes every trial."""
        if run.probe is None or run.quality is not None or run.quality_skipped:
            return
        assert run.summary is not None
        if (counted and self.settings.prune and run.probe.reference is not None and self._missed_slos(run.summary)
                and run.probe.known(quality_key(json.loads(config.model_dump_json()))) is None):
            run.quality_skipped = QUALITY_SKIPPED
            self.reporter.on_skipped(label=run.label, reason=QUALITY_SKIPPED)
            return
        self._probe(server, config, run)

    def _outside_gate(self, run: _Run) -> str:
        """Why a trial's capacity is not searched beyond the trace's rate, or "": its quality lies
        outside the study's gate on its whole interval (`tuner.objectives.outside_gate`), so it is
        infeasible whatever its capacity, never on the front (`tuner.incumbents`). The reference and
        every trial under `--no-prune` are never stopped by the gate."""
        if not self.settings.prune or run.label == REFERENCE:
            return ""
        outside = outside_gate(run.quality, self.settings.max_quality_loss)
        if outside:
            self.reporter.on_skipped(label=run.label, reason=f"{outside}: {GATE_STOP}")
        return outside

    def _probe(self, server: Engine, config: EngineConfig, run: _Run) -> None:
        run.phase = "quality probe"
        assert run.probe is not None
        with run.clock.part("probe_s"):
            run.quality, measured_reference = self._quality(server, config, run.label, run.probe)
        run.reference = run.reference or measured_reference

    def _acceptance(self, server: Engine, config: EngineConfig, run: _Run) -> None:
        """A speculative configuration's draft acceptance measured again on the trace's prompts, with
        natural stops and forced to the recorded lengths (`replay.acceptance`), kept in its summary."""
        n = self.settings.acceptance_prompts
        if config.speculation() == "none" or n <= 0:
            return
        run.phase = "acceptance probe"
        requests = probe_requests(self.requests, n, self.settings.acceptance_tokens)
        with run.clock.part("acceptance_s"):
            acceptance = measure_acceptance(
                server, requests, timeout_s=self.settings.replay.request_timeout_s,
                on_prompt=lambda done, total: self.reporter.on_acceptance(label=run.label, done=done, total=total))
        assert run.summary is not None
        run.summary.acceptance = acceptance.as_dict()
        self.reporter.on_acceptance_done(label=run.label, acceptance=acceptance)

    def _quality(self, server: Engine, config: EngineConfig, label: str,
                 probe: QualityProbe) -> tuple[QualityResult, Reference | None]:
        """The probe on this server against `probe.reference` (measured here first when there is none:
        returned as well), or the stored result of a configuration with the same quality key
        (weights, precisions, kernels, decoding path: `quality.probe.quality_key`)."""
        config_json = json.loads(config.model_dump_json())
        key = quality_key(config_json)
        lossless = probe.reference_config is not None and lossless_by_construction(config_json, probe.reference_config)
        known = probe.known(key) if probe.reference is not None and label != "reference" else None
        if known is not None:
            number, stored = known
            self.reporter.on_quality_reused(label=label, trial=number)
            return dataclasses.replace(QualityResult.from_dict(stored), reused_from=number, lossless=lossless), None
        if not server.quality_probe:
            raise TuneError(f"the {server.name} engine cannot score given tokens, which the quality probe "
                            f"needs; measure it with `tune replay` or `tune capacity`")
        self.reporter.on_quality(label=label)
        reference = probe.reference
        if reference is None:
            prompts = probe_prompts(self.trace, self.settings.probe_prompts)
            reference = measure_reference(_endpoint(server), prompts, max_tokens=self.settings.probe_tokens,
                                          scoring=server.scoring)
        measured = measure_candidate(_endpoint(server), reference, scoring=server.scoring)
        quality = dataclasses.replace(measured, key=key, lossless=lossless)
        if quality.probe_noisy:
            self.reporter.on_probe_noisy(label=label, kld=quality.kld, beyond=quality.beyond_floor)
        return quality, None if probe.reference is not None else reference

    def _engine_cores(self, config: EngineConfig) -> int:
        return client_procs.engine_cores(self.platform.value, config.gpus())

    def _trace_rate_replay(self, server: Engine, label: str, engine_cores: int) -> tuple[ReplayResult, Summary]:
        """The trace at its own rate. A replay whose client could not keep the schedule (its
        summary says client_overloaded) measured the client: it is sent again by twice as many
        client processes while the machine has the cores; what is still overloaded then is
        reported as unmeasurable by `Tuner._judged`, never as the engine's failure. Where no core is
        left to add, it is sent once more by as many: a passing stall of this machine (measured: a
        2-core machine's client lagging 13-24 ms on every request of one trial, under 3 ms on the
        others) is not the client's limit."""
        n_warm = min(self.settings.replay.warmup_requests, len(self.requests))
        procs = self.settings.client_procs or client_procs.auto_client_procs(self.requests[n_warm:], engine_cores)
        endpoint = _endpoint(server)
        same_again = True
        while True:
            result = replay(endpoint.base_url, endpoint.model, self.requests, self.settings.replay,
                            engine=server, headers=self.headers or None, on_progress=self.on_replay_progress,
                            client_procs=procs)
            summary = summarize(result, self.settings.slos)
            if not summary.client_overloaded:
                return result, summary
            more = client_procs.more_client_procs(procs, engine_cores)
            if more <= procs:
                if not same_again:
                    return result, summary
                more, same_again = procs, False
            self.reporter.on_client_overloaded(label=label, procs=more, lag_p99_s=summary.schedule_lag.get("p99", 0.0))
            settle(server, reset_prefix_cache=True)
            procs = more

    def _level_runner(self, server: Engine, label: str, start_scale: float, engine_cores: int) -> LevelRunner:
        """Load levels on this running engine; each starts drained with an empty prefix cache."""
        n_warm = min(self.settings.replay.warmup_requests, len(self.requests))
        assert self.settings.capacity is not None, "a capacity search has its options"
        endpoint = _endpoint(server)
        options = dataclasses.replace(self.settings.capacity, start_scale=start_scale)
        runner = LevelRunner(endpoint.base_url, endpoint.model, self.requests[n_warm:], self.settings.replay,
                             options, warmup=self.requests[:n_warm], engine=server, headers=self.headers or None,
                             before_level=lambda: settle(server, reset_prefix_cache=True),
                             on_progress=self.on_replay_progress, client_procs=self.settings.client_procs,
                             engine_cores=engine_cores,
                             on_level=lambda step: self.reporter.on_capacity_step(label=label, step=step),
                             watch=machine_watch(options, server.process_group(), engine_cores,
                                                 watched=self.engine.watch_machine))
        self.reporter.on_capacity_window(text=runner.describe())
        return runner

    def _trace_rate_level(self, runner: LevelRunner, server: Engine, run: _Run) -> Step:
        """The trace at its own rate, never abandoned by the attainment rule: the latency objectives
        come from it, and it is the capacity search's first level (its step is returned). It ends
        once it certainly misses a TTFT or E2E target of the SLO (`capacity.step.MissedSLO`): the
        configuration is then infeasible whatever the rest would measure, and its search stops there
        (`tuner.incumbents.prune_rival`; the reference's, `_prune_at`); its latencies are lower
        bounds. Every one under --no-prune, and every one under the classic search rules, runs in
        full."""
        assert self.settings.capacity is not None, "a capacity search has its options"
        end_early = self.settings.prune and self.settings.capacity.ends_decided
        step = runner.level(1.0, abandon=False, end_on_slo_miss=end_early)
        run.result = runner.results[1.0]
        run.summary = summarize(run.result, self.settings.slos)
        self._require_served(server, "replay", run.summary)
        return step

    def _require_served(self, server: Engine, phase: str, summary: Summary) -> None:
        """The engine is alive and answered at least one request of the replay (or it ended, its SLO
        certainly missed, before any finished: its requests were cut, not failed)."""
        self._check_alive(server, phase)
        if summary.succeeded == 0 and not summary.ended:
            raise EngineError(f"every request failed, e.g. {summary.error_examples[:1]}",
                              log_tail=server.log_tail())

    @staticmethod
    def _check_alive(server: Engine, phase: str, cause: Exception | None = None) -> None:
        """Name a dead engine as the reason (an error seen by the client is only its symptom)."""
        code = server.exit_code()
        if code is not None or not server.health():
            why = f" (the client saw: {str(cause).splitlines()[0][:300]})" if cause else ""
            raise EngineError(f"the engine crashed during the {phase}" + (f", exit code {code}" if code is not None
                                                                           else ", /health no longer answers") + why,
                              exit_code=code, log_tail=server.log_tail()) from cause
