"""`tune export` and `tune dashboard` as a user runs them (real subprocesses)."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import run_tune
from tracetune.cli.dashboard import is_loopback, streamlit_argv

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tune(*args, cwd=ROOT, timeout=120):
    return run_tune(*args, cwd=cwd, timeout=timeout)


def test_export_to_stdout_and_file(synthetic_url, tmp_path):
    out = tune("export", "--storage", synthetic_url, "--study", "synth", "--best", "--format", "json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["trial"] == 1
    target = tmp_path / "deploy" / "k8s.yaml"
    out = tune("export", "--storage", synthetic_url, "--pick", "max:output_tps where ttft_p99<400ms",
               "--format", "k8s", "-o", str(target), "--image", "vllm/vllm-openai:v0.11.0", "--gpus", "2")
    assert out.returncode == 0, out.stderr
    docs = list(yaml.safe_load_all(target.read_text()))
    assert docs[0]["metadata"]["annotations"]["tracetune.io/trial"] == "0"
    assert docs[0]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert "wrote" in out.stdout


@pytest.mark.parametrize("args, message", [
    (["--trial", "5", "--format", "json"], "is rejected"),
    (["--trial", "99", "--format", "json"], "has no trial 99"),
    (["--pick", "max:bogus", "--format", "json"], "unknown metric 'bogus'"),
    (["--pick", "max:output_tps where ttft_p99<1ms", "--format", "json"], "no trial on the front meets it"),
    (["--best", "--format", "k8s", "--name", "Not_A_Label"], "DNS-1123"),
])
def test_export_errors_are_clear_exit_2(synthetic_url, args, message):
    out = tune("export", "--storage", synthetic_url, *args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr



def test_export_of_an_engine_it_cannot_deploy_exits_2(synthetic_url, tmp_path):
    """A study of an engine tracetune does not start (its rules name the engine) has no server to export."""
    import optuna

    copy = tmp_path / "endpoint.db"
    shutil.copy(synthetic_url.removeprefix("sqlite:///"), copy)
    url = f"sqlite:///{copy}"
    optuna.load_study(study_name="synth", storage=url).set_user_attr("rules", {"engine": "openai"})
    out = tune("export", "--storage", url, "--trial", "1", "--format", "k8s")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "measured the OpenAI-compatible endpoint engine, which tracetune does not start itself" in out.stderr
    assert "Traceback" not in out.stderr


def test_export_needs_exactly_one_choice_and_a_known_format(synthetic_url):
    out = tune("export", "--storage", synthetic_url, "--format", "json")
    # a trial's format needs one of the choices (the study's formats take none)
    assert out.returncode == 2 and "add --trial N, --best, --pick EXPR or --reference" in out.stderr
    out = tune("export", "--storage", synthetic_url, "--trial", "1", "--best", "--format", "json")
    assert out.returncode == 2 and "not allowed with argument" in out.stderr
    out = tune("export", "--storage", synthetic_url, "--best", "--format", "yaml")
    assert out.returncode == 2 and "invalid choice" in out.stderr


def test_missing_storage_is_a_clear_error(synthetic_url, tmp_path):
    out = tune("export", "--storage", synthetic_url[len("sqlite:///"):], "--trial", "0", "--format", "json")
    assert out.returncode == 0 and json.loads(out.stdout)["trial"] == 0  # a plain path to the file works too
    for cmd in (["export", "--best", "--format", "json"], ["dashboard"]):
        out = tune(*cmd, "--storage", f"sqlite:///{tmp_path / 'none.db'}")
        assert out.returncode == 2 and "no such database file" in out.stderr and "Traceback" not in out.stderr
        assert not (tmp_path / "none.db").exists()
    out = tune("dashboard", cwd=tmp_path)  # no --storage and no runs/ here
    assert out.returncode == 2 and "run `tune --trace FILE` first" in out.stderr


@pytest.mark.slow  # one real CLI run per bad storage URL (about 10 s)
def test_every_bad_storage_is_one_line_and_exit_2(tmp_path):
    """A plain missing path, a file that is not a database (plain path and URL), a URL no driver reads
    and a PostgreSQL server that does not answer (a closed port here): exit 2, one line, no traceback."""
    not_db = tmp_path / "notes.txt"
    not_db.write_text("not a database\n")
    cases = [(str(tmp_path / "missing.db"), "no such file"), (str(not_db), "is not a SQLite database"),
             (f"sqlite:///{not_db}", "is not a SQLite database"), ("nodriver://x/y", "not a database URL"),
             (f"postgresql://tuner:secret@127.0.0.1:{free_port()}/studies", "cannot open the database")]
    for storage, message in cases:
        for cmd in (["dashboard"], ["export", "--best", "--format", "json"]):
            out = tune(*cmd, "--storage", storage)
            lines = out.stderr.strip().splitlines()
            assert out.returncode == 2 and len(lines) == 1 and message in lines[0], (storage, cmd, out.stderr)
            assert "secret" not in out.stderr  # the password is never printed
    assert not_db.read_text() == "not a database\n"


def test_a_busy_port_is_refused_before_any_url_is_printed(synthetic_url):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = tune("dashboard", "--storage", synthetic_url, "--port", str(port))
    assert out.returncode == 2 and f"--port {port}: cannot listen on 127.0.0.1:{port}" in out.stderr
    assert "http://" not in out.stdout + out.stderr


def test_dashboard_binds_loopback_by_default():
    argv = streamlit_argv("127.0.0.1", 8501)
    assert argv[argv.index("--server.address") + 1] == "127.0.0.1"
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")


def _listening(port: int) -> set[str]:
    """Local addresses listening on `port`, from /proc/net/tcp and tcp6."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, _, state = line.split()[1], line.split()[2], line.split()[3]
            addr, port_hex = local.rsplit(":", 1)
            if int(port_hex, 16) == port and state == "0A":  # LISTEN
                found.add(addr)
    return found


