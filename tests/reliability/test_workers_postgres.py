"""Two `tune` workers share one study through a real PostgreSQL server (started here), each
starting its own engines (the simulated engine's live servers: the study loop is what is tested) on
its own port. Both are asked to try the same configurations first: the reference and every
configuration are measured once, both workers measure trials, and the front each worker prints is
computed from both workers' trials."""

from __future__ import annotations

import json

import optuna
import pytest

from tests.reliability.engines import FAST, TRACE, Tune, gone_within, new_tag
from tests.reliability.pg import postgres_url  # noqa: F401 - fixture
from tracetune.engine_adapter.process import free_port
from tracetune.tuner.coordination import config_key, counted, make_storage
from tracetune.tuner.storage import ResultStore

pytestmark = pytest.mark.slow

SPACE = """\
name: workers
fixed: {precision: fp8}  # faster than the reference (8 slots, bf16), within the quality gate
parameters:
  max_num_seqs: {choices: [2, 4, 8, 16]}
"""


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory, postgres_url):  # noqa: F811
    root = tmp_path_factory.mktemp("workers")
    (root / "space.yaml").write_text(SPACE)
    tag = new_tag()
    workers = []
    for i, name in enumerate(("a", "b")):
        args = ["--trace", str(TRACE), "--engine", "sim", "--space", str(root / "space.yaml"), "--trials", "2",
                "--study", "shared", "--storage", postgres_url, "--run-dir", str(root / name), *FAST, "--sampler", "random",
                "--seed", str(i), "--heartbeat", "5", "--engine-port", str(free_port()),
                "--try", '{"max_num_seqs": 2}', "--try", '{"max_num_seqs": 16}',
                # Two engines and two replay clients share this machine's cores: a users' SLO (a loose one)
                # sets the schedule-lag bound relative to it (replay.metrics.lag_bound_s), instead of the
                # 10 ms of a replay without SLO that a starved client missed once (12 ms: "unmeasurable").
                "--slo", "ttft:p99<60s", "--objectives", "ttft_p99,output_tps,quality_loss"]
        (root / name).mkdir()
        workers.append(Tune(args, root / f"{name}.log", env={"TRACETUNE_TEST_TAG": tag}))  # its engines inherit it
    codes = [w.wait(1200) for w in workers]
    study = optuna.load_study(study_name="shared", storage=make_storage(postgres_url, 5))
    return {"codes": codes, "outputs": [w.output() for w in workers], "study": study, "root": root,
            "rows": ResultStore(postgres_url).trials("shared"), "cleanup_s": gone_within(tag, 30)}


def test_both_workers_finish(two_workers):
    for code, out in zip(two_workers["codes"], two_workers["outputs"]):
        assert code == 0, out[-3000:]
    assert two_workers["cleanup_s"] is not None
    assert counted(two_workers["study"]) == 2


def test_reference_measured_once(two_workers):
    outputs = two_workers["outputs"]
    assert sum("(unquantized, auto KV cache, no speculation): measuring" in o for o in outputs) == 1
    assert sum("reusing the study's stored reference" in o for o in outputs) == 1
    assert sum((two_workers["root"] / name / "reference").is_dir() for name in ("a", "b")) == 1


def test_no_configuration_measured_twice(two_workers):
    measured = [r for r in two_workers["rows"] if r["status"] in ("measured", "engine_failed")]
    keys = [config_key(r["config"]) for r in measured]
    assert len(keys) == len(set(keys)) == 2
    # Engines started for trials, over both workers: one per measured configuration.
    started = [d for name in ("a", "b") for d in (two_workers["root"] / name).glob("trial-*") if any(d.glob("*.log"))]
    assert len(started) == len(measured)


def test_both_workers_trials_are_in_the_front(two_workers):
    study = two_workers["study"]
    measured = [t for t in study.trials if t.user_attrs.get("status") == "measured"]
    assert len({t.user_attrs["worker"] for t in measured}) == 2  # each worker measured a trial
    fronts = []
    for name in ("a", "b"):
        pareto = json.loads((two_workers["root"] / name / "pareto.json").read_text())
        # the engine's defaults compete on the front too (a row "reference"); the trials are what is compared
        fronts.append({row["trial"] for row in pareto["trials"] if row["trial"] != "reference"})
    # Each worker waited for the other's last trial, so both computed the front over all trials.
    assert fronts[0] == fronts[1] and fronts[0] <= {t.number for t in measured}
    on_front = {t.user_attrs["worker"] for t in measured if t.number in fronts[0]}
    print(f"front {sorted(fronts[0])}; workers with a trial on it: {len(on_front)} of 2")
