"""Bad input, fuzzed: trace lines, public trace formats and search-space files are generated valid,
then corrupted one way each (wrong types, missing fields, negative / unsorted timestamps, NaN,
huge prompts, non-UTF-8 bytes, non-object or truncated JSON, empty files, blank lines, YAML
errors, unknown keys, low > high, empty choices, `when` on an unknown parameter).

Properties:
- library: parsing raises the project's `InputError` (never a raw exception), and the message
  starts with `FILE:LINE: ` at the right 1-based line and names the field where there is one;
- CLI: the real `tune` in a subprocess exits 2, prints no traceback, names the file and line,
  and writes nothing (no run directory, no output file), before any model or engine is touched.

Hypothesis runs derandomized (the same examples on every run, so CI is reproducible). The number
of cases is printed at the end of the module and stored in pytest's cache under
`tracetune/bad_input_cases` (`.pytest_cache/v/tracetune/bad_input_cases`).
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import tracetune.replay.trace as trace_module
from tracetune.errors import InputError
from tracetune.replay.importers import ConvertOptions, read_requests
from tracetune.replay.trace import MAX_TOKENS, TraceError, load_trace, parse_lines
from tracetune.search_spaces.space import KNOBS, SpaceError, load_space

REPO = Path(__file__).resolve().parents[2]

LIBRARY = settings(max_examples=50, derandomize=True, database=None, deadline=2000,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# Per corruption kind. Each CLI example starts `tune` (0.5-2 s of imports on a busy 2-core machine),
# so the CLI runs one generated file of every kind.
CLI = settings(max_examples=1, derandomize=True, database=None, deadline=None,
               phases=[Phase.explicit, Phase.generate],  # no shrinking: every step would start `tune` again
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

CASES: collections.Counter[str] = collections.Counter()


@pytest.fixture(scope="module", autouse=True)
def _report_case_counts(request):
    started = time.perf_counter()
    yield
    total = sum(CASES.values())
    detail = ", ".join(f"{name} {n}" for name, n in sorted(CASES.items()))
    cache = getattr(request.config, "cache", None)  # absent under `-p no:cacheprovider`
    if cache is not None:
        cache.set("tracetune/bad_input_cases",
                  {"total": total, "by_property": dict(CASES), "seconds": round(time.perf_counter() - started, 1)})
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"\nbad-input fuzz cases: {total} ({detail})")


@dataclass
class Case:
    """A corrupted file: its bytes, the 1-based line the error must name (None: the whole file),
    the field the message must name (None: no field), and a fragment the message must contain."""

    data: bytes
    line: int | None
    field: str | None
    says: str
    kind: str

    def __repr__(self) -> str:  # huge fields would flood the failure report
        data = self.data if len(self.data) <= 600 else self.data[:300] + b"..." + self.data[-200:]
        return f"Case({self.kind!r}, line={self.line}, field={self.field!r}, says={self.says!r}, data={data!r})"


def check_message(message: str, path: Path | str, case: Case) -> None:
    where = f"{path}:{case.line}: " if case.line is not None else f"{path}: "
    assert message.startswith(where), f"{case.kind}: expected {where!r} at the start of {message!r}"
    if case.field is not None:
        assert f"field '{case.field}" in message, f"{case.kind}: field {case.field!r} not named in {message!r}"
    assert case.says in message, f"{case.kind}: {case.says!r} not in {message!r}"
    assert "Traceback" not in message


# --- native trace lines ---------------------------------------------------------------------

texts = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40)
sampling = st.fixed_dictionaries({}, optional={
    "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1), "top_k": st.integers(-1, 100),
    "seed": st.integers(0, 2**31), "stop": st.lists(texts, max_size=2)})
inputs = st.one_of(
    st.fixed_dictionaries({"prompt": texts}),
    st.fixed_dictionaries({"messages": st.lists(st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant"]), "content": st.text(max_size=30)}),
        min_size=1, max_size=3)}),
    st.fixed_dictionaries({"input_length": st.integers(1, 4096)},
                          optional={"hash_ids": st.lists(st.integers(0, 10**6), max_size=4)}),
)
extras = st.fixed_dictionaries({}, optional={
    "session_id": texts, "id": texts, "expected": texts, "sampling": sampling})


@st.composite
def valid_records(draw, min_size=1):
    n = draw(st.integers(min_size, 6))
    start = draw(st.one_of(st.just(0.0), st.floats(1, 2e9)))  # relative or epoch seconds
    steps = draw(st.lists(st.floats(0, 100), min_size=n, max_size=n))
    records, t = [], max(start, 1.0)  # >= 1 so an earlier timestamp >= 0 always exists
    for step in steps:
        t += step
        record = {"timestamp": t, **draw(inputs), "output_length": draw(st.integers(1, 4096)), **draw(extras)}
        records.append(record)
    return records


def encode(record, ascii_only=True) -> bytes:
    return json.dumps(record, ensure_ascii=ascii_only).encode("utf-8")


WRONG_NUMBER = st.one_of(st.text(max_size=10), st.booleans(), st.lists(st.integers(), max_size=2),
                         st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
WRONG_TEXT = st.one_of(st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.booleans(),
                       st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
WRONG_FOR = {
    "timestamp": WRONG_NUMBER, "output_length": WRONG_NUMBER | st.integers(max_value=0) | st.floats(0.1, 0.9),
    "input_length": WRONG_NUMBER | st.integers(max_value=0) | st.integers(MAX_TOKENS + 1),
    "prompt": WRONG_TEXT | st.just(""),
    "messages": st.one_of(st.text(max_size=5), st.integers(), st.just([]), st.just([{"role": "robot", "content": "x"}]),
                          st.just([{"role": "user"}]), st.just([{"role": "user", "content": 3}]), st.just(["hi"])),
    "hash_ids": st.one_of(st.text(max_size=5), st.just([True]), st.just(["1"]), st.just([1.5])),
    "sampling": st.one_of(st.text(max_size=5), st.just({"temperature": -1}), st.just({"top_p": 2}),
                          st.just({"colour": 1}), st.just({"seed": "x"})),
    "session_id": WRONG_TEXT, "id": WRONG_TEXT, "expected": WRONG_TEXT,
}


def _wrong_type(draw, records, i):
    field = draw(st.sampled_from(sorted(set(records[i]) & set(WRONG_FOR))))
    records[i][field] = draw(WRONG_FOR[field])
    return field, "", "wrong type"


def _missing(draw, records, i):
    which = draw(st.sampled_from(["timestamp", "output_length", "input"]))
    if which == "input":
        for key in ("prompt", "messages", "input_length"):
            records[i].pop(key, None)
        records[i].pop("hash_ids", None)
        return "(record)", "give exactly one of prompt, messages or input_length", "missing input"
    del records[i][which]
    return which, "Field required", f"missing {which}"


def _two_inputs(draw, records, i):
    records[i].update({"prompt": "a", "input_length": 3})
    records[i].pop("messages", None)
    return "(record)", "give exactly one of", "two inputs"


def _negative_timestamp(draw, records, i):
    records[i]["timestamp"] = -draw(st.floats(1e-6, 1e9))
    return "timestamp", "greater than or equal to 0", "negative timestamp"


def _unsorted(draw, records, i):
    if i == 0:
        i = 1
        if len(records) < 2:
            records.append(dict(records[0]))
    records[i]["timestamp"] = records[i - 1]["timestamp"] * draw(st.floats(0, 0.999))
    return "timestamp", "timestamps must not decrease (sort the file by timestamp)", "unsorted"


def _unknown_field(draw, records, i):
    name = draw(st.sampled_from(["colour", "Timestamp", "max_tokens", "prompt_text", "ttft"]))
    records[i][name] = draw(st.integers())
    return name, "Extra inputs are not permitted", "unknown field"


def _too_many_tokens(draw, records, i):
    field = "input_length" if "input_length" in records[i] else "output_length"
    records[i][field] = draw(st.integers(MAX_TOKENS + 1, 10**30))
    return field, f"less than or equal to {MAX_TOKENS}", "too many tokens"


RECORD_CORRUPTIONS = [_wrong_type, _missing, _two_inputs, _negative_timestamp, _unsorted, _unknown_field,
                      _too_many_tokens]


RAW_KINDS = ["non_finite", "overflow", "non_utf8", "non_object", "truncated", "surrogate", "deep", "control"]


def _raw_line_corruption(draw, kind: str, line: bytes, record: dict) -> tuple[bytes, str | None, str, str]:
    """Corruptions of the bytes of one line: (new line, field, fragment, kind)."""
    if kind == "non_finite":
        field = draw(st.sampled_from(["timestamp", "output_length"]))
        constant = draw(st.sampled_from(["NaN", "Infinity", "-Infinity"]))
        rest = {k: v for k, v in record.items() if k != field}
        body = json.dumps(rest)[1:-1]
        return f'{{"{field}": {constant}, {body}}}'.encode(), field, f"{constant} is not a JSON number", kind
    if kind == "overflow":  # 1e400 is read as inf by json
        field = draw(st.sampled_from(["timestamp", "output_length"]))
        rest = {k: v for k, v in record.items() if k != field}
        return f'{{"{field}": 1e400, {json.dumps(rest)[1:-1]}}}'.encode(), field, "finite number", kind
    if kind == "non_utf8":
        bad = draw(st.sampled_from([b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80", b"\xf8\x88\x80\x80\x80"]))
        at = draw(st.integers(0, len(line)))
        return line[:at] + bad + line[at:], None, "not valid UTF-8", kind
    if kind == "non_object":
        value = draw(st.one_of(st.lists(st.integers(), max_size=3), st.integers(), st.text(max_size=5),
                               st.booleans(), st.none(), st.just(list(record.values())[:2])))
        return json.dumps(value).encode(), None, "expected a JSON object", kind
    if kind == "truncated":
        text = line.decode()
        return text[:draw(st.integers(1, len(text) - 1))].encode(), None, "not valid JSON", kind
    if kind == "surrogate":
        return line[:-1] + b', "prompt": "\\udc80"}' if b'"prompt"' not in line else \
            line.replace(b'"prompt": "', b'"prompt": "\\ud800', 1), "prompt", "lone UTF-16 surrogate", kind
    if kind == "deep":
        depth = draw(st.integers(5_000, 200_000))
        return b'{"timestamp": ' + b"[" * depth + b"]" * depth + b"}", None, "not valid JSON", kind
    # a raw control character inside a string
    return line.replace(b'"output_length"', b'"output\x01_length"', 1), None, "not valid JSON", kind


@st.composite
def empty_traces(draw) -> Case:
    lines = draw(st.lists(st.sampled_from([b"", b" ", b"\t", b"\r", b"  \r"]), max_size=5))
    return Case(draw(st.sampled_from([b"\n", b"\r\n"])).join(lines), None, None, "the trace has no requests", "empty")


TRACE_KINDS = [f.__name__.lstrip("_") for f in RECORD_CORRUPTIONS] + RAW_KINDS + ["empty"]


@st.composite
def bad_traces(draw, kind: str) -> Case:
    if kind == "empty":
        return draw(empty_traces())
    records = draw(valid_records())
    i = draw(st.integers(0, len(records) - 1))
    ascii_only = draw(st.booleans())
    if kind in RAW_KINDS:
        lines = [encode(r, ascii_only) for r in records]
        lines[i], field, says, kind = _raw_line_corruption(draw, kind, lines[i], records[i])
    else:
        corrupt = next(f for f in RECORD_CORRUPTIONS if f.__name__.lstrip("_") == kind)
        field, says, kind = corrupt(draw, records, i)
        if corrupt is _unsorted and i == 0:
            i = 1
        lines = [encode(r, ascii_only) for r in records]
    # Blank lines anywhere (they are skipped but still count as lines).
    blanks = draw(st.lists(st.tuples(st.integers(0, len(lines)), st.sampled_from([b"", b"  ", b"\t", b"\r"])),
                           max_size=4))
    bad_index = i
    for at, blank in sorted(blanks, reverse=True):
        lines.insert(at, blank)
        if at <= bad_index:
            bad_index += 1
    newline = draw(st.sampled_from([b"\n", b"\r\n"]))
    data = newline.join(lines) + draw(st.sampled_from([b"", newline]))
    return Case(data, bad_index + 1, field, says, kind)


@settings(LIBRARY, max_examples=200)
@given(valid_records(), st.sampled_from([b"\n", b"\r\n"]), st.lists(st.integers(0, 6), max_size=3), st.booleans())
def test_generated_valid_traces_parse(records, newline, blank_at, ascii_only):
    """The generator's valid traces are valid (with blank lines and CRLF too), so every failure
    below is the corruption's."""
    CASES["trace valid"] += 1
    lines = [encode(r, ascii_only) for r in records]
    for at in sorted(blank_at, reverse=True):
        lines.insert(min(at, len(lines)), b"")
    trace = parse_lines(newline.join(lines).splitlines(keepends=True), "ok.jsonl")
    assert len(trace.records) == len(records) and trace.records[0].timestamp == 0.0


