"""The simulated engine (engine_adapter/sim/): its queueing truth in virtual time, its settings and
command, its real server (exact token counts and usage, counters engine_adapter/metrics.py reads, a
quality loss the probe measures exactly), and the truth a study on it is held against."""

from __future__ import annotations

import asyncio
import heapq
import math
import random
import sys

import pytest

from tracetune.capacity.step import CapacityOptions
from tracetune.capacity.virtual import VirtualSend, true_capacity
from tracetune.engine_adapter.metrics import parse_metrics
from tracetune.engine_adapter.openai_client import new_session
from tracetune.engine_adapter.platform import Platform
from tracetune.engine_adapter.registry import engine_kind
from tracetune.engine_adapter.sim import lm
from tracetune.engine_adapter.sim.config import SimConfig, loss_nats, model_of
from tracetune.engine_adapter.sim.engine import build_command
from tracetune.engine_adapter.sim.model import Core, SimModel
from tracetune.engine_adapter.sim.server import parse_args
from tracetune.engine_adapter.sim.truth import grid, true_front, true_points
from tracetune.errors import Rejected
from tracetune.replay.metrics import parse_slos
from tracetune.replay.types import PreparedRequest, ReplayOptions


def schedule(n: int, seed: int = 1, rate: float = 20.0) -> list[PreparedRequest]:
    rng, t, out = random.Random(seed), 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        out.append(PreparedRequest(index=i, id=None, scheduled_s=t, max_tokens=rng.randint(1, 60)))
    return out


def flat(times) -> list[float]:
    return [x for one in times for x in one]


def fcfs_slots(model: SimModel, requests) -> list[tuple[float, float, float]]:
    """The plain first-come-first-served slots model (no slow-down), written out on its own."""
    free, out = [0.0] * model.slots, []
    for r in requests:
        start = max(r.scheduled_s, heapq.heappop(free))
        end = start + model.ttft_s + model.tpot_s * (r.max_tokens - 1)
        heapq.heappush(free, end)
        out.append((r.scheduled_s, start + model.ttft_s, end))
    return out


def test_without_slow_down_the_model_is_first_come_first_served_slots():
    model, requests = SimModel(slots=3, ttft_s=0.02, tpot_s=0.005), schedule(300)
    assert flat(model.times(requests)) == pytest.approx(flat(fcfs_slots(model, requests)))


def test_a_fuller_batch_decodes_every_request_more_slowly():
    one = SimModel(slots=2, ttft_s=0.1, tpot_s=0.01, alpha=1.0)
    alone = [PreparedRequest(index=0, id=None, scheduled_s=0.0, max_tokens=11)]
    assert one.times(alone) == [pytest.approx((0.0, 0.1, 0.2))]
    pair = alone + [PreparedRequest(index=1, id=None, scheduled_s=0.0, max_tokens=11)]
    assert one.times(pair) == [pytest.approx((0.0, 0.1, 0.3))] * 2  # two holding slots: 20 ms a token
    assert SimModel(slots=1, ttft_s=0.1, tpot_s=0.01, alpha=1.0).times(pair)[1] == pytest.approx((0.0, 0.3, 0.4))


def test_the_core_advanced_in_small_steps_agrees_with_the_whole_schedule():
    """The server advances the core to the clock as requests arrive; the truth runs it at once."""
    model, requests = SimModel(slots=4, ttft_s=0.03, tpot_s=0.004, alpha=0.2), schedule(200)
    core, now = Core(model), 0.0
    for r in requests:
        while now + 0.007 < r.scheduled_s:
            now += 0.007
            core.advance(now)
            for key in list(core.requests):
                assert core.emitted(key) <= requests[key].max_tokens
        core.arrive(r.scheduled_s, r.index, r.max_tokens)
    core.advance(math.inf)
    assert flat(core.times(r.index) for r in requests) == pytest.approx(flat(model.times(requests)))


def test_a_request_that_leaves_frees_its_slot():
    core = Core(SimModel(slots=1, ttft_s=0.1, tpot_s=0.01))
    core.arrive(0.0, 0, 100)
    core.arrive(0.0, 1, 2)
    core.advance(0.5)
    assert core.emitted(0) > 1 and core.emitted(1) == 0 and core.busy == 1 and list(core.waiting) == [1]
    core.abort(0)
    core.advance(0.65)
    assert core.finished(1) and core.times(1) == pytest.approx((0.0, 0.6, 0.61))


