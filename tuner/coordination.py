"""Several workers on one study: the Optuna storage with its heartbeat, claims on the reference and
on each configuration (`ResultStore.claim`) kept alive while measured, what counts toward --trials,
and recovering the trials of workers that are gone."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from pathlib import Path
from typing import Any

from tracetune.tuner.storage import COUNTED, SKIPPED, ResultStore, normalize_url, owner_is_dead

def make_storage(url: str, heartbeat_s: int):
    """Optuna's RDBStorage with the heartbeat on: a RUNNING trial whose worker stops beating for
    2 x `heartbeat_s` is failed and re-queued (WAITING, same parameters) up to twice."""
    import warnings

    import optuna

    url = normalize_url(url)
    engine_kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if url.startswith("sqlite"):
        engine_kwargs = {"connect_args": {"timeout": 60}}
    import random

    from sqlalchemy.exc import SQLAlchemyError

    for attempt in range(6):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(
                    url, engine_kwargs=engine_kwargs, heartbeat_interval=heartbeat_s, grace_period=2 * heartbeat_s,
                    heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=2))
        except SQLAlchemyError:
            # Workers starting together on a new database race to create Optuna's tables; the
            # loser sees "already exists" and simply connects again.
            if attempt == 5:
                raise
            time.sleep(0.2 + random.random())


def config_key(config_json: dict[str, Any]) -> str:
    """Identity of a configuration across workers and hosts: the engine config without the
    worker's own environment (CPU binding, visible GPUs) and with the model named by its
    directory (checkpoint caches live in different places on different hosts)."""
    ident = {k: v for k, v in config_json.items() if k != "env"}
    ident["model"] = Path(str(config_json.get("model", ""))).name
    return "config:" + hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:40]


class ClaimHeartbeat:
    """Refreshes a claim's heartbeat from a thread while the owner measures."""

    def __init__(self, store: ResultStore, study_name: str, key: str, owner: str, every_s: float) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(store, study_name, key, owner, every_s), daemon=True)

    def _run(self, store, study_name, key, owner, every_s) -> None:
        while not self._stop.wait(every_s):
            try:
                store.touch_claim(study_name, key, owner)
            except Exception:  # a database blip: the next beat tries again
                pass

    def __enter__(self) -> ClaimHeartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)




def counted(study: Any) -> int:
    """Trials that count toward --trials: measured or failed with a reason. Interrupted trials
    (Ctrl-C, a killed worker) have no status and are run again."""
    return sum(1 for t in study.get_trials(deepcopy=False)
               if t.state.is_finished() and t.user_attrs.get("status") in COUNTED)


def skipped(study: Any) -> int:
    return sum(1 for t in study.get_trials(deepcopy=False) if t.user_attrs.get("status") in SKIPPED)


def running(study: Any) -> int:
    import optuna

    return len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)))


def stored_choices(study: Any) -> dict[str, tuple]:
    """Categorical choices each parameter had in the study's earlier trials."""
    import optuna

    out: dict[str, tuple] = {}
    for t in study.get_trials(deepcopy=False):
        for name, dist in t.distributions.items():
            if isinstance(dist, optuna.distributions.CategoricalDistribution):
                out.setdefault(name, tuple(dist.choices))
    return out


class Coordination:
    """The Tuner's part in sharing a study (a mixin: `self.store`, `self.s`, `self.worker`,
    `self.report` are the Tuner's)."""

    def _claim_or_wait(self, key: str, trial_number: int, what: str) -> dict[str, Any] | None:
        """None once this worker owns `key`; the finished claim row when another worker (or an
        earlier trial) has measured it. Waits while a live worker is still measuring it."""
        announced = False
        while True:
            holder = self.store.claim(self.s.study_name, key, owner=self.worker, trial_number=trial_number,
                                      stale_after_s=self.s.grace_s)
            if holder is None or holder["state"] == "done":
                return holder
            if not announced:
                self.report("waiting", what=what, owner=holder["owner"], trial=holder["trial_number"])
                announced = True
            time.sleep(min(2.0, self.s.heartbeat_s / 2))

    def recover(self, study: Any, storage: Any) -> list[int]:
        """Fail the RUNNING trials of dead workers and re-queue them (same parameters): workers on
        this host whose process is gone at once, any other after its heartbeat's grace period.
        `storage` is the study's (`make_storage`). Returns the numbers of the trials failed here."""
        import optuna

        TrialState = optuna.trial.TrialState
        callback = storage.get_heartbeat_stale_trial_callback()
        study_id = storage.get_study_id_from_name(study.study_name)
        failed = []
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            owner = t.user_attrs.get("worker")
            if owner and owner != self.worker and owner_is_dead(owner):
                trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
                try:
                    if storage.set_trial_state_values(trial_id, state=TrialState.FAIL):
                        failed.append(t.number)
                        if callback is not None:
                            callback(study, storage.get_trial(trial_id))
                except optuna.exceptions.UpdateFinishedTrialError:
                    pass  # another worker got there first
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
        if failed:
            self.report("recovered", trials=failed)
        return failed

    def _requeue_interrupted(self, study: Any) -> None:
        """A Ctrl-C'd (or SIGTERMed) trial is FAIL in Optuna: queue it again, with the same
        parameters, so the next run measures it. Interruptions are not the configuration's
        fault, so unlike dead workers' trials these are re-queued every time."""
        import warnings

        import optuna

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            requeue = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=None)
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,)):
            if t.user_attrs.get("worker") == self.worker and "status" not in t.user_attrs:
                requeue(study, t)
