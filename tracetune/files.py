"""Files tracetune writes appear whole or not at all, and never over something it reads.

Every output (an export, a result JSON, a converted trace, a record) is written to a temporary file
in the target's folder and renamed over the target: a reader sees the old file or the new one,
never an empty or half-written one, and a crash mid-write leaves the old file as it was.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from tracetune.errors import InputError

SQLITE_MAGIC = b"SQLite format 3\x00"
# What SQLite keeps beside a database while it is written: writing over one corrupts the database.
SQLITE_SIDECARS = ("-wal", "-shm", "-journal")


@contextlib.contextmanager
def open_atomic(path: Path | str, mode: str = "w", *, encoding: str | None = "utf-8") -> Iterator[IO[Any]]:
    """A file opened for writing ("w" or "wb") that becomes `path` when the block ends without an
    error: written to a temporary file in the same folder (created where missing), then renamed over
    `path`. On an error the temporary file is removed and `path` is left as it was. A new file gets
    the usual permissions (0666 less the umask); a replaced one keeps its own."""
    if mode not in ("w", "wb"):
        raise ValueError(f"open_atomic writes ('w' or 'wb'), got mode {mode!r}")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, _mode_for(target))
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: Path | str, data: str | bytes, *, encoding: str = "utf-8") -> Path:
    """Write `data` to `path` through a temporary file in the same folder, then rename it into place
    (the folder is created where missing). Returns the path written."""
    with open_atomic(path, "wb" if isinstance(data, bytes) else "w", encoding=encoding) as f:
        f.write(data)
    return Path(path)


def _mode_for(target: Path) -> int:
    """The permission bits the file at `target` gets: those of the regular file it replaces, else
    what `open()` would give a new file (mkstemp's 0600 would hide an export from its readers)."""
    try:
        if target.is_file():
            return target.stat().st_mode & 0o7777
    except OSError:
        pass
    return 0o666 & ~_umask()


@functools.cache
def _umask() -> int:
    mask = os.umask(0o022)  # the only way to read it is to set it
    os.umask(mask)
    return mask


def is_database(path: Path | str) -> bool:
    """True when `path` is an existing SQLite database (its header says so)."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError:
        return False


def database_files(path: Path | str) -> list[Path]:
    """A SQLite database's file and the files SQLite keeps beside it (journal, write-ahead log)."""
    p = Path(path)
    return [p, *(p.with_name(p.name + suffix) for suffix in SQLITE_SIDECARS)]


def _same_file(a: Path, b: Path) -> bool:
    """`a` and `b` name one file: the same resolved path, or (both existing) the same inode (a hard link)."""
    if a.resolve() == b.resolve():
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def refuse_overwrite(path: Path | str, *, flag: str, protected: Iterable[Path | str] = ()) -> Path:
    """`path` as an output target, or an `InputError` (exit 2) when writing there would destroy
    something tracetune reads: one of `protected` (the study's storage, the trace being read), any
    existing database, or something that is not a regular file (a folder, a device, a link)."""
    target = Path(path)
    for p in protected:
        if _same_file(target, Path(p)):
            raise InputError(f"{flag} {target}: that is the file this command reads ({p}); writing there "
                             f"would destroy it. Name another output file")
    if target.is_symlink():
        raise InputError(f"{flag} {target}: is a symbolic link (to {os.readlink(target)}); tracetune replaces "
                         f"files, not what a link points to. Name a new file or the link's target")
    if target.exists() and not target.is_file():
        what = "a folder" if target.is_dir() else "a device or other special file"
        raise InputError(f"{flag} {target}: is {what}, not a regular file; name a new file")
    if is_database(target):
        raise InputError(f"{flag} {target}: is a database (a study?); tracetune never writes over one. "
                         f"Name another output file")
    return target
