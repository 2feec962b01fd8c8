"""One definition of a valid answer: the tokens counted are the tokens received. Each stream here is
well formed event by event, served by a real HTTP server on loopback (tests/reliability/fault_server.py,
or a fixed body: tests/engine_adapter/test_openai_client.py) to the real client, and its counts are
what decide: a usage the events contradict, more tokens than max_tokens, fewer than ignore_eos forced,
an event after [DONE], a text outside the choices; a stream with no usage is counted from its events,
never as no tokens. Legitimate streams (several tokens an event, tokens that decode to no text, vLLM's
usage-only last event, a stop sequence the request gave, several choices) stay successes, and records
stored by an earlier tracetune are read back by the same rule."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.engine_adapter.test_openai_client import ScriptedClock, failed, replay, run, sse
from tests.reliability.fault_server import FaultServer
from tracetune.engine_adapter.openai_client import counted_tokens, new_session, stream_completion, stream_fault
from tracetune.replay.metrics import summarize
from tracetune.replay.types import ReplayOptions, ReplayResult, RequestRecord

N = 8  # max_tokens, forced by ignore_eos
ASKS = {"completion": {"prompt": "p"}, "chat": {"messages": [{"role": "user", "content": "q"}]}}
# Each fault: the reason its every request fails with, and whether it is a stream fault.
FAULTS = {
    "zero_tokens": ('truncated stream: 0 of 8 tokens forced by ignore_eos, then finish_reason "length"', True),
    "early_stop": ('truncated stream: 2 of 8 tokens forced by ignore_eos, then finish_reason "stop"', True),
    "empty_choices": ("bad usage: completion_tokens 8, but no event carried a choice", True),
    "done_first": ("event after [DONE]: '{\"id\": \"f\"", True),
    "usage_below": ("bad usage: completion_tokens 2, but 8 events carried output text", True),
    "too_many": ("too many tokens: 24 (usage completion_tokens) for max_tokens 8", True),
    "too_many_no_usage": ("too many tokens: 24 (events that carried text, no usage) for max_tokens 8", True),
    "short_length": ('short answer: 3 of 8 tokens forced by ignore_eos, then finish_reason "length" '
                     "(the engine's context or limit ended it)", False),
}


def served(mode: str, **kwargs):
    """Every combination of completion/chat and text kept or not, sent to a FaultServer in `mode`."""
    async def go(base_url):
        async with new_session() as session:
            return {(kind, keep): await stream_completion(session, base_url, model="m", max_tokens=N, ignore_eos=True,
                                                          keep_text=keep, **ASKS[kind], **kwargs)
                    for kind in ASKS for keep in (False, True)}
    with FaultServer(mode) as server:
        return asyncio.run(go(server.base_url))


@pytest.mark.parametrize("mode", sorted(FAULTS))
def test_a_count_that_is_not_what_arrived_fails_its_request(mode):
    reason, fault = FAULTS[mode]
    for (kind, keep), out in served(mode).items():
        assert not out.success and out.error.startswith(reason), (kind, keep, out.error)
        assert stream_fault(out.error) is fault and not out.client_error


def test_a_text_beside_empty_choices_is_never_output():
    """Every event `"choices": []` with the token's text next to the list: no TTFT, no token."""
    for out in served("empty_choices").values():
        assert out.chunk_times_s == [] and out.ttft_s is None and out.text == ""


def test_ttft_is_the_first_event_whose_choice_carries_text():
    """Events with no choice (a text beside an empty list, a bare `choices: []`) and a role chunk
    come first; the TTFT is the first text in a choice, the ITL runs between texts only."""
    events = [{"choices": [], "text": "x"}, {"choices": []}, {"choices": [{"index": 0, "text": ""}]},
              {"choices": [{"index": 0, "text": "a"}]},
              {"choices": [{"index": 0, "text": "b", "finish_reason": "length"}]},
              {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}}]
    for keep in (False, True):
        # send, six events, end
        clock = ScriptedClock([10.0, 10.1, 10.2, 10.3, 10.4, 10.6, 10.7, 10.8])
        out = run(replay(sse(*events)), prompt="p", max_tokens=2, ignore_eos=True, clock=clock, keep_text=keep)
        assert out.success, out.error
        assert out.ttft_s == pytest.approx(0.4) and out.itl_s == pytest.approx([0.2]) and out.output_tokens == 2


