"""A study remembers the rules it was measured under (SLO, attainment, precision, the trace's content,
engine, model, objectives) and the main job refuses to resume it under others: exit 2, both named,
before anything is written (the study database byte for byte as it was, no run folder). The study is
created as the main job creates it (its own request from the same flags), measured by a scripted
runner (no engine)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from rich.console import Console

from tests.reliability.scripted import SEQS, TRACE, ScriptedRunner, fake_model
from tracetune.cli.main import _build_parser
from tracetune.dashboard.storage import optuna_storage
from tracetune.errors import InputError
from tracetune.tuner.coordination import counted
from tracetune.tuner.settings import check_rules
from tracetune.tuner.study import Tuner

SLO = "ttft:p95<2s,tpot:p95<100ms"
STUDY = "traffic"


class CapacityRunner(ScriptedRunner):
    """Scripted measurements that also carry a capacity (the main job's objective with --slo)."""

    def measure(self, *args, **kwargs):
        measured = super().measure(*args, **kwargs)
        measured.summary.capacity = {"capacity_rps_per_gpu": 2.0, "capacity_scale": 1.0}
        return measured


def flags(tmp: Path, *extra: str, trials: int = 2) -> list[str]:
    """The main job's command line on this folder's trace, space, model and study database."""
    return ["--trace", str(tmp / "traffic.jsonl"), "--space", str(tmp / "space.yaml"), "--model", str(tmp / "model"),
            "--storage", f"sqlite:///{tmp / 'study.db'}", "--study", STUDY, "--run-dir", str(tmp / "run"),
            "--slo", SLO, "--trials", str(trials), *extra]


def request_of(argv: list[str], out: io.StringIO | None = None):
    from tracetune.cli.tune import build_request

    args = _build_parser().parse_args(argv)
    args.argv = argv
    return build_request(args, Console(file=out or io.StringIO(), width=400))


def run_study(argv: list[str], calls: list | None = None):
    """The study the main job would run for `argv`, its engine runs scripted."""
    request = request_of(argv)
    tuner = Tuner(request.settings, trace=request.trace, space=request.space, model_dir=request.model_dir,
                  platform=request.platform, runner=CapacityRunner(lambda c: (0.4, 60.0, 0.0), calls=[] if calls is None else calls),
                  base=request.base, engine=request.engine)
    return tuner.run()


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Path:
    """A folder holding a study of two measured trials under `flags`' rules."""
    tmp = tmp_path_factory.mktemp("measured")
    (tmp / "traffic.jsonl").write_text(TRACE)
    (tmp / "space.yaml").write_text(SEQS)
    fake_model(tmp / "model")
    study = run_study(flags(tmp))
    assert counted(study) == 2 and not (tmp / "run").exists()
    return tmp


@pytest.fixture
def folder(measured, tmp_path) -> Path:
    """A copy of the measured study's folder, for a test to resume."""
    copy = tmp_path / "study"
    shutil.copytree(measured, copy)
    return copy


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tune(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "400", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "tracetune", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def other_trace(tmp: Path) -> list[str]:
    (tmp / "other.jsonl").write_text(TRACE + '{"timestamp": 0.6, "prompt": "one more", "output_length": 8}\n')
    return ["--trace", str(tmp / "other.jsonl")]


# (what changes, the flags that change it, what the study was measured under, what this run asks)
CHANGES = [
    ("slo", lambda tmp: ["--slo", "ttft:p99<1s"], "--slo ttft:p95<2000ms,tpot:p95<100ms", "--slo ttft:p99<1000ms"),
    ("attainment", lambda tmp: ["--attainment", "0.99"], "--attainment 0.95", "--attainment 0.99"),
    ("precision", lambda tmp: ["--precision", "0.1"], "--precision 0.05", "--precision 0.1"),
    ("trace", other_trace, "a --trace of sha256 " + hashlib.sha256(TRACE.encode()).hexdigest()[:12],
     "a --trace of sha256 "),
    ("model", lambda tmp: ["--model", str(fake_model(tmp / "other-model"))], "--model model", "--model other-model"),
    ("objectives", lambda tmp: ["--objectives", "ttft_p99,capacity"], "--objectives ttft_p99,capacity,quality_loss",
     "--objectives ttft_p99,capacity"),
]


@pytest.mark.parametrize(("what", "change", "before", "now"), CHANGES, ids=[c[0] for c in CHANGES])
def test_resuming_under_other_rules_is_refused_naming_both(folder, what, change, before, now):
    db = folder / "study.db"
    kept = digest(db)
    out = tune(flags(folder, *change(folder), trials=4), cwd=folder)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    message = out.stderr.strip().splitlines()[-1]
    assert message.startswith(f"error: study '{STUDY}' was measured under {before}; this run asks {now}"), message
    assert message.endswith("Resume with the same rules, or start a new study: --study NEW"), message
    assert digest(db) == kept  # not a byte written
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith("study.db")) == ["study.db"]
    assert not (folder / "run").exists()


def test_every_difference_is_named_in_one_line(folder):
    out = tune(flags(folder, "--slo", "ttft:p99<1s", "--attainment", "0.9"), cwd=folder)
    assert out.returncode == 2
    assert (f"study '{STUDY}' was measured under --slo ttft:p95<2000ms,tpot:p95<100ms, --attainment 0.95; this run "
            f"asks --slo ttft:p99<1000ms, --attainment 0.9.") in out.stderr


def test_same_rules_resume_the_study(folder):
    # The same trace under another name, the SLO spelled another way: the same rules. (Their order is
    # a rule: the sampler reads each trial's constraints in the order of the SLOs.)
    shutil.copy(folder / "traffic.jsonl", folder / "renamed.jsonl")
    argv = flags(folder, trials=3) + ["--trace", str(folder / "renamed.jsonl"), "--slo", "ttft:p95<2000ms,tpot:p95<0.1s"]
    calls: list[str] = []
    study = run_study(argv, calls)
    # One more trial measured (a configuration drawn again is reused, not measured); the reference reused.
    assert counted(study) == 3 and len(calls) == 1 and calls[0].startswith("trial-"), calls


def test_the_tuner_refuses_other_rules_too(folder):
    """A worker that reaches the study without the command line's check is refused by the study itself."""
    request = request_of(flags(folder, trials=3))
    request.settings.trace_sha256 = "0" * 64
    tuner = Tuner(request.settings, trace=request.trace, space=request.space, model_dir=request.model_dir,
                  platform=request.platform, runner=CapacityRunner(lambda c: (0.4, 60.0, 0.0), calls=[]),
                  base=request.base, engine=request.engine)
    with pytest.raises(InputError, match=r"was measured under a --trace of sha256 \w{12}; this run asks a --trace "
                                         r"of sha256 000000000000"):
        tuner.run()


def forget_rules(folder: Path) -> None:
    """The study as tracetune made it before it kept rules: its objectives and SLOs alone."""
    with sqlite3.connect(folder / "study.db") as conn:
        assert conn.execute("DELETE FROM study_user_attributes WHERE key = 'rules'").rowcount == 1


def test_a_study_from_before_kept_rules_resumes_with_a_warning(folder):
    forget_rules(folder)
    out = io.StringIO()
    request = request_of(flags(folder, "--slo", "ttft:p95<2000ms,tpot:p95<0.1s"), out)  # its SLOs, written otherwise
    assert request.settings.study_name == STUDY
    lines = [line for line in out.getvalue().splitlines() if "could not be checked" in line]
    assert lines == [f"! study '{STUDY}' predates kept rules: its objectives and SLO match this run's; its trace, "
                     f"model, engine, attainment and precision could not be checked"]


def test_a_study_from_before_kept_rules_refuses_another_slo(folder):
    forget_rules(folder)
    kept = digest(folder / "study.db")
    out = tune(flags(folder, "--slo", "ttft:p99<1s", trials=4), cwd=folder)
    assert out.returncode == 2 and "Traceback" not in out.stdout + out.stderr, out.stdout + out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        f"error: study '{STUDY}' was measured under --slo ttft:p95<2000ms,tpot:p95<100ms; this run asks --slo "
        f"ttft:p99<1000ms. Resume with the same rules, or start a new study: --study NEW")
    assert digest(folder / "study.db") == kept and not (folder / "run").exists()