def test_flags_knobs_and_the_command_describe_one_config():
    kind = engine_kind("sim")
    assert kind.tunable and not kind.loads_model and kind.platform() is Platform.CPU
    assert "simulated" in kind.shown and "tests and benchmarks" in kind.shown
    config = kind.translate({"max_num_seqs": 16, "precision": "fp8"}, fixed={}, platform=Platform.CPU,
                            model_dir=kind.config_model().model, base={"tpot_ms": 7.0})
    assert (config.max_num_seqs, config.dtype, config.tpot_ms) == (16, "fp8", 7.0)
    argv, env = build_command(config, Platform.CPU, port=8123)
    assert argv[:3] == [sys.executable, "-m", "tracetune.engine_adapter.sim.server"] and env == {}
    served, host, port = parse_args(argv[3:])
    assert (host, port) == ("127.0.0.1", 8123)
    assert served.model_dump(exclude={"model"}) == {**config.model_dump(exclude={"model"}), "served_model_name": "sim"}
    model = model_of(config)
    assert (model.slots, model.ttft_s, model.tpot_s, model.alpha) == (16, pytest.approx(0.035), pytest.approx(0.0049),
                                                                       0.05)
    reference = kind.reference(fixed={}, model_dir=config.model, base={"dtype": "int4", "tpot_ms": 7.0})
    assert (reference.dtype, reference.tpot_ms, loss_nats(reference)) == ("bf16", 7.0, 0.0)
    with pytest.raises(Rejected, match="max_num_seqs"):
        kind.translate({"max_num_seqs": 0}, fixed={}, platform=Platform.CPU, model_dir=config.model)


def test_every_scored_token_loses_exactly_the_precisions_loss():
    ids = lm.tokenize("The simulated engine answers the same way every time.")
    reference = lm.prompt_logprobs(ids, 20, 0.0)
    fp8 = lm.prompt_logprobs(ids, 20, loss_nats(SimConfig(dtype="fp8")))
    assert reference[0] is None and len(reference) == len(ids)
    deltas = [r[str(t)]["logprob"] - c[str(t)]["logprob"] for t, r, c in zip(ids[1:], reference[1:], fp8[1:])]
    assert deltas == pytest.approx([0.004] * (len(ids) - 1))
    assert [sum(math.exp(v["logprob"]) for v in entry.values()) for entry in reference[1:]] == \
        pytest.approx([1 - lm.REST] * (len(ids) - 1))


@pytest.fixture
def sim_engine(tmp_path):
    """A started simulated engine: 2 slots, 30 ms to the first token, 5 ms a token."""
    kind = engine_kind("sim")
    engine = kind.make(tmp_path / "run")
    engine.launch(SimConfig(max_num_seqs=2, ttft_ms=30.0, tpot_ms=5.0, alpha=0.0), 60.0)
    yield engine
    engine.stop()


async def _streams(engine, tokens: list[int], chat: bool = False):
    async with new_session(timeout_s=60.0) as session:
        ask = {"messages": [{"role": "user", "content": "hello"}]} if chat else {"prompt": "hello"}
        return await asyncio.gather(*(engine.stream(session, max_tokens=n, ignore_eos=True, **ask) for n in tokens))


def test_the_server_streams_exactly_max_tokens_with_usage_and_counts_them(sim_engine):
    before = sim_engine.metrics()
    outs = asyncio.run(_streams(sim_engine, [1, 37, 200]))
    assert [o.success for o in outs] == [True] * 3, [o.error for o in outs]
    assert [(o.output_tokens, o.prompt_tokens) for o in outs] == [(1, 5), (37, 5), (200, 5)]
    assert all(o.ttft_s >= 0.03 for o in outs)  # never before the model's first token
    chat = asyncio.run(_streams(sim_engine, [9], chat=True))[0]
    assert chat.success and chat.output_tokens == 9 and len(chat.text) == 9
    after = sim_engine.metrics()
    assert after.generation_tokens - before.generation_tokens == 1 + 37 + 200 + 9
    assert after.requests_running == after.requests_waiting == 0


def test_the_metrics_show_requests_running_and_waiting(sim_engine):
    async def busy():
        task = asyncio.ensure_future(_streams(sim_engine, [200, 200, 200]))
        await asyncio.sleep(0.3)
        seen = await asyncio.to_thread(sim_engine.metrics)
        await task
        return seen

    seen = asyncio.run(busy())
    assert (seen.requests_running, seen.requests_waiting) == (2, 1)  # two slots, one waits
    text = sim_engine.get("/metrics").text
    assert "vllm:num_requests_running" in text and parse_metrics(text).requests_running == 0


