"""Reliability logic of the study on a scripted engine (no vLLM): a killed worker's trial is
failed and retried, Ctrl-C re-queues, engine failures and timeouts are infeasible trials the
sampler sees, two workers never measure one configuration twice, secrets never reach the
database. The same claims on real vLLM are in this folder's integration tests."""

from __future__ import annotations

import json
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
from tests.reliability.scripted import crash, fake_quality, fake_summary, make_tuner
from tracetune.tuner.storage import ResultStore, secret_values, worker_id
from tracetune.tuner.coordination import counted, make_storage
from tracetune.tuner.front import pareto_trials

ROOT = Path(__file__).resolve().parents[2]
SEQS = """\
name: seqs
fixed: {enforce_eager: true}
parameters:
  max_num_seqs: {choices: [1, 2, 4, 8]}
"""


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
    from tests.reliability.test_study_logic import SEQS
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
    resumed = make_tuner(tmp_path, lambda c: (0.1, 10.0 * c.max_num_seqs, 0.0), space_yaml=SEQS, trials=3,
                         enqueue=enqueue)
    events = []
    resumed.report = lambda event, **fields: events.append((event, fields))
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
    store = ResultStore(f"sqlite:///{tmp_path / 'db.sqlite'}")
    me, other = worker_id(), f"{socket.gethostname()}:1:abcd"  # pid 1 is alive
    assert store.claim("s", "k", owner=me, trial_number=3, stale_after_s=60) is None
    held = store.claim("s", "k", owner=other, trial_number=4, stale_after_s=60)
    assert held["owner"] == me and held["state"] == "running"
    assert store.claim("s", "k", owner=me, trial_number=3, stale_after_s=60) is None  # still ours
    time.sleep(0.05)
    assert store.claim("s", "k", owner=other, trial_number=4, stale_after_s=0.01) is None  # stale: taken over
    store.finish_claim("s", "k", other, 4)
    done = store.claim("s", "k", owner=me, trial_number=5, stale_after_s=60)
    assert done["state"] == "done" and done["trial_number"] == 4
    # A claim of a dead process on this host is taken over at once.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert store.claim("s", "k2", owner=f"{socket.gethostname()}:{dead.pid}:x", trial_number=1, stale_after_s=60) is None
    assert store.claim("s", "k2", owner=me, trial_number=2, stale_after_s=60) is None
    store.release_claim("s", "k2", me)
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


def test_an_overloaded_trace_rate_replay_is_sent_again_by_more_client_processes(tmp_path, monkeypatch):
    """Twice the processes each time, within the cores the engine leaves (8 cores, engine on 2)."""
    import tracetune.tuner.measure as study_module

    tuner = make_tuner(tmp_path, lambda c: (0.1, 10.0, 0.0), space_yaml=SEQS)
    tuner.s.client_procs = 1
    sent_by = []

    def scripted_replay(*args, client_procs=1, **kwargs):
        sent_by.append(client_procs)
        return client_procs

    def scripted_summary(procs, slos):
        summary = fake_summary(0.1, 10.0)
        summary.client_overloaded = procs < 4
        summary.schedule_lag = {"p50": 0.0, "p99": 0.5 if procs < 4 else 0.001, "max": 1.0}
        return summary

    monkeypatch.setattr(study_module, "replay", scripted_replay)
    monkeypatch.setattr(study_module, "summarize", scripted_summary)
    monkeypatch.setattr(study_module, "settle", lambda *a, **k: None)
    monkeypatch.setattr("tracetune.replay.workers.cores", lambda: 8)

    class Server:
        endpoint = type("E", (), {"base_url": "http://x", "model": "m"})()

    result, summary = tuner._trace_rate_replay(Server(), "trial-0000", engine_cores=2)
    assert sent_by == [1, 2, 4] and result == 4 and not summary.client_overloaded
    sent_by.clear()
    monkeypatch.setattr("tracetune.replay.workers.cores", lambda: 4)  # only two cores free: 1, 2, then no more
    result, summary = tuner._trace_rate_replay(Server(), "trial-0000", engine_cores=2)
    assert sent_by == [1, 2] and summary.client_overloaded