@pytest.mark.parametrize("kind", TRACE_KINDS)
@LIBRARY
@given(st.data())
def test_bad_trace_is_named_by_file_line_and_field(kind, data):
    case = data.draw(bad_traces(kind), label="case")
    CASES["trace library"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "traffic.jsonl"
        path.write_bytes(case.data)
        with pytest.raises(TraceError) as info:
            load_trace(path)
    assert info.value.exit_code == 2
    check_message(str(info.value), path, case)
    str(info.value).encode("utf-8")  # printable


@settings(LIBRARY, max_examples=40)
@given(valid_records(), st.data())
def test_over_long_line_is_refused(records, data):
    """Huge prompts: a line over the byte limit (shrunk here so the fuzzer stays fast)."""
    CASES["trace huge line"] += 1
    i = data.draw(st.integers(0, len(records) - 1))
    records[i] = {**{k: v for k, v in records[i].items() if k not in ("messages", "input_length", "hash_ids")},
                  "prompt": "x" * data.draw(st.integers(4096, 20_000))}
    with mock.patch.object(trace_module, "MAX_LINE_BYTES", 4096):
        with pytest.raises(TraceError) as info:
            parse_lines([encode(r) + b"\n" for r in records], "big.jsonl")
    assert str(info.value).startswith(f"big.jsonl:{i + 1}: line is ") and "over the 4096 byte limit" in str(info.value)


def test_real_over_long_line_is_refused():
    CASES["trace huge line"] += 1
    line = b'{"timestamp": 0, "output_length": 1, "prompt": "' + b"y" * trace_module.MAX_LINE_BYTES + b'"}\n'
    with pytest.raises(TraceError, match=r"^huge.jsonl:2: line is \d+ bytes, over the \d+ byte limit"):
        parse_lines([b'{"timestamp": 0, "prompt": "a", "output_length": 1}\n', line], "huge.jsonl")


def test_large_valid_prompt_is_kept():
    prompt = "word " * 200_000  # 1 MB
    trace = parse_lines([encode({"timestamp": 0, "prompt": prompt, "output_length": 1})], "big.jsonl")
    assert trace.records[0].prompt == prompt


# --- public trace formats (tune trace convert) ------------------------------------------------

def _mooncake_row(draw):
    return {"timestamp": draw(st.integers(0, 10**9)), "input_length": draw(st.integers(1, 10**6)),
            "output_length": draw(st.integers(1, 5000)), "hash_ids": draw(st.lists(st.integers(0, 10**6), max_size=4))}


NOT_A_NUMBER = st.sampled_from(["ten", "", [], {}, None, True, False, "1.2.3", [1]])


MOONCAKE_KINDS = ["wrong_type", "missing", "negative", "nan", "hash_ids", "non_object", "truncated", "non_utf8", "deep"]


@st.composite
def bad_mooncake(draw, kind: str) -> Case:
    rows = [_mooncake_row(draw) for _ in range(draw(st.integers(1, 5)))]
    i = draw(st.integers(0, len(rows) - 1))
    field, says = None, ""
    lines = [json.dumps(r).encode() for r in rows]
    if kind == "wrong_type":
        field = draw(st.sampled_from(["timestamp", "input_length", "output_length"]))
        rows[i][field] = draw(NOT_A_NUMBER)
        says = "expected a"
    elif kind == "missing":
        field = draw(st.sampled_from(["timestamp", "input_length", "output_length"]))
        del rows[i][field]
        says = "missing"
    elif kind == "negative":
        field = draw(st.sampled_from(["timestamp", "input_length", "output_length"]))
        rows[i][field] = -draw(st.integers(1, 10**6))
        says = "must be"
    elif kind == "nan":
        field = draw(st.sampled_from(["timestamp", "input_length", "output_length"]))
        rows[i][field] = draw(st.sampled_from([float("nan"), float("inf"), float("-inf")]))
    elif kind == "hash_ids":
        field = "hash_ids"
        rows[i][field] = draw(st.sampled_from(["abc", [1.5], ["1"], [True], {"a": 1}]))
        says = "expected a list of integers"
    lines = [json.dumps(r).encode() for r in rows]  # json writes NaN / Infinity, as Python-made files do
    if kind == "non_object":
        lines[i], says = json.dumps(draw(st.one_of(st.lists(st.integers(), max_size=2), st.integers(),
                                                    st.text(max_size=5), st.none()))).encode(), "expected a JSON object"
    elif kind == "truncated":
        lines[i], says = lines[i][:draw(st.integers(1, len(lines[i]) - 1))], "not valid JSON"
    elif kind == "non_utf8":
        at = draw(st.integers(0, len(lines[i])))
        lines[i], says = lines[i][:at] + b"\xff\xfe" + lines[i][at:], "not valid UTF-8"
    elif kind == "deep":
        lines[i], says = b"[" * 100_000 + b"]" * 100_000, "not valid JSON"
    blanks = draw(st.integers(0, 3))
    lines[i:i] = [b""] * blanks  # blank lines before the bad one still count
    return Case(b"\n".join(lines) + b"\n", i + blanks + 1, field, says, f"mooncake {kind}")


AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"


CSV_KINDS = ["wrong_value", "short_row", "huge_field", "non_utf8", "header"]


@st.composite
def bad_csv(draw, fmt: str, kind: str) -> Case:
    n = draw(st.integers(1, 5))
    if fmt == "azure":
        rows = [[f"2023-11-16 18:15:{draw(st.integers(10, 59))}.{draw(st.integers(0, 9999999)):07d}",
                 str(draw(st.integers(1, 9000))), str(draw(st.integers(1, 900)))] for _ in range(n)]
        fields = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
    else:
        rows = [[str(draw(st.floats(0, 1e6))), "ChatGPT", str(draw(st.integers(1, 9000))),
                 str(draw(st.integers(1, 900))), "0", "Conversation log"] for _ in range(n)]
        fields = ["Timestamp", "", "Request tokens", "Response tokens"]
    i = draw(st.integers(0, n - 1))
    field, says, line = None, "", i + 2
    if kind == "wrong_value":
        column = draw(st.sampled_from([0, 2, 3] if fmt == "burstgpt" else [0, 1, 2]))
        field = fields[column]
        rows[i][column] = draw(st.sampled_from(["", "abc", "nan", "inf", "-5", "1e999", "2023-13-45 99:99:99"]))
        if column > 0 and rows[i][column] == "-5":
            says = "must be >="
    elif kind == "short_row":
        rows[i] = rows[i][:1]
        field, says = fields[1] if fmt == "azure" else fields[2], "missing"
    elif kind == "huge_field":  # a huge prompt-sized field, over csv's field size limit
        rows[i][-1] = "x" * 200_000
        says = "not valid CSV"
    header = AZURE_HEADER if fmt == "azure" else BURST_HEADER
    if kind == "header":
        header, line, says = header.replace(fields[0], "Time"), 1, "header lacks column"
    data = "\n".join([header] + [",".join(r) for r in rows]).encode() + b"\n"
    if kind == "non_utf8":
        lines = data.split(b"\n")
        lines[i + 1] = lines[i + 1] + b"\xe9t\xe9"  # Latin-1 text
        data, says = b"\n".join(lines), "not valid UTF-8"
    return Case(data, line, field, says, f"{fmt} {kind}")


SHAREGPT_KINDS = ["wrong_type", "missing", "not_list", "truncated", "non_utf8"]


@st.composite
def bad_sharegpt(draw, kind: str) -> Case:
    convs = [{"id": str(k), "conversations": [{"from": "human", "value": draw(texts)},
                                              {"from": "gpt", "value": draw(texts)}]}
             for k in range(draw(st.integers(1, 4)))]
    i = draw(st.integers(0, len(convs) - 1))
    field, says = None, ""
    if kind == "wrong_type":
        turn = draw(st.integers(0, 1))  # a reply of null is "no reply recorded", which is valid
        convs[i]["conversations"][turn]["value"] = draw(st.sampled_from([5, [1], {"a": 1}, True] + [None] * (turn == 0)))
        field, says = f"conversations[{turn}].value", "expected text"
    elif kind == "missing":
        convs[i] = draw(st.sampled_from([{}, {"conversations": []}, {"conversations": [{"from": "human"}]}, [], "x"]))
        field = "conversations[0].value"
    # One conversation per line after the first, so conversation i starts on line i + 2.
    text = "[\n" + ",\n".join(json.dumps(c) for c in convs) + "\n]\n"
    line = i + 2
    if kind == "not_list":
        text, line, says = json.dumps({"conversations": convs}), 1, "expected a JSON list"
    elif kind == "truncated":
        lines = text.split("\n")
        text, says = "\n".join(lines[: i + 1] + [lines[i + 1][:-2]]), "not valid JSON"  # ends on line i + 2
    data = text.encode()
    if kind == "non_utf8":
        lines = data.split(b"\n")
        lines[i + 1] = lines[i + 1].replace(b'"value": "', b'"value": "\xff', 1)
        data, says = b"\n".join(lines), "not valid UTF-8"
    return Case(data, line, field, says, f"sharegpt {kind}")


def _read_bad(fmt: str, case: Case, tmp: str) -> str:
    path = Path(tmp) / f"source.{fmt}"
    path.write_bytes(case.data)
    with pytest.raises(InputError) as info:
        read_requests(fmt, path, ConvertOptions(max_input_tokens=100_000))
    assert info.value.exit_code == 2
    message = str(info.value)
    check_message(message, path, case)
    return message


PUBLIC_KINDS = ([("mooncake", k) for k in MOONCAKE_KINDS] + [(f, k) for f in ("azure", "burstgpt") for k in CSV_KINDS]
                + [("sharegpt", k) for k in SHAREGPT_KINDS])


def bad_public(fmt: str, kind: str) -> st.SearchStrategy[Case]:
    if fmt == "mooncake":
        return bad_mooncake(kind)
    if fmt == "sharegpt":
        return bad_sharegpt(kind)
    return bad_csv(fmt, kind)


@pytest.mark.parametrize(("fmt", "kind"), PUBLIC_KINDS)
@LIBRARY
@given(st.data())
def test_bad_public_trace_is_named_by_file_line_and_field(fmt, kind, data):
    case = data.draw(bad_public(fmt, kind), label="case")
    CASES["convert library"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        _read_bad(fmt, case, tmp)


@settings(LIBRARY, max_examples=100)
@given(st.lists(st.builds(dict, timestamp=st.integers(0, 10**6), input_length=st.integers(1, 100),
                          output_length=st.integers(1, 100)), min_size=1, max_size=8))
def test_unsorted_public_traces_are_sorted(rows):
    """Public traces are sorted on import (the native format refuses unsorted timestamps)."""
    CASES["convert unsorted"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        raw, _ = read_requests("mooncake", path, ConvertOptions(max_input_tokens=1000))
    assert [r.timestamp_s for r in raw] == sorted(r["timestamp"] / 1000 for r in rows)


@pytest.mark.parametrize("content", [b"", b"\n\n", b"  \r\n"])
@pytest.mark.parametrize("fmt", ["mooncake", "azure", "burstgpt", "sharegpt"])
def test_empty_public_trace_is_refused(tmp_path, fmt, content):
    CASES["convert empty"] += 1
    path = tmp_path / "empty.in"
    path.write_bytes(content)
    with pytest.raises(InputError) as info:
        read_requests(fmt, path, ConvertOptions(max_input_tokens=1000))
    assert str(info.value).startswith(f"{path}:") or str(info.value).startswith(f"{path}: ")


# --- search-space files -----------------------------------------------------------------------

NUMERIC_KNOBS = ["max_num_seqs", "max_num_batched_tokens", "num_speculative_tokens", "prompt_lookup_max",
                 "max_model_len"]
CATEGORICAL = {"weight_bits": [16, 8, 4], "kv_cache_dtype": ["auto", "fp8"], "enable_prefix_caching": [True, False],
               "enable_chunked_prefill": [True, False], "dtype": ["bfloat16", "float16"]}


@dataclass
class SpaceText:
    """A space written line by line, remembering where each key is."""

    lines: list[str]
    where: dict[tuple, int]  # key path -> 1-based line
    params: list[str]

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _yaml_scalar(value) -> str:
    return json.dumps(value) if not isinstance(value, bool) else str(value).lower()


@st.composite
def valid_spaces(draw, require: str | None = None) -> SpaceText:
    """A valid space; `require` ("numeric" or "categorical") guarantees a parameter of that kind."""
    lines, where = [], {}
    if draw(st.booleans()):
        lines.append("# a search space")
    lines.append(f"name: {draw(st.sampled_from(['default', 'nightly', 'cpu-small']))}")
    where[("name",)] = len(lines)
    if draw(st.booleans()):
        lines += ["fixed:", "  enforce_eager: true"]
        where[("fixed",)] = len(lines) - 1
    lines.append("parameters:")
    where[("parameters",)] = len(lines)
    names = draw(st.lists(st.sampled_from(NUMERIC_KNOBS + list(CATEGORICAL)), min_size=1, max_size=5, unique=True))
    conditional = draw(st.booleans())
    if conditional:
        names = [n for n in names if n not in ("num_speculative_tokens", "speculative")]
        names += ["speculative", "num_speculative_tokens"]
    if require == "numeric" and not set(names) & set(NUMERIC_KNOBS):
        names.insert(0, "max_num_seqs")
    if require == "categorical" and not set(names) & {*CATEGORICAL, "speculative"}:
        names.insert(0, "kv_cache_dtype")
    for name in names:
        lines.append(f"  {name}:")
        where[("parameters", name)] = len(lines)
        if name == "speculative":
            lines.append("    choices: [none, ngram]")
            where[("parameters", name, "choices")] = len(lines)
        elif name in CATEGORICAL:
            choices = draw(st.lists(st.sampled_from(CATEGORICAL[name]), min_size=1, unique=True))
            lines.append(f"    choices: [{', '.join(_yaml_scalar(c) for c in choices)}]")
            where[("parameters", name, "choices")] = len(lines)
        else:
            low = draw(st.integers(1, 64))
            high = low + draw(st.integers(0, 64))
            for key, value in (("low", low), ("high", high)):
                lines.append(f"    {key}: {value}")
                where[("parameters", name, key)] = len(lines)
            if draw(st.booleans()):
                lines.append("    log: true")
                where[("parameters", name, "log")] = len(lines)
        if name == "num_speculative_tokens" and conditional:
            lines.append("    when: {speculative: [ngram]}")
            where[("parameters", name, "when")] = len(lines)
    return SpaceText(lines, where, names)


def _first(space: SpaceText, draw, predicate) -> str:
    return draw(st.sampled_from([n for n in space.params if predicate(n)] or space.params))


SPACE_KINDS = ["unknown_top", "unknown_sub", "unknown_knob", "wrong_type", "low_high", "empty_choices",
               "when_unknown", "non_finite", "duplicate", "non_utf8", "control", "tab", "mapping_value", "unclosed",
               "not_mapping", "empty", "no_parameters", "integer_step", "bool_number", "non_scalar_choice",
               "fixed_value"]
NEEDS = {"low_high": "numeric", "non_finite": "numeric", "integer_step": "numeric", "bool_number": "numeric",
         "empty_choices": "categorical", "non_scalar_choice": "categorical"}


@st.composite
def bad_spaces(draw, kind: str) -> Case:
    space = draw(valid_spaces(NEEDS.get(kind)))
    lines, where = space.lines, space.where
    name = space.params[0]
    numeric = [n for n in space.params if ("parameters", n, "low") in where]
    categorical = [n for n in space.params if ("parameters", n, "choices") in where]
    field, says, line = None, "", None
    if kind == "unknown_top":
        key = draw(st.sampled_from(["parameter", "params", "objectives", "Fixed"]))
        at = draw(st.sampled_from([0, len(lines)]))
        lines.insert(at, f"{key}: 1")
        line, field, says = at + 1, key, "Extra inputs are not permitted"
    elif kind == "unknown_sub":
        key = draw(st.sampled_from(["colour", "default", "choice", "lo", "hi"]))
        at = where[("parameters", name)]
        lines.insert(at, f"    {key}: 3")
        line, field, says = at + 1, f"parameters.{name}.{key}", "Extra inputs are not permitted"
    elif kind == "unknown_knob":
        knob = draw(st.sampled_from(["max_batch", "batch_size", "Max_Num_Seqs", "tensor_parallel"]))
        at = where[("parameters", name)] - 1
        lines[at] = f"  {knob}:"
        line, field, says = at + 1, f"parameters.{knob}", "is not a tunable knob"
    elif kind == "wrong_type" and numeric:
        target = draw(st.sampled_from(numeric))
        key = draw(st.sampled_from(["low", "high"]))
        at = where[("parameters", target, key)]
        lines[at - 1] = f"    {key}: {draw(st.sampled_from(['abc', '[1, 2]', '{a: 1}', '2023-01-01', 'eight']))}"
        line, field = at, f"parameters.{target}.{key}"
    elif kind == "wrong_type":
        at = where[("parameters", name, "choices")]
        lines[at - 1] = f"    choices: {draw(st.sampled_from(['5', 'abc', '{a: 1}', 'true']))}"
        line, field = at, f"parameters.{name}.choices"
    elif kind == "low_high" and numeric:
        target = draw(st.sampled_from(numeric))
        at = where[("parameters", target, "low")]
        lines[at - 1], lines[at] = "    low: 100", f"    high: {draw(st.integers(1, 99))}"
        line, field, says = where[("parameters", target)], f"parameters.{target}", "`low <= high` must hold"
    elif kind == "empty_choices" and categorical:
        target = draw(st.sampled_from(categorical))
        at = where[("parameters", target, "choices")]
        lines[at - 1] = "    choices: []"
        line, field, says = at, f"parameters.{target}.choices", "at least 1 item"
    elif kind == "when_unknown":
        other = draw(st.sampled_from(["speculation", "tensor_parallel"] + space.params[1:]))
        target = space.params[0]
        lines.insert(where[("parameters", target)], f"    when: {{{other}: [1]}}")
        line, field, says = where[("parameters", target)], f"parameters.{target}", \
            f"when refers to {other!r}, which must be a parameter defined above it"
    elif kind == "non_finite" and numeric:
        target = draw(st.sampled_from(numeric))
        key = draw(st.sampled_from(["low", "high"]))
        at = where[("parameters", target, key)]
        lines[at - 1] = f"    {key}: {draw(st.sampled_from(['.nan', '.inf', '-.inf', '.NaN', '1.0e+400']))}"
        line, field, says = at, f"parameters.{target}.{key}", "finite number"
    elif kind == "duplicate":
        at = where[("parameters", name)]
        lines.append(f"  {name}:")
        lines.append("    choices: [1]")
        line, says = len(lines) - 1, f"key {name!r} appears twice (lines {at} and {len(lines) - 1})"
    elif kind == "non_utf8":
        at = draw(st.integers(1, len(lines)))
        data = "\n".join(lines).encode().split(b"\n")
        data[at - 1] += b" # caf\xe9"
        return Case(b"\n".join(data) + b"\n", at, None, "not valid UTF-8", f"space {kind}")
    elif kind == "control":
        at = draw(st.integers(1, len(lines)))
        lines[at - 1] += draw(st.sampled_from(["\x00", "\x07", "\x1b", "\ufffe"]))
        line, says = at, "not valid YAML (unacceptable character"
    elif kind == "tab":
        at = where[("parameters", name)]
        lines.insert(at, "\tlow: 1")
        line, says = at + 1, "not valid YAML"
    elif kind == "mapping_value":
        at = where[("name",)]
        lines[at - 1] = "name: a: b"
        line, says = at, "not valid YAML (mapping values are not allowed here)"
    elif kind == "unclosed":
        at = draw(st.integers(1, len(lines)))
        lines.insert(at, "  broken: [1, 2")
        says = "not valid YAML"  # the parser notices later, at a line it chooses
    elif kind == "not_mapping":
        lines[:] = [draw(st.sampled_from(["- 1", "just text", "42", "[a, b]", "null"]))]
        line, says = 1, "must be a mapping with a 'parameters' section"
    elif kind == "empty":
        lines[:] = draw(st.lists(st.sampled_from(["", "   ", "# only a comment"]), max_size=3))
        line, says = 1, "must be a mapping with a 'parameters' section"
    elif kind == "no_parameters":
        start = where[("parameters",)]
        lines[:] = lines[: start - 1]
        line, field = 1, "parameters"
        if not any(lines):
            field, says = None, "must be a mapping"
    elif kind == "integer_step" and numeric:
        target = draw(st.sampled_from(numeric))
        lines.insert(where[("parameters", target, "high")], f"    step: {draw(st.sampled_from(['0.5', '1.5', '2.25']))}")
        if ("parameters", target, "log") in where:
            says = "log and step cannot be combined"
        else:
            says = "an integer parameter needs an integer step"
        line, field = where[("parameters", target)], f"parameters.{target}"
    elif kind == "bool_number" and numeric:
        target = draw(st.sampled_from(numeric))
        at = where[("parameters", target, "low")]
        lines[at - 1] = "    low: true"
        line, field, says = at, f"parameters.{target}.low", "must be a number, not a boolean"
    elif kind == "non_scalar_choice" and categorical:
        target = draw(st.sampled_from(categorical))
        at = where[("parameters", target, "choices")]
        lines[at - 1] = f"    choices: [{draw(st.sampled_from(['[1]', '{a: 1}', '.nan']))}]"
        line, field = at, f"parameters.{target}.choices.0"
    elif kind == "fixed_value":  # a fixed engine setting no engine config accepts
        key, value = draw(st.sampled_from([
            ("gpu_memory_utilization", "2"), ("gpu_memory_utilization", "half"), ("enforce_eager", "maybe"),
            ("enforce_eager", "3"), ("kv_cache_space_gib", "0"), ("kv_cache_space_gib", "[1]"),
            ("attention_backend", '""'), ("attention_backend", "[1]")]))
        if ("fixed",) in where:
            lines[where[("fixed",)]] = f"  {key}: {value}"
            line = where[("fixed",)] + 1
        else:
            lines[where[("name",)]:where[("name",)]] = ["fixed:", f"  {key}: {value}"]
            line = where[("name",)] + 2
        field = f"fixed.{key}"
    else:
        raise AssertionError(f"no corruption {kind!r}")
    return Case(("\n".join(lines) + "\n").encode(), line, field, says, f"space {kind}")


@settings(LIBRARY, max_examples=200)
@given(valid_spaces())
def test_generated_valid_spaces_load(space):
    CASES["space valid"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "space.yaml"
        path.write_text(space.text())
        loaded = load_space(path)
    assert list(loaded.parameters) == space.params and set(loaded.parameters) <= set(KNOBS)


@pytest.mark.parametrize("kind", SPACE_KINDS)
@LIBRARY
@given(st.data())
def test_bad_space_is_named_by_file_line_and_field(kind, data):
    case = data.draw(bad_spaces(kind), label="case")
    CASES["space library"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "space.yaml"
        path.write_bytes(case.data)
        with pytest.raises(SpaceError) as info:
            load_space(path)
    assert info.value.exit_code == 2
    message = str(info.value)
    if case.line is None:  # the YAML parser picks the line; it must still name one inside the file
        number = message.removeprefix(f"{path}:").split(":", 1)[0]
        assert number.isdigit() and 1 <= int(number) <= case.data.count(b"\n") + 1, message
        assert case.says in message, message
    else:
        check_message(message, path, case)
    message.encode("utf-8")


# --- the real CLI, in a subprocess ----------------------------------------------------------

def run_tune(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "400", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "tracetune", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def check_cli(out: subprocess.CompletedProcess, path: Path, case: Case, cwd: Path, before: set[str]) -> None:
    both = out.stdout + out.stderr
    assert out.returncode == 2, f"{case.kind}: exit {out.returncode}\n{both}"
    assert "Traceback" not in both, both
    # Only the bad input's message: no model was resolved, no engine started.
    assert "starting vLLM" not in both and "model" not in out.stdout, both
    where = f"{path}:{case.line}: " if case.line is not None else f"{path}: "
    assert where in out.stderr, f"{case.kind}: {where!r} not in {out.stderr!r}"
    if case.field is not None:
        assert f"field '{case.field}" in out.stderr, out.stderr
    assert sorted(p.name for p in cwd.iterdir()) == sorted(before), f"{case.kind}: files written: {list(cwd.iterdir())}"


@pytest.mark.parametrize("kind", TRACE_KINDS)
@CLI
@given(st.data())
def test_cli_replay_refuses_bad_trace(kind, data):
    case = data.draw(bad_traces(kind), label="case")
    CASES["cli replay"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        path = cwd / "traffic.jsonl"
        path.write_bytes(case.data)
        before = {p.name for p in cwd.iterdir()}
        # --model names a directory that does not exist: had the trace passed, the command would stop there,
        # so a generator bug can never start an engine.
        out = run_tune(["replay", "--trace", str(path), "--model", str(cwd / "no-model")], cwd)
        check_cli(out, path, case, cwd, before)


@pytest.mark.parametrize(("fmt", "kind"), PUBLIC_KINDS)
@CLI
@given(st.data())
def test_cli_convert_refuses_bad_source(fmt, kind, data):
    case = data.draw(bad_public(fmt, kind), label="case")
    CASES["cli convert"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        path = cwd / f"source.{fmt}"
        path.write_bytes(case.data)
        before = {p.name for p in cwd.iterdir()}
        target = cwd / "out" / "converted.jsonl"
        out = run_tune(["trace", "convert", "--from", fmt, str(path), str(target), "--model", str(cwd / "no-model")],
                       cwd)
        check_cli(out, path, case, cwd, before)
        assert not target.exists() and not target.with_name(target.name + ".tmp").exists()


GOOD_TRACE = b'{"timestamp": 0, "prompt": "Hello", "output_length": 4}\n'


# `tune --trace` reads the trace with the same load_trace as `tune replay` (every kind above): a sample.
@pytest.mark.parametrize("kind", ["wrong_type", "unsorted", "non_finite", "non_utf8", "truncated", "deep", "empty"])
@CLI
@given(st.data())
def test_cli_tune_refuses_bad_trace(kind, data):
    case = data.draw(bad_traces(kind), label="case")
    CASES["cli tune trace"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        path = cwd / "traffic.jsonl"
        path.write_bytes(case.data)
        before = {p.name for p in cwd.iterdir()}
        out = run_tune(["--trace", str(path), "--model", str(cwd / "no-model"), "--trials", "1"], cwd)
        check_cli(out, path, case, cwd, before)


@pytest.mark.parametrize("kind", SPACE_KINDS)
@CLI
@given(st.data())
def test_cli_tune_refuses_bad_space(kind, data):
    case = data.draw(bad_spaces(kind), label="case")
    if case.line is None:  # the YAML parser picks the line; covered at library level
        return
    CASES["cli tune space"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        trace, space = cwd / "traffic.jsonl", cwd / "space.yaml"
        trace.write_bytes(GOOD_TRACE)
        space.write_bytes(case.data)
        before = {p.name for p in cwd.iterdir()}
        out = run_tune(["--trace", str(trace), "--space", str(space), "--model", str(cwd / "no-model"),
                        "--trials", "1"], cwd)
        check_cli(out, space, case, cwd, before)
