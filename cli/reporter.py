"""What the main job prints while a study runs: the tuner's `Reporter` (one method per event, in
`tuner.reporter`) on the console, and the live progress line of the engine being measured."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tracetune.cli.results import fmt_objective
from tracetune.tuner.reporter import NullReporter

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

    from tracetune.capacity.step import CapacityResult, Step
    from tracetune.engine_adapter.kind import EngineConfig
    from tracetune.quality.probe import QualityResult
    from tracetune.replay.acceptance import Acceptance
    from tracetune.replay.metrics import Estimate, Summary
    from tracetune.tuner.reporter import Params
    from tracetune.tuner.trial_record import ParamValue


class ConsoleReporter(NullReporter):
    """A `tuner.reporter.Reporter` that prints the events the console shows (the others are
    `NullReporter`'s: ignored)."""

    def __init__(self, console: Console, progress: Progress, *, storage: str, platform: str) -> None:
        self.console, self.progress = console, progress
        self.storage, self.platform = storage, platform
        self.task: TaskID | None = None  # the progress line of the engine being measured
        self.window_said = False
        self.remaining = 0  # trials still to run, for the estimate of the time left
        self.walls: list[float] = []  # wall seconds of the trials ended in this run
        self.reference_s: float | None = None  # the reference's (stopped early only where it missed the SLO at 1x)

    def print(self, text: str) -> None:
        self.console.print(text, highlight=False)

    def replay_progress(self, done: int, total: int, in_flight: int) -> None:
        if self.task is not None:
            self.progress.update(self.task, completed=done, total=total, info=f"in flight {in_flight}")

    # -- the study ------------------------------------------------------------------------------
    def on_study(self, *, name: str, done: int, remaining: int) -> None:
        self.remaining = remaining
        self.console.print(f"study [bold]{name}[/] · storage {self.storage} · platform {self.platform} · "
                           f"{done} trials done, {remaining} to run")

    def on_retries_first(self, *, trials: list[tuple[int, int, dict[str, ParamValue]]]) -> None:
        for number, failed, params in trials:
            self.print(f"trial {number} runs first: it measures again what trial {failed} was measuring when it was "
                       f"interrupted ({params}); --try configurations and the sampler's follow")

    def on_warm_start(self, *, configs: list[dict[str, ParamValue]]) -> None:
        self.print(f"first trials: {len(configs)} configurations of the --warm-start study, best first (measured "
                   f"again here): " + "; ".join(map(str, configs[:4])) + (" ..." if len(configs) > 4 else ""))

    def on_presets(self, *, configs: list[dict[str, ParamValue]]) -> None:
        self.print("first trials (informed presets, then the sampler): " + "; ".join(map(str, configs)))

    def on_reference_start(self, *, config: EngineConfig) -> None:
        self.console.print("[bold]reference[/] (unquantized, auto KV cache, no speculation): measuring")

    def on_reference_reused(self) -> None:
        self.console.print("reference: reusing the study's stored reference continuations")

    def on_reference_done(self, *, summary: Summary, quality: QualityResult | None) -> None:
        ttft = summary.latency["ttft"]["p99"].value
        if summary.ended:  # its trace-rate level ended once its outcome was certain: a lower bound, no rate
            least = "at least " if math.isfinite(ttft) else ""
            self.console.print(f"reference: TTFT p99 {least}{fmt_objective('ttft_p99', ttft)} at the trace's rate "
                               f"(its level ended once its outcome was certain)")
        else:
            self.console.print(f"reference: TTFT p99 {fmt_objective('ttft_p99', ttft)} · "
                               f"{summary.output_throughput_tps.value:.1f} tok/s at the trace's rate")
        from tracetune.tuner.trial_cost import cost_text

        steps = (summary.capacity or {}).get("steps")
        split = cost_text(summary.cost, len(steps) if isinstance(steps, list) else None)
        if split:
            self.print(f"    time: {split}")
        self.reference_s = (summary.cost or {}).get("wall_s")
        self._end_task()  # else its progress line stayed on screen to the study's end

    def on_waiting(self, *, what: str, owner: str, trial: int | None) -> None:
        who = f" (worker {owner})" if owner else ""
        self.console.print(f"  waiting for {what}{who}: another worker is measuring it")

    def on_timeout(self, *, limit_s: float, done: int, trials: int) -> None:
        self.print(f"[yellow]--timeout {limit_s:g} s reached[/]: no new trial started; {done} of {trials} trials "
                   f"done. Run the same command to go on.")

    def on_converged(self, *, patience: int, done: int, trials: int) -> None:
        self.print(f"[bold]front unchanged for {patience} trials in a row[/] (--patience): stopping after {done} of "
                   f"{trials} trials. Run the same command without --patience to go on.")

    def on_recovered(self, *, trials: list[int]) -> None:
        self.console.print(f"  trials {trials} belonged to a worker that is gone: marked failed and queued again")

    # -- one trial ------------------------------------------------------------------------------
    def on_trial_start(self, *, number: int, values: Params, config: EngineConfig) -> None:
        self.console.print(f"\n[bold]trial {number}[/] {dict(values)}")

    def on_engine_starting(self, *, label: str) -> None:
        self._end_task()
        self.task = self.progress.add_task(f"  {label}: engine starting", total=None, info="")

    def on_engine_ready(self, *, label: str, startup_s: float) -> None:
        if self.task is not None:
            self.progress.update(self.task, description=f"  {label}: replay (engine up in {startup_s:.0f}s)")

    def on_client_overloaded(self, *, label: str, procs: int, lag_p99_s: float) -> None:
        self.print(f"  {label}: [yellow]client overloaded[/] (schedule lag p99 {lag_p99_s * 1000:.0f} ms): measured "
                   f"again with {procs} client processes")

    def on_capacity_window(self, *, text: str) -> None:
        if not self.window_said:  # the same rule for every trial: said once
            self.window_said = True
            self.print("  " + text)

    def on_capacity_step(self, *, label: str, step: Step) -> None:
        self.print("  " + step.line(label))

    def on_capacity_done(self, *, label: str, capacity: CapacityResult) -> None:
        self.print(f"  {label}: {capacity.headline()}")

    def on_quality(self, *, label: str) -> None:
        if self.task is not None:
            self.progress.update(self.task, info="quality probe")

    def on_acceptance(self, *, label: str, done: int, total: int) -> None:
        if self.task is not None:
            self.progress.update(self.task, info=f"acceptance probe {done}/{total}")

    def on_acceptance_done(self, *, label: str, acceptance: Acceptance) -> None:
        self.print(f"  {label}: {acceptance.words()}")
        for caveat in acceptance.caveats():
            self.print(f"  {label}: caveat: {caveat}")

    def on_quality_reused(self, *, label: str, trial: int) -> None:
        self.print(f"  {label}: quality as measured for trial {trial} (same weights, precisions, kernels and "
                   f"decoding path)")

    def on_skipped(self, *, label: str, reason: str) -> None:
        self.print(f"  {label}: {reason}")

    def on_probe_noisy(self, *, label: str, kld: Estimate | None, beyond: dict[str, Estimate] | None) -> None:
        value = kld.value if kld is not None else math.nan
        self.print(f"  {label}: [yellow]quality probe too noisy[/]: lossless by construction, yet measured beyond "
                   f"the reference's noise floor (KLD {value:.4f}); the gate does not count it against this "
                   f"configuration")

    def on_trial_done(self, *, number: int, objectives: dict[str, float], constraints: list[float], summary: Summary,
                      quality: QualityResult | None, wall_s: float, startup_s: float) -> None:
        values = " · ".join(f"{k} {fmt_objective(k, v)}" for k, v in objectives.items())
        feasible = "feasible" if all(c <= 0 for c in constraints) else "[yellow]violates constraints[/]"
        self.console.print(f"  trial {number}: {values} · {feasible} · {wall_s:.0f}s (engine start {startup_s:.0f}s)")
        self._failed_level(summary)
        self._cost(summary, wall_s)
        self._end_task()

    def on_trial_failed(self, *, number: int, status: str, reason: str) -> None:
        self.print(f"  trial {number}: [red]{status}[/] (infeasible) · {reason[:300]}")
        self._end_task()

    def on_trial_pruned(self, *, number: int, reason: str, wall_s: float, summary: Summary | None = None) -> None:
        self.print(f"  trial {number}: [yellow]pruned[/] after {wall_s:.0f}s · {reason[:600]}")  # with its cause
        self._cost(summary, wall_s)
        self._end_task()

    def _failed_level(self, summary: Summary) -> None:
        """Why the level that bounds the capacity failed, where its cause was found (`capacity.causes`)."""
        from tracetune.capacity.result import CapacityResult

        failure = CapacityResult.from_dict(summary.capacity).failure_text() if summary.capacity else ""
        if failure:
            self.print(f"    {failure}")

    def _cost(self, summary: Summary | None, wall_s: float) -> None:
        """Where a trial's time went, and the time left for the trials still to run at that pace."""
        from tracetune.tuner.trial_cost import cost_text, time_left

        self.walls.append(wall_s)
        self.remaining = max(self.remaining - 1, 0)
        steps = (summary.capacity or {}).get("steps") if summary is not None else None
        split = cost_text(summary.cost if summary is not None else None,
                          len(steps) if isinstance(steps, list) else None)
        parts = [p for p in (split, time_left(self.walls, self.remaining, full_s=self.reference_s)) if p]
        if parts:
            self.print("    time: " + "; ".join(parts))

    def on_duplicate(self, *, number: int, original: int | None, reason: str | None = None) -> None:
        self.console.print(f"  trial {number}: same configuration as trial {original}: result reused, "
                           f"no engine started")

    def _end_task(self) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
            self.task = None
