"""Convert public trace formats to the native format (`tune trace convert`).

Formats: mooncake (JSONL, ms timestamps, hash_ids of 512-token blocks), azure (Azure LLM
inference trace CSV: TIMESTAMP, ContextTokens, GeneratedTokens), burstgpt (BurstGPT CSV:
Timestamp, Model, Request tokens, Response tokens, Total tokens, Log Type), sharegpt (JSON list of
conversations; no timing, so arrivals are drawn from a seeded Poisson process at `rate`).
Rows out of arrival order are sorted (public traces are not always sorted; native traces must be).
Bad rows are `InputError`s naming the file, the line and the field, found before any tokenizer loads.
The formats and their readers are listed once, in `replay.trace_formats`.

Length-only formats get prompts synthesised to exact token counts (`replay.synth`). Requests
longer than the model's context follow an explicit policy, and the report says what it did.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import io
import json
import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Literal, cast

from tracetune.errors import InputError
from tracetune.replay.synth import PromptSynthesizer, Tokenizer, implied_reuse_ratio, prefix_reuse_ratio
from tracetune.replay.trace import MAX_TOKENS, Message, TraceRecord
from tracetune.replay.trace_formats import MOONCAKE_BLOCK_TOKENS, trace_format
from tracetune.types import Json, JsonDict

Overlong = Literal["truncate", "drop", "scale", "error"]


@dataclasses.dataclass
class RawRequest:
    """A request as read from a source trace, before synthesis and length policy."""

    line: int  # in the source file (sharegpt: the conversation's number)
    timestamp_s: float
    input_length: int | None
    output_length: int
    hash_ids: list[int] | None = None
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    reply: str | None = None  # sharegpt: the recorded answer, whose token count is the output length


@dataclasses.dataclass
class ConvertOptions:
    max_input_tokens: int
    overlong: Overlong = "truncate"
    limit: int | None = None
    length_scale: float = 1.0
    max_output_tokens: int | None = None
    rate: float = 1.0  # sharegpt arrivals per second
    output_length: int = 128  # sharegpt, when no reply is recorded
    seed: int = 0
    spread_arrivals: bool = False  # arrivals recorded on a coarse grid: spread each instant's over its step

    def __post_init__(self) -> None:
        if self.max_input_tokens < 1:
            raise InputError(f"--max-input-tokens must be >= 1, got {self.max_input_tokens}")
        if self.limit is not None and self.limit < 1:
            raise InputError(f"--limit must be >= 1, got {self.limit}")
        if not (self.length_scale > 0 and math.isfinite(self.length_scale)):
            raise InputError(f"--length-scale must be a finite number > 0, got {self.length_scale}")
        if self.max_output_tokens is not None and self.max_output_tokens < 1:
            raise InputError(f"--max-output-tokens must be >= 1, got {self.max_output_tokens}")
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise InputError(f"--rate must be a finite number > 0, got {self.rate}")
        if self.output_length < 1:
            raise InputError(f"--output-length must be >= 1, got {self.output_length}")


@dataclasses.dataclass(frozen=True)
class ArrivalGrid:
    """Arrival times that sit on a coarse grid (the Mooncake traces record them 3 s apart): several
    requests share each instant, so a replay sends them as one burst."""

    step_s: float
    instants: int
    mean_burst: float
    largest_burst: int


def arrival_grid(timestamps: list[float], *, tolerance: float = 0.01) -> ArrivalGrid | None:
    """The grid `timestamps` (sorted) sit on, or None: at least two requests per instant on average
    and every gap between instants a whole number of steps (within `tolerance` of one step)."""
    counts: dict[float, int] = {}
    for t in timestamps:
        counts[t] = counts.get(t, 0) + 1
    instants = sorted(counts)
    if len(instants) < 2 or len(timestamps) < 2 * len(instants):
        return None
    gaps = [b - a for a, b in zip(instants, instants[1:])]
    step = min(gaps)
    if step <= 0 or any(abs(g / step - round(g / step)) > tolerance * max(1, round(g / step)) for g in gaps):
        return None
    unit = [g for g in gaps if round(g / step) == 1]
    return ArrivalGrid(step_s=round(sum(unit) / len(unit), 6), instants=len(instants),
                       mean_burst=len(timestamps) / len(instants), largest_burst=max(counts.values()))


@dataclasses.dataclass
class ConvertReport:
    source: str
    format: str
    read: int = 0
    written: int = 0
    dropped_overlong: int = 0
    truncated: int = 0
    skipped: int = 0
    skipped_reason: str = ""
    length_scale: float = 1.0
    block_tokens: int | None = None
    implied_reuse: float | None = None
    reproduced_reuse: float | None = None
    duration_s: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    grid: ArrivalGrid | None = None
    spread: bool = False
    spread_asked: bool = False

    def lines(self) -> list[str]:
        out = [f"{self.source} ({self.format}): read {self.read}, wrote {self.written} requests over "
               f"{self.duration_s:.1f}s ({self.input_tokens} input / {self.output_tokens} output tokens)"]
        if self.length_scale != 1.0:
            out.append(f"lengths scaled by {self.length_scale:.4g} (block size {self.block_tokens} tokens)")
        if self.truncated:
            out.append(f"{self.truncated} over-long inputs truncated to the context limit")
        if self.dropped_overlong:
            out.append(f"{self.dropped_overlong} over-long requests dropped")
        if self.skipped:
            out.append(f"{self.skipped} rows skipped: {self.skipped_reason}")
        if self.grid is not None:
            g = self.grid
            where = (f"spread uniformly over each {g.step_s:g} s step" if self.spread else
                     "replayed as simultaneous bursts (--spread-arrivals spreads them over each step)")
            out.append(f"arrivals recorded on a {g.step_s:g} s grid ({g.instants} instants, "
                       f"{g.mean_burst:.1f} requests each, up to {g.largest_burst}): {where}")
        elif self.spread_asked:
            out.append("--spread-arrivals: the arrival times sit on no coarse grid; kept as recorded")
        if self.implied_reuse is not None:
            out.append(f"prefix reuse (infinite cache, {self.block_tokens}-token blocks): trace implies "
                       f"{self.implied_reuse:.1%}, synthesised prompts reproduce {self.reproduced_reuse:.1%}")
        return out


def _bad(path: Path, line: int, field: str, message: str) -> InputError:
    return InputError(f"{path}:{line}: field '{field}': {message}")


def _int_field(path: Path, line: int, row: JsonDict, field: str, *, minimum: int = 0) -> int:
    """A token count: a whole number from `minimum` to MAX_TOKENS (a larger one is a corrupt row)."""
    value: Json = row.get(field)
    try:
        number = int(value) if not isinstance(value, bool) and float(value) == int(float(value)) else None
    except (TypeError, ValueError, OverflowError):
        number = None
    if number is None:
        raise _bad(path, line, field, f"expected an integer, got {value!r}")
    if number < minimum:
        raise _bad(path, line, field, f"must be >= {minimum}, got {number}")
    if number > MAX_TOKENS:
        raise _bad(path, line, field, f"must be <= {MAX_TOKENS:,} tokens (far beyond any model's context), "
                                      f"got {value!r}; fix or remove the line")
    return number


def _float_field(path: Path, line: int, row: JsonDict, field: str) -> float:
    value: Json = row.get(field)
    try:
        if isinstance(value, bool):
            raise TypeError(value)
        number = float(value)
    except (TypeError, ValueError):
        raise _bad(path, line, field, f"expected a number, got {value!r}") from None
    if not math.isfinite(number) or number < 0:
        raise _bad(path, line, field, f"must be a finite number >= 0, got {value!r}")
    return number


def _text(path: Path) -> str:
    """The file as text; a byte that is not UTF-8 is reported with its line."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read the file ({exc.strerror or exc})") from None
    if raw.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark, as some editors write
        raw = raw[3:]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise InputError(f"{path}:{line}: not valid UTF-8 (byte {exc.start}); save the file as UTF-8") from None


