"""The parts of a long trace a load level replays (`capacity.segments`, `capacity.parts`), checked on
constructed windows and, end to end, with tune's own capacity search against a server whose latency
is a known queueing model simulated in virtual time (benchmarks/queue_model.py): the whole trace's
truth is computable there, so what the parts predict can be held against it."""

from __future__ import annotations

import math
import random
from dataclasses import replace as dataclass_replace

import numpy as np
import pytest

from benchmarks.queue_model import QueueModel
from tracetune.capacity import segments
from tracetune.capacity.levels import LevelRunner
from tracetune.capacity.parts import weighted_targets_met
from tracetune.capacity.step import CapacityOptions
from tracetune.replay.metrics import parse_slos
from tracetune.replay.types import PreparedRequest, ReplayOptions, RequestRecord

SLOS = tuple(parse_slos("ttft:p95<500ms"))


def requests_at(times, tokens=100, input_tokens=500.0) -> list[PreparedRequest]:
    return [PreparedRequest(index=i, id=None, scheduled_s=float(t), max_tokens=tokens, input_tokens=input_tokens)
            for i, t in enumerate(times)]


def poisson(rate: float, seconds: float, seed: int, start: float = 0.0) -> list[float]:
    rng, t, out = random.Random(seed), start, []
    while True:
        t += rng.expovariate(rate)
        if t >= start + seconds:
            return out
        out.append(t)


def quiet_then_burst(seed: int = 3) -> list[PreparedRequest]:
    """A recording whose first minutes are quiet and whose load comes later, in bursts: 1 req/s, with
    30-second bursts of 12 req/s at 5, 9 and 14 minutes; 20 minutes in all."""
    times = poisson(1.0, 1200, seed)
    for i, at in enumerate((300, 540, 840)):
        times += poisson(12.0, 30, seed + 10 + i, start=at)
    return requests_at(sorted(times))


def runner(requests, *, representative: bool = True, precision: float = 0.05, confirm: bool = True) -> LevelRunner:
    options = CapacityOptions(slos=SLOS, precision=precision, confirm=confirm, whole_trace=not representative)
    return LevelRunner("http://simulated", "m", requests, ReplayOptions(), options, send=QueueModel().send)


# -- the windows ------------------------------------------------------------------------------------
def test_a_trace_of_a_few_windows_is_replayed_whole():
    assert segments.cut(requests_at(np.arange(0, 100, 0.5)), 30.0) is None  # 100 s: fewer than 4+ windows
    w = segments.cut(requests_at(np.arange(0, 300, 0.5)), 30.0)
    assert w is not None and w.n >= 10 and w.requests == 600


def test_the_grid_holds_the_busiest_stretch_as_one_window():
    times = sorted(list(np.arange(0, 600, 1.0)) + list(np.linspace(201.5, 229.5, 200)))
    w = segments.cut(requests_at(times), 30.0)
    assert w.counts.sum() == len(times)
    busiest = segments.first_parts(w)[0]
    assert busiest.kind == "busiest" and 200.0 <= busiest.start_s <= 201.5  # the stretch starts the window
    assert busiest.requests == 230  # 200 of the burst + 30 of the background
    assert busiest.rate_ratio > 5


def test_the_window_with_most_tokens_is_replayed_too_when_it_is_another():
    times = np.arange(0, 600, 1.0)
    reqs = requests_at(times)
    for r in reqs[400:460]:  # fewer arrivals there than the busiest stretch, but four times the tokens each
        r.max_tokens = 2000
    reqs += requests_at(np.linspace(100.2, 110, 40))
    reqs = sorted(reqs, key=lambda r: r.scheduled_s)
    for i, r in enumerate(reqs):
        r.index = i
    kinds = [p.kind for p in segments.first_parts(segments.cut(reqs, 30.0))]
    assert kinds == ["busiest", "busiest by tokens"]


def windows_of(counts, length=10.0, lead=None) -> segments.Windows:
    counts = np.asarray(counts)
    edges = np.arange(counts.size + 1) * length
    return segments.Windows(length, edges, counts, np.zeros_like(counts) if lead is None else np.asarray(lead),
                            counts * 10.0, counts.sum() / edges[-1], counts.sum() * 10.0 / edges[-1])


def test_bounds_follow_load_and_decide_only_when_they_must():
    w = windows_of([100, 10, 20, 30, 40])  # loads 10, 1..4 req/s (no lead-in here)
    low, high = segments.bounds(w, {0: 0.5})  # only the busiest measured: everything else at least 50%
    assert low == pytest.approx((100 * 0.5 + 100 * 0.5) / 200) and high == pytest.approx((100 * 0.5 + 100) / 200)
    assert segments.decision(w, {0: 0.5}, 0.95)[0] == "fail"  # the busiest alone is half the trace
    assert segments.decision(w, {0: 1.0}, 0.95)[0] == "pass"
    assert segments.decision(w, {0: 0.9}, 0.95)[0] == ""  # 90% of half: the rest must be known
    assert segments.next_part(w, {0: 0.9}).cell == 3  # the middle, by requests, of what is undecided
    # The last third (windows 3 and 4) must reach the target on its own, as a whole-trace level's does.
    assert segments.decision(w, {0: 1.0, 4: 0.5}, 0.95)[0] == "fail"


def test_windows_that_break_the_assumption_are_pooled_not_trusted():
    w = windows_of([10, 20, 30, 40, 50])
    # The busier of two measured windows attained more: the fit pools them, so a window between
    # them is bounded by their pooled value, not squeezed between the two raw ones.
    low, high = segments.window_bounds(w, {1: 0.6, 3: 1.0})
    assert low[2] == pytest.approx(high[2]) == pytest.approx((20 * 0.6 + 40 * 1.0) / 60)
    assert (low[1], high[1], low[3], high[3]) == (0.6, 0.6, 1.0, 1.0)  # measured: their own


