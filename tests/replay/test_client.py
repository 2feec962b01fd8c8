"""The replay client as a measuring instrument: an overloaded client is a verdict (not engine
errors), failures of this machine are counted apart from the engine's, and a replay spread over
several client processes keeps every request exactly once. Against the zero-latency server of
benchmarks/ (a separate process, as an engine is) and the in-process test server."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import wait_for_http
from tests.replay.sse_server import SSEServer
from tracetune.engine_adapter.process import free_port
from tracetune.replay.client_procs import ClientPool, auto_client_procs, peak_rate
from tracetune.replay.metrics import summarize
from tracetune.replay.replayer import Replayer
from tracetune.replay.send import prepare, replay
from tracetune.replay.trace import Trace, TraceRecord
from tracetune.replay.types import ReplayOptions

ROOT = Path(__file__).resolve().parents[2]


def even(rate: float, n: int, tokens: int = 8) -> Trace:
    return Trace(source="even.jsonl", records=[TraceRecord(timestamp=i / rate, prompt="hello", output_length=tokens)
                                               for i in range(n)])


@pytest.fixture(scope="module")
def zero_server(tmp_path_factory):
    """benchmarks/zero_latency_server.py in its own process: answers every request at once."""
    port = free_port()
    arrivals = tmp_path_factory.mktemp("zero") / "arrivals.txt"
    proc = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "zero_latency_server.py"), str(port),
                             str(arrivals), "8"], stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_for_http(url + "/health", 20)
    yield url
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=20)


@pytest.mark.slow  # overloads the client in real time (about 15 s)
def test_a_rate_no_client_can_keep_is_a_client_overloaded_verdict_not_engine_errors(zero_server, tmp_path):
    """200,000 req/s offered for 0.1 s: no single Python process sends that, whatever the machine."""
    trace = tmp_path / "flood.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": i / 200_000, "prompt": "hi", "output_length": 8}) + "\n"
                             for i in range(20_000)))
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "tracetune", "replay", "--trace", str(trace), "--endpoint", zero_server,
                           "--served-model", "zero", "--warmup", "0", "--client-procs", "1", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"}, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())["summary"]
    assert summary["client_overloaded"] is True
    assert summary["schedule_lag_s"]["p99"] > summary["lag_bound_s"]
    assert summary["errors"] == 0 and summary["client_errors"] == 0  # nothing charged to the engine
    assert "warning: client overloaded" in done.stdout and "--client-procs" in done.stdout


def test_a_rate_the_client_keeps_is_not_overloaded(zero_server):
    """50 req/s is a rate any client keeps. This suite's other processes share the cores, and of 25
    requests the lag p99 is the largest: one stall of the machine (10 ms) flags a replay. Three
    tries, and the verdict must clear in one; a verdict stuck at overloaded fails all three."""
    options = ReplayOptions(warmup_requests=0, request_timeout_s=30)
    summaries = []
    for _ in range(3):
        summary = summarize(replay(zero_server, "zero", prepare(even(50, 25), options), options))
        assert summary.succeeded == 25 and summary.client_errors == 0
        summaries.append(summary)
        if not summary.client_overloaded:
            break
    assert not summaries[-1].client_overloaded, [s.schedule_lag for s in summaries]


def test_client_failures_are_counted_apart_from_engine_failures(monkeypatch):
    """Every third connection this machine cannot open (no file descriptor left); the server fails
    one request in four with HTTP 500: two kinds of failure, two counts."""
    class Flaky(SSEServer):
        async def handle(self, request):
            from aiohttp import web
            if (await request.json())["prompt"].endswith("3"):
                return web.Response(status=500, text="engine error")
            return await super().handle(request)

    server = Flaky(tokens=3)
    options = ReplayOptions(warmup_requests=0, request_timeout_s=10)
    # All at once: every request needs a connection of its own, so connects keep happening.
    trace = Trace(source="t.jsonl", records=[TraceRecord(timestamp=0.0, prompt=f"p{i % 4}", output_length=3)
                                             for i in range(40)])

    async def go():
        await server.start()
        loop = asyncio.get_running_loop()
        real = loop.create_connection
        calls = {"n": 0}

        async def sometimes_no_fd(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] % 3 == 0:
                raise OSError(errno.EMFILE, "Too many open files")
            return await real(*args, **kwargs)

        monkeypatch.setattr(loop, "create_connection", sometimes_no_fd)
        try:
            return await Replayer(server.base_url, "m", options).run(prepare(trace, options))
        finally:
            await server.stop()

    records, duration, _ = asyncio.run(go())
    from tracetune.replay.types import ReplayResult
    summary = summarize(ReplayResult(records=records, duration_s=duration, options=options))
    client = [r for r in records if r.client_error]
    engine = [r for r in records if not r.success and not r.client_error]
    assert client and engine and summary.client_errors == len(client) and summary.errors == len(engine)
    assert all("this machine" in r.error for r in client) and all("HTTP 500" in r.error for r in engine)
    assert summary.client_overloaded  # a replay with client-side failures did not measure the engine


def test_several_client_processes_keep_every_request_exactly_once(zero_server):
    options = ReplayOptions(warmup_requests=2, request_timeout_s=30)
    requests = prepare(even(400, 402), options)
    with ClientPool(3) as pool:
        result = replay(zero_server, "zero", requests, options, pool=pool)
        assert [r.index for r in result.records] == list(range(2, 402))  # warm-up excluded, each once, in order
        assert all(r.success and r.output_tokens == 8 for r in result.records)
        assert result.sent == result.planned == 400 and not result.abandoned
        # One schedule: request i is due at i / 400 s from the shared start, whichever process sends it.
        assert max(abs(r.scheduled_s - (r.index - 2) / 400) for r in result.records) < 1e-9
        assert summarize(result).schedule_lag["p50"] < 0.05
        # The same pool again (a capacity search's next level), stopped early from the parent.
        stop_after = 50
        again = replay(zero_server, "zero", prepare(even(100, 402), options), options, pool=pool,
                       stop_when=lambda finished, in_flight, now: len(finished) >= stop_after)
    indices = [r.index for r in again.records]
    assert again.abandoned and stop_after <= len(indices) < 400 and len(set(indices)) == len(indices)


def test_automatic_client_processes_follow_the_peak_rate_within_the_free_cores(monkeypatch):
    options = ReplayOptions(warmup_requests=0)
    slow, fast = prepare(even(10, 50), options), prepare(even(9000, 20000), options)
    assert peak_rate(slow) == pytest.approx(10, abs=1) and peak_rate(fast) == pytest.approx(9000, rel=0.01)
    monkeypatch.setattr("tracetune.replay.client_procs.cores", lambda: 16)
    assert auto_client_procs(slow, engine_cores=2) == 1
    assert auto_client_procs(fast, engine_cores=2) == 5  # 9,000 req/s at 2,000 a process
    assert auto_client_procs(fast, engine_cores=14) == 2  # only two cores left
    assert auto_client_procs(fast, engine_cores=16) == 1  # an engine on every core: one process all the same
