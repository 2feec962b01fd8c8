"""The main job's request (every input checked and resolved) and the tuner built from it, reporting
to the console: used by `tune --trace` (cli.tune) and, once its workers are done, by `--gpus`
(cli.workers) to report the study's results."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

    from tracetune.engine_adapter.kind import CheckpointMaker, EngineKind
    from tracetune.engine_adapter.platform import Platform
    from tracetune.replay.trace import Trace
    from tracetune.search_spaces.space import SearchSpace
    from tracetune.tuner.settings import StudySettings
    from tracetune.tuner.study import Tuner


@dataclasses.dataclass
class TuneRequest:
    """What the main job was asked, checked and resolved: what the tuner is built from."""

    settings: StudySettings
    trace: Trace
    space: SearchSpace  # with what this machine cannot run removed
    model_dir: Path
    platform: Platform
    run_dir: Path
    base: dict[str, object]  # engine settings from the command line, held for every trial
    storage_shown: str
    engine: EngineKind  # which engine the trials start


def make_tuner(request: TuneRequest, console: Console) -> tuple[Tuner, Progress]:
    """The study's tuner, reporting to the console, and the progress display it updates (the run
    directory is made only now: every input has been checked)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tracetune.cli.reporter import ConsoleReporter
    from tracetune.tuner.measure import EngineRunner
    from tracetune.tuner.study import Tuner

    synthesizer = None
    if any(r.input_length is not None for r in request.trace.records):
        from transformers import AutoTokenizer

        from tracetune.replay.synth import PromptSynthesizer, Tokenizer
        # transformers' tokenizer types do not spell out the protocol's signatures; the tokenizer meets it
        synthesizer = PromptSynthesizer(cast("Tokenizer", AutoTokenizer.from_pretrained(str(request.model_dir))))

    factory = request.engine.make_checkpoint  # quantized checkpoints and derived drafts, made on first use
    make_checkpoint: CheckpointMaker | None = None if factory is None else \
        (lambda scheme: factory(request.model_dir, scheme, lambda m: console.print(f"  [dim]·[/] {m}")))

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


def check_storage(url: str, run_dir: Path, *, flag: str = "--storage") -> set[str]:
    """The tables at the main job's storage (none for a SQLite file not made yet), or an InputError
    naming `flag` and what to do: a SQLite file in a folder that does not exist (other than
    `run_dir`, which the job makes), a file that is not a database, a URL SQLAlchemy cannot read, a
    server that does not answer. Read-only; checked before anything is created."""
    from tracetune.dashboard.storage import database_tables, sqlite_path
    from tracetune.errors import InputError
    from tracetune.files import is_database
    from tracetune.tuner.secrets import display_url

    path = sqlite_path(url)
    if path is not None and not path.exists():
        if not path.parent.is_dir() and path.parent.resolve() != run_dir.resolve():
            raise InputError(f"{flag} {display_url(url)}: the folder {str(path.parent)!r} does not exist; "
                             f"create it first (mkdir -p {path.parent}) or name a file in an existing folder")
        return set()
    if path is not None and path.is_file() and path.stat().st_size == 0:
        return set()  # SQLite takes an empty file as a new database
    if path is not None and not is_database(path):
        raise InputError(f"{flag} {display_url(url)}: {str(path)!r} is not a SQLite database; name a new file "
                         f"or the study.db of an earlier run")
    return database_tables(url, flag=flag)


def check_warm_start(url: str, name: str, run_dir: Path, *, flag: str) -> None:
    """--warm-start `name` at `url` (named by `flag`: --warm-start-storage, else --storage): the
    storage checked as `check_storage` checks it and the study found there, read-only, before
    anything is created; an InputError naming the flag and what is there otherwise."""
    from tracetune.dashboard.storage import STUDY_TABLES, study_names
    from tracetune.errors import InputError
    from tracetune.tuner.secrets import display_url

    tables = check_storage(url, run_dir, flag=flag)
    if stored_study_attrs(url, name, tables) is not None:
        return
    names = study_names(url) if STUDY_TABLES <= tables else []
    there = f"studies there: {', '.join(names)}" if names else "it holds no study"
    raise InputError(f"--warm-start {name}: no such study at {flag} {display_url(url)} ({there}); name one of "
                     f"them, or give --warm-start-storage URL of the database that holds it")


def stored_study_attrs(url: str, name: str, tables: set[str]) -> dict[str, object] | None:
    """The user attributes of study `name` at `url` (whose `tables` `check_storage` read), read
    without writing; None when there is no such study yet."""
    from tracetune.dashboard.storage import STUDY_TABLES, optuna_storage

    if not STUDY_TABLES <= tables:
        return None
    storage = optuna_storage(url)
    try:
        return storage.get_study_user_attrs(storage.get_study_id_from_name(name))
    except KeyError:
        return None
    finally:
        storage.engine.dispose()


def check_resume(request: TuneRequest, attrs: dict[str, object] | None, console: Console) -> None:
    """Resuming a study (its user attributes `attrs`; None for a new study) only under the rules it
    was measured under (`tuner.settings.check_rules`): an InputError naming both otherwise. A study
    from before tracetune kept its rules is checked on what it kept (objectives, SLO) and resumes, with
    a line saying the others could not be checked."""
    from tracetune.tuner.settings import check_rules, study_rules

    if attrs is None:
        return
    rules = study_rules(request.settings, engine=request.engine.name, model_dir=request.model_dir)
    if not check_rules(request.settings.study_name, attrs, rules):
        console.print(f"[yellow]![/] study {request.settings.study_name!r} predates kept rules: its objectives and "
                      f"SLO match this run's; its trace, model, engine, attainment and precision could not be "
                      f"checked", highlight=False)
