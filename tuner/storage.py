"""Per-trial results in the same SQL database as the Optuna study (SQLAlchemy Core).

Optuna keeps parameters, objective values and user attributes; everything else a dashboard or a
second worker on another host needs lives here: the engine config, the replay summary and every
request record, engine counters, quality details, and for failures the reason and log tail.

Several workers share one study through this database, so it also holds *claims*: a row per
configuration (and one for the reference) that one worker owns while it measures it. A second
worker that wants the same configuration waits for that row to be done and reuses the result; a
claim whose owner stopped refreshing it (a killed worker) is taken over.

Secrets (API keys, tokens, passwords) given to the tuner are never written: every text that goes
into a table passes through a `Redactor` first.
"""

from __future__ import annotations

import datetime as dt
import enum
import importlib.util
import json
import os
import random
import re
import socket
import time
from typing import Any, Iterable

from sqlalchemy import (Boolean, Column, DateTime, Float, Integer, LargeBinary, MetaData, String, Table, Text,
                        UniqueConstraint, create_engine, select)
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

metadata = MetaData()

trial_results = Table(
    "tracetune_trial_results", metadata,
    Column("id", Integer, primary_key=True),
    Column("study_name", String(512), nullable=False, index=True),
    Column("trial_number", Integer, nullable=False),
    Column("status", String(32), nullable=False),  # measured | rejected | engine_failed | failed | unmeasurable
    Column("values_json", Text),
    Column("config_json", Text),
    Column("summary_json", Text),
    Column("quality_json", Text),
    Column("engine_json", Text),
    Column("requests_jsonl", Text),
    Column("failure_reason", Text),
    Column("log_tail", Text),
    Column("startup_s", Float),
    Column("wall_s", Float),
    Column("created_at", DateTime, nullable=False),
    UniqueConstraint("study_name", "trial_number", name="uq_tracetune_trial"),
)

references = Table(
    "tracetune_reference", metadata,
    Column("id", Integer, primary_key=True),
    Column("study_name", String(512), nullable=False, unique=True),
    Column("config_json", Text),
    Column("probe_json", Text),
    Column("summary_json", Text),
    Column("created_at", DateTime, nullable=False),
)

claims = Table(
    "tracetune_claims", metadata,
    Column("id", Integer, primary_key=True),
    Column("study_name", String(512), nullable=False),
    Column("key", String(128), nullable=False),  # "reference" or "config:<sha256 of the config>"
    Column("owner", String(256), nullable=False),  # worker id: host:pid:random
    Column("trial_number", Integer),  # the trial whose result answers this claim (-1: reference)
    Column("state", String(16), nullable=False),  # running | done
    Column("heartbeat_at", DateTime, nullable=False),
    UniqueConstraint("study_name", "key", name="uq_tracetune_claim"),
)

class Status(str, enum.Enum):
    """How a trial ended, as stored (a str: the database and Optuna's attributes hold the value)."""

    MEASURED = "measured"            # measured within the engine's means (it may still violate an SLO)
    ENGINE_FAILED = "engine_failed"  # the engine did not start, crashed or stopped answering
    FAILED = "failed"                # could not be prepared or measured (an objective was NaN, ...)
    UNMEASURABLE = "unmeasurable"    # the replay client could not keep the schedule: not the engine's failure
    REJECTED = "rejected"            # the platform cannot run it: known before any engine started
    DUPLICATE = "duplicate"          # the same configuration as an earlier trial: its result is reused
    PRUNED = "pruned"                # its capacity search stopped early: below a config at least as good otherwise

    def __str__(self) -> str:
        return self.value


COUNTED = (Status.MEASURED, Status.PRUNED, Status.ENGINE_FAILED, Status.FAILED,  # count toward --trials
           Status.UNMEASURABLE)
SKIPPED = (Status.REJECTED, Status.DUPLICATE)  # cost no engine time: do not count

# The reference's own run (vLLM's defaults: config, summary, records, engine counters, log) is a row of
# tracetune_trials under this number, so it can be shown, compared and exported like a trial.
REFERENCE_RUN = -1

# Every load level of a capacity search (the reference's under REFERENCE_RUN), its request records
# as compressed columns (`encode_levels`): a level of 500 requests takes a few kB, not megabytes.
level_records = Table(
    "tracetune_level_records", metadata,
    Column("id", Integer, primary_key=True),
    Column("study_name", String(512), nullable=False, index=True),
    Column("trial_number", Integer, nullable=False),
    Column("position", Integer, nullable=False),  # order in which the search measured the levels
    Column("scale", Float, nullable=False),
    Column("repeat", Boolean, nullable=False),
    Column("records", LargeBinary, nullable=False),
    UniqueConstraint("study_name", "trial_number", "position", name="uq_tracetune_level"),
)

