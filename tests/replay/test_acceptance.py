"""Draft acceptance measured with natural stops beside forced lengths (`replay.acceptance`), on a
scripted engine: a model that ends each prompt after `end` tokens, whose drafts are accepted
`before` of the time up to its end and `after` past it (a model forced on repeats itself)."""

from __future__ import annotations

import dataclasses
import math

from tracetune.engine_adapter.metrics import EngineMetrics
from tracetune.engine_adapter.openai_client import StreamedCompletion
from tracetune.replay.acceptance import (
    Acceptance,
    measure_acceptance,
    probe_requests,
    stored_acceptance,
    stored_caveats,
)
from tracetune.replay.types import PreparedRequest
from tracetune.tuner.front import Candidate, decide

K = 4  # draft tokens proposed per step


class ScriptedEngine:
    """Counts drafts in its /metrics (vLLM's way) or reports them per response (llama.cpp's)."""

    def __init__(self, end: int, before: float, after: float, per_response: bool = False) -> None:
        self.end, self.before, self.after, self.per_response = end, before, after, per_response
        self.counters = EngineMetrics()
        self.asked: list[dict] = []

    def metrics(self) -> EngineMetrics:
        return self.counters

    async def stream(self, session, **request) -> StreamedCompletion:
        self.asked.append(request)
        limit = request["max_tokens"]
        tokens = limit if request["ignore_eos"] else min(self.end, limit)
        natural = min(tokens, self.end)
        steps = math.ceil(tokens / K)
        drafted = steps * K
        accepted = round(min(natural, drafted) * self.before + max(0, tokens - natural) * self.after)
        out = StreamedCompletion(success=True, chunk_times_s=[0.1], end_time_s=0.1 + 0.01 * (tokens - 1),
                                 output_tokens=tokens, prompt_tokens=5,
                                 finish_reason="stop" if tokens < limit else "length")
        if self.per_response:
            out.draft_tokens, out.accepted_tokens = drafted, accepted
        else:
            c = self.counters
            self.counters = dataclasses.replace(c, spec_decode_drafts=c.spec_decode_drafts + steps,
                                                spec_decode_draft_tokens=c.spec_decode_draft_tokens + drafted,
                                                spec_decode_accepted_tokens=c.spec_decode_accepted_tokens + accepted,
                                                generation_tokens=c.generation_tokens + tokens)
        return out


def requests(n: int, max_tokens: int = 128, synthesized: bool = False) -> list[PreparedRequest]:
    return [PreparedRequest(index=i, id=None, scheduled_s=float(i), max_tokens=max_tokens, prompt=f"prompt {i}",
                            synthesized=synthesized, extra_body={"temperature": 0.9}) for i in range(n)]


def test_acceptance_past_the_natural_end_is_told_apart_and_caveated():
    engine = ScriptedEngine(end=32, before=0.25, after=1.0)
    acceptance = measure_acceptance(engine, requests(4))
    assert acceptance.prompts == 4 and acceptance.ended == 4 and acceptance.recorded == 4
    assert acceptance.natural.tokens == 4 * 32 and acceptance.forced.tokens == 4 * 128
    assert math.isclose(acceptance.natural.rate, 0.25)
    assert math.isclose(acceptance.past_end_rate, 1.0)
    assert acceptance.forced.rate > 0.75 and acceptance.past_end_share > 0.9
    caveats = acceptance.caveats()
    assert len(caveats) == 1 and "after the model's natural end" in caveats[0] and "25%" in caveats[0]
    # greedy, one at a time, each prompt with natural stops then forced; the trace's sampling dropped
    assert [(a["ignore_eos"], a["temperature"]) for a in engine.asked[:2]] == [(False, 0.0), (True, 0.0)]
    assert all("extra_body" not in a or not a["extra_body"] for a in engine.asked)


def test_acceptance_within_the_natural_end_carries_no_caveat():
    engine = ScriptedEngine(end=1000, before=0.5, after=1.0)  # no prompt ends before its recorded length
    acceptance = measure_acceptance(engine, requests(4))
    assert acceptance.ended == 0 and acceptance.past_end_tokens == 0
    assert math.isclose(acceptance.natural.rate, acceptance.forced.rate) and acceptance.caveats() == []
    assert math.isclose(acceptance.natural.tokens_per_step, 1 + 0.5 * K)


def test_counts_reported_per_response_are_read_as_llamacpp_reports_them():
    engine = ScriptedEngine(end=32, before=0.5, after=1.0, per_response=True)
    acceptance = measure_acceptance(engine, requests(3))
    assert math.isclose(acceptance.natural.rate, 0.5) and acceptance.forced.drafted == 3 * 128
    assert math.isnan(acceptance.natural.tokens_per_step)  # llama.cpp does not count drafts


def test_synthesized_prompts_and_too_few_drafts_are_said():
    engine = ScriptedEngine(end=1000, before=0.6, after=1.0)
    acceptance = measure_acceptance(engine, requests(2, max_tokens=8, synthesized=True))
    caveats = " ".join(acceptance.caveats())
    assert "synthesized to the trace's lengths (2 of 2)" in caveats and "too few to measure" in caveats


def test_a_failed_request_drops_its_prompt():
    engine = ScriptedEngine(end=32, before=0.5, after=1.0)
    real = engine.stream

    async def failing(session, **request):
        out = await real(session, **request)
        if request["prompt"] == "prompt 1" and request["ignore_eos"]:
            out.success = False
        return out

    engine.stream = failing
    acceptance = measure_acceptance(engine, requests(3))
    assert acceptance.prompts == 2 and acceptance.failed == 1


