"""Files tracetune writes appear whole or not at all, and never over something it reads.

Every output (an export, a result JSON, a converted trace, a record) is written to a temporary file
in the target's folder and renamed over the target: a reader sees the old file or the new one,
never an empty or half-written one, and a crash mid-write leaves the old file as it was.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from tracetune.errors import InputError

SQLITE_MAGIC = b"SQLite format 3\x00"


def write_atomic(path: Path | str, data: str | bytes, *, encoding: str = "utf-8") -> Path:
    """Write `data` to `path` through a temporary file in the same folder, then rename it into place
    (the folder is created where missing). Returns the path written."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode(encoding) if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def is_database(path: Path | str) -> bool:
    """True when `path` is an existing SQLite database (its header says so)."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError:
        return False


def refuse_overwrite(path: Path | str, *, flag: str, protected: Iterable[Path | str] = ()) -> Path:
    """`path` as an output target, or an `InputError` (exit 2) when writing there would destroy
    something tracetune reads: one of `protected` (the study's storage, the trace being read), any
    existing database, or something that is not a regular file (a folder, a device, a link)."""
    target = Path(path)
    resolved = target.resolve()
    for p in protected:
        if Path(p).resolve() == resolved:
            raise InputError(f"{flag} {target}: that is the file this command reads ({p}); writing there "
                             f"would destroy it. Name another output file")
    if target.is_symlink() or (target.exists() and not target.is_file()):
        raise InputError(f"{flag} {target}: exists and is not a regular file; name a new file")
    if is_database(target):
        raise InputError(f"{flag} {target}: is a database (a study?); tracetune never writes over one. "
                         f"Name another output file")
    return target