_JSON_FIELDS = ("values", "config", "summary", "quality", "engine")
# Per-request records of the trace-rate replay are stored zlib-compressed (JSON lines compress about
# 8x); text without this prefix is plain JSON lines from an older tracetune.
_PACKED = "zlib+b64:"


def pack_records(jsonl: str | None) -> str | None:
    """JSON lines as they are stored: compressed, base64 (fits any SQL text column)."""
    if not jsonl:
        return jsonl
    import base64
    import zlib

    return _PACKED + base64.b64encode(zlib.compress(jsonl.encode("utf-8"), 6)).decode("ascii")


def unpack_records(stored: str | None) -> str | None:
    """The JSON lines of `pack_records`' output (plain text is returned as it is)."""
    if not stored or not stored.startswith(_PACKED):
        return stored
    import base64
    import zlib

    return zlib.decompress(base64.b64decode(stored[len(_PACKED):])).decode("utf-8")


_COLUMNS = ("index", "scheduled_s", "lag_s", "ttft_s", "e2e_s", "tpot_s", "prompt_tokens", "output_tokens")


def encode_levels(records: Iterable[Any]) -> bytes:
    """A level's request records (replay.runner.RequestRecord) as compressed float columns: the
    values the metrics need (NaN where absent), every ITL gap (half precision), success flags and
    error texts."""
    import io

    import numpy as np

    records = list(records)
    nan = float("nan")
    cols = {c: np.asarray([nan if getattr(r, c) is None else getattr(r, c) for r in records], dtype=np.float64
                          if c in ("scheduled_s", "lag_s") else np.float32) for c in _COLUMNS}
    cols["success"] = np.asarray([r.success for r in records], dtype=bool)
    # Inter-token gaps are most of a level's numbers: half precision keeps 3 significant digits
    # (a 6 ms gap to within 3 us) at half the size.
    cols["itl_s"] = np.asarray([g for r in records for g in r.itl_s], dtype=np.float16)
    cols["itl_count"] = np.asarray([len(r.itl_s) for r in records], dtype=np.int32)
    cols["error"] = np.asarray([r.error for r in records], dtype=str)
    buf = io.BytesIO()
    np.savez_compressed(buf, **cols)
    return buf.getvalue()


def decode_levels(blob: bytes) -> dict[str, Any]:
    """The columns of `encode_levels` as numpy arrays (`itl_s` flat, split by `itl_count`)."""
    import io

    import numpy as np

    with np.load(io.BytesIO(blob), allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


def records_of_level(columns: dict[str, Any]) -> list[Any]:
    """A stored level (`decode_levels`' columns) as request records again, for judging it under
    another SLO. What `encode_levels` did not keep (ids, texts, finish reasons) is left empty."""
    import numpy as np

    from tracetune.replay.types import RequestRecord

    def value(name: str, i: int) -> float | None:
        v = float(columns[name][i])
        return None if v != v else v

    def count(name: str, i: int) -> int | None:
        v = value(name, i)
        return None if v is None else int(v)

    ends = np.cumsum(columns["itl_count"])
    gaps = columns["itl_s"].astype(float)
    return [RequestRecord(index=int(columns["index"][i]), id=None, scheduled_s=float(columns["scheduled_s"][i]),
                          send_s=float(columns["scheduled_s"][i] + columns["lag_s"][i]), lag_s=float(columns["lag_s"][i]),
                          success=bool(columns["success"][i]), error=str(columns["error"][i]), ttft_s=value("ttft_s", i),
                          e2e_s=value("e2e_s", i) or 0.0, itl_s=gaps[ends[i] - columns["itl_count"][i]:ends[i]].tolist(),
                          prompt_tokens=count("prompt_tokens", i), output_tokens=count("output_tokens", i),
                          requested_tokens=count("output_tokens", i) or 0, finish_reason=None)
            for i in range(len(columns["success"]))]


def normalize_url(url: str) -> str:
    """`postgresql://...` means psycopg 3 (the driver tracetune installs) unless psycopg2 is there."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix) and importlib.util.find_spec("psycopg2") is None:
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def display_url(url: str) -> str:
    """The URL with its password replaced by ***, for printing."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy understands: show nothing that could be a secret
        return re.sub(r"//[^@/]*@", "//***@", url)


_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSW|CREDENTIAL)", re.IGNORECASE)
# In the environment tracetune itself runs in, only names that end like a credential (HF_TOKEN,
# OPENAI_API_KEY, PGPASSWORD, ...), and never paths: a broader match would mask ordinary text.
_SECRET_ENV = re.compile(r"(^|_)(API_?KEY|KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)$|^PGPASSWORD$", re.IGNORECASE)


