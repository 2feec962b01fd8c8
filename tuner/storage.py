"""Per-trial results in the same SQL database as the Optuna study (SQLAlchemy Core).

Optuna keeps parameters, objective values and user attributes; everything else a dashboard or a
second worker on another host needs lives here: the engine config, the replay summary and every
request record, engine counters, quality details, and for failures the reason and log tail.

Several workers share one study through this database, so it also holds *claims*: a row per
configuration (and one for the reference) that one worker owns while it measures it (the table is
here; taking, refreshing and releasing claims is `tuner.coordination.Claims`).

Secrets (API keys, tokens, passwords) given to the tuner are never written: every text that goes
into a table passes through a `tuner.secrets.Redactor` first.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import importlib.util
import json
import random
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, TypedDict

from sqlalchemy import (
    Boolean,
    Column,
    DateTime,
    Float,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    create_engine,
    select,
)
from sqlalchemy.exc import SQLAlchemyError

from tracetune.engine_adapter.metrics import EngineMetrics
from tracetune.errors import TuneError
from tracetune.quality.probe import StoredQuality
from tracetune.replay.metrics import Summary
from tracetune.tuner.secrets import Redactor
from tracetune.types import JsonDict, ParamValues

if TYPE_CHECKING:
    import numpy as np
    from sqlalchemy import Engine

    from tracetune.replay.types import RequestRecord

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


class Status(enum.StrEnum):
    """How a trial ended, as stored (a str: the database and Optuna's attributes hold the value)."""

    MEASURED = "measured"            # measured within the engine's means (it may still violate an SLO)
    ENGINE_FAILED = "engine_failed"  # the engine did not start, crashed or stopped answering
    FAILED = "failed"                # could not be prepared or measured (an objective was NaN, ...)
    UNMEASURABLE = "unmeasurable"    # the replay client could not keep the schedule: not the engine's failure
    REJECTED = "rejected"            # the platform cannot run it: known before any engine started
    DUPLICATE = "duplicate"          # the same configuration as an earlier trial: its result is reused
    PRUNED = "pruned"                # its capacity search stopped early: below a config at least as good otherwise


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


class StoredReference(TypedDict, total=False):
    """A study's reference run as stored (`ResultStore.save_reference`): the engine's defaults' config,
    their quality probe (`quality.probe.Reference.to_json`; None in a study that measures no quality)
    and their summary (`Summary.as_dict`); a page may hold the config and summary alone."""

    config: JsonDict
    probe: JsonDict | list[JsonDict] | None
    summary: dict[str, object] | None


@dataclasses.dataclass
class StoredRun:
    """One row of tracetune_trial_results read back: the summary and engine counters as the typed
    records they were written from; the engine config and the quality result as stored (JSON)."""

    trial_number: int
    status: str  # a `Status`
    values: ParamValues | None = None  # the search-space values
    config: JsonDict | None = None
    summary: Summary | None = None
    quality: StoredQuality | None = None  # quality.probe.QualityResult.as_dict()
    engine: EngineMetrics | None = None
    requests_jsonl: str | None = None
    failure_reason: str | None = None
    log_tail: str | None = None
    startup_s: float | None = None
    wall_s: float | None = None

    @classmethod
    def from_row(cls, row: JsonDict) -> StoredRun:
        """A row as `ResultStore.trials` (or the dashboard's plain SELECT) decodes it: JSON columns
        parsed, records unpacked."""
        summary, engine = row.get("summary"), row.get("engine")
        return cls(trial_number=int(row["trial_number"]), status=str(row.get("status") or ""), values=row.get("values"),
                   config=row.get("config"), summary=Summary.from_dict(summary) if summary else None,
                   quality=row.get("quality"), engine=EngineMetrics.from_dict(engine) if engine is not None else None,
                   requests_jsonl=row.get("requests_jsonl"), failure_reason=row.get("failure_reason"),
                   log_tail=row.get("log_tail"), startup_s=row.get("startup_s"), wall_s=row.get("wall_s"))
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


def encode_levels(records: Iterable[RequestRecord]) -> bytes:
    """A level's request records (replay.types.RequestRecord) as compressed float columns: the
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
    np.savez_compressed(buf, **cols)  # type: ignore[arg-type]  # (numpy's stubs read **cols as allow_pickle)
    return buf.getvalue()


def decode_levels(blob: bytes) -> dict[str, np.ndarray]:
    """The columns of `encode_levels` as numpy arrays (`itl_s` flat, split by `itl_count`)."""
    import io

    import numpy as np

    with np.load(io.BytesIO(blob), allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


def records_of_level(columns: dict[str, np.ndarray]) -> list[RequestRecord]:
    """A stored level (`decode_levels`' columns) as request records again, for judging it under
    another SLO, their output tokens counted as the client counts them (`RequestRecord.recounted`).
    What `encode_levels` did not keep (ids, texts, finish reasons, max_tokens) is left empty."""
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
    scheduled, lag = columns["scheduled_s"], columns["lag_s"]
    return [RequestRecord(index=int(columns["index"][i]), id=None, scheduled_s=float(scheduled[i]),
                          send_s=float(scheduled[i] + lag[i]), lag_s=float(lag[i]),
                          success=bool(columns["success"][i]), error=str(columns["error"][i]),
                          ttft_s=value("ttft_s", i), e2e_s=value("e2e_s", i) or 0.0,
                          itl_s=gaps[ends[i] - columns["itl_count"][i]:ends[i]].tolist(),
                          prompt_tokens=count("prompt_tokens", i), output_tokens=count("output_tokens", i),
                          requested_tokens=count("output_tokens", i) or 0, finish_reason=None).recounted()
            for i in range(len(columns["success"]))]


def normalize_url(url: str) -> str:
    """`postgresql://...` means psycopg 3 (the driver tracetune installs) unless psycopg2 is there."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix) and importlib.util.find_spec("psycopg2") is None:
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def refused(url: str, error: BaseException) -> TuneError:
    """What a worker stops with when the study's database keeps refusing it (its connection limit
    reached, the server gone): the database's own reason and the URL, its password masked. A
    PostgreSQL server refuses connections past max_connections (100 by default), and every worker
    keeps 3 open, 4 at peak (docs/workers.md)."""
    from tracetune.tuner.secrets import display_url

    while error.__cause__ is not None:
        error = error.__cause__
    reason = (str(getattr(error, "orig", None) or error).strip().splitlines() or ["no reason given"])[0]
    hint = ""
    if "too many" in reason:
        hint = (": every worker keeps 3 connections open, 4 at peak; raise the server's max_connections "
                "to at least 4 x workers, or run fewer workers")
    return TuneError(f"--storage {display_url(url)}: the study database refused this worker "
                     f"({display_url(reason)}){hint}")


def utc_now() -> dt.datetime:
    """Now, as the tables store time: naive UTC."""
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


def _dump(value: object) -> str | None:
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
            except SQLAlchemyError as error:
                # Workers starting together on a new database race to create the tables; the
                # loser sees "already exists" and checks again.
                if attempt == 5:
                    raise refused(url, error) from None
                time.sleep(0.2 + random.random())

    def save_trial(self, study_name: str, trial_number: int, status: str, *, values: dict | None = None,
                   config: dict | None = None, summary: dict | None = None, quality: StoredQuality | None = None,
                   engine: dict | None = None, requests_jsonl: str | None = None, failure_reason: str | None = None,
                   log_tail: str | None = None, startup_s: float | None = None, wall_s: float | None = None) -> None:
        r = self.redact
        row = {
            "study_name": study_name, "trial_number": trial_number, "status": str(status),
            "values_json": r(_dump(values)), "config_json": r(_dump(config)), "summary_json": r(_dump(summary)),
            "quality_json": _dump(quality), "engine_json": _dump(engine),
            "requests_jsonl": pack_records(r(requests_jsonl)),
            "failure_reason": r(failure_reason), "log_tail": r(log_tail), "startup_s": startup_s, "wall_s": wall_s,
            "created_at": utc_now(),
        }
        with self.engine.begin() as conn:
            conn.execute(trial_results.delete().where(trial_results.c.study_name == study_name,
                                                      trial_results.c.trial_number == trial_number))
            conn.execute(trial_results.insert().values(**row))

    def measured_qualities(self, study_name: str) -> list[tuple[int, JsonDict, StoredQuality]]:
        """(trial number, config, quality) of every measured trial with a quality result, without
        reading the heavy columns."""
        query = select(trial_results.c.trial_number, trial_results.c.config_json, trial_results.c.quality_json) \
            .where(trial_results.c.study_name == study_name, trial_results.c.status == Status.MEASURED,
                   trial_results.c.trial_number >= 0,
                   trial_results.c.quality_json.is_not(None)).order_by(trial_results.c.trial_number)
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        return [(n, json.loads(c), json.loads(q)) for n, c, q in rows if c and q]

    def trials(self, study_name: str, trial_number: int | None = None) -> list[JsonDict]:
        """The stored trials (one when `trial_number` is given; REFERENCE_RUN: the reference's run), as
        decoded rows (`StoredRun.from_row` reads one as its typed records)."""
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

    def save_levels(self, study_name: str, trial_number: int,
                    levels: Iterable[tuple[float, bool, Sequence[RequestRecord]]]) -> None:
        """Every load level a capacity search measured: (scale, is_repeat, request records)."""
        rows = [{"study_name": study_name, "trial_number": trial_number, "position": i, "scale": scale,
                 "repeat": repeat, "records": encode_levels(records)}
                for i, (scale, repeat, records) in enumerate(levels)]
        with self.engine.begin() as conn:
            conn.execute(level_records.delete().where(level_records.c.study_name == study_name,
                                                      level_records.c.trial_number == trial_number))
            if rows:
                conn.execute(level_records.insert(), rows)

    def levels(self, study_name: str, trial_number: int) -> list[dict[str, np.ndarray | float | bool]]:
        """The stored levels of one trial (REFERENCE_RUN: the reference), in search order, decoded."""
        query = select(level_records).where(level_records.c.study_name == study_name,
                                            level_records.c.trial_number == trial_number)
        with self.engine.connect() as conn:
            rows = conn.execute(query.order_by(level_records.c.position)).mappings().all()
        return [{"scale": row["scale"], "repeat": row["repeat"], **decode_levels(row["records"])} for row in rows]

    def save_reference(self, study_name: str, *, config: dict, probe: dict | None, summary: dict | None) -> None:
        with self.engine.begin() as conn:
            conn.execute(references.delete().where(references.c.study_name == study_name))
            conn.execute(references.insert().values(
                study_name=study_name, config_json=self.redact(_dump(config)), probe_json=_dump(probe),
                summary_json=self.redact(_dump(summary)), created_at=utc_now()))

    def reference(self, study_name: str) -> StoredReference | None:
        return read_reference(self.engine, study_name)


def read_reference(engine: Engine, study_name: str) -> StoredReference | None:
    """The reference run of `study_name` (config, probe, summary) read with a plain SELECT (on a
    read-only engine too); None when there is none, or no table for it yet."""
    from sqlalchemy import inspect

    if references.name not in inspect(engine).get_table_names():
        return None
    with engine.connect() as conn:
        row = conn.execute(select(references).where(references.c.study_name == study_name)).mappings().first()
    if row is None:
        return None
    return {"config": json.loads(row["config_json"]),
            "probe": json.loads(row["probe_json"]) if row["probe_json"] else None,
            "summary": json.loads(row["summary_json"]) if row["summary_json"] else None}
