"""What the bad-input fuzz suite shares: a corrupted file (`Case`), the check of a message that names
its file, line and field, Hypothesis's settings, and the count of cases run.

The suite (tests/reliability/test_bad_traces.py, test_bad_spaces.py, test_bad_input_cli.py) fuzzes
trace lines, public trace formats and search-space files: generated valid (bad_traces.py,
bad_spaces.py), then corrupted one way each (wrong types, missing fields, negative / unsorted
timestamps, NaN, huge prompts, non-UTF-8 bytes, non-object or truncated JSON, empty files, blank
lines, YAML errors, unknown keys, low > high, empty choices, `when` on an unknown parameter).

Properties:
- library: parsing raises the project's `InputError` (never a raw exception), and the message
  starts with `FILE:LINE: ` at the right 1-based line and names the field where there is one;
- CLI: the real `tune` in a subprocess exits 2, prints no traceback, names the file and line,
  and writes nothing (no run directory, no output file), before any model or engine is touched.

Hypothesis runs derandomized (the same examples on every run, so CI is reproducible). The number
of cases is printed at the end of each module (the session's total so far) and stored in pytest's
cache under `tracetune/bad_input_cases` (`.pytest_cache/v/tracetune/bad_input_cases`).
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings

LIBRARY = settings(max_examples=50, derandomize=True, database=None, deadline=2000,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# Per corruption kind. Each CLI example starts `tune` (0.5-2 s of imports on a busy 2-core machine),
# so the CLI runs one generated file of every kind.
CLI = settings(max_examples=1, derandomize=True, database=None, deadline=None,
               phases=[Phase.explicit, Phase.generate],  # no shrinking: every step would start `tune` again
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

CASES: collections.Counter[str] = collections.Counter()  # every module's cases, this session
STARTED: list[float] = []  # when the first module of the suite started


@pytest.fixture(scope="module", autouse=True)
def report_case_counts(request):
    """Autouse in every module that imports it: at its end, the session's case count so far, printed
    and cached."""
    STARTED[:] = STARTED or [time.perf_counter()]
    started = STARTED[0]
    yield
    total = sum(CASES.values())
    detail = ", ".join(f"{name} {n}" for name, n in sorted(CASES.items()))
    cache = getattr(request.config, "cache", None)  # absent under `-p no:cacheprovider`
    if cache is not None:
        cache.set("tracetune/bad_input_cases",
                  {"total": total, "by_property": dict(CASES), "seconds": round(time.perf_counter() - started, 1)})
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"\nbad-input fuzz cases: {total} ({detail})")


@dataclass
class Case:
    """A corrupted file: its bytes, the 1-based line the error must name (None: the whole file),
    the field the message must name (None: no field), and a fragment the message must contain."""

    data: bytes
    line: int | None
    field: str | None
    says: str
    kind: str

    def __repr__(self) -> str:  # huge fields would flood the failure report
        data = self.data if len(self.data) <= 600 else self.data[:300] + b"..." + self.data[-200:]
        return f"Case({self.kind!r}, line={self.line}, field={self.field!r}, says={self.says!r}, data={data!r})"


def check_message(message: str, path: Path | str, case: Case) -> None:
    where = f"{path}:{case.line}: " if case.line is not None else f"{path}: "
    assert message.startswith(where), f"{case.kind}: expected {where!r} at the start of {message!r}"
    if case.field is not None:
        assert f"field '{case.field}" in message, f"{case.kind}: field {case.field!r} not named in {message!r}"
    assert case.says in message, f"{case.kind}: {case.says!r} not in {message!r}"
    assert "Traceback" not in message