def test_quality_is_measured_once_per_quality_key_and_reused(tmp_path, monkeypatch):
    """A config differing from a measured one only in batching knobs reuses its stored quality (from
    the database: another worker's, or before a resume); a different KV-cache precision is measured."""
    import tracetune.tuner.measure as study_module
    from tracetune.engine_adapter.vllm.server import VLLMConfig
    from tracetune.tuner.quality import ProbeItem, Reference

    tuner = make_tuner(tmp_path, lambda c: (0.1, 10.0, 0.0), space_yaml=SEQS)

    def server(endpoint):  # an engine that serves prompt log-probabilities
        return type("S", (), {"endpoint": endpoint, "quality_probe": True})()

    tuner.reference = Reference(items=[ProbeItem(prompt_ids=[1], reference_ids=[2], reference_logprobs=[-0.5])])
    measured = []
    monkeypatch.setattr(study_module, "measure_candidate", lambda endpoint, ref: measured.append(endpoint)
                        or fake_quality(0.3))
    first = VLLMConfig(model=tmp_path / "model", max_num_seqs=4)
    tuner.store.save_trial("s", 0, "measured", config=json.loads(first.model_dump_json()),
                           quality=tuner._quality(server("server-0"), first, "trial-0000").as_dict())
    tuner._quality_known.clear()  # as a new process (a resume, another worker): only the database knows
    again = tuner._quality(None, VLLMConfig(model=tmp_path / "model", max_num_seqs=64), "trial-0001")
    assert again.reused_from == 0 and measured == ["server-0"]
    fp8 = tuner._quality(server("server-2"),
                         VLLMConfig(model=tmp_path / "model", max_num_seqs=4, kv_cache_dtype="fp8"), "trial-0002")
    assert fp8.reused_from is None and measured == ["server-0", "server-2"] and fp8.key != again.key


def test_a_study_stopped_by_its_timeout_says_so(tmp_path):
    """--timeout stops starting new trials; the reporter hears how many were done (it used to say nothing)."""
    tuner = make_tuner(tmp_path, good_unless_one, space_yaml=SEQS, trials=4)
    tuner.s.timeout_s = 0.0
    events = []
    tuner.report = lambda event, **fields: events.append((event, fields))
    tuner.run()
    assert ("timeout", {"limit_s": 0.0, "done": 0, "trials": 4}) in events
    assert tuner.calls == ["reference"]  # the reference, and no trial after the deadline


def test_patience_stops_the_study_once_the_front_stops_changing(tmp_path):
    """--patience 2: the first trial (max_num_seqs 1) beats vLLM's defaults on every objective; the next
    two are dominated by it, so the front is unchanged twice and the study stops at 3 of 8 trials."""
    tuner = make_tuner(tmp_path, lambda c: (0.1 * c.max_num_seqs, 100.0 / c.max_num_seqs, 0.0), space_yaml=SEQS,
                       trials=8, enqueue=[{"max_num_seqs": 1}, {"max_num_seqs": 2}, {"max_num_seqs": 4}])
    tuner.s.patience = 2
    events = []
    tuner.report = lambda event, **fields: events.append((event, fields))
    study = tuner.run()
    assert ("converged", {"patience": 2, "done": 3, "trials": 8}) in events
    assert counted(study) == 3 and tuner.calls == ["reference", "trial-0000", "trial-0001", "trial-0002"]
    assert tuner.front_labels(study) == {0}


BITS = """\
name: bits
fixed: {enforce_eager: true}
parameters:
  weight_bits: {choices: [16, 8]}
  max_num_seqs: {choices: [2, 4, 8]}
"""


