"""The line comparing engines in a study that chooses between them: each engine's best within the
quality gate, and which is ahead only where the capacity brackets say so."""

from __future__ import annotations

from tracetune.tuner.engine_standings import Entry, best_of, standings_text

ENGINES = ["vLLM", "llama.cpp"]


def rps(value: float) -> str:
    return f"{value:.3g} req/s"


def text(entries, outside=None, maximize=True, by="capacity"):
    return standings_text(entries, ENGINES, by, maximize, rps, outside or {})


def test_each_engine_by_its_best_and_the_lead_from_the_brackets():
    line = text([Entry("vLLM", "its defaults", 4.45, 5.29), Entry("vLLM", "trial 4", 2.22, 4.45),
                 Entry("llama.cpp", "its defaults", 0.0, 2.22), Entry("llama.cpp", "trial 3", 0.0, 2.22)],
                outside={"vLLM": 1})
    assert line == ("engines, by capacity within the quality gate: vLLM 4.45 req/s [4.45, 5.29] (its defaults, "
                    "best of 2, 1 outside the gate); llama.cpp below 2.22 req/s (its defaults, best of 2): "
                    "vLLM's best carries at least 2.00x llama.cpp's best.")


def test_overlapping_brackets_name_no_engine_ahead():
    line = text([Entry("vLLM", "its defaults", 4.0, 5.0), Entry("llama.cpp", "trial 2", 4.5, 5.5)])
    assert line.endswith("their brackets overlap, so neither engine is ahead at this precision.")


def test_an_engine_with_nothing_within_the_gate_says_so_and_no_lead_is_claimed():
    line = text([Entry("vLLM", "its defaults", 4.0, 5.0)], outside={"llama.cpp": 3})
    assert "llama.cpp: none measured within the gate, 3 outside it" in line
    assert "ahead" not in line and "at least" not in line


def test_point_values_without_brackets_say_so():
    line = text([Entry("vLLM", "its defaults", 200.0), Entry("llama.cpp", "trial 1", 100.0)], by="output_tps")
    assert line.endswith("vLLM's best is 2.00x llama.cpp's (point values).")


def test_best_prefers_the_higher_value_then_the_narrower_bracket():
    wide, narrow = Entry("vLLM", "a", 4.0, 6.0), Entry("vLLM", "b", 4.0, 4.4)
    assert best_of([wide, narrow], maximize=True) is narrow
    assert best_of([Entry("vLLM", "c", 3.0, 3.3), wide], maximize=True) is wide
    assert best_of([], maximize=True) is None


def test_trials_whose_quality_was_not_probed_count_by_their_capacity_and_say_so():
    """A trial that missed the SLOs at the trace's rate was not probed: not outside the gate (its quality
    is unknown), its capacity bracket still stands for its engine, and the line says it was not probed."""
    line = standings_text([Entry("vLLM", "its defaults", 2.53, 2.87), Entry("llama.cpp", "its defaults", 0.0, 2.22),
                           Entry("llama.cpp", "trial 2", 0.0, 2.22)], ENGINES, "capacity", True, rps,
                          {"vLLM": 1}, {"llama.cpp": 2})
    assert "llama.cpp below 2.22 req/s (its defaults, best of 2, 2 with quality not probed)" in line
    assert "none measured within the gate" not in line and line.endswith("at least 1.14x llama.cpp's best.")