def _json(path: Path, line: int, text: str) -> Json:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{line + exc.lineno - 1}: not valid JSON ({exc.msg})") from None
    except (ValueError, RecursionError) as exc:  # an integer of thousands of digits, or nesting too deep
        raise InputError(f"{path}:{line}: not valid JSON ({str(exc) or 'nested too deeply'})") from None


def read_mooncake(path: Path, options: ConvertOptions | None = None) -> Iterator[RawRequest]:
    for line, text in enumerate(_text(path).split("\n"), 1):
        if not text.strip():
            continue
        row = _json(path, line, text)
        if not isinstance(row, dict):
            raise InputError(f"{path}:{line}: expected a JSON object, got {type(row).__name__}")
        for field in ("timestamp", "input_length", "output_length"):
            if field not in row:
                raise _bad(path, line, field, "missing")
        hash_ids = row.get("hash_ids") or []
        if not isinstance(hash_ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in hash_ids):
            raise _bad(path, line, "hash_ids", "expected a list of integers")
        yield RawRequest(line, _float_field(path, line, row, "timestamp") / 1000.0,
                         _int_field(path, line, row, "input_length", minimum=1),
                         _int_field(path, line, row, "output_length", minimum=0), hash_ids=hash_ids)


def _csv_rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    reader = csv.DictReader(io.StringIO(_text(path), newline=""))
    try:
        header = [h.strip() for h in (reader.fieldnames or [])]
        missing = [c for c in required if c not in header]
        if missing:
            raise InputError(f"{path}:1: header lacks column(s) {missing}; found {header}")
        reader.fieldnames = header
        for row in reader:
            short = [c for c in required if row.get(c) is None]
            if short:
                raise _bad(path, reader.line_num, short[0], "missing (the row has fewer columns than the header)")
            yield reader.line_num, {k: (v.strip() if isinstance(v, str) else v) for k, v in row.items()}
    except csv.Error as exc:  # e.g. a field over csv's size limit; line_num counts the rows read before it
        raise InputError(f"{path}:{reader.line_num + 1}: not valid CSV ({exc})") from None


