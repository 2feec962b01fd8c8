"""What `tune replay` and `tune capacity` keep, whatever happens: a results folder of their own (an
earlier run's is never written over), every measured request's record on disk as soon as it
finishes, and Ctrl-C or SIGTERM turned into one clean stop that writes what was measured."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING

from tracetune.errors import InputError

if TYPE_CHECKING:
    from rich.console import Console

    from tracetune.replay.types import RequestRecord

RECORDS_FILE = "requests.jsonl"
SUMMARY_FILE = "summary.json"
# Files that mark a folder as an earlier run's (a replay's records and summary, an engine's log).
RUN_MARKERS = (RECORDS_FILE, SUMMARY_FILE, "engine-*.log")
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}  # 128 + the signal, as a shell reports it


def fresh_out_dir(out_dir: Path, console: Console) -> Path:
    """`out_dir`, or where it holds an earlier run's results, the first free `DIR-2`, `DIR-3`, ...
    beside it (said on the console): results are never written over. A file there is an error."""
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"--out {out_dir}: is a file, not a folder; name a folder for the results")
    if not _holds_a_run(out_dir):
        return out_dir
    n = 2
    while (beside := out_dir.with_name(f"{out_dir.name}-{n}")).exists():
        n += 1
    console.print(f"{out_dir} holds an earlier run's results (kept as they are); writing to {beside}",
                  highlight=False)
    return beside


def _holds_a_run(folder: Path) -> bool:
    return folder.is_dir() and any(next(folder.glob(pattern), None) is not None for pattern in RUN_MARKERS)


class RecordLog:
    """Measured requests' records, each appended to a JSONL file (and flushed) the moment it
    finishes, so an interrupt or a failing summary loses none; `records` holds them as well. The
    file (and its folder) is created with the first record. `label` adds fields to every line
    (a capacity search's load level)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[RequestRecord] = []
        self.lines: list[str] = []
        self._file: IO[str] | None = None

    def __call__(self, record: RequestRecord, **label: object) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (open until close())
        line = record.to_json()
        if label:  # the label's fields first, then the record's own: one JSON object
            line = json.dumps(label)[:-1] + ", " + line[1:]
        self._file.write(line + "\n")
        self._file.flush()
        self.records.append(record)
        self.lines.append(line)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def finish_in_trace_order(self) -> None:
        """Close, then rewrite the file (whole, atomically) in the trace's order, as a finished
        replay's records read best; until then it holds them in the order they finished."""
        from tracetune.files import write_atomic

        self.close()
        if self.lines:
            order = sorted(range(len(self.records)), key=lambda i: self.records[i].index)
            write_atomic(self.path, "".join(self.lines[i] + "\n" for i in order))


@dataclasses.dataclass
class Interrupt:
    """SIGTERM when it stopped the block; None otherwise (an interrupt then is Ctrl-C's)."""

    signum: int | None = None

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[signal.SIGTERM if self.signum == signal.SIGTERM else signal.SIGINT]

    @property
    def name(self) -> str:
        return "SIGTERM" if self.signum == signal.SIGTERM else "Ctrl-C"


@contextlib.contextmanager
def interruptible() -> Iterator[Interrupt]:
    """Within the block SIGTERM (a scheduler, `kill`) takes Ctrl-C's path, as in the main job: it
    calls whatever handles SIGINT at that moment (inside a replay's event loop: the loop's own, which
    cancels the replay cleanly; elsewhere Python's, which raises KeyboardInterrupt). SIGINT's handler
    is left alone (asyncio installs its clean one only over Python's default). The yielded
    `Interrupt` says which signal came; SIGTERM's previous handler is restored afterwards."""
    caught = Interrupt()

    def on_sigterm(signum, frame):
        caught.signum = signal.SIGTERM
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            return handler(signal.SIGINT, frame)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield caught
    finally:
        signal.signal(signal.SIGTERM, previous)
