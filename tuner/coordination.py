"""Several workers on one study: the Optuna storage with its heartbeat, which workers are alive,
claims on the reference and on each configuration (`Claims`) kept alive while measured, what counts
toward --trials, and recovering the trials of workers that are gone (`Coordinator`, the Tuner's part)."""

from __future__ import annotations

import contextlib
import copy
import datetime
import enum
import hashlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, cast

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from tracetune.errors import InputError
from tracetune.tuner.reporter import Reporter
from tracetune.tuner.storage import ResultStore, claims, normalize_url, refused, utc_now
from tracetune.tuner.trial_record import Attr, TrialRecord

if TYPE_CHECKING:
    import optuna
    from optuna.storages import RDBStorage

    from tracetune.search_spaces.space import SearchSpace


class ClaimState(enum.StrEnum):
    """A claim's state, as stored in `storage.claims`."""

    RUNNING = "running"  # its owner is measuring it (while it keeps the heartbeat fresh)
    DONE = "done"        # its trial's stored result answers it


class ClaimRow(TypedDict):
    """A row of the claims table (`storage.claims`)."""

    id: int
    study_name: str
    key: str
    owner: str
    trial_number: int
    state: str
    heartbeat_at: datetime.datetime


def worker_id() -> str:
    """This process as a claim owner: host, pid and a random part (pids are reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"


def owner_is_dead(owner: str) -> bool:
    """True when `owner` ran on this host and its process is gone (zombies count as gone)."""
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().decode(errors="replace").rsplit(")", 1)[-1].split()[0]
        return state in ("Z", "X")
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def make_storage(url: str, heartbeat_s: int) -> RDBStorage:
    """Optuna's RDBStorage with the heartbeat on: a RUNNING trial whose worker stops beating for
    2 x `heartbeat_s` is failed and re-queued (WAITING, same parameters) up to twice."""
    import warnings

    import optuna

    given, url = url, normalize_url(url)
    engine_kwargs: dict[str, object] = {"pool_pre_ping": True}
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
                    heartbeat_stale_trial_callback=Requeue(max_retry=2))
        except (SQLAlchemyError, optuna.exceptions.StorageInternalError) as error:
            # Workers starting together on a new database race to create Optuna's tables; the
            # loser sees "already exists" and simply connects again. A server at its connection
            # limit (Optuna wraps that refusal in StorageInternalError) may free one meanwhile.
            if attempt == 5:
                raise refused(given, error) from None
            time.sleep(0.2 + random.random())
    raise AssertionError("unreachable: the last attempt returns or raises")


class Requeue:
    """Optuna's retry of a failed trial (`RetryHeartbeatStaleTrialCallback`: a WAITING trial with the
    same parameters and `failed_trial`, up to `max_retry` times), less the failed trial's worker.
    Optuna's retry copies every user attribute: the dead worker's id would stay on the retry until the
    worker that takes it up writes its own, and in between another worker's `recover` would read a
    RUNNING trial of a dead worker and fail it under the live one (seen at 16 workers: the live
    worker measured on, crashed when it reported, and the configuration was queued again)."""

    def __init__(self, max_retry: int | None) -> None:
        import warnings

        import optuna

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            self._retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=max_retry)

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        trial = copy.copy(trial)
        trial.user_attrs = {k: v for k, v in trial.user_attrs.items() if k not in (Attr.WORKER, Attr.WORKER_NAME)}
        self._retry(study, trial)


def config_key(config_json: Mapping[str, object]) -> str:
    """Identity of a configuration across workers and hosts: the engine config without the
    worker's own environment (CPU binding, visible GPUs) and with the model named by its
    directory (checkpoint caches live in different places on different hosts)."""
    ident = {k: v for k, v in config_json.items() if k != "env"}
    ident["model"] = Path(str(config_json.get("model", ""))).name
    return "config:" + hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:40]


class Claims:
    """The claims table (`storage.claims`) of a study's database: one worker measures a configuration,
    the others reuse its result; a claim whose owner stopped refreshing it, or whose process on this
    host is gone, is taken over."""

    def __init__(self, store: ResultStore) -> None:
        self.engine = store.engine

    def claim(self, study_name: str, key: str, *, owner: str, trial_number: int,
              stale_after_s: float) -> ClaimRow | None:
        """Take `key` for `owner`; None when it is now ours, else the current claim row (done, or
        held by a live worker). A claim whose heartbeat is older than `stale_after_s`, or whose
        owner process on this host is gone, is taken over (compare-and-set on owner + heartbeat,
        so two workers cannot both take it)."""
        now = utc_now()
        try:
            with self.engine.begin() as conn:
                conn.execute(claims.insert().values(study_name=study_name, key=key, owner=owner,
                                                    trial_number=trial_number, state=ClaimState.RUNNING.value,
                                                    heartbeat_at=now))
            return None
        except IntegrityError:
            pass
        with self.engine.connect() as conn:
            found = conn.execute(select(claims).where(claims.c.study_name == study_name, claims.c.key == key)) \
                .mappings().first()
        if found is None:  # released between our insert and this read: try again
            return self.claim(study_name, key, owner=owner, trial_number=trial_number, stale_after_s=stale_after_s)
        row = cast(ClaimRow, dict(found))
        if row["state"] == ClaimState.DONE or row["owner"] == owner:
            return row if row["state"] == ClaimState.DONE else None
        stale = (now - row["heartbeat_at"]).total_seconds() > stale_after_s or owner_is_dead(row["owner"])
        if not stale:
            return row
        if self._take_over(row, owner, trial_number, now):
            return None
        return self.claim(study_name, key, owner=owner, trial_number=trial_number, stale_after_s=stale_after_s)

    def _take_over(self, row: ClaimRow, owner: str, trial_number: int, now: datetime.datetime) -> bool:
        with self.engine.begin() as conn:
            return conn.execute(claims.update().where(
                claims.c.id == row["id"], claims.c.owner == row["owner"], claims.c.state == ClaimState.RUNNING.value,
                claims.c.heartbeat_at == row["heartbeat_at"]).values(
                owner=owner, trial_number=trial_number, heartbeat_at=now)).rowcount == 1

    def touch(self, study_name: str, key: str, owner: str) -> None:
        """Refresh a claim's heartbeat (the owner is alive and still measuring)."""
        with self.engine.begin() as conn:
            conn.execute(claims.update().where(claims.c.study_name == study_name, claims.c.key == key,
                                               claims.c.owner == owner).values(heartbeat_at=utc_now()))

    def finish(self, study_name: str, key: str, owner: str, trial_number: int) -> None:
        """Mark a claim done: trial `trial_number`'s stored result answers it from now on."""
        with self.engine.begin() as conn:
            conn.execute(claims.update().where(claims.c.study_name == study_name, claims.c.key == key,
                                               claims.c.owner == owner)
                         .values(state=ClaimState.DONE.value, trial_number=trial_number, heartbeat_at=utc_now()))

    def release(self, study_name: str, key: str, owner: str) -> None:
        """Give a claim up unfinished (interrupted): the next worker measures the configuration."""
        with self.engine.begin() as conn:
            conn.execute(claims.delete().where(claims.c.study_name == study_name, claims.c.key == key,
                                               claims.c.owner == owner, claims.c.state == ClaimState.RUNNING.value))