def secret_values(*, env: dict[str, str] | None = None, process_env: dict[str, str] | None = None,
                  args: Iterable[str] = (), urls: Iterable[str] = (), extra: Iterable[str] = ()) -> list[str]:
    """Values that must never be stored: engine environment variables whose name says key/token/
    secret/password, credentials in the tuner's own environment, the value of such a
    `--flag value` / `--flag=value`, URL passwords, and `extra`."""
    found = [v for v in extra if v]
    for name, value in (env or {}).items():
        if _SECRET_NAME.search(name):
            found.append(value)
    for name, value in (process_env or {}).items():
        if _SECRET_ENV.search(name) and not value.startswith("/"):
            found.append(value)
    args = list(args)
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag.startswith("-") and _SECRET_NAME.search(flag):
            if eq:
                found.append(value)
            elif i + 1 < len(args):
                found.append(args[i + 1])
    for url in urls:
        from sqlalchemy.engine import make_url

        try:
            password = make_url(url).password
        except Exception:
            password = None
        if password:
            found.append(str(password))
    # Short values ("1", "true") are flags, not secrets, and scrubbing them would mangle every text.
    return sorted({v for v in found if len(v) >= 6}, key=len, reverse=True)


class Redactor:
    """Replaces every known secret value with *** in strings, lists and dicts."""

    MASK = "***"

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def __call__(self, value: Any) -> Any:
        if not self.secrets or value is None:
            return value
        if isinstance(value, str):
            for secret in self.secrets:
                if secret in value:
                    value = value.replace(secret, self.MASK)
            return value
        if isinstance(value, dict):
            return {self(k): self(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self(v) for v in value)
        return value


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


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def _dump(value: Any) -> str | None:
    return None if value is None else json.dumps(value, default=str)


class ResultStore:
    """Reads and writes tracetune's tables at a SQLAlchemy URL (created on first use)."""

    def __init__(self, url: str, *, redact: Redactor | None = None) -> None:
        self.url = url
        self.redact = redact or Redactor()
        self.engine = create_engine(normalize_url(url), pool_pre_ping=True)
        for attempt in range(6):
            try:
                metadata.create_all(self.engine)
                break
            except SQLAlchemyError:
                # Workers starting together on a new database race to create the tables; the
                # loser sees "already exists" and checks again.
                if attempt == 5:
                    raise
                time.sleep(0.2 + random.random())

    def save_trial(self, study_name: str, trial_number: int, status: str, *, values: dict | None = None,
                   config: dict | None = None, summary: dict | None = None, quality: dict | None = None,
                   engine: dict | None = None, requests_jsonl: str | None = None, failure_reason: str | None = None,
                   log_tail: str | None = None, startup_s: float | None = None, wall_s: float | None = None) -> None:
        r = self.redact
        row = {
            "study_name": study_name, "trial_number": trial_number, "status": str(status),
            "values_json": r(_dump(values)), "config_json": r(_dump(config)), "summary_json": r(_dump(summary)),
            "quality_json": _dump(quality), "engine_json": _dump(engine),
            "requests_jsonl": pack_records(r(requests_jsonl)),
            "failure_reason": r(failure_reason), "log_tail": r(log_tail), "startup_s": startup_s, "wall_s": wall_s,
            "created_at": _now(),
        }
        with self.engine.begin() as conn:
            conn.execute(trial_results.delete().where(trial_results.c.study_name == study_name,
                                                      trial_results.c.trial_number == trial_number))
            conn.execute(trial_results.insert().values(**row))

    def measured_qualities(self, study_name: str) -> list[tuple[int, dict[str, Any], dict[str, Any]]]:
        """(trial number, config, quality) of every measured trial with a quality result, without
        reading the heavy columns."""
        query = select(trial_results.c.trial_number, trial_results.c.config_json, trial_results.c.quality_json) \
            .where(trial_results.c.study_name == study_name, trial_results.c.status == Status.MEASURED,
                   trial_results.c.trial_number >= 0,
                   trial_results.c.quality_json.is_not(None)).order_by(trial_results.c.trial_number)
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        return [(n, json.loads(c), json.loads(q)) for n, c, q in rows if c and q]

    def trials(self, study_name: str, trial_number: int | None = None) -> list[dict[str, Any]]:
        """The stored trials (one when `trial_number` is given; REFERENCE_RUN: the reference's run)."""
        query = select(trial_results).where(trial_results.c.study_name == study_name)
        if trial_number is not None:
            query = query.where(trial_results.c.trial_number == trial_number)
        else:
            query = query.where(trial_results.c.trial_number >= 0)
        with self.engine.connect() as conn:
            rows = conn.execute(query.order_by(trial_results.c.trial_number)).mappings().all()
        out = []
        for row in rows:
            item = dict(row)
            for name in _JSON_FIELDS:
                raw = item.pop(f"{name}_json")
                item[name] = json.loads(raw) if raw else None
            item["requests_jsonl"] = unpack_records(item["requests_jsonl"])
            out.append(item)
        return out

    def save_levels(self, study_name: str, trial_number: int, levels: Iterable[tuple[float, bool, Any]]) -> None:
        """Every load level a capacity search measured: (scale, is_repeat, request records)."""
        rows = [{"study_name": study_name, "trial_number": trial_number, "position": i, "scale": scale,
                 "repeat": repeat, "records": encode_levels(records)}
                for i, (scale, repeat, records) in enumerate(levels)]
        with self.engine.begin() as conn:
            conn.execute(level_records.delete().where(level_records.c.study_name == study_name,
                                                      level_records.c.trial_number == trial_number))
            if rows:
                conn.execute(level_records.insert(), rows)

    def levels(self, study_name: str, trial_number: int) -> list[dict[str, Any]]:
        """The stored levels of one trial (REFERENCE_RUN: the reference), in search order, decoded."""
        query = select(level_records).where(level_records.c.study_name == study_name,
                                            level_records.c.trial_number == trial_number)
        with self.engine.connect() as conn:
            rows = conn.execute(query.order_by(level_records.c.position)).mappings().all()
        return [{"scale": row["scale"], "repeat": row["repeat"], **decode_levels(row["records"])} for row in rows]

    def save_reference(self, study_name: str, *, config: dict, probe: list, summary: dict | None) -> None:
        with self.engine.begin() as conn:
            conn.execute(references.delete().where(references.c.study_name == study_name))
            conn.execute(references.insert().values(
                study_name=study_name, config_json=self.redact(_dump(config)), probe_json=_dump(probe),
                summary_json=self.redact(_dump(summary)), created_at=_now()))

    def reference(self, study_name: str) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(references).where(references.c.study_name == study_name)).mappings().first()
        if row is None:
            return None
        return {"config": json.loads(row["config_json"]), "probe": json.loads(row["probe_json"]),
                "summary": json.loads(row["summary_json"]) if row["summary_json"] else None}

    # -- claims: one worker measures a configuration, the others reuse its result -----------------
    def claim(self, study_name: str, key: str, *, owner: str, trial_number: int,
              stale_after_s: float) -> dict[str, Any] | None:
        """Take `key` for `owner`; None when it is now ours, else the current claim row (done, or
        held by a live worker). A claim whose heartbeat is older than `stale_after_s`, or whose
        owner process on this host is gone, is taken over (compare-and-set on owner + heartbeat,
        so two workers cannot both take it)."""
        now = _now()
        try:
            with self.engine.begin() as conn:
                conn.execute(claims.insert().values(study_name=study_name, key=key, owner=owner,
                                                    trial_number=trial_number, state="running", heartbeat_at=now))
            return None
        except IntegrityError:
            pass
        with self.engine.connect() as conn:
            row = conn.execute(select(claims).where(claims.c.study_name == study_name, claims.c.key == key)) \
                .mappings().first()
        if row is None:  # released between our insert and this read: try again
            return self.claim(study_name, key, owner=owner, trial_number=trial_number, stale_after_s=stale_after_s)
        row = dict(row)
        if row["state"] == "done":
            return row
        if row["owner"] == owner:
            return None
        stale = (now - row["heartbeat_at"]).total_seconds() > stale_after_s or owner_is_dead(row["owner"])
        if not stale:
            return row
        with self.engine.begin() as conn:
            taken = conn.execute(claims.update().where(
                claims.c.id == row["id"], claims.c.owner == row["owner"], claims.c.state == "running",
                claims.c.heartbeat_at == row["heartbeat_at"]).values(
                owner=owner, trial_number=trial_number, heartbeat_at=now)).rowcount
        if taken == 1:
            return None
        return self.claim(study_name, key, owner=owner, trial_number=trial_number, stale_after_s=stale_after_s)

    def touch_claim(self, study_name: str, key: str, owner: str) -> None:
        """Refresh a claim's heartbeat (the owner is alive and still measuring)."""
        with self.engine.begin() as conn:
            conn.execute(claims.update().where(claims.c.study_name == study_name, claims.c.key == key,
                                               claims.c.owner == owner).values(heartbeat_at=_now()))

    def finish_claim(self, study_name: str, key: str, owner: str, trial_number: int) -> None:
        """Mark a claim done: trial `trial_number`'s stored result answers it from now on."""
        with self.engine.begin() as conn:
            conn.execute(claims.update().where(claims.c.study_name == study_name, claims.c.key == key,
                                               claims.c.owner == owner)
                         .values(state="done", trial_number=trial_number, heartbeat_at=_now()))

    def release_claim(self, study_name: str, key: str, owner: str) -> None:
        """Give a claim up unfinished (interrupted): the next worker measures the configuration."""
        with self.engine.begin() as conn:
            conn.execute(claims.delete().where(claims.c.study_name == study_name, claims.c.key == key,
                                               claims.c.owner == owner, claims.c.state == "running"))
