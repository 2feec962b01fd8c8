"""The study's search on a scripted engine (no vLLM): --timeout and --patience stop it, presets and a
warm start choose its first trials, a capacity search stops early where the trial cannot reach the
front; and the engine runner's own decisions (more client processes for an overloaded replay, one
quality probe per quality key)."""

from __future__ import annotations

import json

import pytest

from tests.reliability.scripted import REFERENCE, SEQS, TRACE, Events, fake_quality, fake_summary, make_tuner
from tests.reliability.test_study_logic import good_unless_one
from tracetune.engine_adapter.platform import Platform
from tracetune.engine_adapter.registry import engine_kind
from tracetune.replay.trace import load_trace
from tracetune.replay.types import ReplayOptions
from tracetune.tuner.coordination import counted
from tracetune.tuner.measure import QUALITY_SKIPPED, EngineRunner
from tracetune.tuner.runner import Measurement
from tracetune.tuner.settings import StudySettings
from tracetune.tuner.storage import ResultStore


def engine_runner(tmp_path, slos=(), **settings) -> EngineRunner:
    """The engine-backed runner of a study on the scripted trace (no engine is started)."""
    (tmp_path / "trace.jsonl").write_text(TRACE)
    study = StudySettings(study_name="s", storage_url=f"sqlite:///{tmp_path / 'study.db'}", trials=1,
                          objectives=["ttft_p99", "output_tps", "quality_loss"], slos=list(slos), max_quality_loss=None,
                          sampler="random", seed=0, replay=ReplayOptions(), **settings)
    return EngineRunner(study, trace=load_trace(tmp_path / "trace.jsonl"), engine=engine_kind("vllm"),
                        platform=Platform.CPU, run_dir=tmp_path / "run")


def test_an_overloaded_trace_rate_replay_is_sent_again_by_more_client_processes(tmp_path, monkeypatch):
    """Twice the processes each time, within the cores the engine leaves (8 cores, engine on 2)."""
    import tracetune.tuner.measure as study_module

    runner = engine_runner(tmp_path, client_procs=1)
    sent_by = []

    def scripted_replay(*args, client_procs=1, **kwargs):
        sent_by.append(client_procs)
        return client_procs

    def scripted_summary(procs, slos):
        summary = fake_summary(0.1, 10.0)
        summary.client_overloaded = procs < 4
        summary.schedule_lag = {"p50": 0.0, "p99": 0.5 if procs < 4 else 0.001, "max": 1.0}
        return summary

    monkeypatch.setattr(study_module, "replay", scripted_replay)
    monkeypatch.setattr(study_module, "summarize", scripted_summary)
    monkeypatch.setattr(study_module, "settle", lambda *a, **k: None)
    monkeypatch.setattr("tracetune.replay.client_procs.cores", lambda: 8)

    class Server:
        endpoint = type("E", (), {"base_url": "http://x", "model": "m"})()

    result, summary = runner._trace_rate_replay(Server(), "trial-0000", engine_cores=2)
    assert sent_by == [1, 2, 4] and result == 4 and not summary.client_overloaded
    sent_by.clear()
    monkeypatch.setattr("tracetune.replay.client_procs.cores", lambda: 4)  # two cores free: 1, 2, 2 again, no more
    result, summary = runner._trace_rate_replay(Server(), "trial-0000", engine_cores=2)
    assert sent_by == [1, 2, 2] and summary.client_overloaded