def test_a_study_from_before_kept_rules_still_checks_its_objectives_and_slos():
    attrs = {"objectives": ["ttft_p99", "output_tps"], "slos": []}
    rules = {"objectives": ["ttft_p99", "capacity"], "slo": ""}
    with pytest.raises(InputError, match="measured under --objectives ttft_p99,output_tps; this run asks "
                                         "--objectives ttft_p99,capacity"):
        check_rules("old", attrs, rules)
    same = {**rules, "objectives": ["ttft_p99", "output_tps"]}
    assert check_rules("old", attrs, same) is False
    with pytest.raises(InputError, match="measured under no --slo; this run asks --slo ttft:p99<1000ms"):
        check_rules("old", attrs, {**same, "slo": "ttft:p99<1000ms"})
    # kept in whatever form it was written: read again where it can be, compared as written where not
    assert check_rules("old", {**attrs, "slos": ["ttft:p99<1s", "tpot:p50<50ms"]},
                       {**same, "slo": "ttft:p99<1000ms,tpot:p50<50ms"}) is False
    with pytest.raises(InputError, match="measured under --slo speed<fast; this run asks --slo ttft:p99<1000ms"):
        check_rules("old", {**attrs, "slos": ["speed<fast"]}, {**same, "slo": "ttft:p99<1000ms"})


