"""The tuner's events (tuner.reporter.Reporter): the console implements every one with the keywords the
tuner passes; NullReporter hears them all and does nothing."""

from __future__ import annotations

import inspect

from tracetune.cli.reporter import ConsoleReporter
from tracetune.tuner.reporter import NullReporter, Reporter

EVENTS = [name for name in vars(Reporter) if name.startswith("on_") or name == "replay_progress"]


def test_the_console_takes_every_event_with_the_tuners_keywords():
    assert len(EVENTS) == 29
    for name in EVENTS:
        wanted = [p for p in inspect.signature(getattr(Reporter, name)).parameters if p != "self"]
        taken = inspect.signature(getattr(ConsoleReporter, name)).parameters
        any_keyword = any(p.kind == p.VAR_KEYWORD for p in taken.values())
        assert any_keyword or all(p in taken for p in wanted), name
        required = [p for p, v in taken.items() if p != "self" and v.default is v.empty
                    and v.kind not in (v.VAR_KEYWORD, v.VAR_POSITIONAL)]
        assert set(required) <= set(wanted), name


def test_the_null_reporter_ignores_every_event():
    reporter = NullReporter()
    for name in EVENTS:
        params = [p for p in inspect.signature(getattr(Reporter, name)).parameters.values() if p.name != "self"]
        args = {p.name: None for p in params if p.default is p.empty}
        if name == "replay_progress":
            assert reporter.replay_progress(1, 2, 0) is None
        else:
            assert getattr(reporter, name)(**args) is None


def test_the_references_progress_line_ends_with_the_reference():
    """The reference's progress line went on to the study's end (printed stale below the last trial);
    each engine's line now ends with its measurement, the reference's too."""
    import io

    from rich.console import Console
    from rich.progress import Progress

    from tracetune.replay.metrics import summarize
    from tracetune.replay.types import ReplayOptions, ReplayResult

    console = Console(file=io.StringIO(), width=80)
    progress = Progress(console=console)
    reporter = ConsoleReporter(console, progress, storage="sqlite://", platform="cpu")
    reporter.on_engine_starting(label="reference")
    assert len(progress.tasks) == 1
    reporter.on_reference_done(summary=summarize(ReplayResult([], 1.0, ReplayOptions())), quality=None)
    assert progress.tasks == []
    reporter.on_engine_starting(label="trial-0000")
    reporter.on_engine_starting(label="trial-0001")  # a line left open is ended by the next
    assert [t.description for t in progress.tasks] == ["  trial-0001: engine starting"]