def start_dashboard(*args, cwd=ROOT):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tracetune", "dashboard", "--port", str(port), *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"tune dashboard exited {proc.returncode}: {proc.stdout.read()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).status_code == 200:
                return proc, port
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop(proc)
    raise AssertionError("tune dashboard did not come up within 90 s")


def stop(proc) -> str:
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass
    return proc.stdout.read()


def test_dashboard_serves_the_latest_run_on_loopback_only(synthetic_url, tmp_path):
    # After `tune --trace ...` the run's study is runs/STUDY/study.db in the working directory.
    (tmp_path / "runs" / "synth").mkdir(parents=True)
    shutil.copy(synthetic_url[len("sqlite:///"):], tmp_path / "runs" / "synth" / "study.db")
    proc, port = start_dashboard(cwd=tmp_path)
    try:
        listening = _listening(port)
        assert listening == {"0100007F"}, listening  # 127.0.0.1 only, not 0.0.0.0 / ::
    finally:
        output = stop(proc)
    assert "dashboard for study synth" in output and f"http://localhost:{port}" in output


def test_every_export_format_is_one_record_the_cli_offers_and_its_writer_loads(capsys):
    from tracetune.cli.main import _build_parser
    from tracetune.dashboard.export_formats import EXPORT_FORMATS, FORMATS, STUDY_FORMATS, export_format
    from tracetune.errors import InputError

    parser = _build_parser()
    for name in (*FORMATS, "vllm-cmd"):
        assert parser.parse_args(["export", "--best", "--format", name]).fmt == export_format(name).name
    for name in STUDY_FORMATS:
        assert parser.parse_args(["export", "--format", name]).fmt == name
    with pytest.raises(SystemExit):
        parser.parse_args(["export", "--best", "--format", "pdf"])
    choices = (*FORMATS, *STUDY_FORMATS)
    assert "choose from " + ", ".join(map(repr, choices)) in " ".join(capsys.readouterr().err.split())
    assert len({f.file_name for f in EXPORT_FORMATS}) == len(choices) == len(EXPORT_FORMATS)
    for fmt in EXPORT_FORMATS:
        module, function = fmt.writer.split(":")
        assert callable(getattr(importlib.import_module(f"tracetune.dashboard.export.{module}"), function)), fmt
        assert export_format(fmt.name) is fmt and all(export_format(a) is fmt for a in fmt.aliases)
    with pytest.raises(InputError, match="--format 'pdf' is not one of command, compose, k8s, helm-values, json, "
                                         "pareto, best"):
        export_format("pdf")


