"""Reliability logic of the study on a scripted engine (no vLLM): a killed worker's trial is
failed and retried, Ctrl-C re-queues, engine failures and timeouts are infeasible trials the
sampler sees, two workers never measure one configuration twice, secrets never reach the
database. The same claims on real vLLM are in this folder's integration tests."""

from __future__ import annotations

import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import optuna
import pytest

from tests.reliability.pg import postgres_url  # noqa: F401 - fixture
from tests.reliability.scripted import SEQS, Events, crash, make_tuner
from tracetune.tuner.coordination import Claims, counted, make_storage, worker_id
from tracetune.tuner.front import pareto_trials
from tracetune.tuner.secrets import secret_values
from tracetune.tuner.storage import ResultStore

ROOT = Path(__file__).resolve().parents[2]


def good_unless_one(config):
    if config.max_num_seqs == 1:
        crash("vLLM server exited with code 1 after 3.0s, before it became healthy: ValueError: bad")
    return (0.1 * config.max_num_seqs, 10.0 * config.max_num_seqs, 0.0)


def seen_by_sampler(trial) -> list[float]:
    """The constraint values the sampler reads for a finished trial (Optuna 5 and 4)."""
    if hasattr(trial, "constraints"):
        return list(trial.constraints.values())
    return list(trial.system_attrs["constraints"])


def load(tmp_path, study="s"):
    return optuna.load_study(study_name=study, storage=make_storage(f"sqlite:///{tmp_path / 'study.db'}", 2))


def run_concurrently(tuners) -> list[BaseException]:
    """Run each tuner in its own thread (two workers of one study); the errors they raised."""
    errors: list[BaseException] = []

    def run(t):
        try:
            t.run()
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in tuners]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return errors


def test_engine_failure_is_an_infeasible_complete_trial_the_sampler_sees(tmp_path):
    tuner = make_tuner(tmp_path, good_unless_one, space_yaml=SEQS, trials=4, sampler="nsga2",
                       enqueue=[{"max_num_seqs": 1}, {"max_num_seqs": 8}])
    study = tuner.run()
    failed = [t for t in study.trials if t.user_attrs.get("status") == "engine_failed"]
    assert failed and all(t.state == optuna.trial.TrialState.COMPLETE for t in failed)
    t = failed[0]
    assert t.params == {"max_num_seqs": 1}
    assert "ValueError: bad" in t.user_attrs["failure_reason"] and "RuntimeError: boom" in t.user_attrs["log_tail"]
    # What NSGA-II's constraints_func returned, as Optuna stored it: infeasible.
    assert seen_by_sampler(t)[0] > 0
    measured = [x for x in study.trials if x.user_attrs.get("status") == "measured"]
    assert all(seen_by_sampler(x)[0] == 0 for x in measured)
    # Penalty: worst latency measured so far, zero throughput.
    assert t.values[1] == 0.0 and t.values[0] >= 0.5
    assert t.number not in [p.number for p in pareto_trials(study)]
    assert counted(study) == 4
    rows = {r["trial_number"]: r for r in tuner.store.trials("s")}
    assert rows[t.number]["status"] == "engine_failed" and "ValueError: bad" in rows[t.number]["failure_reason"]


def test_rejected_configs_are_infeasible_and_do_not_count(tmp_path):
    space = SEQS.replace("fixed: {enforce_eager: true}", "fixed: {enforce_eager: true, max_num_batched_tokens: 512}") \
        + "  enable_chunked_prefill: {choices: [true, false]}\n"
    tuner = make_tuner(tmp_path, lambda c: (0.1, 10.0, 0.0), space_yaml=space, trials=3, sampler="tpe",
                       enqueue=[{"max_num_seqs": 2, "enable_chunked_prefill": False}])
    study = tuner.run()
    rejected = [t for t in study.trials if t.user_attrs.get("status") == "rejected"]
    assert rejected and rejected[0].state == optuna.trial.TrialState.COMPLETE
    assert seen_by_sampler(rejected[0])[0] > 0
    assert counted(study) == 3 and tuner.calls.count("reference") == 1 and len(tuner.calls) == 4


@pytest.mark.slow  # a 40-trial scripted study (about 12 s)
def test_tpe_learns_to_avoid_configs_that_crash(tmp_path):
    space = "name: wide\nfixed: {}\nparameters:\n  max_num_seqs: {low: 1, high: 100}\n"

    def script(config):
        if config.max_num_seqs <= 50:
            crash()
        return (1.0 / config.max_num_seqs, config.max_num_seqs, 0.0)

    tuner = make_tuner(tmp_path, script, space_yaml=space, trials=40, sampler="tpe", seed=1)
    study = tuner.run()
    crashed = [t.user_attrs["status"] == "engine_failed" for t in sorted(study.trials, key=lambda t: t.number)]
    first, last = sum(crashed[:10]) / 10, sum(crashed[-20:]) / 20
    assert first >= 0.3 and last <= first / 2, (first, last)


