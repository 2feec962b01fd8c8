"""The guided search (`capacity.response`): the SLO ratio of a level, the crossing the model predicts,
where levels go, which ends are repeated; and against scripted engines whose truth is known, that it
needs fewer levels than the classic rules for the same answer."""

from __future__ import annotations

import math
import random

import pytest

from tracetune.capacity.response import Prediction, Ratio, place, predict, repeat_rule, slo_ratio
from tracetune.capacity.search import search_capacity
from tracetune.capacity.step import CapacityOptions, DecidedBy, Step
from tracetune.replay.metrics import parse_slos
from tracetune.replay.types import RequestRecord

SLOS = tuple(parse_slos("ttft:p95<1s"))


def record(ttft: float, success: bool = True) -> RequestRecord:
    return RequestRecord(index=0, id=None, scheduled_s=0.0, send_s=0.0, lag_s=0.0, success=success, error="",
                         ttft_s=ttft, e2e_s=ttft + 1.0, itl_s=[], prompt_tokens=10, output_tokens=10,
                         requested_tokens=10, finish_reason="length")


def test_slo_ratio_is_the_score_at_the_attainment_target_with_an_interval():
    records = [record(0.01 * i) for i in range(1, 101)]  # TTFT 10 ms .. 1 s
    ratio = slo_ratio([(1.0, records, 100)], SLOS, 0.95)
    assert ratio is not None and ratio.value == pytest.approx(0.95)
    assert ratio.low < ratio.value < ratio.high <= 1.0
    failed = slo_ratio([(1.0, records[:90] + [record(0.1, success=False)] * 10, 100)], SLOS, 0.95)
    assert failed is not None and math.isinf(failed.value)  # 10% failed: the 95th percentile is a failure
    unsent = slo_ratio([(1.0, records[:50], 100)], SLOS, 0.95)
    assert unsent is not None and math.isinf(unsent.value)  # planned, never finished: infinitely slow


def test_ratio_is_stored_without_infinities():
    ratio = Ratio(0.5, 0.9, math.inf)
    assert ratio.as_list() == [0.5, 0.9, None]
    assert Ratio.from_list(ratio.as_list()) == ratio


def step(scale: float, passed: bool, ratio: float | None, *, abandoned: bool = False, attainment: float = 1.0,
         planned: int = 100, decided_by: DecidedBy = DecidedBy.NOT_JUDGED) -> Step:
    r = None if ratio is None else Ratio(ratio * 0.95, ratio, ratio * 1.05).as_list()
    return Step(scale=scale, rps=scale, output_tps=scale, attainment=attainment, passed=passed, abandoned=abandoned,
                requests=planned, planned=planned, good=int(attainment * planned), duration_s=1.0, slo_ratio=r,
                decided_by=decided_by or (DecidedBy.HELD if passed else DecidedBy.ATTAINMENT))


def test_predict_reads_the_crossing_off_a_falling_headroom():
    # headroom 1/m = 2 - k/3 crosses 1 at k = 3
    steps = [step(k, 1 / (2 - k / 3) < 1, 1 / (2 - k / 3)) for k in (1.0, 2.0, 4.0)]
    prediction = predict(steps)
    assert prediction is not None and prediction.scale == pytest.approx(3.0)
    assert prediction.low <= 3.0 <= prediction.high
    assert predict(steps[:1]) is None  # one level: no line
    assert predict([step(1.0, True, 0.5), step(2.0, True, 0.5)]) is None  # headroom not falling: no crossing


