"""Errors shared by every tracetune package: the root `TuneError` and what derives from it.

Every package imports them from here (`tracetune.errors`); the CLI turns a `TuneError` into its
message and `exit_code`, never a traceback.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


class TuneError(Exception):
    """Root of every error tracetune reports to a user.

    The CLI prints `str(error)` and exits with `exit_code`, never a traceback.
    """

    exit_code = 1


class InputError(TuneError):
    """Bad user input (a flag, a trace line, a config file). Exit code 2."""

    exit_code = 2


class ModelError(TuneError):
    """A model could not be fetched, converted or found."""


class ModelDirError(InputError, ModelError):
    """A model directory the user named is missing or incomplete. Exit code 2."""


class EngineError(TuneError):
    """An engine failed to start, crashed or misbehaved.

    Carries what a user needs to diagnose it: the exit code (None when the process was still
    alive, e.g. on a timeout) and the last lines the engine logged.
    """

    def __init__(self, message: str, *, exit_code: int | None = None, log_tail: str = "") -> None:
        self.engine_exit_code = exit_code
        self.log_tail = log_tail
        full = message
        if log_tail:
            full += "\n--- last engine log lines ---\n" + log_tail.rstrip()
        super().__init__(full)
        self.reason = message


class EngineStartError(EngineError):
    """The engine process exited before it became healthy."""


class EngineTimeoutError(EngineError):
    """The engine did not become healthy within the allowed time."""


class Rejected(Exception):
    """A configuration that cannot run on this platform, known before any engine starts; `reasons`
    says why (a trial's data, not a user's error)."""

    def __init__(self, reasons: list[str]):
        self.reasons = reasons
        super().__init__("; ".join(reasons))


@contextlib.contextmanager
def opened_input(path: Path, what: str, error: type[InputError] = InputError) -> Iterator[BinaryIO]:
    """A user's input file opened for reading (bytes). A missing file, a directory or one that
    cannot be read is `error` naming the file and `what` it should be ("trace file", ...)."""
    try:
        with open(path, "rb") as f:
            yield f
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory, not a {what}") from None
    except OSError as exc:  # e.g. no permission to read it
        raise error(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