def test_the_study_formats_write_the_front_and_its_best_and_take_no_trial(synthetic_url, tmp_path):
    """`--format pareto` and `--format best` export the study (the files `tune --trace` writes when it
    ends): the best row is the trial `--best` exports; a trial choice with them, or none with a trial's
    format, is refused before anything is written."""
    common = ["export", "--storage", synthetic_url, "--study", "synth"]
    pareto = tune(*common, "--format", "pareto")
    best = tune(*common, "--format", "best", "-o", str(tmp_path))
    assert pareto.returncode == best.returncode == 0, pareto.stderr + best.stderr
    front = json.loads(pareto.stdout)
    written = json.loads((tmp_path / "best.json").read_text())
    assert front["study"] == "synth" and front["verdict"] and written["verdict"] == front["verdict"]
    assert written["trial"] in [row["trial"] for row in front["trials"]]
    chosen = tune(*common, "--best", "--format", "json")
    if written["reference_is_best"]:
        assert chosen.returncode == 2
    else:
        assert chosen.returncode == 0 and json.loads(chosen.stdout)["trial"] == written["trial"]
    both = tune(*common, "--format", "pareto", "--trial", "1")
    neither = tune(*common, "--format", "json", "-o", str(tmp_path / "t.json"))
    assert both.returncode == neither.returncode == 2 and not (tmp_path / "t.json").exists()
    assert "writes the whole study" in both.stderr and "exports one trial" in neither.stderr


def test_the_earlier_names_of_a_format_and_the_version_flag_still_work(synthetic_url):
    """`--format vllm-cmd` and `--vllm-version` (their names before llama.cpp's server could be
    exported) give what `--format command` and `--engine-version` give."""
    common = ["export", "--storage", synthetic_url, "--study", "synth", "--best"]
    new = tune(*common, "--format", "command", "--engine-version", "0.26.0")
    old = tune(*common, "--format", "vllm-cmd", "--vllm-version", "0.26.0")
    assert new.returncode == old.returncode == 0, old.stderr
    assert old.stdout == new.stdout and "# tracetune export (command)" in new.stdout
    assert "vLLM 0.26.0" in new.stdout


@pytest.mark.integration
def test_export_best_is_the_trial_in_best_json(mini_study, tmp_path):
    """`tune export --best` and the tuner's best.json name the same trial; its command runs in a shell."""
    run_dir, _, first = mini_study
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    best = json.loads((run_dir / "best.json").read_text())
    out = tune("export", "--storage", f"sqlite:///{run_dir / 'study.db'}", "--study", "mini", "--best",
               "--format", "json")
    if best["trial"] == "reference":  # this machine measured vLLM's defaults best: nothing to deploy but them
        assert out.returncode == 2 and "defaults" in out.stderr and best["reference_is_best"]
        return
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["trial"] == best["trial"] and doc["config"] == best["config"]
    assert doc["measured_platform"] == "cpu"


def test_export_of_the_h200_random_weight_study_refuses_without_the_flag(tmp_path):
    """docs/results/h200/study_a.db.xz: the H200 study measured the 8B shape with random weights."""
    import lzma

    db = tmp_path / "study_a.db"
    db.write_bytes(lzma.decompress((ROOT / "docs" / "results" / "h200" / "study_a.db.xz").read_bytes()))
    out = tune("export", "--storage", str(db), "--best", "--format", "k8s")
    assert out.returncode == 2 and "was measured with random weights (load_format dummy)" in out.stderr
    assert "--allow-dummy-weights" in out.stderr and "Traceback" not in out.stderr and not out.stdout
    out = tune("export", "--storage", str(db), "--best", "--format", "k8s", "--allow-dummy-weights")
    assert out.returncode == 0 and "# WARNING: measured with random weights" in out.stdout
    assert "--load-format" in out.stdout and "image: vllm/vllm-openai:v0.24.0" in out.stdout


