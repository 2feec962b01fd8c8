"""Bad search-space files, fuzzed at the library: each corruption named by file, line and field with
exit code 2 (tests/reliability/fuzz.py has the properties)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.reliability.bad_spaces import SPACE_KINDS, bad_spaces, valid_spaces
from tests.reliability.fuzz import CASES, LIBRARY, check_message, report_case_counts  # noqa: F401 (autouse)
from tracetune.engine_adapter.vllm.settings import KNOBS
from tracetune.search_spaces.space import SpaceError, load_space


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