def test_a_quiet_window_after_a_burst_carries_its_lead_in():
    w = windows_of([100, 5, 5, 5, 5], lead=[0, 50, 2, 2, 2])
    assert w.load[1] > 3 * w.load[2]  # the window right after the burst inherits half of it


def test_percentile_targets_weigh_each_part_by_what_it_stands_for():
    def rec(i, ttft):
        return RequestRecord(index=i, id=None, scheduled_s=0, send_s=0, lag_s=0, success=True, error="",
                             ttft_s=ttft, e2e_s=ttft + 1, itl_s=[], prompt_tokens=1, output_tokens=10,
                             requested_tokens=10, finish_reason="length")

    slow = [rec(i, 2.0) for i in range(100)]  # a busy window, every request late
    fast = [rec(i, 0.1) for i in range(100)]
    assert weighted_targets_met([(0.02, slow, 100), (0.98, fast, 100)], SLOS)  # 2% of the trace: p95 holds
    assert not weighted_targets_met([(0.10, slow, 100), (0.90, fast, 100)], SLOS)
    assert not weighted_targets_met([(0.02, slow, 100), (0.98, fast[:90], 100)], SLOS)  # 9% never finished


# -- end to end, against a known queueing model --------------------------------------------------------
def test_a_level_of_a_long_trace_replays_parts_and_says_which():
    reqs = quiet_then_burst()
    r = runner(reqs)
    step = r.level(0.5)
    assert step.parts and step.trace_windows > len(step.parts)
    assert step.parts[0]["kind"] == "busiest" and step.parts[0]["rate_ratio"] > 3
    assert step.planned < len(reqs) / 2  # a fraction of the trace replayed
    low, high = step.attainment_bounds
    assert low <= step.attainment <= high
    assert "windows: busiest" in step.line()


def test_the_parts_predict_the_whole_trace_where_its_first_minute_cannot():
    reqs = quiet_then_burst()
    truth = runner(reqs, representative=False, precision=0.01, confirm=False).search().capacity_scale
    assert truth and 0.1 < truth < 10
    parts = runner(reqs).search()
    assert parts.capacity_scale == pytest.approx(truth, rel=0.15)
    first_minute = runner([r for r in reqs if r.scheduled_s <= 60], representative=False).search()
    rate_first = first_minute.capacity_rps
    rate_truth = truth * runner(reqs).base_rates[0]
    assert rate_first > 1.5 * rate_truth  # the quiet first minute overstates what the trace holds
    replayed = sum(step.planned for step in parts.steps)
    assert replayed < 0.5 * len(reqs) * len(parts.steps)  # far less than the whole trace at every level


def test_far_from_the_capacity_a_level_is_decided_by_few_windows():
    reqs = quiet_then_burst()
    r = runner(reqs)
    step = r.level(0.05)  # 1/20 of the recorded rate: the busiest window passes with room
    # The busiest, and the window right after the second burst (its lead-in holds the burst, so its
    # load is not bounded by the busiest window's): both pass, which bounds every other window.
    assert step.passed and len(step.parts) <= 2 and not step.undecided
    assert math.isclose(step.attainment_bounds[0], 1.0)
    assert r.windows(0.05).n > 10 * len(step.parts)


# -- the real command, against the same model served over HTTP ------------------------------------------
@pytest.fixture
def queue_server(tmp_path):
    import socket
    import subprocess
    import sys
    from pathlib import Path

    from tests.conftest import wait_for_http

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, str(root / "benchmarks" / "queue_server.py"), str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_for_http(f"http://127.0.0.1:{port}/health")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.slow  # load levels in real time (about a minute)
def test_tune_capacity_replays_windows_of_a_long_trace_and_says_which(queue_server, tmp_path):
    import json
    import subprocess
    import sys

    reqs = quiet_then_burst(seed=5)[:900]  # 10 minutes: a burst at 5 and 9 minutes
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"timestamp": r.scheduled_s, "prompt": "x", "output_length": r.max_tokens})
                            + "\n" for r in reqs))
    flags = ["--slo", "ttft:p95<500ms", "--level-seconds", "6", "--level-requests", "20", "--level-lifetimes", "2",
             "--precision", "0.25", "--warmup", "0"]
    out = subprocess.run([sys.executable, "-m", "tracetune", "capacity", "--trace", str(path), "--endpoint",
                          queue_server, *flags, "--json", str(tmp_path / "cap.json"), "--out", str(tmp_path / "o")],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    text = " ".join(out.stdout.split())
    assert "trace: 900 requests" in text and "windows: busiest" in text and "Traceback" not in out.stderr
    result = json.loads((tmp_path / "cap.json").read_text())
    assert result["trace_profile"]["requests"] == 900
    with_parts = [s for s in result["steps"] if s["parts"]]
    assert with_parts and all(s["parts"][0]["kind"] == "busiest" for s in with_parts)
    assert all(sum(p["planned"] for p in s["parts"]) < 900 / 2 for s in with_parts)
    # The same search on the simulated server (same windows) finds the same capacity within its bracket's slack.
    options = CapacityOptions(slos=SLOS, precision=0.25, level_seconds=6, level_requests=20, level_lifetimes=2)
    truth = LevelRunner("sim", "m", reqs, ReplayOptions(), dataclass_replace(options, whole_trace=True, confirm=False,
                                                                            precision=0.01),
                        send=QueueModel().send).search().capacity_scale
    assert result["capacity_scale"] == pytest.approx(truth, rel=0.3)
