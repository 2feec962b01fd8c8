"""Native trace parsing: valid forms, and bad lines named by file, line and field."""

from __future__ import annotations

import json

import pytest

from tracetune.replay.trace import TraceError, TraceRecord, load_trace, parse_lines, write_trace


def lines(*objs):
    return [(o if isinstance(o, bytes) else json.dumps(o).encode()) + b"\n" for o in objs]


def test_three_input_kinds_and_relative_timestamps():
    trace = parse_lines(lines(
        {"timestamp": 1700000000.5, "prompt": "Hello", "output_length": 8},
        {"timestamp": 1700000001.0, "messages": [{"role": "user", "content": "Hi"}], "output_length": 4,
         "session_id": "s", "sampling": {"temperature": 0.7, "seed": 3}},
        {"timestamp": 1700000002.5, "input_length": 900, "output_length": 20, "hash_ids": [1, 2]},
    ), "t.jsonl")
    assert [r.timestamp for r in trace.records] == [0.0, 0.5, 2.0]
    assert [r.kind for r in trace.records] == ["completion", "chat", "completion"]
    assert trace.duration_s == 2.0 and trace.records[1].sampling.seed == 3


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"timestamp": 0, "output_length": 5}, "field '(record)': Value error, give exactly one of prompt, messages or input_length"),
        ({"timestamp": 0, "prompt": "a", "input_length": 3, "output_length": 5}, "(got prompt, input_length)"),
        ({"timestamp": -1, "prompt": "a", "output_length": 5}, "field 'timestamp': Input should be greater than or equal to 0"),
        ({"timestamp": "soon", "prompt": "a", "output_length": 5}, "field 'timestamp': Value error, must be a number, not a string ('soon')"),
        ({"timestamp": "1.5", "prompt": "a", "output_length": 5}, "field 'timestamp': Value error, must be a number, not a string"),
        ({"timestamp": True, "prompt": "a", "output_length": 5}, "field 'timestamp': Value error, must be a number, not a boolean"),
        ({"timestamp": 0, "prompt": "a", "output_length": True}, "field 'output_length': Value error, must be a number, not a boolean"),
        ({"timestamp": 0, "input_length": 10**12, "output_length": 5}, "field 'input_length': Input should be less than or equal to 10000000"),
        ({"timestamp": 0, "prompt": "", "output_length": 5}, "field 'prompt': String should have at least 1 character"),
        (b'{"timestamp": 0, "prompt": "\\ud800", "output_length": 5}', "field 'prompt': contains a lone UTF-16 surrogate"),
        (b'{"timestamp": 0, "prompt": "a", "output_length": 5, "sampling": {"stop": ["x", "\\udc00"]}}', "field 'sampling.stop.1': contains a lone UTF-16 surrogate"),
        (b'{"timestamp": 0, "prompt": "a", "output_length": 5, "\\ud800k": 1}', "field '\\ud800k': contains a lone UTF-16 surrogate"),
        (b'{"timestamp": 0, "prompt": "a", "output_length": 5, "sampling": {"top_p": Infinity}}', "field 'top_p': Infinity is not a JSON number"),
        (b"[" * 100_000 + b"]" * 100_000, "not valid JSON (nested too deeply)"),
        ({"timestamp": 0, "prompt": "a"}, "field 'output_length': Field required"),
        ({"timestamp": 0, "prompt": "a", "output_length": 0}, "field 'output_length': Input should be greater than 0"),
        ({"timestamp": 0, "prompt": "a", "output_length": 5, "colour": 1}, "field 'colour': Extra inputs are not permitted"),
        ({"timestamp": 0, "messages": [{"role": "robot", "content": "x"}], "output_length": 5}, "field 'messages.0.role'"),
        (b'{"timestamp": NaN, "prompt": "a", "output_length": 5}', "field 'timestamp': NaN is not a JSON number; write a finite number"),
        (b'{"timestamp": 0, "prompt": "a", "output_length": 5', "not valid JSON"),
        (b"[1, 2]", "expected a JSON object, got list"),
        (b'{"timestamp": 0, "prompt": "\xff\xfe", "output_length": 5}', "not valid UTF-8"),
    ],
)
def test_bad_line_is_named(bad, message):
    good = {"timestamp": 0, "prompt": "fine", "output_length": 1}
    with pytest.raises(TraceError) as info:
        parse_lines(lines(good, bad), "traffic.jsonl")
    assert str(info.value).startswith("traffic.jsonl:2: ")
    assert message in str(info.value)
    assert info.value.exit_code == 2


def test_decreasing_timestamps_are_refused():
    with pytest.raises(TraceError, match=r"t.jsonl:3: field 'timestamp': 1.0 is earlier than the previous line's 2.0"):
        parse_lines(lines(*({"timestamp": t, "prompt": "a", "output_length": 1} for t in (0, 2, 1))), "t.jsonl")


def test_a_byte_order_mark_is_accepted():
    trace = parse_lines([b'\xef\xbb\xbf{"timestamp": 0, "prompt": "a", "output_length": 1}\n'], "t.jsonl")
    assert trace.records[0].prompt == "a"


def test_empty_and_blank_files(tmp_path):
    (tmp_path / "e.jsonl").write_text("\n  \n")
    with pytest.raises(TraceError, match="has no requests"):
        load_trace(tmp_path / "e.jsonl")
    with pytest.raises(TraceError, match="no such trace file"):
        load_trace(tmp_path / "missing.jsonl")


def test_write_then_load_round_trip(tmp_path):
    records = [TraceRecord(timestamp=0.0, prompt="a b", output_length=3, expected="x"),
               TraceRecord(timestamp=1.5, input_length=40, output_length=2, hash_ids=[4, 5])]
    assert write_trace(records, tmp_path / "out.jsonl") == 2
    assert load_trace(tmp_path / "out.jsonl").records == records
