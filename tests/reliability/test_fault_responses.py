"""A response counts only if it is one: `tune replay --endpoint` against a server that answers with
an HTML page, truncated streams, lines without `data:`, bad token counts, malformed events or an
endless line, or with well-formed events whose counts are not what arrived (no tokens, a stop the
request did not allow, text beside empty choices, events after [DONE], more tokens than max_tokens:
tests/reliability/fault_server.py). No request counts as a success, each record says why, the
summary's throughput stays finite, the command says the endpoint is not what it seems (exit 1) and
nothing prints a traceback; a correct stream (and a slow one) still counts in full, and one without
a usage is counted from its events."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability.fault_server import FaultServer
from tracetune.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
N, TOKENS = 4, 8
# Each fault and how the reason of every request it fails begins.
FAULTS = {
    "html": "not an OpenAI stream: text/html (HTTP 200, body '<!doctype html>",
    "truncated": "truncated stream: 3 of 8 tokens (no finish reason, no [DONE])",
    "no_data_prefix": "not an OpenAI stream: a line without 'data:': '{\"id\": \"f\"",
    "bad_usage_string": 'bad usage: completion_tokens "2" is not a whole number of tokens',
    "bad_usage_negative": "bad usage: completion_tokens -100 is outside 0..10,000,000",
    "bad_usage_overflow": "bad usage: completion_tokens Infinity is not a whole number of tokens",
    "malformed_sse": "malformed SSE event (",
    "huge_line": "SSE line too long: over 1 MiB",
    "zero_tokens": 'truncated stream: 0 of 8 tokens forced by ignore_eos, then finish_reason "length"',
    "early_stop": 'truncated stream: 2 of 8 tokens forced by ignore_eos, then finish_reason "stop"',
    "empty_choices": "bad usage: completion_tokens 8, but no event carried a choice",
    "done_first": "event after [DONE]: '{\"id\": \"f\"",
    "usage_below": "bad usage: completion_tokens 2, but 8 events carried output text",
    "too_many": "too many tokens: 24 (usage completion_tokens) for max_tokens 8",
    "too_many_no_usage": "too many tokens: 24 (events that carried text, no usage) for max_tokens 8",
}


def trace(path: Path) -> Path:
    """Four requests 10 ms apart, two completions and two chats, of 8 forced output tokens each."""
    lines = []
    for i in range(N):
        text = {"prompt": f"hello {i}"} if i % 2 == 0 else {"messages": [{"role": "user", "content": f"hi {i}"}]}
        lines.append(json.dumps({"timestamp": i * 0.01, **text, "output_length": TOKENS}))
    path.write_text("\n".join(lines) + "\n")
    return path


def args(server: FaultServer, tmp_path: Path, *extra: str) -> list[str]:
    return ["replay", "--trace", str(trace(tmp_path / "t.jsonl")), "--endpoint", server.base_url, "--warmup", "0",
            "--client-procs", "1", "--slo", "ttft:p99<10s", "--out", str(tmp_path / "out"), *extra]


def replay_in_process(server, tmp_path, capfd, caplog, *extra):
    """Run `tune replay` against `server` in this process: (exit code, stdout + stderr with its
    lines joined, the records, summary.json's summary)."""
    with caplog.at_level(logging.WARNING):
        code = main(args(server, tmp_path, *extra))
    out, err = capfd.readouterr()
    both = " ".join((out + err).split())  # rich wraps long lines at the terminal's width
    assert "Traceback" not in out + err, out + err
    loop_errors = [r for r in caplog.records if r.name == "asyncio" or r.name.startswith("tracetune")]
    assert not loop_errors, [r.getMessage() for r in loop_errors]  # e.g. "Exception in callback", data_received
    records = [json.loads(line) for line in (tmp_path / "out" / "requests.jsonl").read_text().splitlines()]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())["summary"]
    assert len(records) == N and server.requests == N
    return code, both, records, summary


@pytest.mark.parametrize("mode", sorted(FAULTS))
def test_no_answer_that_is_not_an_openai_stream_counts_as_a_success(mode, tmp_path, capfd, caplog):
    reason = FAULTS[mode]
    with FaultServer(mode) as server:
        code, out, records, summary = replay_in_process(server, tmp_path, capfd, caplog)
    assert [r["success"] for r in records] == [False] * N
    assert all(r["error"].startswith(reason) for r in records), [r["error"] for r in records]
    assert summary["succeeded"] == 0 and summary["errors"] == N and summary["stream_faults"] == N
    assert summary["slo_attainment"] == 0.0 and summary["goodput_rps"]["value"] == 0.0
    for rate in ("request_throughput_rps", "output_throughput_tps"):
        assert math.isfinite(summary[rate]["value"]) and summary[rate]["value"] == 0.0, summary[rate]
    assert f"replay: 0/{N} ok" in out
    assert code == 1
    assert (f"error: the endpoint is not what it seems: {N} of {N} responses were not OpenAI streams "
            f"(first reason: {reason}") in out, out
    assert "check that --endpoint is the root URL of an OpenAI-compatible server" in out