def test_quality_is_measured_once_per_quality_key_and_reused(tmp_path, monkeypatch):
    """A config differing from a measured one only in batching knobs reuses its stored quality (from
    the database: another worker's, or before a resume); a different KV-cache precision is measured."""
    import tracetune.tuner.measure as study_module
    from tracetune.engine_adapter.vllm.server import VLLMConfig

    tuner = make_tuner(tmp_path, lambda c: (0.1, 10.0, 0.0), space_yaml=SEQS)
    tuner.ref.reference = REFERENCE
    runner = engine_runner(tmp_path)

    def server(endpoint):  # an engine that serves prompt log-probabilities
        return type("S", (), {"endpoint": endpoint, "quality_probe": True, "scoring": "prompt_logprobs"})()

    def quality(endpoint, config, label):  # the runner's probe, with what the study knows now
        return runner._quality(server(endpoint) if endpoint else None, config, label, tuner.ref.probe())[0]

    measured = []
    monkeypatch.setattr(study_module, "measure_candidate", lambda endpoint, ref, **_: measured.append(endpoint)
                        or fake_quality(0.3))
    first = VLLMConfig(model=tmp_path / "model", max_num_seqs=4)
    tuner.store.save_trial("s", 0, "measured", config=json.loads(first.model_dump_json()),
                           quality=quality("server-0", first, "trial-0000").as_dict())
    again = quality(None, VLLMConfig(model=tmp_path / "model", max_num_seqs=64), "trial-0001")
    assert again.reused_from == 0 and measured == ["server-0"]
    fp8 = quality("server-2", VLLMConfig(model=tmp_path / "model", max_num_seqs=4, kv_cache_dtype="fp8"), "trial-0002")
    assert fp8.reused_from is None and measured == ["server-0", "server-2"] and fp8.key != again.key


def test_a_study_stopped_by_its_timeout_says_so(tmp_path):
    """--timeout stops starting new trials; the reporter hears how many were done (it used to say nothing)."""
    events = Events()
    tuner = make_tuner(tmp_path, good_unless_one, space_yaml=SEQS, trials=4, timeout_s=0.0, events=events)
    tuner.run()
    assert ("timeout", {"limit_s": 0.0, "done": 0, "trials": 4}) in events
    assert tuner.calls == ["reference"]  # the reference, and no trial after the deadline


def test_patience_stops_the_study_once_the_front_stops_changing(tmp_path):
    """--patience 2: the first trial (max_num_seqs 1) beats vLLM's defaults on every objective; the next
    two are dominated by it, so the front is unchanged twice and the study stops at 3 of 8 trials."""
    events = Events()
    tuner = make_tuner(tmp_path, lambda c: (0.1 * c.max_num_seqs, 100.0 / c.max_num_seqs, 0.0), space_yaml=SEQS,
                       trials=8, enqueue=[{"max_num_seqs": 1}, {"max_num_seqs": 2}, {"max_num_seqs": 4}], patience=2,
                       events=events)
    study = tuner.run()
    assert ("converged", {"patience": 2, "done": 3, "trials": 8}) in events
    assert counted(study) == 3 and tuner.calls == ["reference", "trial-0000", "trial-0001", "trial-0002"]
    assert tuner.front_labels(study) == {0}


BITS = """\
name: bits
fixed: {enforce_eager: true}
parameters:
  weight_bits: {choices: [16, 8]}
  max_num_seqs: {choices: [2, 4, 8]}
"""


def test_presets_run_first_within_the_trials_left_after_the_users_tries(tmp_path):
    """8-bit weights is tried first (the space offers it); a --try value comes before it; with no
    room left after the --try values, no preset is queued (nothing would be left waiting)."""
    events = Events()
    tuner = make_tuner(tmp_path, lambda c: (0.1, 10.0, 0.0), space_yaml=BITS,
                       trials=3, enqueue=[{"weight_bits": 16, "max_num_seqs": 2}], events=events)
    study = tuner.run()
    assert ("presets", {"configs": [{"max_num_seqs": 8, "weight_bits": 8}]}) in events  # vLLM-like batch limit
    values = [t.user_attrs["values"] for t in sorted(study.trials, key=lambda t: t.number)]
    assert values[0] == {"weight_bits": 16, "max_num_seqs": 2} and values[1]["weight_bits"] == 8

    (tmp_path / "full").mkdir()
    events.clear()
    full = make_tuner(tmp_path / "full", lambda c: (0.1, 10.0, 0.0), space_yaml=BITS, trials=1,
                      enqueue=[{"weight_bits": 16, "max_num_seqs": 2}], events=events)
    done = full.run()
    assert not [e for e in events if e[0] == "presets"] and len(done.trials) == 1