def test_the_quality_probe_measures_the_known_loss_beyond_a_zero_floor(tmp_path):
    from tracetune.quality.probe import measure_candidate, measure_reference

    kind = engine_kind("sim")
    prompts = [("What is a queue?", None), ("Name three fruits, please.", None)]
    reference_engine, candidate_engine = kind.make(tmp_path / "ref"), kind.make(tmp_path / "fp8")
    try:
        reference_engine.launch(SimConfig(), 60.0)
        candidate_engine.launch(SimConfig(dtype="fp8"), 60.0)
        reference = measure_reference(reference_engine.endpoint, prompts, max_tokens=64)
        same = measure_candidate(reference_engine.endpoint, reference)
        fp8 = measure_candidate(candidate_engine.endpoint, reference)
    finally:
        reference_engine.stop()
        candidate_engine.stop()
    assert set(reference.floor["nll"]) == {0.0} and same.nll_delta_per_token.value == 0.0 and same.within_floor
    assert fp8.nll_delta_per_token.value == pytest.approx(0.004)
    assert fp8.ppl_change.value == pytest.approx(math.expm1(0.004)) and not fp8.within_floor
    assert 0.003 < fp8.kld.value < 0.004 and fp8.top1_agreement.value == 1.0


def test_the_truth_ranks_configurations_and_keeps_the_front():
    requests = schedule(200, rate=30.0)
    options = CapacityOptions(slos=tuple(parse_slos("ttft:p95<300ms")))
    base = SimConfig(ttft_ms=20.0, tpot_ms=2.0, alpha=0.05)
    configs = grid([2, 8], ["bf16", "fp8", "int4"], base)

    def judge(model):
        return true_capacity(requests, options, model).rps

    points = true_points(configs, judge)
    capacity = {(p.config.max_num_seqs, p.config.dtype): p.capacity for p in points}
    assert capacity[(8, "bf16")] > capacity[(2, "bf16")] > 0
    assert capacity[(8, "int4")] > capacity[(8, "fp8")] > capacity[(8, "bf16")]
    front = true_front(points)
    assert [(p.config.max_num_seqs, p.config.dtype) for p in front] == [(8, "int4"), (8, "fp8"), (8, "bf16")]
    assert [(p.config.dtype) for p in true_front(points, max_loss_nats=0.01)] == ["fp8", "bf16"]


def test_a_virtual_replay_records_what_the_model_says():
    model, requests = SimModel(slots=2, ttft_s=0.05, tpot_s=0.01), schedule(50)
    result = VirtualSend(model)("http://virtual", "m", requests, ReplayOptions())
    by_index = {r.index: r for r in result.records}
    for r, (arrival, first, end) in zip(requests, model.times(requests)):
        assert by_index[r.index].ttft_s == pytest.approx(first - arrival)
        assert by_index[r.index].e2e_s == pytest.approx(end - arrival)


SMALL_TRACE = [{"timestamp": round(i * 0.1, 3), "prompt": f"Question {i}: what is a queue?", "output_length": 8 + i % 9}
               for i in range(30)]


def sim_study(tmp_path, *, tpot_ms: int, tried: str):
    """`tune --trace` on SMALL_TRACE with the simulated engine: the reference and one trial (`tried`, its
    --try), in tmp_path/run; the finished process."""
    import json
    import os
    import subprocess

    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(line) + "\n" for line in SMALL_TRACE))
    args = ["--trace", str(trace), "--engine", "sim", "--trials", "1", "--study", "s", "--run-dir", str(tmp_path / "run"),
            "--slo", "ttft:p95<500ms", "--precision", "0.5", "--level-seconds", "1", "--level-lifetimes", "1",
            "--level-requests", "20", "--probe-prompts", "2", "--probe-tokens", "32", "--sim-tpot-ms", str(tpot_ms),
            "--try", tried]
    out = subprocess.run([sys.executable, "-m", "tracetune", *args], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


@pytest.mark.slow
def test_a_short_study_runs_end_to_end_on_the_simulated_engine(tmp_path):
    """`tune --trace --engine sim`: no model, the sim's own space, a capacity search and the quality probe
    on real servers. The fp8 trial's quality loss is the known one, and its capacity lies near the truth
    (the bracket is 50% wide; the live servers share this machine's cores with the client)."""
    import optuna

    from tracetune.replay.send import prepare
    from tracetune.replay.trace import load_trace

    out = sim_study(tmp_path, tpot_ms=5, tried='{"max_num_seqs": 32, "precision": "fp8"}')
    trace = tmp_path / "t.jsonl"
    assert "model" not in out.stdout.split("study s")[0]  # nothing was said of preparing a model
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 'run' / 'study.db'}")
    (trial,) = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert trial.params == {"max_num_seqs": 32, "precision": "fp8"}
    measured = dict(zip(["ttft_p99", "capacity", "quality_loss"], trial.values))
    assert measured["quality_loss"] == pytest.approx(0.004)
    options = CapacityOptions(slos=tuple(parse_slos("ttft:p95<500ms")), precision=0.5, level_seconds=1,
                              level_lifetimes=1, level_requests=20)
    requests = prepare(load_trace(trace), ReplayOptions())[2:]  # the 2 warm-up requests are not measured
    truth = true_capacity(requests, options, model_of(SimConfig(max_num_seqs=32, dtype="fp8", tpot_ms=5))).rps
    assert truth / 2 <= measured["capacity"] <= truth * 1.2, (measured, truth)
    assert (tmp_path / "run" / "best.json").is_file() and (tmp_path / "run" / "pareto.json").is_file()


