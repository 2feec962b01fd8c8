"""Per-trial results in the same SQL database as the Optuna study (SQLAlchemy Core).

Optuna keeps parameters, objective values and user attributes; everything else a dashboard or a
second worker on another host needs lives here: the engine config, the replay summary and every
request record, engine counters, quality details, and for failures the reason and log tail.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from sqlalchemy import (Column, DateTime, Float, Integer, MetaData, String, Table, Text, UniqueConstraint,
                        create_engine, select)

metadata = MetaData()

trial_results = Table(
    "tracetune_trial_results", metadata,
    Column("id", Integer, primary_key=True),
    Column("study_name", String(512), nullable=False, index=True),
    Column("trial_number", Integer, nullable=False),
    Column("status", String(32), nullable=False),  # measured | rejected | engine_failed | failed
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

_JSON_FIELDS = ("values", "config", "summary", "quality", "engine")


def _dump(value: Any) -> str | None:
    return None if value is None else json.dumps(value, default=str)


class ResultStore:
    """Reads and writes tracetune's tables at a SQLAlchemy URL (created on first use)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = create_engine(url, pool_pre_ping=True)
        metadata.create_all(self.engine)

    def save_trial(self, study_name: str, trial_number: int, status: str, *, values: dict | None = None,
                   config: dict | None = None, summary: dict | None = None, quality: dict | None = None,
                   engine: dict | None = None, requests_jsonl: str | None = None, failure_reason: str | None = None,
                   log_tail: str | None = None, startup_s: float | None = None, wall_s: float | None = None) -> None:
        row = {
            "study_name": study_name, "trial_number": trial_number, "status": status,
            "values_json": _dump(values), "config_json": _dump(config), "summary_json": _dump(summary),
            "quality_json": _dump(quality), "engine_json": _dump(engine), "requests_jsonl": requests_jsonl,
            "failure_reason": failure_reason, "log_tail": log_tail, "startup_s": startup_s, "wall_s": wall_s,
            "created_at": dt.datetime.now(dt.timezone.utc).replace(tzinfo=None),
        }
        with self.engine.begin() as conn:
            conn.execute(trial_results.delete().where(trial_results.c.study_name == study_name,
                                                      trial_results.c.trial_number == trial_number))
            conn.execute(trial_results.insert().values(**row))

    def trials(self, study_name: str) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(trial_results).where(trial_results.c.study_name == study_name)
                                .order_by(trial_results.c.trial_number)).mappings().all()
        out = []
        for row in rows:
            item = dict(row)
            for name in _JSON_FIELDS:
                raw = item.pop(f"{name}_json")
                item[name] = json.loads(raw) if raw else None
            out.append(item)
        return out

    def save_reference(self, study_name: str, *, config: dict, probe: list, summary: dict | None) -> None:
        with self.engine.begin() as conn:
            conn.execute(references.delete().where(references.c.study_name == study_name))
            conn.execute(references.insert().values(
                study_name=study_name, config_json=_dump(config), probe_json=_dump(probe), summary_json=_dump(summary),
                created_at=dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)))

    def reference(self, study_name: str) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(references).where(references.c.study_name == study_name)).mappings().first()
        if row is None:
            return None
        return {"config": json.loads(row["config_json"]), "probe": json.loads(row["probe_json"]),
                "summary": json.loads(row["summary_json"]) if row["summary_json"] else None}
