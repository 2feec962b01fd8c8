"""Hypothesis strategies for search-space files: valid spaces written line by line (remembering
where each key is), and one corruption each (see tests/reliability/fuzz.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from hypothesis import strategies as st

from tests.reliability.fuzz import Case

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


SPACE_KINDS = ["unknown_top", "unknown_sub", "unknown_knob", "wrong_type", "low_high", "empty_choices",
               "when_unknown", "non_finite", "duplicate", "non_utf8", "control", "tab", "mapping_value", "unclosed",
               "not_mapping", "empty", "no_parameters", "integer_step", "bool_number", "non_scalar_choice",
               "fixed_value"]
NEEDS = {"low_high": "numeric", "non_finite": "numeric", "integer_step": "numeric", "bool_number": "numeric",
         "empty_choices": "categorical", "non_scalar_choice": "categorical"}


# One function per corruption: it changes `space.lines` and returns (line, field, fragment) the message
# must name (line None: the YAML parser picks it), or a whole `Case`; None when the space has no
# parameter of the kind it needs.
Where = tuple  # (1-based line or None, field or None, fragment of the message)


def _numeric(space: SpaceText) -> list[str]:
    return [n for n in space.params if ("parameters", n, "low") in space.where]


def _categorical(space: SpaceText) -> list[str]:
    return [n for n in space.params if ("parameters", n, "choices") in space.where]


def _unknown_top(draw, space: SpaceText) -> Where:
    key = draw(st.sampled_from(["parameter", "params", "objectives", "Fixed"]))
    at = draw(st.sampled_from([0, len(space.lines)]))
    space.lines.insert(at, f"{key}: 1")
    return at + 1, key, "Extra inputs are not permitted"


def _unknown_sub(draw, space: SpaceText) -> Where:
    name = space.params[0]
    key = draw(st.sampled_from(["colour", "default", "choice", "lo", "hi"]))
    at = space.where[("parameters", name)]
    space.lines.insert(at, f"    {key}: 3")
    return at + 1, f"parameters.{name}.{key}", "Extra inputs are not permitted"


def _unknown_knob(draw, space: SpaceText) -> Where:
    knob = draw(st.sampled_from(["max_batch", "batch_size", "Max_Num_Seqs", "tensor_parallel"]))
    at = space.where[("parameters", space.params[0])] - 1
    space.lines[at] = f"  {knob}:"
    return at + 1, f"parameters.{knob}", "is not a tunable knob"


def _wrong_type(draw, space: SpaceText) -> Where:
    numeric = _numeric(space)
    if numeric:
        target = draw(st.sampled_from(numeric))
        key = draw(st.sampled_from(["low", "high"]))
        at = space.where[("parameters", target, key)]
        space.lines[at - 1] = f"    {key}: {draw(st.sampled_from(['abc', '[1, 2]', '{a: 1}', '2023-01-01', 'eight']))}"
        return at, f"parameters.{target}.{key}", ""
    name = space.params[0]
    at = space.where[("parameters", name, "choices")]
    space.lines[at - 1] = f"    choices: {draw(st.sampled_from(['5', 'abc', '{a: 1}', 'true']))}"
    return at, f"parameters.{name}.choices", ""


def _low_high(draw, space: SpaceText) -> Where | None:
    if not _numeric(space):
        return None
    target = draw(st.sampled_from(_numeric(space)))
    at = space.where[("parameters", target, "low")]
    space.lines[at - 1], space.lines[at] = "    low: 100", f"    high: {draw(st.integers(1, 99))}"
    return space.where[("parameters", target)], f"parameters.{target}", "`low <= high` must hold"


def _empty_choices(draw, space: SpaceText) -> Where | None:
    if not _categorical(space):
        return None
    target = draw(st.sampled_from(_categorical(space)))
    at = space.where[("parameters", target, "choices")]
    space.lines[at - 1] = "    choices: []"
    return at, f"parameters.{target}.choices", "at least 1 item"


def _when_unknown(draw, space: SpaceText) -> Where:
    other = draw(st.sampled_from(["speculation", "tensor_parallel"] + space.params[1:]))
    target = space.params[0]
    space.lines.insert(space.where[("parameters", target)], f"    when: {{{other}: [1]}}")
    return space.where[("parameters", target)], f"parameters.{target}", \
        f"when refers to {other!r}, which must be a parameter defined above it"


def _non_finite(draw, space: SpaceText) -> Where | None:
    if not _numeric(space):
        return None
    target = draw(st.sampled_from(_numeric(space)))
    key = draw(st.sampled_from(["low", "high"]))
    at = space.where[("parameters", target, key)]
    space.lines[at - 1] = f"    {key}: {draw(st.sampled_from(['.nan', '.inf', '-.inf', '.NaN', '1.0e+400']))}"
    return at, f"parameters.{target}.{key}", "finite number"


def _duplicate(draw, space: SpaceText) -> Where:
    name, lines = space.params[0], space.lines
    at = space.where[("parameters", name)]
    lines.append(f"  {name}:")
    lines.append("    choices: [1]")
    return len(lines) - 1, None, f"key {name!r} appears twice (lines {at} and {len(lines) - 1})"


def _non_utf8(draw, space: SpaceText) -> Case:
    at = draw(st.integers(1, len(space.lines)))
    data = "\n".join(space.lines).encode().split(b"\n")
    data[at - 1] += b" # caf\xe9"
    return Case(b"\n".join(data) + b"\n", at, None, "not valid UTF-8", "space non_utf8")


def _control(draw, space: SpaceText) -> Where:
    at = draw(st.integers(1, len(space.lines)))
    space.lines[at - 1] += draw(st.sampled_from(["\x00", "\x07", "\x1b", "\ufffe"]))
    return at, None, "not valid YAML (unacceptable character"


def _tab(draw, space: SpaceText) -> Where:
    at = space.where[("parameters", space.params[0])]
    space.lines.insert(at, "\tlow: 1")
    return at + 1, None, "not valid YAML"


def _mapping_value(draw, space: SpaceText) -> Where:
    at = space.where[("name",)]
    space.lines[at - 1] = "name: a: b"
    return at, None, "not valid YAML (mapping values are not allowed here)"


def _unclosed(draw, space: SpaceText) -> Where:
    at = draw(st.integers(1, len(space.lines)))
    space.lines.insert(at, "  broken: [1, 2")
    return None, None, "not valid YAML"  # the parser notices later, at a line it chooses


def _not_mapping(draw, space: SpaceText) -> Where:
    space.lines[:] = [draw(st.sampled_from(["- 1", "just text", "42", "[a, b]", "null"]))]
    return 1, None, "must be a mapping with a 'parameters' section"


def _empty(draw, space: SpaceText) -> Where:
    space.lines[:] = draw(st.lists(st.sampled_from(["", "   ", "# only a comment"]), max_size=3))
    return 1, None, "must be a mapping with a 'parameters' section"


def _no_parameters(draw, space: SpaceText) -> Where:
    lines = space.lines
    lines[:] = lines[: space.where[("parameters",)] - 1]
    return (1, "parameters", "") if any(lines) else (1, None, "must be a mapping")


def _integer_step(draw, space: SpaceText) -> Where | None:
    if not _numeric(space):
        return None
    target = draw(st.sampled_from(_numeric(space)))
    step = draw(st.sampled_from(['0.5', '1.5', '2.25']))
    space.lines.insert(space.where[("parameters", target, "high")], f"    step: {step}")
    if ("parameters", target, "log") in space.where:
        says = "log and step cannot be combined"
    else:
        says = "an integer parameter needs an integer step"
    return space.where[("parameters", target)], f"parameters.{target}", says


def _bool_number(draw, space: SpaceText) -> Where | None:
    if not _numeric(space):
        return None
    target = draw(st.sampled_from(_numeric(space)))
    at = space.where[("parameters", target, "low")]
    space.lines[at - 1] = "    low: true"
    return at, f"parameters.{target}.low", "must be a number, not a boolean"


def _non_scalar_choice(draw, space: SpaceText) -> Where | None:
    if not _categorical(space):
        return None
    target = draw(st.sampled_from(_categorical(space)))
    at = space.where[("parameters", target, "choices")]
    space.lines[at - 1] = f"    choices: [{draw(st.sampled_from(['[1]', '{a: 1}', '.nan']))}]"
    return at, f"parameters.{target}.choices.0", ""


def _fixed_value(draw, space: SpaceText) -> Where:
    """A fixed engine setting no engine config accepts."""
    lines, where = space.lines, space.where
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
    return line, f"fixed.{key}", ""


SPACE_CORRUPTIONS = {kind: globals()[f"_{kind}"] for kind in SPACE_KINDS}


@st.composite
def bad_spaces(draw, kind: str) -> Case:
    space = draw(valid_spaces(NEEDS.get(kind)))
    out = SPACE_CORRUPTIONS[kind](draw, space)
    if isinstance(out, Case):
        return out
    if out is None:
        raise AssertionError(f"no corruption {kind!r}")
    line, field, says = out
    return Case(space.text().encode(), line, field, says, f"space {kind}")
