"""One engine run of a configuration: start it, replay the trace (at its own rate, or the capacity
search), probe its quality against the reference, stop it; the engine's failures named by phase."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from tracetune.engine_adapter.base import Engine
from tracetune.errors import EngineError, TuneError
from tracetune.replay import workers
from tracetune.replay.levels import LevelRunner, settle
from tracetune.replay.metrics import Summary, summarize
from tracetune.replay.runner import replay
from tracetune.replay.types import ReplayResult
from tracetune.tuner.quality import (QualityResult, lossless_by_construction, measure_candidate, measure_reference,
                           probe_prompts, quality_key)

def client_overload_reason(summary: Summary) -> str:
    """Why a trial is unmeasurable when its replay measured the client, not the engine."""
    lag = summary.schedule_lag.get("p99", 0.0) if summary.schedule_lag else 0.0
    return (f"unmeasurable: the replay client could not keep the trace's schedule (lag p99 {lag * 1000:.0f} ms "
            f"> {summary.lag_bound_s * 1000:.0f} ms, {summary.client_errors} client-side failures) even with every "
            f"core the engine leaves; this is not the engine's failure. Run the client on a machine with more "
            f"free cores (--client-procs N) or replay a slower part of the trace")


class EngineRuns:
    """The Tuner's engine runs (a mixin: settings, platform, run directory, reference and reporter
    are the Tuner's)."""

    # -- one engine run: start, replay, probe, stop ------------------------------------------
    def _measure(self, config: Any, label: str, *, with_quality: bool, start: float = 1.0,
                 prune: Any = None) -> dict[str, Any]:
        """`prune(summary, quality, gpus, base_rps)`: the level at which the capacity search may stop
        early (`replay.capacity.search_capacity`'s `prune_at`), from what the trial measured so far."""
        server = self.engine.make(self.run_dir / label, platform=self.platform, port=self.s.engine_port)
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
                if with_quality:  # before the search: an early stop weighs the trial's other objectives
                    phase = "quality probe"
                    out["quality"] = self._quality(server, config, label)
                phase = "capacity search"
                prune_at = prune(out["summary"], out.get("quality"), config.gpus(),
                                 runner.base_rates[0]) if prune else None
                capacity = runner.search(seed_steps=out.pop("seed_steps"), gpus=config.gpus(), prune_at=prune_at)
                if runner.results[1.0] is not result:  # the trace's rate was measured again (client lag)
                    result = runner.results[1.0]
                    out["summary"] = summarize(result, self.s.slos)
                out["summary"].capacity = capacity.as_dict()
                out["levels"] = [(step.scale, step.repeat, res.records) for step, res in runner.measured]
                self.report("capacity_done", label=label, capacity=capacity)
            out["requests_jsonl"] = "".join(r.to_json() + "\n" for r in result.records)
            self._require_served(server, phase, out["summary"])
            if with_quality and "quality" not in out:
                phase = "quality probe"
                out["quality"] = self._quality(server, config, label)
        except EngineError as exc:
            if phase != "start":
                self._check_alive(server, phase, cause=exc)
            raise
        finally:
            out["log_tail"] = server.log_tail()
            server.stop()
        return out

    def _quality(self, server: Engine, config: Any, label: str) -> QualityResult:
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
        if not server.quality_probe:
            raise TuneError(f"the {server.name} engine serves no prompt log-probabilities, which the quality probe "
                            f"needs; measure it with `tune replay` or `tune capacity`")
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

    def _engine_cores(self, config: Any) -> int:
        return workers.engine_cores(self.platform.value, config.gpus())

    def _trace_rate_replay(self, server: Engine, label: str, engine_cores: int) -> tuple[ReplayResult, Summary]:
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

    def _level_runner(self, server: Engine, label: str, start_scale: float, engine_cores: int) -> LevelRunner:
        """Load levels on this running engine; each starts drained with an empty prefix cache."""
        n_warm = min(self.s.replay.warmup_requests, len(self.requests))
        options = dataclasses.replace(self.s.capacity, start_scale=start_scale)
        runner = LevelRunner(server.endpoint.base_url, server.endpoint.model, self.requests[n_warm:], self.s.replay,
                             options, warmup=self.requests[:n_warm], engine=server, headers=self.headers or None,
                             before_level=lambda: settle(server, reset_prefix_cache=True),
                             on_progress=self.on_replay_progress, client_procs=self.s.client_procs,
                             engine_cores=engine_cores,
                             on_level=lambda step: self.report("capacity_step", label=label, step=step))
        self.report("capacity_window", text=runner.describe())
        return runner

    def _trace_rate_level(self, runner: LevelRunner, server: Engine, out: dict[str, Any]) -> ReplayResult:
        """The trace at its own rate, replayed in full (never abandoned): the latency objectives
        come from it, and it is the capacity search's first level."""
        step = runner.level(1.0, abandon=False)
        result = runner.results[1.0]
        out["summary"] = summarize(result, self.s.slos)
        out["seed_steps"] = [step]
        self._require_served(server, "replay", out["summary"])
        return result

    def _require_served(self, server: Engine, phase: str, summary: Summary) -> None:
        """The engine is alive and answered at least one request of the replay."""
        self._check_alive(server, phase)
        if summary.succeeded == 0:
            raise EngineError(f"every request failed, e.g. {summary.error_examples[:1]}",
                              log_tail=server.log_tail())

    @property
    def capacity_start(self) -> float:
        """Where a trial's capacity search starts: the reference's capacity (most configurations
        land near it, so the bracket closes in a few levels), else the trace's own rate."""
        if self.s.capacity is None or not self.reference_capacity:
            return 1.0
        return min(max(self.reference_capacity, self.s.capacity.min_scale), self.s.capacity.max_scale)

    @staticmethod
    def _check_alive(server: Engine, phase: str, cause: Exception | None = None) -> None:
        """Name a dead engine as the reason (an error seen by the client is only its symptom)."""
        code = server.exit_code()
        if code is not None or not server.health():
            why = f" (the client saw: {str(cause).splitlines()[0][:300]})" if cause else ""
            raise EngineError(f"the engine crashed during the {phase}" + (f", exit code {code}" if code is not None
                                                                           else ", /health no longer answers") + why,
                              exit_code=code, log_tail=server.log_tail()) from cause