def test_presets_run_first_within_the_trials_left_after_the_users_tries(tmp_path):
    """8-bit weights is tried first (the space offers it); a --try value comes before it; with no
    room left after the --try values, no preset is queued (nothing would be left waiting)."""
    tuner = make_tuner(tmp_path, lambda c: (0.1, 10.0, 0.0), space_yaml=BITS,
                       trials=3, enqueue=[{"weight_bits": 16, "max_num_seqs": 2}])
    events = []
    tuner.report = lambda event, **fields: events.append((event, fields))
    study = tuner.run()
    assert ("presets", {"configs": [{"max_num_seqs": 8, "weight_bits": 8}]}) in events  # vLLM-like batch limit
    values = [t.user_attrs["values"] for t in sorted(study.trials, key=lambda t: t.number)]
    assert values[0] == {"weight_bits": 16, "max_num_seqs": 2} and values[1]["weight_bits"] == 8

    (tmp_path / "full").mkdir()
    full = make_tuner(tmp_path / "full", lambda c: (0.1, 10.0, 0.0), space_yaml=BITS, trials=1,
                      enqueue=[{"weight_bits": 16, "max_num_seqs": 2}])
    events.clear()
    full.report = lambda event, **fields: events.append((event, fields))
    done = full.run()
    assert not [e for e in events if e[0] == "presets"] and len(done.trials) == 1


def test_a_warm_start_tries_the_earlier_studys_best_configurations_first(tmp_path):
    """Study "a" measures max_num_seqs 2, 4, 8 (8 is best on output tok/s, 2 on latency: both on its
    front); study "b" on another trace starts with a's front, then the rest, all measured again."""
    script = lambda c: (0.1 * c.max_num_seqs, 10.0 * c.max_num_seqs, 0.0)  # noqa: E731
    first = make_tuner(tmp_path, script, space_yaml=SEQS, study="a", trials=3,
                       enqueue=[{"max_num_seqs": 2}, {"max_num_seqs": 4}, {"max_num_seqs": 8}])
    first.run()
    calls = []
    second = make_tuner(tmp_path, script, space_yaml=SEQS, study="b", trials=2, calls=calls)
    second.s.warm_start = (second.s.storage_url, "a")
    events = []
    second.report = lambda event, **fields: events.append((event, fields))
    study = second.run()
    warm = next(f["configs"] for e, f in events if e == "warm_start")
    assert warm == [{"max_num_seqs": 2}, {"max_num_seqs": 4}]  # room for 2 of a's 3, front first
    assert [t.user_attrs["values"] for t in study.trials] == warm
    assert calls == ["reference", "trial-0000", "trial-0001"]  # measured again, not reused

    from tracetune.errors import InputError

    other = make_tuner(tmp_path, script, space_yaml=SEQS, study="c", trials=1)
    other.s.warm_start = (other.s.storage_url, "nope")
    with pytest.raises(InputError, match="--warm-start: no study 'nope'"):
        other.run()


def capacity_tuner(tmp_path, truth, *, trials: int, enqueue: list, prune: bool = True):
    """A study with capacity as an objective whose engine is scripted: `truth(config or None)` ->
    (TTFT p99 s, true capacity k); a level passes when it is at most k. The capacity search, the
    early stop and everything the Tuner does with them are real."""
    from tracetune.replay.capacity import CapacityOptions, Step
    from tracetune.replay.capacity_search import search_capacity
    from tracetune.replay.metrics import parse_slos
    from tracetune.tuner.quality import ProbeItem, Reference

    slos = parse_slos("ttft:p99<2s")
    tuner = make_tuner(tmp_path, lambda c: None, space_yaml=SEQS, trials=trials, enqueue=enqueue, slos=slos)
    tuner.s.objectives = ["ttft_p99", "capacity", "quality_loss"]
    tuner.s.capacity = CapacityOptions(slos=tuple(slos), precision=0.1)
    tuner.s.prune = prune
    levels: dict[str, list[float]] = {}

    def measure(config, label, *, with_quality, start=1.0, prune=None):
        ttft, true_k = truth(None if label == "reference" else config)
        if label == "reference":
            tuner.reference = Reference(items=[ProbeItem(prompt_ids=[1], reference_ids=[2], reference_logprobs=[-0.5])])
        summary, quality = fake_summary(ttft, 10.0), fake_quality(0.0)

        def level(scale, repeat):
            levels.setdefault(label, []).append(scale)
            ok = scale <= true_k
            return Step(scale=scale, rps=2.0 * scale, output_tps=64.0 * scale, attainment=1.0 if ok else 0.5,
                        passed=ok, abandoned=not ok, requests=20, planned=20, good=20 if ok else 10, duration_s=1.0,
                        repeat=repeat)

        prune_at = prune(summary, quality, 1, 2.0) if prune else None
        result = search_capacity(level, tuner.s.capacity, seed_steps=[level(1.0, False)], base_rates=(2.0, 64.0),
                                 prune_at=prune_at)
        summary.capacity = result.as_dict()
        return {"summary": summary, "quality": quality, "startup_s": 1.0, "requests_jsonl": "", "log_tail": ""}

    tuner._measure = measure  # type: ignore[method-assign]
    tuner.levels = levels  # type: ignore[attr-defined]
    return tuner