def read_azure(path: Path, options: ConvertOptions | None = None) -> Iterator[RawRequest]:
    for line, row in _csv_rows(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens")):
        stamp = row["TIMESTAMP"]
        try:
            # 7 fractional digits ("18:15:46.6805900"): keep microseconds, drop the 7th digit.
            head, _, frac = stamp.partition(".")
            when = dt.datetime.strptime(head, "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.UTC)
            if frac and not frac.isdigit():
                raise ValueError(frac)
            seconds = when.timestamp() + (float("0." + frac) if frac else 0.0)
        except ValueError:
            raise _bad(path, line, "TIMESTAMP", f"expected 'YYYY-MM-DD HH:MM:SS.fffffff', got {stamp!r}") from None
        yield RawRequest(line, seconds, _int_field(path, line, row, "ContextTokens", minimum=1),
                         _int_field(path, line, row, "GeneratedTokens", minimum=0))


def read_burstgpt(path: Path, options: ConvertOptions | None = None) -> Iterator[RawRequest]:
    for line, row in _csv_rows(path, ("Timestamp", "Request tokens", "Response tokens")):
        yield RawRequest(line, _float_field(path, line, row, "Timestamp"),
                         _int_field(path, line, row, "Request tokens", minimum=1),
                         _int_field(path, line, row, "Response tokens", minimum=0))


def _list_item_lines(text: str) -> list[int]:
    """1-based line of each element of the (already validated) top-level JSON list in `text`."""
    decoder = json.JSONDecoder()
    lines: list[int] = []
    i = text.index("[") + 1
    line, counted_to = 1, 0
    while True:
        while text[i] in " \t\r\n,":
            i += 1
        if text[i] == "]":
            return lines
        line += text.count("\n", counted_to, i)
        counted_to = i
        lines.append(line)
        _, i = decoder.raw_decode(text, i)


def read_sharegpt(path: Path, options: ConvertOptions) -> Iterator[RawRequest]:
    text = _text(path)
    data = _json(path, 1, text)
    if not isinstance(data, list):
        raise InputError(f"{path}:1: expected a JSON list of conversations")
    rng = random.Random(options.seed)
    t = 0.0
    for index, (conv, line) in enumerate(zip(data, _list_item_lines(text))):
        where = f"{path}:{line}: conversation #{index}"
        turns = conv.get("conversations") if isinstance(conv, dict) else None
        if not turns or not isinstance(turns, list) or not isinstance(turns[0], dict) or "value" not in turns[0]:
            raise InputError(f"{where}: field 'conversations[0].value': missing")
        prompt = turns[0]["value"]
        if not isinstance(prompt, str):
            raise InputError(f"{where}: field 'conversations[0].value': expected text, got {type(prompt).__name__}")
        reply = turns[1].get("value") if len(turns) > 1 and isinstance(turns[1], dict) else None
        if reply is not None and not isinstance(reply, str):
            raise InputError(f"{where}: field 'conversations[1].value': expected text, got {type(reply).__name__}")
        for field, value in (("conversations[0].value", prompt), ("conversations[1].value", reply or "")):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise InputError(f"{where}: field '{field}': contains a lone UTF-16 surrogate escape (such as "
                                 f"\\ud800), which is not text") from None
        # Numbered by conversation (ids stay "name:N" for the Nth); errors above name the file line.
        yield RawRequest(index + 1, t, None, options.output_length, reply=reply or None,
                         messages=[{"role": "user", "content": prompt}])
        t += rng.expovariate(options.rate)


def read_requests(fmt: str, path: Path, options: ConvertOptions) -> tuple[list[RawRequest], ConvertReport]:
    """Read and validate `path` (no tokenizer needed), sorted by arrival: bad input fails here,
    before any model is loaded."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    report = ConvertReport(source=str(path), format=fmt)
    raw: list[RawRequest] = []
    for request in cast(Iterator[RawRequest], trace_format(fmt).read(path, options)):
        report.read += 1
        if request.output_length == 0:
            report.skipped += 1
            report.skipped_reason = "no output tokens recorded (failed or cancelled requests)"
            continue
        raw.append(request)
        if options.limit is not None and len(raw) >= options.limit:
            break
    if not raw:
        raise InputError(f"{path}: no usable requests (the file is empty, or every request has 0 output tokens)")
    # Public traces are not always in arrival order; they are sorted here (native traces must be sorted).
    raw.sort(key=lambda r: (r.timestamp_s, r.line))
    return raw, report


def convert(fmt: str, path: Path, tokenizer: Tokenizer, options: ConvertOptions,
            synthesizer: PromptSynthesizer | None = None,
            read: tuple[list[RawRequest], ConvertReport] | None = None) -> tuple[list[TraceRecord], ConvertReport]:
    """Read `path` in format `fmt` (or take `read`, what read_requests returned) and return native
    records plus a report of what was done."""
    path = Path(path)
    raw, report = read or read_requests(fmt, path, options)
    t0 = raw[0].timestamp_s
    report.grid = arrival_grid([r.timestamp_s for r in raw])
    report.spread = bool(options.spread_arrivals and report.grid)
    report.spread_asked = options.spread_arrivals
    jitter = random.Random(options.seed)

    scale = options.length_scale
    longest = max(r.input_length or 0 for r in raw)
    if options.overlong == "scale" and longest * scale > options.max_input_tokens:
        scale = options.max_input_tokens / longest
    report.length_scale = scale
    hashed = trace_format(fmt).block_tokens
    block = max(1, round(hashed * scale)) if hashed is not None else None
    report.block_tokens = block

    if synthesizer is None and any(r.input_length is not None for r in raw):
        synthesizer = PromptSynthesizer(tokenizer, block_tokens=block or MOONCAKE_BLOCK_TOKENS, seed=options.seed)
    elif synthesizer is not None and block is not None:
        synthesizer.block_tokens = block

    records: list[TraceRecord] = []
    kept_for_reuse: list[tuple[int, list[int]]] = []
    prompts_for_reuse: list[str] = []
    for r in raw:
        out_len = r.output_length
        if r.reply:
            out_len = max(1, len(tokenizer.encode(r.reply, add_special_tokens=False)))
        if options.max_output_tokens is not None:
            out_len = min(out_len, options.max_output_tokens)
        arrival = r.timestamp_s - t0 + (jitter.uniform(0, report.grid.step_s) if report.spread and report.grid else 0.0)
        fields: JsonDict = {"timestamp": round(arrival, 6), "output_length": out_len,
                                  "id": f"{path.stem}:{r.line}"}
        if r.input_length is not None:
            assert synthesizer is not None  # made above for any request with an input length
            length = max(1, round(r.input_length * scale))
            hash_ids = r.hash_ids
            if length > options.max_input_tokens:
                if options.overlong in ("drop",):
                    report.dropped_overlong += 1
                    continue
                if options.overlong == "error":
                    raise InputError(
                        f"{path}:{r.line}: field 'input_length': {length} tokens exceed the model's limit "
                        f"{options.max_input_tokens}; choose --overlong truncate, drop or scale")
                length = options.max_input_tokens
                report.truncated += 1
                if hash_ids and block:
                    hash_ids = hash_ids[: math.ceil(length / block)]
            fields["prompt"] = synthesizer.prompt(length, hash_ids=hash_ids, unique_key=(path.stem, r.line))
            if hash_ids:
                fields["hash_ids"] = hash_ids
                kept_for_reuse.append((length, hash_ids))
                prompts_for_reuse.append(fields["prompt"])
            report.input_tokens += length
        else:
            fields["messages"] = [Message(**m) for m in r.messages or []]
        report.output_tokens += out_len
        records.append(TraceRecord(**fields))
    if not records:
        raise InputError(f"{path}: every request was dropped by --overlong {options.overlong}")
    if kept_for_reuse and block:
        report.implied_reuse = implied_reuse_ratio(kept_for_reuse, block)
        token_lists = [tokenizer.encode(p, add_special_tokens=True) for p in prompts_for_reuse]
        report.reproduced_reuse = prefix_reuse_ratio(token_lists, block)
    records.sort(key=lambda rec: rec.timestamp)  # spread arrivals may reorder an instant's requests
    report.written = len(records)
    report.duration_s = records[-1].timestamp
    return records, report