def test_a_warm_start_tries_the_earlier_studys_best_configurations_first(tmp_path):
    """Study "a" measures max_num_seqs 2, 4, 8 (8 is best on output tok/s, 2 on latency: both on its
    front); study "b" on another trace starts with a's front, then the rest, all measured again."""
    script = lambda c: (0.1 * c.max_num_seqs, 10.0 * c.max_num_seqs, 0.0)  # noqa: E731
    first = make_tuner(tmp_path, script, space_yaml=SEQS, study="a", trials=3,
                       enqueue=[{"max_num_seqs": 2}, {"max_num_seqs": 4}, {"max_num_seqs": 8}])
    first.run()
    calls = []
    events = Events()
    second = make_tuner(tmp_path, script, space_yaml=SEQS, study="b", trials=2, calls=calls, events=events)
    second.settings.warm_start = (second.settings.storage_url, "a")
    study = second.run()
    warm = next(f["configs"] for e, f in events if e == "warm_start")
    assert warm == [{"max_num_seqs": 2}, {"max_num_seqs": 4}]  # room for 2 of a's 3, front first
    assert [t.user_attrs["values"] for t in study.trials] == warm
    assert calls == ["reference", "trial-0000", "trial-0001"]  # measured again, not reused

    from tracetune.errors import InputError

    other = make_tuner(tmp_path, script, space_yaml=SEQS, study="c", trials=1)
    other.settings.warm_start = (other.settings.storage_url, "nope")
    with pytest.raises(InputError, match="--warm-start: no study 'nope'"):
        other.run()


def capacity_tuner(tmp_path, truth, *, trials: int, enqueue: list, prune: bool = True, events: Events | None = None,
                   rules: str = "classic", level_records=None, loss=lambda config: 0.0, skip_unfit_probe: bool = False,
                   gate=None):
    """A study with capacity as an objective whose engine is scripted: `truth(config or None)` ->
    (TTFT p99 s, true capacity k); a level passes when it is at most k. The capacity search, the
    early stop and everything the Tuner does with them are real. `rules`: the search's (classic by
    default: these tests pin its levels; the guided rules' are tested where named). `level_records(scale,
    passed)`: each level's request records, handed to the study as the levels measured (none by default).
    `loss(config)`: a trial's quality loss (the reference's is 0). `skip_unfit_probe`: a trial missing
    the SLO at 1x comes back unprobed, as `EngineRunner` returns it. `gate`: the study's quality gate;
    a trial outside it is searched no further than 1x, as `EngineRunner._outside_gate` decides."""
    from tracetune.capacity.search import search_capacity
    from tracetune.capacity.step import CapacityOptions, Step
    from tracetune.replay.metrics import parse_slos
    from tracetune.tuner.objectives import outside_gate
    slos = parse_slos("ttft:p99<2s")
    capacity = CapacityOptions(slos=tuple(slos), precision=0.1, rules=rules)
    levels: dict[str, list[float]] = {}

    def measure(config, label, *, probe, start=1.0, prune=None):
        ttft, true_k = truth(None if label == "reference" else config)
        summary, quality = fake_summary(ttft, 10.0), fake_quality(0.0 if label == "reference" else loss(config))
        skipped = QUALITY_SKIPPED if skip_unfit_probe and label != "reference" and ttft >= 2.0 else ""
        quality = None if skipped else quality

        measured = []

        def level(scale, repeat):
            levels.setdefault(label, []).append(scale)
            ok = scale <= true_k
            if level_records is not None:
                measured.append((scale, repeat, level_records(scale, ok)))
            return Step(scale=scale, rps=2.0 * scale, output_tps=64.0 * scale, attainment=1.0 if ok else 0.5,
                        passed=ok, abandoned=not ok, requests=20, planned=20, good=20 if ok else 10, duration_s=1.0,
                        repeat=repeat)

        prune_at = prune(summary, quality, 1, 2.0) if prune else None
        seeds_only = prune and label != "reference" and bool(outside_gate(quality, gate))
        result = search_capacity(level, capacity, seed_steps=[level(1.0, False)], base_rates=(2.0, 64.0),
                                 prune_at=prune_at, seeds_only=seeds_only)
        summary.capacity = result.as_dict()
        return Measurement(summary=summary, quality=quality, startup_s=1.0, levels=tuple(measured),
                           reference=REFERENCE if label == "reference" else None, quality_skipped=skipped)

    runner = type("CapacityRunner", (), {"measure": staticmethod(measure)})()
    tuner = make_tuner(tmp_path, lambda c: None, space_yaml=SEQS, trials=trials, enqueue=enqueue, slos=slos,
                       objectives=["ttft_p99", "capacity", "quality_loss"], capacity=capacity, prune=prune,
                       runner=runner, events=events)
    tuner.settings.max_quality_loss = gate
    tuner.levels = levels  # type: ignore[attr-defined]
    return tuner


