"""A worker's readable name, kept on each trial it measures (`trial_record.Attr.WORKER_NAME`) so that the
dashboard can say which worker measured what: `TRACETUNE_WORKER` when the worker's environment sets it
(a fleet's manifests set it from the pod's index or name), else this host and process (`host:pid`).

It only labels trials; claims and recovery go by the owner id (`coordination.worker_id`), which stays
unique when two workers are given one name."""

from __future__ import annotations

import os
import socket

ENV_WORKER = "TRACETUNE_WORKER"  # a worker's name, as its environment gives it
MAX_NAME_CHARS = 200  # a name set by mistake to something long still fits a table cell


def worker_name() -> str:
    """This process's name as a worker: `TRACETUNE_WORKER` (trimmed) when set, else `host:pid`."""
    given = " ".join(os.environ.get(ENV_WORKER, "").split())[:MAX_NAME_CHARS]
    return given or f"{socket.gethostname()}:{os.getpid()}"
