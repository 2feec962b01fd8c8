"""Bad traces, fuzzed at the library: native trace lines and the public formats, each corruption named
by file, line and field with exit code 2 (tests/reliability/fuzz.py has the properties)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tracetune.replay.trace as trace_module
from tests.reliability.bad_traces import PUBLIC_KINDS, TRACE_KINDS, bad_public, bad_traces, encode, valid_records
from tests.reliability.fuzz import CASES, LIBRARY, Case, check_message, report_case_counts  # noqa: F401 (autouse)
from tracetune.errors import InputError
from tracetune.replay.importers import ConvertOptions, read_requests
from tracetune.replay.trace import TraceError, load_trace, parse_lines


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


def _read_bad(fmt: str, case: Case, tmp: str) -> str:
    path = Path(tmp) / f"source.{fmt}"
    path.write_bytes(case.data)
    with pytest.raises(InputError) as info:
        read_requests(fmt, path, ConvertOptions(max_input_tokens=100_000))
    assert info.value.exit_code == 2
    message = str(info.value)
    check_message(message, path, case)
    return message


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
