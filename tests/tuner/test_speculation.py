"""Speculative decoding as data: acceptance in the results table, and speculation on random weights
flagged not meaningful and kept off the front (a scripted study: real database, real sampler)."""

from __future__ import annotations

import io

from rich.console import Console

from tests.reliability.scripted import make_tuner
from tracetune.cli.results import _front_table, spec_text
from tracetune.dashboard.export.front import _shown_diff
from tracetune.dashboard.trial import TrialView, config_diff
from tracetune.tuner.front import measured_trials, not_meaningful, pareto_trials, trials_outside_constraints

SPACE = """\
name: spec
fixed: {enforce_eager: true}
parameters:
  speculative: {choices: [none, ngram]}
  num_speculative_tokens: {low: 3, high: 3, when: {speculative: [ngram]}}
"""


def test_speculation_on_random_weights_is_not_meaningful():
    dummy = {"load_format": "dummy", "speculative": {"method": "ngram"}}
    assert "random weights" in not_meaningful(dummy)
    assert not_meaningful({**dummy, "speculative": {"method": "none"}}) is None
    assert not_meaningful({"speculative": {"method": "draft_model"}}) is None


def test_random_weight_speculation_is_measured_but_kept_off_the_front(tmp_path):
    # speculation measures faster, yet must not reach the front on random weights
    tuner = make_tuner(tmp_path, lambda c: (0.1, 500.0 if c.speculative.method == "ngram" else 100.0, 0.0),
                       space_yaml=SPACE, trials=2, base={"load_format": "dummy"},
                       enqueue=[{"speculative": "ngram", "num_speculative_tokens": 3}, {"speculative": "none"}])
    study = tuner.run()
    spec = next(t for t in study.trials if t.params.get("speculative") == "ngram")
    plain = next(t for t in study.trials if t.params.get("speculative") == "none")
    assert "not meaningful" in spec.user_attrs["not_meaningful"] and spec.user_attrs["feasible"] is False
    assert [t.number for t in pareto_trials(study)] == [plain.number]
    assert spec.number not in {t.number for t in measured_trials(study)}
    assert trials_outside_constraints(study) == 0  # not counted as breaking the SLO or the gate
    row = tuner.store.trials("s", spec.number)[0]
    assert row["status"] == "measured" and row["failure_reason"].startswith("not meaningful")


def test_the_table_shows_acceptance_compactly_at_80_columns():
    engine = {"spec_decode_drafts": 20.0, "spec_decode_draft_tokens": 80.0, "spec_decode_accepted_tokens": 30.0}
    assert spec_text(engine) == "38% x2.5"
    assert spec_text({"spec_decode_drafts": 0.0}) == "-" and spec_text(None) == "-"
    ref = {"model": "/m", "speculative": {"method": "none"}}
    cfg = {"model": "/m", "speculative": {"method": "draft_model", "num_speculative_tokens": 4,
                                          "draft_model": "/cache/drafts/m-layers-4-0123456789ab"}}
    view = TrialView(number=3, state="COMPLETE", status="measured", objective_values={"output_tps": 12.0},
                     constraints=[], feasible=True, params={"draft_model": "derived:layers-4"}, config=cfg,
                     diff=config_diff(cfg, ref, "vllm"))
    diff = _shown_diff(view)
    assert diff["draft_model"] == "derived:layers-4"
    trial = {"trial": 3, "values": {"output_tps": 12.0}, "config": cfg, "differs_from_reference": diff,
             "summary": {"engine": engine}, "quality": {}, "capacity": None, "economics": {}}
    reference = {"trial": "reference", "values": {"output_tps": 10.0}, "config": ref, "differs_from_reference": {},
                 "summary": {}, "quality": {}, "capacity": None, "economics": {}}
    out = io.StringIO()
    Console(file=out, width=80).print(_front_table([reference, trial], ["output_tps"], "s", 1, {}))
    text = out.getvalue()
    assert "38% x2.5" in text and "draft accepted: share of draft tokens" in text
    assert max(map(len, text.splitlines())) <= 80