def test_a_correct_stream_counts_every_request(tmp_path, capfd, caplog):
    with FaultServer("ok") as server:
        code, out, records, summary = replay_in_process(server, tmp_path, capfd, caplog)
    assert code == 0 and "not what it seems" not in out
    assert all(r["success"] and r["output_tokens"] == TOKENS and r["error"] == "" for r in records), records
    assert {r["finish_reason"] for r in records} == {"length"}
    assert summary["succeeded"] == N and summary["stream_faults"] == 0 and summary["slo_attainment"] == 1.0
    assert summary["output_throughput_tps"]["value"] > 0


def test_a_stream_without_usage_is_counted_from_its_events(tmp_path, capfd, caplog):
    """`"usage": null` at the end: each request's tokens are the text events it received, and the
    throughput is built on them (it was "output 0.0 tok/s" from the missing count)."""
    with FaultServer("usage_null") as server:
        code, out, records, summary = replay_in_process(server, tmp_path, capfd, caplog)
    assert code == 0 and "not what it seems" not in out
    assert all(r["success"] and r["output_tokens"] == TOKENS and r["tpot_s"] is not None for r in records), records
    assert summary["output_throughput_tps"]["value"] == pytest.approx(N * TOKENS / summary["duration_s"], rel=1e-6)


def test_an_engine_stopped_short_at_its_length_limit_fails_without_calling_the_endpoint_false(tmp_path, capfd, caplog):
    """finish_reason "length" at 3 of 8 forced tokens (llama-server does so when its slot's context
    is full): every request fails with both numbers, counted as errors, not as stream faults."""
    with FaultServer("short_length") as server:
        code, out, records, summary = replay_in_process(server, tmp_path, capfd, caplog)
    assert all(not r["success"] and r["error"].startswith("short answer: 3 of 8 tokens forced by ignore_eos")
               for r in records), records
    assert summary["succeeded"] == 0 and summary["errors"] == N and summary["stream_faults"] == 0
    assert summary["output_throughput_tps"]["value"] == 0.0
    assert code == 0 and "not what it seems" not in out


def test_a_slow_first_token_is_measured_not_rejected(tmp_path, capfd, caplog):
    with FaultServer("slow", delay_s=0.3) as server:
        code, out, records, summary = replay_in_process(server, tmp_path, capfd, caplog)
    assert code == 0 and summary["succeeded"] == N
    assert all(r["success"] and r["ttft_s"] >= 0.3 for r in records), records


def test_a_server_slower_than_the_timeout_times_out_and_is_no_stream_fault(tmp_path, capfd, caplog):
    with FaultServer("slow", delay_s=1.0) as server:
        code, out, records, summary = replay_in_process(server, tmp_path, capfd, caplog, "--request-timeout", "0.3")
    assert [r["error"] for r in records] == ["timed out after 0.3s"] * N
    # A slow engine is measured as one (its errors are in the summary), not called a false endpoint.
    assert code == 0 and summary["succeeded"] == 0 and summary["stream_faults"] == 0
    assert "not what it seems" not in out


def test_the_real_command_says_so_without_a_traceback(tmp_path):
    """The same through `python -m tracetune`, as a user runs it: stderr holds no traceback."""
    with FaultServer("html") as server:
        done = subprocess.run([sys.executable, "-m", "tracetune", *args(server, tmp_path)], cwd=ROOT,
                              capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "300"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "Exception in callback" not in done.stderr, done.stderr
    assert f"the endpoint is not what it seems: {N} of {N} responses were not OpenAI streams" in done.stdout
    assert (tmp_path / "out" / "requests.jsonl").read_text().count('"success": false') == N


@pytest.mark.parametrize("mode", ["html", "too_many", "ok", "usage_null"])
def test_capacity_says_when_the_endpoint_is_not_what_it_seems(mode, tmp_path, capfd, caplog):
    """`tune capacity --endpoint` says what `tune replay` says (exit 1), after keeping what it measured;
    a stream without usage is counted from its events there too."""
    with FaultServer(mode) as server, caplog.at_level(logging.WARNING):
        code = main(["capacity", "--trace", str(trace(tmp_path / "t.jsonl")), "--endpoint", server.base_url,
                     "--warmup", "0", "--client-procs", "1", "--slo", "ttft:p99<10s", "--level-seconds", "0",
                     "--level-lifetimes", "0", "--level-requests", "0", "--no-repeat",
                     # Every level to the end: a request cancelled in flight by an abandoned level counts as
                     # sent but has no record, and whether one is in flight when the level is abandoned
                     # depends on the machine's load.
                     "--no-abandon",
                     "--out", str(tmp_path / "out"), "--json", str(tmp_path / "cap.json")])
    out = " ".join("".join(capfd.readouterr()).split())
    assert "Traceback" not in out
    steps = json.loads((tmp_path / "cap.json").read_text())["steps"]
    records = (tmp_path / "out" / "requests.jsonl").read_text().splitlines()
    assert len(records) == sum(step["requests"] for step in steps) > 0
    if mode in ("ok", "usage_null"):
        assert code == 0 and "not what it seems" not in out, out
        assert all(r["success"] and r["output_tokens"] == TOKENS for r in map(json.loads, records))
        return
    assert code == 1 and all(not step["passed"] for step in steps), out
    assert (f"error: the endpoint is not what it seems: {len(records)} of {len(records)} responses were not "
            f"OpenAI streams (first reason: {FAULTS[mode]}") in out, out