# Events whose text key is not the first choice's own text, then one that is (as SGLang writes a delta).
TRAPS = {"completion": [b'{"choices":[{"index":0}],"text":"x"}',
                        b'{"choices":[{"index":0,"logprobs":{"text":"x"},"text":""}]}',
                        b'{"choices":[{"index":0,"text":"a","finish_reason":null}]}'],
         "chat": [b'{"choices":[{"index":0,"delta":{}}],"content":"x"}',
                  b'{"choices":[{"index":0,"logprobs":{"content":"x"},"delta":{"content":""}}]}',
                  b'{"choices":[{"index":0,"delta":{"role":null,"content":"a","reasoning_content":null}}]}']}


@pytest.mark.parametrize("kind", sorted(TRAPS))
def test_only_the_first_choices_own_text_is_output_on_either_path(kind):
    end = [b'{"choices":[{"index":0,"finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}']
    body = b"".join(b"data: " + e + b"\n\n" for e in TRAPS[kind] + end) + b"data: [DONE]\n\n"
    for keep in (False, True):
        out = run(replay(body), max_tokens=1, ignore_eos=True, keep_text=keep, **ASKS[kind])
        assert out.success and len(out.chunk_times_s) == 1 and out.output_tokens == 1, (keep, out.error)
        assert out.text == ("a" if keep else "")


def test_no_usage_counts_the_events_received_never_no_tokens():
    """`"usage": null` at the end: the count is the text events, and a summary's throughput is
    built on them (it was 0.0 tok/s from the missing count)."""
    outs = served("usage_null")
    for out in outs.values():
        assert out.success and out.error == "" and out.output_tokens == N and len(out.chunk_times_s) == N
    records = [written(index=i, success=o.success, error=o.error, ttft_s=o.ttft_s, e2e_s=o.e2e_s, itl_s=o.itl_s,
                       output_tokens=o.output_tokens) for i, o in enumerate(outs.values())]
    summary = summarize(ReplayResult(records=records, duration_s=2.0, options=ReplayOptions()))
    assert summary.output_throughput_tps.value == pytest.approx(len(records) * N / 2.0)


def test_events_after_done_fail_however_they_arrive():
    tokens = sse({"choices": [{"text": "t0", "finish_reason": "length"}]},
                 {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
    assert failed(tokens + b"data: [DONE]\n\n", max_tokens=1) == "event after [DONE]: '[DONE]'"
    later = failed(tokens + b'data: {"choices": [{"text": "t1"}]}\n\n', max_tokens=1)
    assert later == "event after [DONE]: '{\"choices\": [{\"text\": \"t1\"}]}'" and stream_fault(later)


# What legitimate engines send, and must stay a success.
SPECULATIVE = sse(  # vLLM with speculative decoding: several tokens in one event
    {"choices": [{"index": 0, "text": " the cat", "finish_reason": None}]},
    {"choices": [{"index": 0, "text": " sat on the", "finish_reason": None}]},
    {"choices": [{"index": 0, "text": " mat.", "finish_reason": "length"}]},
    {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 8}})
SILENT_TOKENS = sse(  # tokens that decode to no text (a partial UTF-8 character, a special token)
    *[{"choices": [{"index": 0, "text": "" if i % 2 else f"t{i}", "finish_reason": None}]} for i in range(7)],
    {"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
     "usage": {"prompt_tokens": 5, "completion_tokens": 8}, "timings": {"predicted_n": 8}})  # as llama-server ends


@pytest.mark.parametrize("body,events", [(SPECULATIVE, 3), (SILENT_TOKENS, 4)], ids=["speculative", "silent_tokens"])
def test_more_tokens_than_text_events_is_no_fault(body, events):
    for keep in (False, True):
        out = run(replay(body), prompt="p", max_tokens=N, ignore_eos=True, keep_text=keep)
        assert out.success and out.output_tokens == N and len(out.chunk_times_s) == events, out.error


def test_a_forced_answer_may_end_early_only_at_a_stop_sequence_it_asked_for():
    body = sse(*[{"choices": [{"text": f"t{i}", "finish_reason": "stop" if i == 2 else None}]} for i in range(3)],
               {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 3}})
    for stops in ({"stop": ["\n\n"]}, {"stop_token_ids": [13]}):
        out = run(replay(body), prompt="p", max_tokens=N, ignore_eos=True, extra_body=stops)
        assert out.success and out.output_tokens == 3, out.error
    assert failed(body, max_tokens=N, ignore_eos=True) == \
        'truncated stream: 3 of 8 tokens forced by ignore_eos, then finish_reason "stop"'
    assert run(replay(body), prompt="p", max_tokens=N).success  # not forced: a natural stop


