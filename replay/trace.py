"""The native trace format: JSONL, one request per line, validated with pydantic.

    {"timestamp": 0.0,  "prompt": "Summarise ...", "output_length": 128}
    {"timestamp": 0.8,  "messages": [{"role": "user", "content": "Hi"}], "output_length": 40, "session_id": "s1"}
    {"timestamp": 1.25, "input_length": 2048, "output_length": 300, "hash_ids": [17, 18, 91, 92]}

`timestamp` is in seconds, relative to the trace start or absolute (epoch seconds): absolute
timestamps are shifted so the first request is at 0. Timestamps must not decrease: an earlier
timestamp than the line before is an error (the importers of `tune trace convert` sort public traces),
and so is a gap of more than a day (relative and epoch seconds mixed) or a span of more than 31 days.
Exactly one of `prompt`, `messages` or `input_length` says what is sent. Records with only
`input_length` get prompts synthesised from real text (see `replay.synth`). Numbers are JSON
numbers (not strings or booleans), finite, and lengths at most MAX_TOKENS; blank lines are skipped.
Errors name the file, the line and the field, and are `InputError`s (exit code 2).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Literal, NoReturn

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import ErrorDetails

from tracetune.errors import InputError, opened_input
from tracetune.files import open_atomic, refuse_overwrite

MAX_LINE_BYTES = 64 * 2**20
# Far beyond any model's context; a larger length is a corrupt line, and synthesising its prompt
# would exhaust memory.
MAX_TOKENS = 10_000_000
# No recorded traffic pauses for a day between two requests, nor spans more than a month: such a
# timestamp is a mix of relative and epoch seconds (or a typo), and a replay would sleep through it.
MAX_GAP_S = 86_400.0
MAX_SPAN_S = 31 * 86_400.0


class TraceError(InputError):
    """A trace file that cannot be used, with file, line and field."""


def _json_number(value: object) -> object:
    # pydantic's lax mode would read true as 1 and "5" as 5; a trace writes numbers as numbers.
    if isinstance(value, bool):
        raise ValueError("must be a number, not a boolean")
    if isinstance(value, str):
        raise ValueError(f"must be a number, not a string ({value[:20]!r})")
    return value


Number = Annotated[float, BeforeValidator(_json_number)]
Count = Annotated[int, BeforeValidator(_json_number)]


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str


class Sampling(BaseModel):
    """Per-request sampling parameters, sent as the OpenAI fields of the same names."""

    model_config = ConfigDict(extra="forbid")

    temperature: Number | None = Field(None, ge=0, allow_inf_nan=False)
    top_p: Number | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    top_k: Count | None = Field(None, ge=-1)
    seed: Count | None = None
    stop: list[str] | None = None


class TraceRecord(BaseModel):
    """One recorded request."""

    model_config = ConfigDict(extra="forbid")

    timestamp: Number = Field(ge=0, allow_inf_nan=False, description="Arrival time in seconds.")
    prompt: str | None = Field(None, min_length=1, description="Completion prompt text.")
    messages: list[Message] | None = Field(None, min_length=1, description="Chat messages.")
    input_length: Count | None = Field(None, gt=0, le=MAX_TOKENS,
                                       description="Prompt length in tokens (length-only traces).")
    output_length: Count = Field(gt=0, le=MAX_TOKENS, description="Tokens to generate.")
    hash_ids: list[Count] | None = Field(None, description="Prefix block ids; equal ids = identical prompt blocks.")
    prefix_id: str | None = None
    session_id: str | None = None
    id: str | None = None
    response: str | None = Field(None, description="The recorded output text.")
    expected: str | None = Field(None, description="A label to score accuracy against.")
    sampling: Sampling | None = None

    @model_validator(mode="after")
    def _one_input(self) -> TraceRecord:
        given = [name for name in ("prompt", "messages", "input_length") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of prompt, messages or input_length"
                + (f" (got {', '.join(given)})" if given else "")
            )
        return self

    @property
    def kind(self) -> str:
        return "chat" if self.messages is not None else "completion"


class Trace(BaseModel):
    """A loaded trace: records with timestamps relative to the first request."""

    source: str
    records: list[TraceRecord]

    @property
    def duration_s(self) -> float:
        return self.records[-1].timestamp - self.records[0].timestamp if self.records else 0.0


def _field_of(error: ErrorDetails) -> str:
    loc = [str(p) for p in error["loc"]]
    return ".".join(loc) if loc else "(record)"


class _NonFinite(ValueError):
    """NaN or Infinity in a line: Python's json reads them, but JSON has no such numbers."""


def _refuse_constant(name: str) -> NoReturn:
    raise _NonFinite(name)