def test_a_rule_kept_as_unknown_is_not_checked_and_the_others_are():
    attrs = {"objectives": ["ttft_p99"], "rules": {"slo": "", "trace_sha256": None, "engine": "vllm"}}
    asked = {"objectives": ["ttft_p99"], "slo": "", "trace_sha256": "ab" * 32, "engine": "vllm"}
    assert check_rules("s", attrs, asked) is True
    with pytest.raises(InputError, match="measured under no --slo; this run asks --slo ttft:p99<1000ms"):
        check_rules("s", attrs, {**asked, "slo": "ttft:p99<1000ms"})


def test_a_new_study_keeps_its_rules(measured):
    study = optuna.load_study(study_name=STUDY, storage=optuna_storage(f"sqlite:///{measured / 'study.db'}"))
    rules = study.user_attrs["rules"]
    assert rules == {"slo": "ttft:p95<2000ms,tpot:p95<100ms", "attainment": 0.95, "precision": 0.05,
                     "trace_sha256": hashlib.sha256(TRACE.encode()).hexdigest(), "engine": "vllm", "model": "model"}
    assert study.user_attrs["objectives"] == ["ttft_p99", "capacity", "quality_loss"]


@pytest.mark.parametrize("tables", ["all", "optuna's only"])
def test_a_warm_start_reads_the_earlier_study_and_writes_nothing_there(folder, tables):
    """--warm-start-storage opens the earlier study read-only: not a byte written there, even where a
    writer would add what it lacks (a study database without tracetune's tables)."""
    earlier = folder / "study.db"
    if tables != "all":
        conn = sqlite3.connect(earlier)
        with conn:
            ours = [n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE name LIKE 'tracetune_%' "
                                               "AND type = 'table'")]
            for name in ours:
                conn.execute(f"DROP TABLE {name}")
        conn.close()
        assert ours
    kept, mtime = digest(earlier), earlier.stat().st_mtime_ns
    with sqlite3.connect(earlier) as conn:
        values = {v for (v,) in conn.execute("SELECT value_json FROM trial_user_attributes WHERE key = 'values'")}
    study = run_study(flags(folder, "--storage", f"sqlite:///{folder / 'new.db'}", "--study", "fresh",
                            "--warm-start", STUDY, "--warm-start-storage", str(earlier)))
    assert digest(earlier) == kept and earlier.stat().st_mtime_ns == mtime
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith("study.db")) == ["study.db"]
    firsts = [json.dumps(t.user_attrs["values"]) for t in study.trials[:len(values)]]
    assert values and set(firsts) == values  # the earlier study's configurations, tried first