def test_a_trial_that_cannot_reach_the_front_is_pruned_early_with_its_steps_kept(tmp_path):
    """vLLM's defaults: TTFT 0.5 s, capacity 2x. max_num_seqs 1 is slower (0.6 s) and carries 1.2x: it
    fails 2x (where the defaults pass) twice and is pruned. 4 is faster (0.4 s) and carries 3x: searched to
    the end. 8 is slower than 4 (0.45 s) and carries 2.5x: it fails trial 1's capacity (where trial 1 passes),
    pruned."""
    truth = {None: (0.5, 2.0), 1: (0.6, 1.2), 4: (0.4, 3.0), 8: (0.45, 2.5)}
    events = Events()
    tuner = capacity_tuner(tmp_path, lambda c: truth[c and c.max_num_seqs], trials=3,
                           enqueue=[{"max_num_seqs": 1}, {"max_num_seqs": 4}, {"max_num_seqs": 8}], events=events)
    study = tuner.run()
    trials = sorted(study.trials, key=lambda t: t.number)
    assert [t.user_attrs["status"] for t in trials] == ["pruned", "measured", "pruned"]
    assert counted(study) == 3  # a pruned trial used the engine: it counts toward --trials
    assert tuner.levels["trial-0000"] == [1.0, 2.0, 2.0]  # the trace's rate, the prune level and its repeat
    assert len(tuner.levels["trial-0001"]) > 3  # searched to the end: capacity 2.83x (precision 10%)
    rival = trials[1].values[1] / 2.0
    assert 2.5 < rival <= 3.0 and tuner.levels["trial-0002"][1:] == [rival, rival]
    assert "where vLLM's defaults pass and are at least as good on ttft_p99" in trials[0].user_attrs["failure_reason"]
    assert "where trial 1 passes" in trials[2].user_attrs["failure_reason"]
    assert [f["number"] for e, f in events if e == "trial_pruned"] == [0, 2]
    # The sampler sees its values (capacity: what it is known to carry, the trace's rate of 2 req/s);
    # the front never takes it.
    assert trials[0].values[1] == trials[2].values[1] == pytest.approx(2.0)
    assert tuner.front_labels(study) == {1}
    stored = {r["trial_number"]: r for r in ResultStore(tuner.settings.storage_url).trials("s")}
    assert stored[0]["status"] == "pruned" and stored[0]["summary"]["capacity"]["verdict"] == "pruned"
    assert [s["scale"] for s in stored[2]["summary"]["capacity"]["steps"]] == [1.0, rival, rival]


def test_a_pruned_trials_stored_reason_names_why_its_level_failed(tmp_path):
    """max_num_seqs 1 fails 2x, where vLLM's defaults pass: at 2x about 14 requests are in flight for its one
    slot, their TTFT 5 s against 2 s; the stored reason, the console's line and the stored steps say so."""
    from tests.capacity.test_causes import records

    truth = {None: (0.5, 2.0), 1: (0.6, 1.2)}
    events = Events()
    tuner = capacity_tuner(tmp_path, lambda c: truth[c and c.max_num_seqs], trials=1, enqueue=[{"max_num_seqs": 1}],
                           events=events, level_records=lambda scale, ok: records(ttft_s=0.3 if ok else 5.0))
    study = tuner.run()
    trial = next(t for t in study.trials if t.number == 0)
    assert trial.user_attrs["status"] == "pruned"
    said = "At 2x: at least 14 requests in flight for 1 slot: TTFT is the wait for a slot (TTFT p50 5 s"
    assert said in trial.user_attrs["failure_reason"]
    assert said in next(f["reason"] for e, f in events if e == "trial_pruned")
    stored = ResultStore(tuner.settings.storage_url).trials("s", 0)[0]
    assert stored["failure_reason"] == trial.user_attrs["failure_reason"]
    steps = stored["summary"]["capacity"]["steps"]
    slot_wait = "at least 14 requests in flight for 1 slot"  # an abandoned level kept its finished requests
    assert [s["cause"].split(":")[0] for s in steps] == ["", slot_wait, slot_wait]  # 1x passed; 2x, its repeat failed


