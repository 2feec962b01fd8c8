"""Importers on samples of the real public traces (examples/public_traces), plus malformed inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracetune.errors import InputError
from tracetune.replay.importers import ArrivalGrid, ConvertOptions, arrival_grid, convert
from tracetune.replay.synth import PromptSynthesizer, implied_reuse_ratio

TRACES = Path(__file__).resolve().parents[2] / "examples" / "public_traces"  # shipped samples


@pytest.fixture(scope="module")
def tokenizer(default_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(default_model))


def count(tokenizer, text):
    return len(tokenizer.encode(text, add_special_tokens=True))


def test_mooncake_exact_lengths_and_shared_prefixes(tokenizer):
    records, report = convert("mooncake", TRACES / "mooncake_conversation_60.jsonl", tokenizer,
                              ConvertOptions(max_input_tokens=2000, limit=40, length_scale=0.1))
    assert report.read == 40 and report.written == 40 and report.block_tokens == 51
    source = [json.loads(line) for line in (TRACES / "mooncake_conversation_60.jsonl").read_text().splitlines()[:40]]
    for rec, src in zip(records, source):
        assert rec.timestamp == pytest.approx(src["timestamp"] / 1000.0)
        assert count(tokenizer, rec.prompt) == min(round(src["input_length"] * 0.1), 2000)
        assert rec.output_length == src["output_length"]
    # Requests whose hash_ids start alike share text; the first block id (0) is in most requests.
    first_block_text = {}
    for rec in records:
        if rec.hash_ids and rec.hash_ids[0] == 0 and len(rec.hash_ids) > 1:
            first_block_text.setdefault("x", rec.prompt[:100])
            assert rec.prompt[:100] == first_block_text["x"]
    assert report.implied_reuse > 0
    assert abs(report.reproduced_reuse - report.implied_reuse) < 0.03


def test_mooncake_grid_arrivals_are_reported_and_spread_on_request(tokenizer):
    """The Mooncake sample's arrivals sit 3 s apart, several per instant: the report says so; with
    spread_arrivals each request lands uniformly inside its own step, reproducibly."""
    source = [json.loads(line)["timestamp"] / 1000.0
              for line in (TRACES / "mooncake_conversation_60.jsonl").read_text().splitlines()[:40]]
    options = dict(max_input_tokens=2000, limit=40, length_scale=0.1)
    kept, report = convert("mooncake", TRACES / "mooncake_conversation_60.jsonl", tokenizer, ConvertOptions(**options))
    assert report.grid is not None and report.grid.step_s == pytest.approx(3.0, abs=0.002)
    assert report.grid.largest_burst == max(source.count(t) for t in source) >= 2
    assert any("simultaneous bursts (--spread-arrivals" in line for line in report.lines())
    spread, report = convert("mooncake", TRACES / "mooncake_conversation_60.jsonl", tokenizer,
                             ConvertOptions(**options, spread_arrivals=True, seed=3))
    assert report.spread and any("spread uniformly over each 3 s step" in line for line in report.lines())
    times = [r.timestamp for r in spread]
    assert times == sorted(times) and len(set(times)) == len(times) == 40
    by_id = {r.id: r.timestamp for r in kept}
    for r in spread:  # inside its own step, after its recorded instant
        assert by_id[r.id] <= r.timestamp < by_id[r.id] + report.grid.step_s
    again, _ = convert("mooncake", TRACES / "mooncake_conversation_60.jsonl", tokenizer,
                       ConvertOptions(**options, spread_arrivals=True, seed=3))
    assert [r.timestamp for r in again] == times


def test_spread_arrivals_on_a_trace_without_a_grid_says_it_kept_them(tokenizer):
    options = ConvertOptions(max_input_tokens=8000, limit=20)
    kept, _ = convert("azure", TRACES / "azure2023_conv_60.csv", tokenizer, options)
    records, report = convert("azure", TRACES / "azure2023_conv_60.csv", tokenizer,
                              ConvertOptions(max_input_tokens=8000, limit=20, spread_arrivals=True))
    assert report.grid is None and not report.spread
    assert "--spread-arrivals: the arrival times sit on no coarse grid; kept as recorded" in report.lines()
    assert [r.timestamp for r in records] == [r.timestamp for r in kept]


def test_arrival_grid_needs_repeated_instants_on_whole_steps():
    assert arrival_grid([0, 0, 0, 3, 3, 9, 9, 9]) == ArrivalGrid(step_s=3, instants=3, mean_burst=8 / 3, largest_burst=3)
    assert arrival_grid([0.0, 0.4, 1.7, 2.2, 5.0]) is None  # Azure-like: every arrival its own instant
    assert arrival_grid([0, 0, 2, 2, 5, 5]) is None  # gaps 2 and 3: not whole steps of the smallest
    assert arrival_grid([5, 5, 5]) is None  # one instant: no step to spread over


def test_no_accidental_sharing_without_hash_ids(tokenizer):
    records, _ = convert("azure", TRACES / "azure2023_conv_60.csv", tokenizer,
                         ConvertOptions(max_input_tokens=4000, limit=30, length_scale=0.2))
    prefixes = {r.prompt[:60] for r in records}
    assert len(prefixes) == len(records)


def test_azure_timestamps_lengths(tokenizer):
    records, report = convert("azure", TRACES / "azure2023_conv_60.csv", tokenizer,
                              ConvertOptions(max_input_tokens=8000, limit=20))
    assert records[0].timestamp == 0.0
    # Second row of the file: 18:15:50.9951690 - 18:15:46.6805900 = 4.314579 s
    assert records[1].timestamp == pytest.approx(4.314579, abs=1e-5)
    assert count(tokenizer, records[0].prompt) == 374 and records[0].output_length == 44
    assert report.written == 20


@pytest.mark.parametrize("policy", ["truncate", "drop", "scale"])
def test_overlong_policies_are_applied_and_reported(tokenizer, policy):
    records, report = convert("azure", TRACES / "azure2023_conv_60.csv", tokenizer,
                              ConvertOptions(max_input_tokens=400, overlong=policy, limit=25))
    lengths = [count(tokenizer, r.prompt) for r in records]
    assert max(lengths) <= 400
    if policy == "truncate":
        assert report.truncated > 0 and len(records) == 25 and 400 in lengths
    elif policy == "drop":
        assert report.dropped_overlong > 0 and len(records) == 25 - report.dropped_overlong
    else:
        assert report.length_scale < 1 and report.truncated == 0 and len(records) == 25


def test_overlong_error_policy_names_line(tokenizer):
    with pytest.raises(InputError, match=r"azure2023_conv_60.csv:\d+: field 'input_length'"):
        convert("azure", TRACES / "azure2023_conv_60.csv", tokenizer,
                ConvertOptions(max_input_tokens=100, overlong="error", limit=25))


def test_sharegpt_real_prompts_with_poisson_arrivals(tokenizer):
    records, report = convert("sharegpt", TRACES / "sharegpt_v3_filtered_250.json", tokenizer,
                              ConvertOptions(max_input_tokens=8000, limit=200, rate=4.0, output_length=50))
    assert len(records) == 200 and all(r.messages and r.output_length == 50 for r in records)
    gaps = [b.timestamp - a.timestamp for a, b in zip(records, records[1:])]
    assert 0.15 < sum(gaps) / len(gaps) < 0.35  # mean inter-arrival ~ 1/4 s


def test_burstgpt_csv_and_failed_rows(tmp_path, tokenizer):
    path = tmp_path / "burst.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    "5,ChatGPT,120,30,150,Conversation log\n"
                    "7.5,GPT-4,80,0,80,Conversation log\n"
                    "9,ChatGPT,60,12,72,API log\n")
    records, report = convert("burstgpt", path, tokenizer, ConvertOptions(max_input_tokens=1000))
    assert [r.timestamp for r in records] == [0.0, 4.0]
    assert [count(tokenizer, r.prompt) for r in records] == [120, 60]
    assert report.skipped == 1 and "no output tokens" in report.skipped_reason


@pytest.mark.parametrize(
    ("fmt", "content", "message"),
    [
        ("mooncake", '{"timestamp": 0, "input_length": 10}\n', r"t.in:1: field 'output_length': missing"),
        ("mooncake", '{"timestamp": 0, "input_length": "ten", "output_length": 3}\n', r"t.in:1: field 'input_length': expected an integer"),
        ("mooncake", '{"timestamp": -5, "input_length": 10, "output_length": 3}\n', r"t.in:1: field 'timestamp': must be a finite number >= 0"),
        ("mooncake", 'not json\n', r"t.in:1: not valid JSON"),
        ("azure", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.1,3\n", r"t.in:1: header lacks column\(s\) \['GeneratedTokens'\]"),
        ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,3,4\n", r"t.in:2: field 'TIMESTAMP'"),
        ("burstgpt", "Timestamp,Model,Request tokens,Response tokens\n1,m,nan,3\n", r"t.in:2: field 'Request tokens'"),
        ("sharegpt", '{"a": 1}', r"t.in:1: expected a JSON list"),
    ],
)
def test_malformed_sources_name_file_line_field(tmp_path, tokenizer, fmt, content, message):
    path = tmp_path / "t.in"
    path.write_text(content)
    with pytest.raises(InputError, match=message):
        convert(fmt, path, tokenizer, ConvertOptions(max_input_tokens=1000))


def test_implied_reuse_counts_repeated_prefix_blocks():
    # Second request repeats block 0 (4 of its 10 tokens) and nothing else.
    assert implied_reuse_ratio([(8, [0, 1]), (10, [0, 2, 3])], block_tokens=4) == pytest.approx(4 / 18)


def test_synthesizer_prompts_are_exact_and_deterministic(tokenizer):
    synth = PromptSynthesizer(tokenizer, block_tokens=32)
    for n in (5, 31, 32, 33, 100, 777):
        assert count(tokenizer, synth.prompt(n, unique_key=n)) == n
    assert synth.prompt(100, hash_ids=[1, 2, 3, 4], unique_key="a") == \
        PromptSynthesizer(tokenizer, block_tokens=32).prompt(100, hash_ids=[1, 2, 3, 4], unique_key="a")


def test_the_cli_offers_every_registered_format_and_only_mooncake_hashes_blocks(tmp_path):
    import inspect

    from tracetune.cli.main import _build_parser
    from tracetune.errors import InputError
    from tracetune.replay import importers
    from tracetune.replay.importers import ConvertOptions, read_requests
    from tracetune.replay.trace_formats import FORMATS, TRACE_FORMATS

    convert = _build_parser().parse_args(["trace", "convert", "--from", "azure", "in.csv", "out.jsonl"])
    assert convert.fmt == "azure"
    for fmt in TRACE_FORMATS:  # each reader is a function of replay.importers taking (path, options)
        assert list(inspect.signature(getattr(importers, fmt.reader)).parameters)[:2] == ["path", "options"]
        assert _build_parser().parse_args(["trace", "convert", "--from", fmt.name, "in", "out"]).fmt == fmt.name
    assert [f.name for f in TRACE_FORMATS if f.block_tokens] == ["mooncake"] and len(set(FORMATS)) == len(FORMATS)
    path = tmp_path / "t.in"
    path.write_text("{}\n")
    with pytest.raises(InputError, match="unknown trace format 'vcr'; use one of"):
        read_requests("vcr", path, ConvertOptions(max_input_tokens=100))
