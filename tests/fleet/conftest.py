"""Helpers of the fleet tests: run `tune fleet` in this process and read back what it wrote."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tracetune.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "examples" / "traffic.jsonl"
STORAGE = "postgresql://tuner@db.internal:5432/tracetune"


def write_trace(path: Path, records: int, prompt_chars: int) -> Path:
    """A valid native trace of `records` requests, each prompt `prompt_chars` long."""
    lines = [json.dumps({"timestamp": i * 0.5, "prompt": "x" * prompt_chars, "output_length": 8})
             for i in range(records)]
    path.write_text("\n".join(lines) + "\n")
    return path


class Run:
    """One `tune fleet` run in this process: its exit code, output, and the files it wrote."""

    def __init__(self, capsys: pytest.CaptureFixture[str], out: Path, argv: list[str]) -> None:
        self.code = main(["fleet", *argv] if "--out" in argv else ["fleet", "--out", str(out), *argv])
        self.stdout, self.stderr = capsys.readouterr()
        self.files = {p.name: p.read_text() for p in out.iterdir()} if out.is_dir() else {}
        self.docs = [d for d in yaml.safe_load_all(self.files["fleet.yaml"])] if "fleet.yaml" in self.files else []

    def kind(self, kind: str) -> dict:
        found = [d for d in self.docs if d["kind"] == kind]
        assert len(found) == 1, [d["kind"] for d in self.docs]
        return found[0]

    @property
    def worker(self) -> dict:
        return self.kind("Job")["spec"]["template"]["spec"]["containers"][0]


@pytest.fixture
def fleet(tmp_path, capsys):
    """`fleet(*argv)`: `tune fleet --out TMP ARGV...` run here."""
    def run(*argv: str) -> Run:
        return Run(capsys, tmp_path / "out", list(argv))
    return run