def test_place_brackets_then_closes_on_the_prediction():
    assert place(1.0, None, None, 0.05) == (2.0, "doubling")
    assert place(None, 1.0, None, 0.05) == (0.5, "halving")
    scale, rule = place(1.0, None, Prediction(10.0, 8.0, 12.0), 0.05)
    assert rule == "model" and scale == 4.0  # at most x4 a step
    # a prediction just above the highest pass: a level one precision above it closes the bracket
    assert place(2.0, 4.0, Prediction(2.05, 2.0, 2.1), 0.05) == (2.1, "model")
    # in the middle: half a precision under it
    scale, rule = place(2.0, 4.0, Prediction(3.0, 2.9, 3.1), 0.05)
    assert rule == "model" and scale == pytest.approx(3.0 / math.sqrt(1.05))
    # a prediction outside the bracket contradicts the outcomes; a model proven wrong: bisection
    assert place(2.0, 4.0, Prediction(5.0, 4.5, 5.5), 0.05) == (math.sqrt(8.0), "bisection")
    assert place(2.0, 4.0, Prediction(3.0, 2.9, 3.1), 0.05, bisect=True) == (math.sqrt(8.0), "bisection")


def test_repeat_rule_repeats_only_marginal_levels():
    assert repeat_rule(step(2.0, True, 0.5), 0.95)[0] is False  # clear pass
    assert repeat_rule(step(2.0, False, 1.5), 0.95)[0] is False  # clear fail
    needed, why = repeat_rule(step(2.0, True, 0.98), 0.95)  # [0.93, 1.03] spans 1
    assert needed and why.startswith("marginal")
    assert repeat_rule(step(2.0, False, None, abandoned=True, attainment=0.5), 0.95)[0] is False
    needed, why = repeat_rule(step(2.0, False, None, abandoned=True, attainment=0.94), 0.95)
    assert needed and "abandoned" in why
    assert repeat_rule(step(2.0, False, 0.5, decided_by=DecidedBy.QUEUE_RISING), 0.95)[0] is False  # decided on an interval
    assert repeat_rule(step(2.0, False, 0.5, decided_by=DecidedBy.LAST_THIRD), 0.95)[0] is True


def knee(true: float, noise: float = 0.0, seed: int = 0):
    """A scripted engine whose SLO ratio grows as a queue's does: m = 0.3 / (1 - k / (1.2 true)) (m = 1
    near `true`); a level's load wanders by +-noise; passes when m < 1."""
    rng = random.Random(seed)
    calls: list[tuple[float, bool]] = []
    saturation = true / (1 - 0.3)

    def measure(scale: float, repeat: bool) -> Step:
        calls.append((scale, repeat))
        seen = scale * (1 + rng.uniform(-noise, noise))
        m = 0.3 / (1 - seen / saturation) if seen < saturation else math.inf
        passed = m < 1
        s = step(scale, passed, m if math.isfinite(m) else None, attainment=1.0 if passed else 0.5)
        s.repeat = repeat
        return s

    return measure, calls


@pytest.mark.parametrize("true", [0.3, 1.7, 5.0, 37.0])
def test_guided_search_finds_the_same_capacity_in_fewer_levels(true):
    counts = {}
    for rules in ("classic", "guided"):
        measure, calls = knee(true)
        result = search_capacity(measure, CapacityOptions(slos=SLOS, precision=0.05, rules=rules))
        assert result.capacity_scale is not None and result.bracket_high is not None
        assert result.capacity_scale <= true * (1 + 1e-9) < result.bracket_high
        assert result.bracket_high / result.capacity_scale - 1 <= 0.05 + 1e-9
        counts[rules] = len(calls)
    assert counts["guided"] < counts["classic"]


def test_guided_search_under_noise_stays_near_the_truth():
    for seed in range(20):
        measure, _ = knee(4.0, noise=0.05, seed=seed)
        result = search_capacity(measure, CapacityOptions(slos=SLOS, precision=0.05))
        assert result.capacity_scale is not None and 4.0 * 0.85 <= result.capacity_scale <= 4.0 * 1.15
        placed = {s.placed_by for s in result.steps}
        assert placed <= {"start", "doubling", "halving", "model", "bisection", "repeat"}
        ends = [s for s in result.steps if s.repeat_rule]
        assert ends and all(s.repeat_rule.startswith(("clear", "marginal")) for s in ends)
