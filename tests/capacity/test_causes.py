"""Why a load level failed (`capacity.causes`): each rule on records built to show it."""

from __future__ import annotations

from tracetune.capacity.causes import cause, explain_steps, in_flight
from tracetune.engine_adapter.metrics import EngineMetrics
from tracetune.replay.metrics import parse_slos
from tracetune.replay.types import RequestRecord

SLOS = parse_slos("ttft:p90<2s,tpot:p90<100ms")


def records(n: int = 200, *, every_s: float = 0.5, ttft_s: float = 5.0, tpot_s: float = 0.047, tokens: int = 51,
            failed: int = 0) -> list[RequestRecord]:
    """`n` requests sent `every_s` apart, each with `ttft_s` and `tpot_s` over `tokens` tokens (each lives
    ttft + tpot x 50); the first `failed` of them failed."""
    out = []
    for i in range(n):
        ok = i >= failed
        e2e = ttft_s + tpot_s * (tokens - 1) if ok else 0.1
        out.append(RequestRecord(index=i, id=None, scheduled_s=i * every_s, send_s=i * every_s, lag_s=0.0, success=ok,
                                 error="" if ok else f"HTTP 500: out of memory ({i})", ttft_s=ttft_s if ok else None,
                                 e2e_s=e2e, itl_s=[], prompt_tokens=10, output_tokens=tokens if ok else None,
                                 requested_tokens=tokens, finish_reason="length" if ok else None))
    return out


def test_in_flight_is_the_time_average_over_the_sends():
    # each request lives 7.35 s, one sent every 0.5 s: about 14.7 in flight (less the first ones' ramp)
    assert 13.5 < in_flight(records()) < 14.8
    assert in_flight(records(1)) != in_flight(records(1))  # NaN: nothing to average over


def test_ttft_misses_with_more_in_flight_than_slots_are_the_wait_for_a_slot():
    found = cause(records(), SLOS, slots=8)
    assert found is not None and found.rule == "slots"
    assert found.text.startswith("about 14 requests in flight for 8 slots: TTFT is the wait for a slot (TTFT p50 5 s, "
                                 "p90 5 s against 2 s; TPOT p50 47 ms within 100 ms; 200 of 200 misses late in TTFT)")


def test_ttft_misses_claim_no_slot_wait_where_the_slots_are_unknown_or_not_full():
    for slots in (None, 32):
        found = cause(records(), SLOS, slots=slots)
        assert found is not None and found.rule == "ttft" and "slot" not in found.text.split("(")[0]
        assert found.text.startswith("first tokens late: TTFT p50 5 s, p90 5 s against 2 s (TPOT p50 47 ms within 100 ms, "
                                     "about 14 requests in flight")


def test_tpot_misses_say_the_tokens_are_too_slow_with_the_batch():
    found = cause(records(ttft_s=0.3, tpot_s=0.15), SLOS, slots=8)
    assert found is not None and found.rule == "tpot"
    assert found.text == ("tokens too slow: TPOT p50 150 ms against 100 ms (the batch: about 15 requests in flight for "
                          "8 slots); 200 of 200 misses by TPOT")


def test_errors_name_the_first_error():
    found = cause(records(failed=120), SLOS, slots=8)
    assert found is not None and found.rule == "errors"
    assert found.text == "120 of 200 requests failed, first error: HTTP 500: out of memory (0)"


def test_preemptions_counted_by_the_engine_are_said():
    found = cause(records(), SLOS, slots=8, engine=EngineMetrics(preemptions=37))
    assert found is not None and found.text.endswith("; 37 preemptions: the KV cache was full, running requests "
                                                     "were evicted")
    assert "preemptions" not in (cause(records(), SLOS, slots=8, engine=EngineMetrics()) or found).text


def test_a_level_cut_short_gives_a_lower_bound_and_a_level_without_misses_no_cause():
    found = cause(records(), SLOS, slots=8, complete=False)
    assert found is not None and found.text.startswith("at least 14 requests in flight for 8 slots")
    assert cause(records(ttft_s=0.3), SLOS, slots=8) is None


def test_mixed_misses_are_counted_by_target():
    mixed = records(100, ttft_s=5.0, tpot_s=0.02)[:50] + records(100, ttft_s=0.3, tpot_s=0.2)[50:]
    found = cause(mixed, SLOS)
    assert found is not None and found.rule == "mixed"
    assert found.text.startswith("100 misses: 50 by TTFT, 50 by TPOT, 0 failed, 0 by another target (")


def test_each_failed_step_is_explained_by_its_own_level():
    """Levels are matched to steps by (scale, repeat), a level measured again at once (window short)
    by its last measurement; passed steps get no cause; the engine's counters go to the trace's rate."""
    steps = [{"scale": 1.0, "passed": False}, {"scale": 0.5, "passed": True},
             {"scale": 1.0, "passed": False, "repeat": True}]
    levels = [(1.0, False, records(ttft_s=0.3, tpot_s=0.15)), (0.5, False, records(ttft_s=0.3)),
              (0.5, False, records(ttft_s=0.3)), (1.0, True, records())]
    causes = explain_steps(steps, levels, SLOS, slots=8, trace_rate_engine=EngineMetrics(preemptions=3))
    assert causes[0].startswith("tokens too slow") and "preemptions" not in causes[0]
    assert causes[1] == ""
    assert causes[2].startswith("about 14 requests in flight for 8 slots") and causes[2].endswith("were evicted")
