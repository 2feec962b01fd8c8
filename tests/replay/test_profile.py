"""The trace profile (`replay.profile`): rates at several time scales, burstiness, lengths, prefix
reuse and the rate over time, on traces built to show each; and the check of a part against the whole."""

from __future__ import annotations

import pytest

from tracetune.replay import profile
from tracetune.replay.trace import TraceRecord


def rec(t: float, *, inp: int = 100, out: int = 50) -> TraceRecord:
    return TraceRecord(timestamp=t, input_length=inp, output_length=out)


def test_rates_at_each_time_scale_and_the_peak():
    # 2 req/s for 10 minutes, with 60 extra requests in one second at t = 100
    records = [rec(i * 0.5) for i in range(1200)] + [rec(100.0 + i / 100) for i in range(60)]
    records.sort(key=lambda r: r.timestamp)
    p = profile.profile_records(records)
    assert p.requests == 1260 and p.duration_s == pytest.approx(599.5)
    assert p.mean_rps == pytest.approx(1260 / 600, rel=0.01)
    by_scale = {r.scale_s: r for r in p.rates}
    assert set(by_scale) == {1.0, 10.0, 60.0}  # 599.5 s: no 10-minute scale
    assert by_scale[1.0].peak == pytest.approx(62)  # the second holding the extra 60
    assert by_scale[1.0].p50 == pytest.approx(2)
    assert by_scale[60.0].peak == pytest.approx(180 / 60)
    assert p.peak_ratio(1.0) > 25 and p.peak_ratio(60.0) < 1.5  # bursty at 1 s, smooth at a minute
    bursts = profile.profile_records([rec(10.0 * (i // 10) + (i % 10) * 0.001) for i in range(200)])
    assert bursts.interarrival_cv > 2  # ten at once every 10 s; Poisson would give 1


def test_length_quantiles_and_estimated_inputs():
    p = profile.profile_records([rec(float(i), inp=10 * (i + 1), out=i + 1) for i in range(100)])
    assert p.input_tokens["p50"] == pytest.approx(505) and p.output_tokens["p99"] == pytest.approx(99.01)
    assert not p.input_estimated
    text = profile.profile_records([TraceRecord(timestamp=0.0, prompt="x" * 400, output_length=5),
                                    TraceRecord(timestamp=1.0, prompt="y" * 400, output_length=5)])
    assert text.input_estimated and text.input_tokens["mean"] == pytest.approx(100)


def test_prefix_reuse_by_blocks_and_by_text():
    blocks = [TraceRecord(timestamp=float(i), input_length=1024, output_length=5, hash_ids=[1, 2, i + 10])
              for i in range(4)]
    assert profile.prefix_reuse(blocks) == pytest.approx(6 / 12)  # blocks 1, 2 seen again three times
    shared = "s" * profile.PREFIX_CHUNK * 3
    texts = [TraceRecord(timestamp=float(i), prompt=shared + f"question {i}", output_length=5) for i in range(2)]
    assert profile.prefix_reuse(texts) == pytest.approx(3 / 8)  # 3 of the second's 4 chunks, of 8
    assert profile.prefix_reuse([rec(0.0), rec(1.0)]) == 0.0  # lengths only: nothing to compare


def test_a_part_unlike_the_whole_is_named():
    whole = profile.profile_records([rec(float(i), out=100 + (i % 100)) for i in range(600)])
    alike = profile.profile_records([rec(float(i), out=100 + (i % 100)) for i in range(300)])
    assert profile.compare(alike, whole) == []
    quiet_short = profile.profile_records([rec(3.0 * i, out=20) for i in range(50)])
    found = profile.compare(quiet_short, whole)
    assert any(f.startswith("mean rate") for f in found) and any(f.startswith("output p50") for f in found)


def test_the_terminal_profile_reads_at_80_columns():
    p = profile.profile_records([rec(i * 0.25) for i in range(4000)])
    lines = p.lines()
    assert all(len(line) <= 80 for line in lines) and len(p.short()) <= 160
    assert profile.sparkline([0, 1, 2, 4]) == "▁▃▅█"
