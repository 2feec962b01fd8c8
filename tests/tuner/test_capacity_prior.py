"""Where a trial's capacity search starts (`tuner.capacity_prior`): the reference's capacity until
trials are measured, then the capacities of the trials nearest in knob values."""

from __future__ import annotations

import math

import pytest

from tracetune.search_spaces.space import SearchSpace
from tracetune.tuner.capacity_prior import CapacityPrior, stands_for

SPACE = SearchSpace.model_validate({"parameters": {"max_num_seqs": {"low": 4, "high": 64, "log": True},
                                                   "weight_bits": {"choices": [16, 8, 4]},
                                                   "speculative": {"choices": ["none", "ngram"]}}})


def capacity(scale: float, high: float | None = None, verdict: str = "ok") -> dict[str, object]:
    return {"capacity_scale": scale, "bracket_scale": [scale, high], "verdict": verdict}


def test_without_trials_the_reference_capacity_is_the_start():
    prior = CapacityPrior(SPACE, fallback=2.5)
    assert prior.start({"max_num_seqs": 8}) == (2.5, "the reference's capacity")


def test_the_nearest_trials_predict_the_start():
    prior = CapacityPrior(SPACE, fallback=2.0)
    prior.add(0, {"max_num_seqs": 8, "weight_bits": 16, "speculative": "none"}, capacity(1.0, 1.05), 0.125)
    prior.add(1, {"max_num_seqs": 64, "weight_bits": 16, "speculative": "none"}, capacity(6.0, 6.3), 0.125)
    near_small, why = prior.start({"max_num_seqs": 8, "weight_bits": 16, "speculative": "none"})
    near_large, _ = prior.start({"max_num_seqs": 48, "weight_bits": 16, "speculative": "none"})
    assert near_small < near_large
    assert 1.0 <= near_small < 2.0 and "trial 0" in why
    assert 4.0 < near_large <= 6.0


def test_a_pruned_trial_stands_for_the_middle_of_its_bracket():
    assert stands_for(capacity(0.0, 2.0, "pruned"), 0.125) == pytest.approx(math.sqrt(0.125 * 2.0))
    assert stands_for(capacity(1.0, 2.0, "pruned"), 0.125) == pytest.approx(math.sqrt(2.0))
    assert stands_for(capacity(0.0, None), 0.125) is None  # no capacity, no bracket: nothing to go by
    assert stands_for(capacity(1.0, None, "pruned"), 0.125) is None  # outside the gate: searched no further
    assert stands_for(None, 0.125) is None