def _unencodable(data: object) -> str | None:
    """The field of the first string that cannot be sent as UTF-8 (a lone surrogate written as
    an escape such as \\ud800), or None. Iterative: a line may nest as deep as json allows."""
    stack: list[tuple[str, object]] = [("", data)]
    while stack:
        field, value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return field or "(record)"
        elif isinstance(value, (dict, list)):
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in reversed(list(items)):
                name = str(key)
                try:
                    name.encode("utf-8")
                except UnicodeEncodeError:
                    name = ascii(name)[1:-1]
                    return f"{field}.{name}" if field else name
                stack.append((f"{field}.{name}" if field else name, item))
    return None


def _check_gap(where: str, timestamp: float, previous: float, first: float) -> None:
    """A replay sleeps through every gap of its trace: a gap over MAX_GAP_S (typically relative and
    epoch timestamps mixed in one file) or a trace over MAX_SPAN_S is refused, not slept through."""
    if timestamp - previous > MAX_GAP_S:
        raise TraceError(
            f"{where}: field 'timestamp': {timestamp} comes {timestamp - previous:.6g} s after the previous "
            f"line's {previous}, a gap of more than a day (relative and epoch timestamps mixed?); write every "
            f"timestamp the same way: seconds from the trace start, or all epoch seconds")
    if timestamp - first > MAX_SPAN_S:
        raise TraceError(
            f"{where}: field 'timestamp': {timestamp} is {(timestamp - first) / 86400:.3g} days after the first "
            f"line's {first}, more than the {MAX_SPAN_S / 86400:g} days a trace may span; keep the part "
            f"to replay in the file, or check its timestamps")


def parse_lines(lines: Iterable[bytes], source: str) -> Trace:
    """Validate JSONL lines; raise TraceError at the first bad one."""
    records: list[TraceRecord] = []
    previous = -math.inf
    for lineno, raw in enumerate(lines, 1):
        where = f"{source}:{lineno}"
        if len(raw) > MAX_LINE_BYTES:
            raise TraceError(f"{where}: line is {len(raw)} bytes, over the {MAX_LINE_BYTES} byte limit")
        if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark, as some editors write
            raw = raw[3:]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TraceError(f"{where}: not valid UTF-8 (byte {exc.start}); save the trace as UTF-8") from None
        if not text.strip():
            continue
        try:
            data = json.loads(text, parse_constant=_refuse_constant)
        except _NonFinite as exc:
            named = re.search(r'"([^"\\]*)"\s*:\s*-?(?:NaN|Infinity)', text)
            field = f"field '{named.group(1)}': " if named else ""
            raise TraceError(f"{where}: {field}{exc} is not a JSON number; write a finite number") from None
        except RecursionError:
            raise TraceError(f"{where}: not valid JSON (nested too deeply); "
                             "each line must be one JSON object") from None
        except ValueError as exc:
            raise TraceError(f"{where}: not valid JSON ({exc}); each line must be one JSON object") from None
        if not isinstance(data, dict):
            raise TraceError(f"{where}: expected a JSON object, got {type(data).__name__}")
        bad_text = _unencodable(data)
        if bad_text:
            raise TraceError(f"{where}: field '{bad_text}': contains a lone UTF-16 surrogate escape (such as "
                             f"\\ud800), which is not text; write the character itself or remove it")
        try:
            record = TraceRecord.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            more = f" (and {exc.error_count() - 1} more problems)" if exc.error_count() > 1 else ""
            raise TraceError(f"{where}: field '{_field_of(err)}': {err['msg']}{more}") from None
        if record.timestamp < previous:
            raise TraceError(
                f"{where}: field 'timestamp': {record.timestamp} is earlier than the previous line's "
                f"{previous}; timestamps must not decrease (sort the file by timestamp)"
            )
        if records:
            _check_gap(where, record.timestamp, previous, records[0].timestamp)
        previous = record.timestamp
        records.append(record)
    if not records:
        raise TraceError(f"{source}: the trace has no requests (the file is empty or only blank lines); "
                         f"write one JSON object per line")
    start = records[0].timestamp
    if start > 0:  # absolute (epoch) or offset timestamps: the replay starts with the first request
        records = [r.model_copy(update={"timestamp": r.timestamp - start}) for r in records]
    return Trace(source=source, records=records)


def load_trace(path: str | Path) -> Trace:
    """Load and validate a native JSONL trace file."""
    path = Path(path)
    with opened_input(path, "trace file", TraceError) as f:
        return parse_lines(f, str(path))


def write_trace(records: Iterable[TraceRecord], path: str | Path, *, protected: Iterable[str | Path] = ()) -> int:
    """Write records as JSONL (unset fields left out), whole or not at all; return how many were
    written. Refused (`InputError`) where `path` is one of `protected` (the trace read), a database,
    a link or a device: a converted trace never replaces what it was made from."""
    refuse_overwrite(path, flag="output trace", protected=protected)
    n = 0
    with open_atomic(path) as f:
        for record in records:
            f.write(record.model_dump_json(exclude_none=True) + "\n")
            n += 1
    return n
