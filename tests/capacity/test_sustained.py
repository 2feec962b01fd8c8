"""Sustained load levels (`capacity.sustain`): the window and its looping, the held-to-the-end tests on
records made to show each failure, and `tune capacity` on a held-out server whose streams slow as
its batch grows (tests/capacity/batch_server.py), whose steady-state capacity is known."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import wait_for_http
from tracetune.capacity import sustain
from tracetune.capacity.levels import LevelRunner
from tracetune.capacity.step import CapacityOptions, judge
from tracetune.replay.metrics import parse_slos
from tracetune.replay.types import PreparedRequest, ReplayOptions, ReplayResult, RequestRecord

SLOS = tuple(parse_slos("ttft:p95<1s,tpot:p95<100ms"))
ROOT = Path(__file__).resolve().parents[2]


def trace(n: int, rate: float, tokens: int = 32) -> list[PreparedRequest]:
    return [PreparedRequest(index=i, id=f"r{i}", scheduled_s=i / rate, max_tokens=tokens, prompt=f"p{i}")
            for i in range(n)]


def record(i: int, send: float, *, ttft: float = 0.1, e2e: float = 1.0, ok: bool = True, tokens: int = 32
           ) -> RequestRecord:
    return RequestRecord(index=i, id=None, scheduled_s=send, send_s=send, lag_s=0.0, success=ok, error="",
                         ttft_s=ttft, e2e_s=e2e, itl_s=[], prompt_tokens=4, output_tokens=tokens,
                         requested_tokens=tokens, finish_reason="length")


# -- the window -----------------------------------------------------------------------------------
def test_lifetime_is_what_the_slo_allows_a_median_request():
    assert sustain.lifetime_bound(SLOS, [32, 32, 8]) == pytest.approx(1.0 + 0.1 * 31)
    assert sustain.lifetime_bound(tuple(parse_slos("e2e:p99<2s,ttft:p99<1s,tpot:p99<100ms")), [32]) == 2.0
    assert sustain.lifetime_bound(tuple(parse_slos("ttft:p99<1s")), [32]) == 0.0  # not bounded: measured


def test_a_window_meets_every_minimum_in_whole_passes():
    reqs = trace(20, rate=10.0)  # 2 s a pass (1.9 s span + one mean gap)
    assert sustain.period(reqs) == pytest.approx(2.0)
    by_seconds = sustain.plan(reqs, 1.0, seconds=30, lifetimes=5, min_requests=0, lifetime_s=1.0)
    assert (by_seconds.passes, by_seconds.seconds, by_seconds.requests) == (15, pytest.approx(30.0), 300)
    by_lifetimes = sustain.plan(reqs, 1.0, seconds=30, lifetimes=5, min_requests=0, lifetime_s=9.0)
    assert by_lifetimes.passes == 23 and by_lifetimes.seconds >= 45
    by_requests = sustain.plan(reqs, 4.0, seconds=1, lifetimes=0, min_requests=1000, lifetime_s=0)
    assert by_requests.requests == 1000 and by_requests.seconds == pytest.approx(25.0)
    # a faster level replays the trace more often to last as long
    assert sustain.plan(reqs, 2.0, seconds=30, lifetimes=0, min_requests=0, lifetime_s=0).passes == 30


def test_looping_keeps_rate_and_mix_and_gives_later_passes_their_own_prefix():
    reqs = trace(10, rate=5.0)
    reqs[3] = PreparedRequest(index=3, id=None, scheduled_s=reqs[3].scheduled_s, max_tokens=7,
                              messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
    loop = sustain.looped(reqs, 3)
    assert len(loop) == 30 and len({r.index for r in loop}) == 30
    assert loop[:10] == reqs  # the first pass is the trace itself
    gaps = [b.scheduled_s - a.scheduled_s for a, b in zip(loop, loop[1:])]
    assert max(gaps) == pytest.approx(min(gaps))  # evenly spaced trace: the loop's rate is the trace's
    assert [r.max_tokens for r in loop[10:20]] == [r.max_tokens for r in reqs]
    assert loop[10].prompt == "(pass 2) p0" and loop[25].prompt == "(pass 3) p5" and loop[11].id == "r1~2"
    assert loop[13].messages[0]["content"] == "(pass 2) be brief" and loop[13].messages[1]["content"] == "hi"
    assert reqs[3].messages[0]["content"] == "be brief"  # the trace's own request is untouched
    assert sustain.looped(reqs, 1) == reqs


# -- was the level held? ------------------------------------------------------------------------------
def level(records, planned):
    opts = CapacityOptions(slos=SLOS)
    result = ReplayResult(records=records, duration_s=planned[-1].scheduled_s, options=ReplayOptions())
    return judge(result, 1.0, planned, opts, planned[-1].scheduled_s)


def test_a_steady_level_is_held():
    planned = trace(600, rate=10.0)
    step = level([record(i, r.scheduled_s, ttft=0.1 + 0.02 * (i % 3)) for i, r in enumerate(planned)], planned)
    assert step.passed and step.decided_by == "held" and step.last_third == 1.0
    slope, low, high, _ = step.in_flight_trend
    assert low <= 0 <= high and step.quarters == [1.0] * 4
    assert "held to the end" in step.line()


def test_a_level_that_decays_at_its_end_fails_on_its_last_third():
    planned = trace(600, rate=10.0)  # 95.8% good overall, but the last 25 requests all miss
    records = [record(i, r.scheduled_s, ok=i < 575) for i, r in enumerate(planned)]
    step = level(records, planned)
    assert step.attainment >= 0.95 and not step.passed and step.decided_by == "last third"
    assert step.last_third < 0.95 and step.quarters[-1] < 0.95 < step.quarters[0]


def test_a_growing_queue_fails_the_level_though_every_request_was_good():
    planned = trace(600, rate=10.0)  # lifetimes grow 1 s -> 7 s: in flight 10 -> 70
    records = [record(i, r.scheduled_s, e2e=1.0 + 6.0 * i / 600, tokens=256) for i, r in enumerate(planned)]
    step = level(records, planned)
    assert step.attainment == 1.0 and not step.passed and step.decided_by == "queue rising"
    assert step.in_flight_trend[1] > 0.05 * 10.0
    assert "queue still rising" in step.line()


def test_a_ttft_rising_toward_its_threshold_fails_the_level():
    planned = trace(600, rate=10.0)  # TTFT 0.1 s -> 0.9 s, under the 1 s threshold, not for long
    records = [record(i, r.scheduled_s, ttft=0.1 + 0.8 * i / 600, e2e=2.0) for i, r in enumerate(planned)]
    step = level(records, planned)
    assert step.attainment == 1.0 and not step.passed and step.decided_by == "TTFT rising"


def test_a_slow_harmless_ttft_drift_is_not_a_failure():
    planned = trace(600, rate=10.0)  # +10 ms over the window: far from crossing 1 s within another
    records = [record(i, r.scheduled_s, ttft=0.1 + 0.01 * i / 600) for i, r in enumerate(planned)]
    assert level(records, planned).decided_by == "held"


def test_trend_interval_covers_the_true_slope():
    t = [float(i) for i in range(8)]
    fit = sustain.Trend.fit(t, [2.0 * x + (0.3 if i % 2 else -0.3) for i, x in enumerate(t)])
    assert fit.low < 2.0 < fit.high and fit.low > 1.5
    assert sustain.Trend.fit([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) is None  # too few blocks for an interval


# -- a held-out server whose streams slow as its batch grows ------------------------------------------------
# step 40 ms + 0.4 ms per running request, 16 tokens a request, TPOT < 200 ms: its batch settles under the
# threshold up to (0.2 - 0.04) / (0.0004 x 16 x 0.2) = 125 req/s (batch 400), and takes lifetimes to fill.
STEADY_RPS = 125.0
SERVER_SLO = "ttft:p95<500ms,tpot:p95<200ms"


@pytest.fixture(scope="module")
def batch_server(tmp_path_factory):
    from tracetune.engine_adapter.process import free_port

    port = free_port()
    log = open(tmp_path_factory.mktemp("batch") / "server.log", "w")
    proc = subprocess.Popen([sys.executable, str(Path(__file__).parent / "batch_server.py"), "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_for_http(url + "/v1/models", 30)
    yield url
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.mark.slow
def test_a_600_request_window_passes_half_again_above_what_the_server_sustains(batch_server):
    """Every request of a 600-request window meets the SLO at 1.5x what the server sustains (the
    transient: its batch never filled); only the queue test sees it. Under the guided rules the level
    ends at its last arrival on that test, its requests in flight cut."""
    def level(rules: str):
        requests = trace(600, rate=1.5 * STEADY_RPS, tokens=16)
        opts = CapacityOptions(slos=tuple(parse_slos(SERVER_SLO)), rules=rules, level_seconds=0, level_lifetimes=0,
                               level_requests=0)
        return LevelRunner(batch_server, "batch", requests, ReplayOptions(), opts).level(1.0)

    step = level("classic")
    assert step.passes == 1 and step.planned == 600
    assert step.attainment >= 0.95, step.as_dict()  # the transient: the batch never filled
    assert not step.passed and step.decided_by == "queue rising" and step.cut == 0
    guided = level("guided")
    assert not guided.passed and guided.decided_by == "queue rising" and guided.cut > 0
    assert guided.ended == "its queue certainly rising" and guided.duration_s < step.duration_s


@pytest.mark.slow
def test_tune_capacity_measures_the_held_out_servers_steady_state(batch_server, tmp_path):
    path = tmp_path / "even.jsonl"  # 45 req/s for 4.4 s: levels loop it
    path.write_text("".join(json.dumps({"timestamp": i / 45, "prompt": "hello", "output_length": 16}) + "\n"
                            for i in range(200)))
    out = tmp_path / "cap.json"
    env = {**os.environ, "COLUMNS": "100"}
    proc = subprocess.run([sys.executable, "-m", "tracetune", "capacity", "--trace", str(path), "--endpoint", batch_server,
                           "--slo", SERVER_SLO, "--level-seconds", "15", "--warmup", "0", "--json", str(out),
                           "--out", str(tmp_path / "run")], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert math.isclose(result["capacity_rps"], STEADY_RPS, rel_tol=0.10), proc.stdout
    steps = result["steps"]
    # 5 lifetimes of 0.5 + 0.2 x 15 s = 17.5 s at every level, the trace replayed again to fill them
    assert all(s["window_s"] >= 17.0 and s["passes"] > 1 for s in steps if not s["abandoned"])
    assert all(s["decided_by"] for s in steps)
    assert {s["decided_by"] for s in steps if s["passed"]} == {"held"}
    assert "passes of the trace" in proc.stdout and "held to the end" in proc.stdout


def test_a_level_whose_requests_outlive_its_window_is_measured_again_over_a_longer_one():
    from tests.capacity.test_capacity import SlotServer

    # a TTFT target bounds no lifetime: the 1 s window is sized blind, the requests live 0.4 s
    requests = trace(20, rate=20.0, tokens=2)
    opts = CapacityOptions(slos=tuple(parse_slos("ttft:p99<1s")), level_seconds=1, level_lifetimes=5,
                           level_requests=0)
    with SlotServer(slots=64, service_s=0.4) as server:
        runner = LevelRunner(server.base_url, "m", requests, ReplayOptions(), opts)
        assert runner.lifetime_s == 0
        step = runner.level(1.0)
    first, second = [s for s, _ in runner.measured]
    assert not first.passed and first.decided_by == "window short" and first.passes == 1
    assert second is step and step.passed and step.decided_by == "held"
    assert runner.lifetime_s == pytest.approx(0.4, abs=0.1) and step.window_s >= 5 * 0.35 and step.passes >= 2