# -- read-only, the storage box, the cost of the choice (#27, #25) --------------------------------
def test_an_empty_file_is_refused_by_both_commands_and_stays_empty(tmp_path):
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    for storage in (str(empty), f"sqlite:///{empty}"):
        for cmd in (["dashboard"], ["export", "--best", "--format", "json"]):
            out = tune(*cmd, "--storage", storage)
            assert out.returncode == 2, (cmd, out.stdout, out.stderr)
            assert f"{str(empty)!r} is empty, not a study database" in out.stderr and "tune --trace" in out.stderr
            assert "Traceback" not in out.stderr and "http://" not in out.stdout
    assert empty.stat().st_size == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["empty.db"]


def test_export_leaves_the_study_file_byte_identical(synthetic_url, tmp_path):
    import hashlib

    db = tmp_path / "study.db"
    shutil.copy(synthetic_url[len("sqlite:///"):], db)
    os.utime(db, ns=(10**18, 10**18))
    before = hashlib.sha256(db.read_bytes()).hexdigest(), db.stat().st_mtime_ns
    for fmt in ("json", "k8s"):
        out = tune("export", "--storage", str(db), "--best", "--format", fmt, "-o", str(tmp_path / f"out.{fmt}"))
        assert out.returncode == 0, out.stderr
    assert (hashlib.sha256(db.read_bytes()).hexdigest(), db.stat().st_mtime_ns) == before


def test_export_prints_the_quality_cost_to_stderr_and_keeps_stdout_the_export(synthetic_url):
    out = tune("export", "--storage", synthetic_url, "--best", "--format", "json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["trial"] == 1  # stdout is the export alone
    said = " ".join(out.stderr.split())  # wrapped at 80 columns
    assert "quality cost vs vLLM's defaults: +2.0% perplexity [+1.9%, +2.1%] (KLD 0.010, top-1 0.90)" in said
    assert "within the study's quality gate (nats<=0.05)" in said
    assert all(len(line) <= 80 for line in out.stderr.splitlines())


def test_pick_exports_vllms_defaults_when_they_meet_the_rule_best(synthetic_url):
    out = tune("export", "--storage", synthetic_url, "--pick", "max:output_tps where ttft_p99<280ms", "--format", "json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["trial"] == "reference"
    said = " ".join(out.stderr.split())
    assert "vLLM's defaults meet it and no trial on the front does better; exporting the defaults" in said
    assert "no quality cost" in said


@pytest.mark.parametrize("host, flag, shown", [("127.0.0.1", [], "1"), ("127.0.0.1", ["--no-storage-picker"], "0"),
                                               ("0.0.0.0", [], "0"), ("::1", [], "1")])
def test_the_storage_box_is_off_beyond_loopback_and_on_request(synthetic_url, monkeypatch, host, flag, shown):
    """`tune dashboard` tells the app through TRACETUNE_DASHBOARD_STORAGE_PICKER (the Streamlit
    process itself is started elsewhere in this file; here its environment is caught)."""
    import argparse

    from rich.console import Console

    from tracetune.cli import dashboard as command
    from tracetune.dashboard import ENV_STORAGE_PICKER

    seen = {}

    class Caught:
        def __init__(self, argv, env):
            seen.update(env)

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(command.subprocess, "Popen", Caught)
    parser = argparse.ArgumentParser()
    command.add_parsers(parser.add_subparsers())
    args = parser.parse_args(["dashboard", "--storage", synthetic_url, "--host", host, "--port", str(free_port()),
                              *flag])
    assert command.dashboard_command(args, Console(file=open(os.devnull, "w"))) == 0
    assert seen[ENV_STORAGE_PICKER] == shown