def test_guided_rules_prune_on_a_clear_fail_without_a_repeat(tmp_path):
    """The same study under the guided rules: a fail at the prune level with half its requests missed
    is clear (its attainment interval lies under the target), so it is not measured again."""
    truth = {None: (0.5, 2.0), 1: (0.6, 1.2)}
    tuner = capacity_tuner(tmp_path, lambda c: truth[c and c.max_num_seqs], trials=1,
                           enqueue=[{"max_num_seqs": 1}], rules="guided")
    study = tuner.run()
    trial = next(t for t in study.trials if t.number == 0)
    assert trial.user_attrs["status"] == "pruned"
    assert tuner.levels["trial-0000"] == [1.0, 2.0]  # the trace's rate and the prune level, no repeat
    stored = {r["trial_number"]: r for r in ResultStore(tuner.settings.storage_url).trials("s")}
    prune_level = stored[0]["summary"]["capacity"]["steps"][-1]
    assert prune_level["repeat_rule"].startswith("clear fail")
    assert "(a clear fail, so not repeated)" in trial.user_attrs["failure_reason"]


def test_no_prune_searches_every_trial_to_the_end(tmp_path):
    truth = {None: (0.5, 2.0), 1: (0.6, 1.2)}
    tuner = capacity_tuner(tmp_path, lambda c: truth[c and c.max_num_seqs], trials=1,
                           enqueue=[{"max_num_seqs": 1}], prune=False)
    study = tuner.run()
    assert study.trials[0].user_attrs["status"] == "measured"
    assert len(tuner.levels["trial-0000"]) > 3


def test_a_trial_that_misses_the_slo_at_the_traces_rate_stops_where_it_fails_it(tmp_path):
    """max_num_seqs 1 misses the study's SLO at the trace's rate (TTFT p99 3 s against 2 s) and fails 1x;
    its quality measured a hair better than the defaults', so no incumbent is at least as good on every other
    objective. It is infeasible whatever its capacity: the search stops at 1x (and its repeat) instead of
    going down. 2 misses the SLO too but passes 1x (capacity 1.5x): searched as usual."""
    truth = {None: (0.5, 2.0), 1: (3.0, 0.3), 2: (3.0, 1.5)}
    tuner = capacity_tuner(tmp_path, lambda c: truth[c and c.max_num_seqs], trials=2,
                           enqueue=[{"max_num_seqs": 1}, {"max_num_seqs": 2}], loss=lambda config: -0.0004)
    study = tuner.run()
    trials = sorted(study.trials, key=lambda t: t.number)
    assert [t.user_attrs["status"] for t in trials] == ["pruned", "measured"]
    assert tuner.levels["trial-0000"] == [1.0, 1.0]  # the trace's rate and its repeat, nothing below
    reason = trials[0].user_attrs["failure_reason"]
    assert "pruned: fails 1x the trace's rate (confirmed by a repeat), and misses the study's SLOs there: " \
        "TTFT p99 3 s against 2 s: it cannot be on the front" in reason, reason
    assert len(tuner.levels["trial-0001"]) > 3 and max(tuner.levels["trial-0001"]) > 1.0
    assert tuner.front_labels(study) == {"reference"}


def test_a_trial_unprobed_for_missing_the_slo_is_pruned_with_a_penalty_and_no_stored_quality(tmp_path):
    """The runner skipped the probe of the trial missing its SLO at 1x (its quality could not put it on
    the front): the study stores no quality for it, tells its sampler the worst quality measured so far
    (not NaN, which would fail the trial), and says so in its pruned reason."""
    truth = {None: (0.5, 2.0), 1: (3.0, 0.3), 2: (0.3, 1.5)}
    tuner = capacity_tuner(tmp_path, lambda c: truth[c and c.max_num_seqs], trials=2,
                           enqueue=[{"max_num_seqs": 2}, {"max_num_seqs": 1}], loss=lambda config: 0.02,
                           skip_unfit_probe=True)
    study = tuner.run()
    measured, unprobed = sorted(study.trials, key=lambda t: t.number)
    assert [measured.user_attrs["status"], unprobed.user_attrs["status"]] == ["measured", "pruned"]
    assert unprobed.user_attrs["failure_reason"].split(". At")[0].endswith("; its quality not probed")
    assert unprobed.values[2] == pytest.approx(0.02)  # trial 0's loss, the worst measured so far
    row = tuner.store.trials("s", unprobed.number)[0]
    assert row["quality"] is None and row["summary"] is not None