def test_failed_requests_make_a_measured_trial_infeasible(tmp_path):
    tuner = make_tuner(tmp_path, lambda c: (0.1, 10.0, 0.0, 0.5 if c.max_num_seqs == 2 else 0.0),
                       space_yaml=SEQS, trials=2, sampler="nsga2",
                       enqueue=[{"max_num_seqs": 2}, {"max_num_seqs": 4}])
    study = tuner.run()
    t = next(t for t in study.trials if t.params == {"max_num_seqs": 2})
    assert t.user_attrs["status"] == "measured" and t.user_attrs["feasible"] is False
    assert "50% of requests failed" in t.user_attrs["failure_reason"] and "timed out" in t.user_attrs["failure_reason"]
    assert seen_by_sampler(t)[0] == 0.5
    assert [p.params for p in pareto_trials(study)] == [{"max_num_seqs": 4}]


KILLER = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from tests.reliability.scripted import make_tuner
    from tests.reliability.scripted import SEQS
    n = [0]
    def script(config):
        n[0] += 1
        if n[0] == 2:
            os.kill(os.getpid(), signal.SIGKILL)  # kill -9 in the middle of the second trial
        return (0.1, 10.0 * config.max_num_seqs, 0.0)
    make_tuner(Path({tmp!r}), script, space_yaml=SEQS, trials=3, sampler="random", heartbeat_s=60,
               enqueue=[{{"max_num_seqs": 2}}, {{"max_num_seqs": 4}}, {{"max_num_seqs": 8}}]).run()