def test_the_limit_counts_every_choice_asked_for():
    both = [{"choices": [{"index": c, "text": f"t{i}", "finish_reason": "length" if i == N - 1 else None}]}
            for i in range(N) for c in (0, 1)]
    body = sse(*both, {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2 * N}})
    assert run(replay(body), prompt="p", max_tokens=N, ignore_eos=True, extra_body={"n": 2}).success
    assert failed(body, max_tokens=N) == "too many tokens: 16 (usage completion_tokens) for max_tokens 8"


def test_a_json_completion_without_usage_has_no_count():
    body = json.dumps({"choices": [{"message": {"content": "hi there"}, "finish_reason": "stop"}]}).encode()
    assert failed(body, content_type="application/json", extra_body={"stream": False}) == \
        "bad usage: a completion answered without streaming has no usage"


def test_counted_tokens_is_the_one_rule():
    assert counted_tokens(8, 3) == (8, "") and counted_tokens(None, 3) == (3, "") and counted_tokens(0, 0) == (0, "")
    assert counted_tokens(2, 3)[1] == "bad usage: completion_tokens 2, but 3 events carried output text"
    assert counted_tokens(9, 3, 8)[1] == "too many tokens: 9 (usage completion_tokens) for max_tokens 8"


def written(**fields) -> RequestRecord:
    """A record as an earlier tracetune wrote it: 4 output events, max_tokens 8."""
    record = {"index": 0, "id": None, "scheduled_s": 0.0, "send_s": 0.0, "lag_s": 0.0, "success": True, "error": "",
              "ttft_s": 0.1, "e2e_s": 0.4, "itl_s": [0.1, 0.1, 0.1], "prompt_tokens": 5, "output_tokens": 8,
              "requested_tokens": 8, "finish_reason": "length", **fields}
    return RequestRecord(**record)


def stored(**fields) -> RequestRecord:
    """`written`, stored in requests.jsonl and read back."""
    return RequestRecord.from_dict(json.loads(written(**fields).to_json()))


def test_stored_records_are_read_by_the_same_rule():
    assert stored(output_tokens=8).output_tokens == 8 and stored(output_tokens=8).success
    missing = stored(output_tokens=None)  # `usage: null` once stored as a success with no count
    assert missing.success and missing.output_tokens == 4 and missing.tpot_s == pytest.approx(0.1)
    for count, error in ((24, "too many tokens: 24 (usage completion_tokens) for max_tokens 8"),
                         (2, "bad usage: completion_tokens 2, but 4 events carried output text")):
        record = stored(output_tokens=count)
        assert not record.success and record.error == error and stream_fault(record.error)
    kept = stored(success=False, error="HTTP 500", output_tokens=None)
    assert (kept.success, kept.error, kept.output_tokens) == (False, "HTTP 500", None)
    records = [stored(output_tokens=None), stored(output_tokens=24)]
    summary = summarize(ReplayResult(records=records, duration_s=1.0, options=ReplayOptions()))
    assert summary.succeeded == 1 and summary.output_throughput_tps.value == pytest.approx(4.0)


def test_stored_levels_are_read_by_the_same_rule():
    from tracetune.tuner.storage import decode_levels, encode_levels, records_of_level

    back = records_of_level(decode_levels(encode_levels([written(output_tokens=None), written(output_tokens=2)])))
    assert (back[0].success, back[0].output_tokens) == (True, 4)
    assert not back[1].success and back[1].error.startswith("bad usage: completion_tokens 2, but 4 events")