@pytest.mark.slow
def test_tune_capacity_says_why_a_level_failed(tmp_path):
    """`tune capacity` names the cause of the level bounding the capacity (`capacity.causes`), with the
    configuration's slots as the simulated engine states them."""
    import json
    import os
    import subprocess

    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(line) + "\n" for line in SMALL_TRACE))
    args = ["capacity", "--engine", "sim", "--trace", str(trace), "--slo", "ttft:p95<300ms", "--max-num-seqs", "1",
            "--sim-tpot-ms", "5", "--level-seconds", "1", "--level-lifetimes", "1", "--level-requests", "20",
            "--precision", "0.5", "--out", str(tmp_path / "run"), "--json", str(tmp_path / "cap.json")]
    out = subprocess.run([sys.executable, "-m", "tracetune", *args], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    stored = json.loads((tmp_path / "cap.json").read_text())
    failed = [s for s in stored["steps"] if not s["passed"]]
    assert failed and all(s["cause"] for s in failed), failed
    assert "for 1 slot" in failed[-1]["cause"] and f"the trace's rate: {failed[-1]['cause']}" in out.stdout


@pytest.mark.slow
def test_a_trial_that_certainly_misses_the_slo_at_the_traces_rate_ends_there_unprobed(tmp_path):
    """Two slots against a request every 0.1 s of 0.4-0.8 s each: the trial's trace-rate level ends once
    its TTFT p95 is certainly past the SLO (well before its last request), its requests in flight cut, not
    failed; it is pruned there, and its quality is not probed (stored as none, its reason says so)."""
    import optuna

    from tracetune.tuner.storage import ResultStore

    out = sim_study(tmp_path, tpot_ms=50, tried='{"max_num_seqs": 2, "precision": "fp8"}')
    url = f"sqlite:///{tmp_path / 'run' / 'study.db'}"
    (trial,) = [t for t in optuna.load_study(study_name="s", storage=url).trials if t.number == 0]
    assert trial.user_attrs["status"] == "pruned", trial.user_attrs
    assert "TTFT p95 at least" in trial.user_attrs["failure_reason"]
    assert "its quality not probed" in trial.user_attrs["failure_reason"]
    row = ResultStore(url).trials("s", 0)[0]
    summary, (first, *_) = row["summary"], row["summary"]["capacity"]["steps"]
    assert row["quality"] is None and summary["errors"] == 0 and summary["ended"]
    assert first["decided_by"] == "SLO missed" and first["abandoned"] and first["requests"] < first["planned"]
    assert summary["cost"]["probe_s"] == 0.0
    assert "quality not probed: it missed the study's SLOs" in out.stdout


@pytest.mark.slow
def test_a_reference_that_misses_the_slo_at_the_traces_rate_is_measured_as_a_trial_would_be(tmp_path):
    """The reference (8 slots) at 200 ms a token against a request every 0.1 s misses TTFT p95 < 500 ms at
    the trace's rate: like a trial, its trace-rate level ends once that is certain, and its capacity search
    stops there (pruned, the bracket [0, 1x]) instead of searching the loads below, where no configuration
    that misses the trace's rate could be on the front. Its quality is still probed: the trials' texts are
    scored against it."""
    from tracetune.tuner.storage import REFERENCE_RUN, ResultStore

    out = sim_study(tmp_path, tpot_ms=200, tried='{"max_num_seqs": 2, "precision": "fp8"}')
    row = ResultStore(f"sqlite:///{tmp_path / 'run' / 'study.db'}").trials("s", REFERENCE_RUN)[0]
    summary = row["summary"]
    capacity = summary["capacity"]
    assert summary["ended"] and capacity["verdict"] == "pruned", capacity["verdict"]
    assert not capacity["capacity_scale"] and capacity["bracket_scale"][1] == 1.0
    assert {s["scale"] for s in capacity["steps"]} == {1.0}, [s["scale"] for s in capacity["steps"]]
    assert capacity["steps"][0]["decided_by"] == "SLO missed"
    assert row["quality"] is not None
    assert "  reference: pruned: fails 1x" in out.stdout
    assert "reference: TTFT p99 at least" in out.stdout
