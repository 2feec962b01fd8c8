"""The front and "best" leave out vLLM's defaults when they break the SLO (`tuner.front.decide`), and the
verdict says by how much (`tuner.front.slo_breach`)."""

from __future__ import annotations

from tracetune.replay.metrics import parse_slos
from tracetune.tuner.front import REFERENCE, Candidate, decide, slo_breach

DIRS = ["maximize", "minimize"]  # capacity, quality_loss
OBJS = ["capacity", "quality_loss"]


def test_defaults_breaking_the_slo_are_never_on_the_front_nor_best():
    # the defaults would have the best capacity; breaking the SLO, they are no candidate
    ref = Candidate(REFERENCE, (9.0, 0.0))
    trials = [Candidate(1, (4.0, 0.0)), Candidate(2, (6.0, 0.1))]
    kept = decide(trials, ref, OBJS, DIRS)
    assert kept.reference_is_best and kept.dominated_by_reference == [1, 2]
    broke = decide(trials, ref, OBJS, DIRS, reference_feasible=False, reference_breach="TTFT p95 17.8 s against 2 s")
    assert REFERENCE not in [c.label for c in broke.front] and not broke.reference_is_best
    assert broke.best.label == 2 and broke.dominated_by_reference == []  # it beats no trial that keeps the SLO
    assert broke.verdict() == ("trial 2 is best by capacity on the front; vLLM's defaults are not a candidate: they "
                               "break the SLO (TTFT p95 17.8 s against 2 s).")
    assert broke.reference_values == (9.0, 0.0)  # still the reference the ratios read


def test_nothing_meeting_the_slo_says_by_how_much():
    d = decide([], Candidate(REFERENCE, (0.0, 0.0)), OBJS, DIRS, reference_feasible=False, outside_constraints=3,
               reference_breach="TTFT p95 17.8 s against 2 s, every load failed")
    assert d.best is None and d.front == []
    assert d.verdict() == ("no configuration meets the SLO, vLLM's defaults included (vLLM's defaults break it: TTFT "
                           "p95 17.8 s against 2 s, every load failed; 3 measured trial(s) broke the SLO or the "
                           "quality gate): nothing to recommend. Loosen the SLO, or serve this traffic on a faster "
                           "machine.")


def test_slo_breach_names_each_statistic_failures_and_failed_loads():
    slos = parse_slos("ttft:p95<2s") + parse_slos("itl:p99<200ms")
    summary = {"latency_s": {"ttft": {"p95": {"value": 17.8}}, "itl": {"p99": {"value": 0.05}}},
               "error_rate": 0.0,
               "capacity": {"steps": [{"passed": False}, {"passed": False}, {"passed": False}]}}
    assert slo_breach(summary, slos) == "TTFT p95 17.8 s against 2 s, every load failed"
    summary["capacity"] = {"steps": [{"scale": 1.0, "passed": False}, {"scale": 1.0, "passed": False}]}
    assert slo_breach(summary, slos) == "TTFT p95 17.8 s against 2 s, its one load failed"  # and its repeat
    summary["latency_s"]["itl"]["p99"]["value"] = 0.45
    summary.update(error_rate=0.25, errors=3, requests=12, capacity={"steps": [{"passed": True}, {"passed": False}]})
    assert slo_breach(summary, slos) == "TTFT p95 17.8 s against 2 s, ITL p99 450 ms against 200 ms, 3 of 12 " \
                                        "requests failed"
    assert slo_breach(None, slos) == ""


def test_the_verdict_says_the_gates_word_on_the_best():
    words = {2: "undecided against the default quality gate ppl<=+1% (this study set none): its 95% interval "
                "[-13.37%, +4.86%] reaches both sides of the limit"}
    d = decide([Candidate(1, (4.0, 0.0)), Candidate(2, (6.0, 0.1))], None, OBJS, DIRS, quality_words=words)
    assert d.verdict() == f"trial 2 is best by capacity on the front (vLLM's defaults included). Its quality: {words[2]}."
    assert "Its quality" not in decide([Candidate(1, (7.0, 0.0))], None, OBJS, DIRS, quality_words=words).verdict()