def test_the_probe_is_skipped_only_where_no_quality_could_change_the_trials_standing(tmp_path, monkeypatch):
    """`EngineRunner._probe_if_it_counts`: a trial that missed the study's SLOs at the trace's rate is not
    probed; one that kept them is, and so are the reference, a trial whose level measured a busy machine
    (measured again), one whose quality key was already probed (reused for free), and every trial
    under --no-prune."""
    import dataclasses

    import tracetune.tuner.measure as measure_module
    from tracetune.engine_adapter.vllm.server import VLLMConfig
    from tracetune.replay.metrics import parse_slos
    from tracetune.tuner.measure import _Run
    from tracetune.tuner.runner import QualityProbe

    runner = engine_runner(tmp_path)
    runner.settings = dataclasses.replace(runner.settings, slos=parse_slos("ttft:p99<2s"))
    probed: list[str] = []
    monkeypatch.setattr(EngineRunner, "_probe", lambda self, server, config, run: probed.append(run.label))
    config = VLLMConfig(model=tmp_path / "model")
    trial_probe = QualityProbe(reference=REFERENCE)

    def decide(label: str, ttft_s: float, probe: QualityProbe, *, counted: bool = True) -> bool:
        run = _Run(label=label, probe=probe, summary=fake_summary(ttft_s, 10.0))
        runner._probe_if_it_counts(None, config, run, counted=counted)
        return label in probed and not run.quality_skipped

    assert not decide("missed", 3.0, trial_probe)
    assert decide("kept", 1.0, trial_probe)
    assert decide("reference", 3.0, QualityProbe())
    assert decide("busy", 3.0, trial_probe, counted=False)
    assert decide("known", 3.0, dataclasses.replace(trial_probe, known=lambda key: (0, {})))
    runner.settings = dataclasses.replace(runner.settings, prune=False)
    assert decide("no-prune", 3.0, trial_probe)
    assert measure_module.keeps_slos(fake_summary(1.0, 10.0), runner.settings.slos)


def test_without_the_slo_stop_the_same_trial_is_searched_below_the_traces_rate(tmp_path):
    """The control of the test above: with the SLO met at 1x (TTFT 1 s), nothing stops the search of a trial
    no incumbent rivals; it goes below the trace's rate to find 0.3x."""
    truth = {None: (0.5, 2.0), 1: (1.0, 0.3)}
    tuner = capacity_tuner(tmp_path, lambda c: truth[c and c.max_num_seqs], trials=1,
                           enqueue=[{"max_num_seqs": 1}], loss=lambda config: -0.0004)
    study = tuner.run()
    assert study.trials[0].user_attrs["status"] == "measured"
    assert min(tuner.levels["trial-0000"]) < 0.5


def test_a_trial_outside_the_quality_gate_is_measured_at_the_traces_rate_only(tmp_path):
    """A faster trial (TTFT 0.3 s, 1.5x) whose loss, 0.02 nats on its whole interval, is past the gate's
    0.01: infeasible whatever its capacity, so its search ends after the trace's rate, pruned with the
    gate's words, its capacity a lower bound (1x: the trace's 2 req/s). Its twin within the gate (0.004
    nats) is searched to the end."""
    from tracetune.quality.gate import QualityGate

    truth = {None: (0.5, 2.0), 1: (0.3, 1.5), 2: (0.3, 1.5)}
    tuner = capacity_tuner(tmp_path, lambda c: truth[c and c.max_num_seqs], trials=2,
                           enqueue=[{"max_num_seqs": 1}, {"max_num_seqs": 2}], gate=QualityGate("nats", 0.01),
                           loss=lambda config: 0.02 if config.max_num_seqs == 1 else 0.004)
    study = tuner.run()
    outside, within = sorted(study.trials, key=lambda t: t.number)
    assert tuner.levels["trial-0000"] == [1.0] and len(tuner.levels["trial-0001"]) > 2
    assert [outside.user_attrs["status"], within.user_attrs["status"]] == ["pruned", "measured"]
    reason = outside.user_attrs["failure_reason"]
    assert reason.startswith("pruned: outside the quality gate nats<=0.01"), reason
    assert "capacity [2, -) req/s, not searched beyond the trace's rate" in reason, reason
    assert outside.values[1] == pytest.approx(2.0)  # what it is known to carry
    stored = tuner.store.trials("s", outside.number)[0]["summary"]["capacity"]
    assert stored["verdict"] == "pruned" and stored["bracket_scale"] == [1.0, None]
    from tracetune.capacity.result import CapacityResult

    assert CapacityResult.from_dict(stored).headline().startswith("capacity at least 2 req/s = 1x the trace's rate")