""")


def test_killed_worker_trial_is_failed_and_retried_on_resume(tmp_path):
    proc = subprocess.run([sys.executable, "-c", KILLER.format(root=str(ROOT), tmp=str(tmp_path))], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    study = load(tmp_path)
    states = {t.number: t.state for t in study.trials}
    assert states[0] == optuna.trial.TrialState.COMPLETE and states[1] == optuna.trial.TrialState.RUNNING
    # Resume at once (heartbeat 60 s: not stale yet): the dead pid on this host is enough.
    tuner = make_tuner(tmp_path, lambda c: (0.1, 10.0 * c.max_num_seqs, 0.0), space_yaml=SEQS, trials=3,
                       heartbeat_s=60, enqueue=[{"max_num_seqs": 2}, {"max_num_seqs": 4}, {"max_num_seqs": 8}])
    study = tuner.run()
    by_number = {t.number: t for t in study.trials}
    assert by_number[0].user_attrs["status"] == "measured"  # completed before the kill: kept, not re-run
    assert by_number[1].state == optuna.trial.TrialState.FAIL  # the interrupted one: failed ...
    retry = [t for t in study.trials if t.system_attrs.get("failed_trial") == 1]
    assert len(retry) == 1 and retry[0].params == by_number[1].params  # ... and retried with its params
    assert retry[0].user_attrs["status"] == "measured"
    assert counted(study) == 3
    assert "reference" not in tuner.calls  # stored reference reused


def test_ctrl_c_requeues_the_interrupted_trial_and_frees_its_claim(tmp_path):
    n = [0]

    def interrupted(config):
        n[0] += 1
        if n[0] == 2:
            raise KeyboardInterrupt
        return (0.1, 10.0 * config.max_num_seqs, 0.0)

    enqueue = [{"max_num_seqs": 2}, {"max_num_seqs": 4}, {"max_num_seqs": 8}]
    with pytest.raises(KeyboardInterrupt):
        make_tuner(tmp_path, interrupted, space_yaml=SEQS, trials=3, enqueue=enqueue).run()
    events = Events()
    resumed = make_tuner(tmp_path, lambda c: (0.1, 10.0 * c.max_num_seqs, 0.0), space_yaml=SEQS, trials=3,
                         enqueue=enqueue, events=events)
    study = resumed.run()
    retries = [fields["trials"] for event, fields in events if event == "retries_first"]
    assert len(retries) == 1 and [(failed, params) for _, failed, params in retries[0]] == [(1, {"max_num_seqs": 4})]
    assert counted(study) == 3
    retried = [t for t in study.trials if t.system_attrs.get("failed_trial") == 1]
    assert retried and retried[0].params == {"max_num_seqs": 4} and retried[0].user_attrs["status"] == "measured"


def test_two_workers_share_a_study_without_measuring_anything_twice(tmp_path):
    calls: list[str] = []
    configs: list[int] = []

    def script(config):
        configs.append(config.max_num_seqs)
        return (0.1, 10.0 * config.max_num_seqs, 0.0)

    a = make_tuner(tmp_path, script, space_yaml=SEQS, trials=4, sampler="random", seed=1, calls=calls, delay_s=0.3)
    b = make_tuner(tmp_path, script, space_yaml=SEQS, trials=4, sampler="random", seed=2, calls=calls, delay_s=0.3)
    errors = run_concurrently([a, b])
    assert not errors, errors
    assert calls.count("reference") == 1
    assert sorted(configs) == [1, 2, 4, 8]  # four configs, each measured once
    study = load(tmp_path)
    assert counted(study) == 4
    workers = {t.user_attrs["worker"] for t in study.trials if t.user_attrs.get("status") == "measured"}
    assert workers <= {a.worker, b.worker}


def test_claims(tmp_path):
    store = Claims(ResultStore(f"sqlite:///{tmp_path / 'db.sqlite'}"))
    me, other = worker_id(), f"{socket.gethostname()}:1:abcd"  # pid 1 is alive
    assert store.claim("s", "k", owner=me, trial_number=3, stale_after_s=60) is None
    held = store.claim("s", "k", owner=other, trial_number=4, stale_after_s=60)
    assert held["owner"] == me and held["state"] == "running"
    assert store.claim("s", "k", owner=me, trial_number=3, stale_after_s=60) is None  # still ours
    time.sleep(0.05)
    assert store.claim("s", "k", owner=other, trial_number=4, stale_after_s=0.01) is None  # stale: taken over
    store.finish("s", "k", other, 4)
    done = store.claim("s", "k", owner=me, trial_number=5, stale_after_s=60)
    assert done["state"] == "done" and done["trial_number"] == 4
    # A claim of a dead process on this host is taken over at once.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = f"{socket.gethostname()}:{dead.pid}:x"
    assert store.claim("s", "k2", owner=gone, trial_number=1, stale_after_s=60) is None
    assert store.claim("s", "k2", owner=me, trial_number=2, stale_after_s=60) is None
    store.release("s", "k2", me)
    assert store.claim("s", "k2", owner=other, trial_number=6, stale_after_s=60) is None


def test_secrets_given_to_the_tuner_never_reach_the_database(tmp_path):
    token, key, pw = "hf_SECRETtoken123", "sk-SECRETkey456", "pgSECRETpw789"
    base = {"env": {"HF_TOKEN": token, "VLLM_CPU_OMP_THREADS_BIND": "0"}, "extra_args": ["--api-key", key]}
    secrets = secret_values(env=base["env"], args=base["extra_args"], urls=[f"postgresql://u:{pw}@db/x"],
                            process_env={"OPENAI_API_KEY": "sk-SECRETenv000", "HOME": "/root"})
    assert set(secrets) == {token, key, pw, "sk-SECRETenv000"}

    def leaky(config):
        if config.max_num_seqs == 1:
            crash(f"exited: api_key={key} token={token}")
        return (0.1, 10.0, 0.0)

    tuner = make_tuner(tmp_path, leaky, space_yaml=SEQS, trials=2, base=base, secrets=secrets,
                       enqueue=[{"max_num_seqs": 1}, {"max_num_seqs": 2}])
    tuner.run()
    dump = "\n".join(sqlite3.connect(tmp_path / "study.db").iterdump())
    for secret in secrets:
        assert secret not in dump
    assert "***" in dump and "VLLM_CPU_OMP_THREADS_BIND" in dump


def test_two_workers_on_postgresql_measure_each_config_once(tmp_path, postgres_url):  # noqa: F811
    calls: list[str] = []
    configs: list[int] = []

    def script(config):
        configs.append(config.max_num_seqs)
        return (0.1, 10.0 * config.max_num_seqs, 0.0)

    # Both workers are asked to try the same configurations first: they must not both measure them.
    enqueue = [{"max_num_seqs": 2}, {"max_num_seqs": 4}]
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    workers = [make_tuner(tmp_path / name, script, space_yaml=SEQS, trials=4, url=postgres_url, study="pg",
                          seed=seed, calls=calls, delay_s=0.5, enqueue=enqueue)
               for name, seed in (("a", 1), ("b", 2))]
    errors = run_concurrently(workers)
    assert not errors, errors
    assert calls.count("reference") == 1
    assert sorted(configs) == [1, 2, 4, 8]
    study = optuna.load_study(study_name="pg", storage=make_storage(postgres_url, 2))
    assert counted(study) == 4
    assert ResultStore(postgres_url).reference("pg") is not None


def test_root_cause_names_an_engine_argument_refused_by_argparse():
    from tracetune.engine_adapter.process import root_cause

    log = "usage: api_server.py [-h] [--model MODEL]\napi_server.py: error: unrecognized arguments: --no-such-flag\n"
    assert root_cause(log) == "the engine refused its arguments: unrecognized arguments: --no-such-flag"


def test_a_replay_the_client_could_not_keep_is_unmeasurable_not_an_engine_failure(tmp_path):
    tuner = make_tuner(tmp_path, lambda c: (0.1, 10.0, 0.0, 0.0, c.max_num_seqs == 2), space_yaml=SEQS, trials=2,
                       sampler="nsga2", enqueue=[{"max_num_seqs": 2}, {"max_num_seqs": 4}])
    study = tuner.run()
    t = next(t for t in study.trials if t.params == {"max_num_seqs": 2})
    assert t.user_attrs["status"] == "unmeasurable" and t.user_attrs["feasible"] is False
    assert "replay client could not keep" in t.user_attrs["failure_reason"]
    assert "not the engine's failure" in t.user_attrs["failure_reason"]
    assert [p.params for p in pareto_trials(study)] == [{"max_num_seqs": 4}]
    row = tuner.store.trials("s", t.number)[0]  # stored with what it saw, under its own status
    assert row["status"] == "unmeasurable" and row["summary"] is not None and "not the engine" in row["failure_reason"]
