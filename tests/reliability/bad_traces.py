"""Hypothesis strategies for bad traces: native trace lines (`tune replay`, `tune --trace`) and the
public formats `tune trace convert` reads, each generated valid and then corrupted one way (see
tests/reliability/fuzz.py)."""

from __future__ import annotations

import json

from hypothesis import strategies as st

from tests.reliability.fuzz import Case
from tracetune.replay.trace import MAX_TOKENS

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


PUBLIC_KINDS = ([("mooncake", k) for k in MOONCAKE_KINDS] + [(f, k) for f in ("azure", "burstgpt") for k in CSV_KINDS]
                + [("sharegpt", k) for k in SHAREGPT_KINDS])


def bad_public(fmt: str, kind: str) -> st.SearchStrategy[Case]:
    if fmt == "mooncake":
        return bad_mooncake(kind)
    if fmt == "sharegpt":
        return bad_sharegpt(kind)
    return bad_csv(fmt, kind)
