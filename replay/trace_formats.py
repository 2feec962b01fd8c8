"""Every public trace format `tune trace convert --from` reads, one record each, in the one table the
command line and `replay.importers` take it from. A new format is a reader in replay/importers.py,
(path, options) -> RawRequests in arrival order with bad rows as `InputError`s, and one line here.

It imports nothing heavy: `tune --help` lists the formats from it, and a reader (with the tokenizer
and synthesizer behind it) is imported only when a trace is converted."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

from tracetune.errors import InputError

# (path, options: importers.ConvertOptions) -> importers.RawRequest in arrival order (typed there:
# this table imports nothing of it)
Reader = Callable[[Path, object], Iterator[object]]
MOONCAKE_BLOCK_TOKENS = 512  # Mooncake's hash ids each stand for a block of this many tokens


@dataclasses.dataclass(frozen=True)
class TraceFormat:
    """One format: its name, its reader (a function of `replay.importers`) and the tokens each of its
    prefix hash ids stands for (None: the format records no prefixes)."""

    name: str
    reader: str
    block_tokens: int | None = None

    def read(self, path: Path, options: object) -> Iterator[object]:
        found = getattr(importlib.import_module("tracetune.replay.importers"), self.reader)
        return cast(Reader, found)(path, options)


TRACE_FORMATS = (
    TraceFormat("mooncake", "read_mooncake", MOONCAKE_BLOCK_TOKENS),
    TraceFormat("azure", "read_azure"),
    TraceFormat("burstgpt", "read_burstgpt"),
    TraceFormat("sharegpt", "read_sharegpt"),
)
FORMATS = tuple(f.name for f in TRACE_FORMATS)


def trace_format(name: str) -> TraceFormat:
    """The format named `name`; an InputError naming the choices otherwise."""
    for fmt in TRACE_FORMATS:
        if fmt.name == name:
            return fmt
    raise InputError(f"unknown trace format {name!r}; use one of {list(FORMATS)}")