def test_the_stored_form_reads_back_with_its_caveats():
    acceptance = measure_acceptance(ScriptedEngine(end=32, before=0.25, after=1.0), requests(4))
    stored = acceptance.as_dict()
    assert Acceptance.from_dict(stored) == acceptance
    assert stored["caveats"] == acceptance.caveats()
    assert stored_caveats({"acceptance": stored}) == acceptance.caveats()[0]
    assert stored_caveats({}) == "" and stored_caveats(None) == "" and stored_acceptance({"x": 1}) is None
    assert list(stored) == ["prompts", "recorded", "ended", "failed", "forced", "natural", "synthetic",
                            "natural_rate", "forced_rate", "past_end_share", "caveats"]
    assert list(stored["forced"]) == ["tokens", "drafted", "accepted", "drafts", "tpot_s"]


def test_an_older_stored_probe_reads_with_what_it_lacks_as_zero():
    from tracetune.replay.acceptance import Pass

    older = {"prompts": 2, "recorded": 2, "ended": 1, "forced": {"tokens": 40, "drafted": 32, "accepted": "many",
                                                                 "tpot_s": [0.01, None]},
             "natural": {"tokens": 20, "drafted": 16.0, "accepted": 8.0}, "natural_rate": 0.5}
    assert Acceptance.from_dict(older) == Acceptance(prompts=2, recorded=2, ended=1, forced=Pass(40, 32.0, 0.0, 0.0, (0.01,)),
                                                     natural=Pass(20, 16.0, 8.0))


def test_probe_requests_are_distinct_spread_over_the_trace_and_capped():
    many = requests(10, max_tokens=500) + requests(10, max_tokens=500)  # every prompt twice
    chosen = probe_requests(many, 4, max_tokens=64)
    assert [r.prompt for r in chosen] == ["prompt 0", "prompt 3", "prompt 6", "prompt 9"]
    assert all(r.max_tokens == 64 and r.extra_body == {} for r in chosen)
    assert len(probe_requests(requests(2), 8, 64)) == 2


def test_the_verdict_never_recommends_a_caveated_speculative_trial_silently():
    words = {1: "90% of the accepted draft tokens came after the model's natural end"}
    best = decide([Candidate(1, (5.0,)), Candidate(2, (4.0,))], None, ["capacity"], ["maximize"],
                  speculation_words=words)
    assert best.best is not None and best.best.label == 1
    assert "Caveat" in best.verdict() and words[1] in best.verdict()
    clean = decide([Candidate(1, (5.0,))], None, ["capacity"], ["maximize"], speculation_words={})
    assert "Caveat" not in clean.verdict() and "speculat" not in clean.verdict()


def test_the_results_table_shows_the_natural_figure_and_marks_a_caveat():
    from tracetune.cli.results import natural_text, stored_caveats

    caveated = measure_acceptance(ScriptedEngine(end=32, before=0.25, after=1.0), requests(4)).as_dict()
    clean = measure_acceptance(ScriptedEngine(end=1000, before=0.5, after=1.0), requests(4)).as_dict()
    assert natural_text({"acceptance": caveated}) == ", nat 25%!"
    assert natural_text({"acceptance": clean}) == ", nat 50%" and natural_text({}) == ""
    assert "natural end" in stored_caveats({"acceptance": caveated})
    assert not stored_caveats({"acceptance": clean}) and not stored_caveats(None)


def test_its_words_say_acceptance_and_tpot_both_ways():
    words = measure_acceptance(ScriptedEngine(end=32, before=0.25, after=1.0), requests(4)).words()
    assert "accepted 25% with natural stops, 81% forced" in words and "4 of 4 prompts ended early" in words
    assert "TPOT p50 one request at a time 10 ms natural, 10 ms forced" in words and "4 of 4 prompts recorded" in words


def test_no_tokens_past_the_end_means_no_past_end_figures_whatever_the_drafts():
    """llama.cpp drafts differently run to run: the same tokens, other draft counts (measured)."""
    from tracetune.replay.acceptance import Pass

    same = Acceptance(prompts=2, recorded=2, ended=0, natural=Pass(200, 100.0, 80.0, 25.0),
                      forced=Pass(200, 108.0, 78.0, 27.0))
    assert same.past_end_share == 0.0 and math.isnan(same.past_end_rate) and same.caveats() == []


def test_recorded_and_synthesized_prompts_are_told_apart():
    recorded = ScriptedEngine(end=1000, before=0.5, after=1.0)
    mixed = requests(2) + [dataclasses.replace(r, prompt=f"synthetic {r.index}") for r in requests(1, synthesized=True)]

    class ByText(ScriptedEngine):
        async def stream(self, session, **request):  # synthetic text: a quarter of the drafts accepted
            self.before = 0.25 if request["prompt"].startswith("synthetic") else 0.5
            return await super().stream(session, **request)

    acceptance = measure_acceptance(ByText(end=1000, before=0.5, after=1.0), mixed)
    assert (acceptance.recorded, acceptance.synthesized) == (2, 1)
    assert math.isclose(acceptance.recorded_rate, 0.5) and math.isclose(acceptance.synthetic.rate, 0.25)
    assert "(accepted 50% there, 25% on the synthesized)" in acceptance.words()
    assert Acceptance.from_dict(acceptance.as_dict()) == acceptance
    assert "on the synthesized" not in measure_acceptance(recorded, requests(2)).words()