def test_a_trial_that_cannot_reach_the_front_is_pruned_early_with_its_steps_kept(tmp_path):
    """vLLM's defaults: TTFT 0.5 s, capacity 2x. max_num_seqs 1 is slower (0.6 s) and carries 1.2x: it
    fails 2x (where the defaults pass) twice and is pruned. 4 is faster (0.4 s) and carries 3x: searched to
    the end. 8 is slower than 4 (0.45 s) and carries 2.5x: it fails trial 1's capacity (where trial 1 passes),
    pruned."""
    truth = {None: (0.5, 2.0), 1: (0.6, 1.2), 4: (0.4, 3.0), 8: (0.45, 2.5)}
    tuner = capacity_tuner(tmp_path, lambda c: truth[c and c.max_num_seqs], trials=3,
                           enqueue=[{"max_num_seqs": 1}, {"max_num_seqs": 4}, {"max_num_seqs": 8}])
    events = []
    tuner.report = lambda event, **fields: events.append((event, fields))
    study = tuner.run()
    trials = sorted(study.trials, key=lambda t: t.number)
    assert [t.user_attrs["status"] for t in trials] == ["pruned", "measured", "pruned"]
    assert counted(study) == 3  # a pruned trial used the engine: it counts toward --trials
    assert tuner.levels["trial-0000"] == [1.0, 2.0, 2.0]  # the trace's rate, the prune level and its repeat
    assert len(tuner.levels["trial-0001"]) > 3  # searched to the end: capacity 2.83x (precision 10%)
    rival = trials[1].values[1] / 2.0
    assert 2.5 < rival <= 3.0 and tuner.levels["trial-0002"][1:] == [rival, rival]
    assert "where vLLM's defaults pass and are at least as good on ttft_p99" in trials[0].user_attrs["failure_reason"]
    assert "where trial 1 passes" in trials[2].user_attrs["failure_reason"]
    assert [f["number"] for e, f in events if e == "trial_pruned"] == [0, 2]
    # The sampler sees its values (capacity: what it is known to carry, the trace's rate of 2 req/s);
    # the front never takes it.
    assert trials[0].values[1] == trials[2].values[1] == pytest.approx(2.0)
    assert tuner.front_labels(study) == {1}
    stored = {r["trial_number"]: r for r in ResultStore(tuner.s.storage_url).trials("s")}
    assert stored[0]["status"] == "pruned" and stored[0]["summary"]["capacity"]["verdict"] == "pruned"
    assert [s["scale"] for s in stored[2]["summary"]["capacity"]["steps"]] == [1.0, rival, rival]


def test_no_prune_searches_every_trial_to_the_end(tmp_path):
    truth = {None: (0.5, 2.0), 1: (0.6, 1.2)}
    tuner = capacity_tuner(tmp_path, lambda c: truth[c and c.max_num_seqs], trials=1,
                           enqueue=[{"max_num_seqs": 1}], prune=False)
    study = tuner.run()
    assert study.trials[0].user_attrs["status"] == "measured"
    assert len(tuner.levels["trial-0000"]) > 3