class ClaimHeartbeat:
    """Refreshes a claim's heartbeat from a thread while the owner measures."""

    def __init__(self, claims_: Claims, study_name: str, key: str, owner: str, every_s: float) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(claims_, study_name, key, owner, every_s),
                                        daemon=True)

    def _run(self, claims_: Claims, study_name: str, key: str, owner: str, every_s: float) -> None:
        while not self._stop.wait(every_s):
            try:
                claims_.touch(study_name, key, owner)
            except Exception:  # a database blip: the next beat tries again
                pass

    def __enter__(self) -> ClaimHeartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def counted(study: optuna.Study) -> int:
    """Trials that count toward --trials: measured or failed with a reason. Interrupted trials
    (Ctrl-C, a killed worker) have no status and are run again."""
    return sum(1 for t in study.get_trials(deepcopy=False)
               if t.state.is_finished() and TrialRecord.of(t).counts)


def skipped(study: optuna.Study) -> int:
    """Trials that cost no engine time (rejected, duplicate): not counted toward --trials."""
    return sum(1 for t in study.get_trials(deepcopy=False) if TrialRecord.of(t).skipped)


def running(study: optuna.Study) -> int:
    import optuna

    return len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)))


def stored_choices(study: optuna.Study) -> dict[str, tuple[object, ...]]:
    """Categorical choices each parameter had in the study's earlier trials."""
    import optuna

    out: dict[str, tuple[object, ...]] = {}
    for t in study.get_trials(deepcopy=False):
        for name, dist in t.distributions.items():
            if isinstance(dist, optuna.distributions.CategoricalDistribution):
                out.setdefault(name, tuple(dist.choices))
    return out


