"""The main job's request (every input checked and resolved) and the tuner built from it, reporting
to the console: used by `tune --trace` (cli.tune) and, once its workers are done, by `--gpus`
(cli.workers) to report the study's results."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any


@dataclasses.dataclass
class TuneRequest:
    """What the main job was asked, checked and resolved: what the tuner is built from."""

    settings: Any  # tuner.study.StudySettings
    trace: Any  # replay.trace.Trace
    space: Any  # search_spaces.space.SearchSpace, with what this machine cannot run removed
    model_dir: Path
    platform: Any  # engine_adapter.platform.Platform
    run_dir: Path
    base: dict[str, Any]  # engine settings from the command line, held for every trial
    storage_shown: str
    engine: Any  # engine_adapter.registry.EngineKind: which engine the trials start


def make_tuner(request: TuneRequest, console) -> tuple[Any, Any]:
    """The study's tuner, reporting to the console, and the progress display it updates (the run
    directory is made only now: every input has been checked)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tracetune.cli.reporter import ConsoleReporter
    from tracetune.tuner.measure import EngineRunner
    from tracetune.tuner.study import Tuner

    synthesizer = None
    if any(r.input_length is not None for r in request.trace.records):
        from transformers import AutoTokenizer

        from tracetune.replay.synth import PromptSynthesizer
        synthesizer = PromptSynthesizer(AutoTokenizer.from_pretrained(str(request.model_dir)))

    def make_checkpoint(scheme: str) -> Path:
        from tracetune.engine_adapter.vllm.quantize import quantized_checkpoint
        return quantized_checkpoint(request.model_dir, scheme, lambda m: console.print(f"  [dim]·[/] {m}"))

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console)
    reporter = ConsoleReporter(console, progress, storage=request.storage_shown, platform=request.platform.value)
    request.run_dir.mkdir(parents=True, exist_ok=True)
    runner = EngineRunner(request.settings, trace=request.trace, engine=request.engine, platform=request.platform,
                          run_dir=request.run_dir, reporter=reporter, synthesizer=synthesizer,
                          on_replay_progress=reporter.replay_progress)
    tuner = Tuner(request.settings, trace=request.trace, space=request.space, model_dir=request.model_dir,
                  platform=request.platform, runner=runner, base=request.base, make_checkpoint=make_checkpoint,
                  report=reporter, engine=request.engine)
    return tuner, progress