def test_the_search_stops_at_the_traces_rate_only_for_a_trial_clearly_outside_the_gate(tmp_path):
    """`EngineRunner._outside_gate`: a trial whose whole quality interval lies past the gate; not one within
    it or undecided (its interval reaches both sides), not the reference, none under --no-prune or without
    a gate."""
    import dataclasses

    from tracetune.quality.gate import QualityGate
    from tracetune.replay.metrics import Estimate
    from tracetune.tuner.measure import _Run

    runner = engine_runner(tmp_path)
    runner.settings = dataclasses.replace(runner.settings, max_quality_loss=QualityGate("nats", 0.01))

    def stops(label: str, loss: float, low: float | None = None) -> bool:
        quality = dataclasses.replace(fake_quality(loss), nll_delta_per_token=Estimate(loss, low or loss, loss))
        return bool(runner._outside_gate(_Run(label=label, probe=None, quality=quality)))

    assert stops("outside", 0.02)
    assert not stops("within", 0.004)
    assert not stops("undecided", 0.02, low=0.005)
    assert not stops("reference", 0.02)
    assert not runner._outside_gate(_Run(label="unprobed", probe=None))
    runner.settings = dataclasses.replace(runner.settings, prune=False)
    assert not stops("no-prune", 0.02)
    runner.settings = dataclasses.replace(runner.settings, prune=True, max_quality_loss=None)
    assert not stops("no gate", 0.02)


def test_the_reference_stops_at_1x_only_where_a_counted_level_missed_the_slo(tmp_path):
    """`EngineRunner._prune_at` for the reference: 1x (its search stops there, as a trial's would)
    only where its trace-rate level missed the study's SLOs, measured the engine (not the client, not
    a busy machine) and pruning is on; a trial's comes from the study's rule."""
    from tracetune.capacity.result import Step
    from tracetune.replay.metrics import parse_slos
    from tracetune.tuner.front import REFERENCE as REFERENCE_LABEL
    from tracetune.tuner.measure import _Run

    def prune_at(summary, seed, *, prune=True, label=REFERENCE_LABEL, rule=None):
        runner = engine_runner(tmp_path, slos=parse_slos("ttft:p99<1s"), prune=prune)
        run = _Run(label=label, probe=None, summary=summary)
        return runner._prune_at(run, seed, rule, 1, 1.0)

    missed, kept = fake_summary(2.0, 10.0), fake_summary(0.5, 10.0)
    failed = Step(scale=1.0, passed=False)
    assert prune_at(missed, failed) == 1.0
    assert prune_at(kept, failed) is None  # it kept the SLO: its search goes on
    assert prune_at(missed, failed, prune=False) is None  # --no-prune searches below 1x
    assert prune_at(missed, Step(scale=1.0, passed=False, client_overloaded=True)) is None
    assert prune_at(missed, Step(scale=1.0, passed=False, machine_busy="busy")) is None
    # A level measured on a busy machine is measured again first, whatever it read.
    assert prune_at(missed, Step(scale=1.0, passed=True, machine_busy="busy")) is None
    overloaded = fake_summary(2.0, 10.0)
    overloaded.client_overloaded = True  # the summary measured the client, not the engine
    assert prune_at(overloaded, failed) is None
    # A trial's stop is the study's rule (`tuner.incumbents.prune_rival`), whatever its SLOs.
    assert prune_at(missed, failed, label="trial-0001", rule=lambda *a: 2.5) == 2.5
    assert prune_at(missed, failed, label="trial-0001") is None