def check_same_choices(study: optuna.Study, space: SearchSpace, study_name: str) -> None:
    """Optuna cannot resume a study whose categorical choices changed (e.g. another --space, or
    choices this platform cannot run removed on another kind of machine): say so up front."""
    for name, before in stored_choices(study).items():
        param = space.parameters.get(name)
        if param is None or param.choices is None:
            continue
        if tuple(param.choices) != before:
            raise InputError(
                f"study {study_name!r} was created with {name} choices {list(before)}, this search space "
                f"has {list(param.choices)} (another --space, or choices this machine cannot run were removed). "
                f"Resume it with the same space on the same kind of machine, or start a new --study")


class Coordinator:
    """This worker's part in sharing a study: claims what it measures (waiting while another live
    worker measures the same), recovers dead workers' trials, re-queues its own interrupted ones."""

    def __init__(self, store: ResultStore, *, study_name: str, heartbeat_s: int, reporter: Reporter,
                 worker: str | None = None) -> None:
        self.claims = Claims(store)
        self.study_name = study_name
        self.heartbeat_s = heartbeat_s
        self.reporter = reporter
        self.worker = worker or worker_id()

    def claim_or_wait(self, key: str, trial_number: int, what: str) -> ClaimRow | None:
        """None once this worker owns `key`; the finished claim row when another worker (or an
        earlier trial) has measured it. Waits while a live worker is still measuring it; one silent
        for 2 x heartbeat_s is considered dead and its claim taken over."""
        announced = False
        while True:
            holder = self.claims.claim(self.study_name, key, owner=self.worker, trial_number=trial_number,
                                       stale_after_s=2 * self.heartbeat_s)
            if holder is None or holder["state"] == ClaimState.DONE:
                return holder
            if not announced:
                self.reporter.on_waiting(what=what, owner=holder["owner"], trial=holder["trial_number"])
                announced = True
            time.sleep(min(2.0, self.heartbeat_s / 2))

    @contextlib.contextmanager
    def measuring(self, key: str, trial_number: int) -> Iterator[None]:
        """Hold this worker's claim on `key` alive while the block measures it; done (answered by
        `trial_number`) when the block ends, given up when it raises (Ctrl-C, SIGTERM, a bug): the
        configuration is free for the next worker."""
        try:
            with ClaimHeartbeat(self.claims, self.study_name, key, self.worker, self.heartbeat_s):
                yield
        except BaseException:
            self.claims.release(self.study_name, key, self.worker)
            raise
        self.claims.finish(self.study_name, key, self.worker, trial_number)

    def recover(self, study: optuna.Study, storage: RDBStorage) -> list[int]:
        """Fail the RUNNING trials of dead workers and re-queue them (same parameters): workers on
        this host whose process is gone at once, any other after its heartbeat's grace period.
        `storage` is the study's (`make_storage`). Returns the numbers of the trials failed here."""
        import optuna

        TrialState = optuna.trial.TrialState
        callback = storage.get_heartbeat_stale_trial_callback()
        study_id = storage.get_study_id_from_name(study.study_name)
        failed = []
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            owner = TrialRecord.of(t).worker
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
            self.reporter.on_recovered(trials=failed)
        return failed

    def requeue_interrupted(self, study: optuna.Study) -> None:
        """A Ctrl-C'd (or SIGTERMed) trial is FAIL in Optuna: queue it again, with the same
        parameters, so the next run measures it. Interruptions are not the configuration's
        fault, so unlike dead workers' trials these are re-queued every time."""
        import optuna

        requeue = Requeue(max_retry=None)
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,)):
            record = TrialRecord.of(t)
            if record.worker == self.worker and not record.ended:
                requeue(study, t)
