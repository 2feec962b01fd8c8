"""The probe on llama-server's dialect (forced tokens), against a fake server over real HTTP, and the
quality identity of llama.cpp's configurations."""

from __future__ import annotations

import math

import httpx
import pytest

from tests.quality.fake_llama_server import FakeLlamaServer, logprobs
from tracetune.engine_adapter.base import Endpoint
from tracetune.engine_adapter.registry import scorer
from tracetune.engine_adapter.scoring import FORCED_TOKENS, PROMPT_LOGPROBS
from tracetune.errors import EngineError
from tracetune.quality.probe import (
    QualityResult,
    lossless_by_construction,
    measure_candidate,
    measure_reference,
    quality_key,
)

PROMPTS = [("abcdefgh", None), ("the sky is", "blue"), ("xyz", None)]


@pytest.fixture
def reference_server():
    server = FakeLlamaServer(slots=2)
    yield server
    server.close()


def _endpoint(server: FakeLlamaServer) -> Endpoint:
    return Endpoint(base_url=server.url, model="m")


def test_each_position_is_scored_as_its_forced_token_with_the_full_top_k(reference_server):
    reference = measure_reference(_endpoint(reference_server), PROMPTS, max_tokens=5, scoring=FORCED_TOKENS)
    first = reference.items[0]
    ids = first.ids
    assert len(first.reference_logprobs) == len(ids) - 1 == len(first.reference_top)
    for position, (chosen, top) in enumerate(zip(first.reference_logprobs, first.reference_top), start=1):
        lp = logprobs(ids[position - 1])
        assert chosen == pytest.approx(lp[ids[position]])
        assert len(top) == 20 and max(top.values()) == pytest.approx(max(lp))
    assert reference_server.slots_used and reference_server.slots_used <= {0, 1}  # pinned to the 2 slots
    # the floor: the same server again, in another order, measures no difference
    assert reference.floor is not None and max(map(abs, reference.floor["nll"])) < 1e-9


def test_a_candidate_on_llama_server_reads_in_the_probes_units_and_names_its_scorer(reference_server):
    reference = measure_reference(_endpoint(reference_server), PROMPTS, max_tokens=5, scoring=FORCED_TOKENS)
    same = measure_candidate(_endpoint(reference_server), reference, scoring=FORCED_TOKENS)
    assert same.scorer == FORCED_TOKENS and same.within_floor
    assert same.kld is not None and same.kld.value == pytest.approx(0.0, abs=1e-9)
    assert same.top1_agreement is not None and same.top1_agreement.value == 1.0
    assert same.accuracy is not None and same.accuracy.value == 1.0  # "blue" in the answer
    lossy = FakeLlamaServer(shift=0.8)
    try:
        worse = measure_candidate(_endpoint(lossy), reference, scoring=FORCED_TOKENS)
    finally:
        lossy.close()
    assert worse.kld is not None and worse.kld.value > 0.01
    assert worse.ppl_change is not None and worse.ppl_change.value == pytest.approx(
        math.expm1(worse.nll_delta_per_token.value))
    assert worse.within_floor is False
    assert QualityResult.from_dict(worse.as_dict()).scorer == FORCED_TOKENS


def test_a_server_that_does_not_return_the_forced_token_cannot_score():
    server = FakeLlamaServer(forced_wrong=True)
    try:
        with pytest.raises(EngineError, match="forced token"):
            measure_reference(_endpoint(server), PROMPTS[:1], max_tokens=3, scoring=FORCED_TOKENS)
    finally:
        server.close()


def test_a_byte_token_the_server_holds_back_is_read_from_the_whole_distribution(reference_server):
    reference = measure_reference(_endpoint(reference_server), PROMPTS, max_tokens=5, scoring=FORCED_TOKENS)
    item = reference.items[0]
    # a token the text holds where the model's own top token is another (that one is sent instead)
    held = next(t for prev, t in zip(item.ids, item.ids[1:]) if max(range(40), key=logprobs(prev).__getitem__) != t)
    server = FakeLlamaServer(held_back=frozenset({held}))
    try:
        chosen, tops = scorer(FORCED_TOKENS).score(httpx.Client(), _endpoint(server), item.ids, item.start)
    finally:
        server.close()
    assert chosen == pytest.approx(item.reference_logprobs)  # the held-back positions included
    assert tops == item.reference_top


def test_a_byte_token_where_the_greedy_token_is_one_too_is_read_past_a_plain_token(reference_server):
    reference = measure_reference(_endpoint(reference_server), PROMPTS, max_tokens=5, scoring=FORCED_TOKENS)
    item = reference.items[0]
    plain = ord("a") % 40  # the fake's /tokenize of "a"
    greedy = {t: max(range(40), key=logprobs(prev).__getitem__) for prev, t in zip(item.ids, item.ids[1:])}
    held = next(t for t, g in greedy.items() if g != t and plain not in (t, g))
    server = FakeLlamaServer(held_back=frozenset({held, greedy[held]}))  # mid-character: both held back
    try:
        chosen, tops = scorer(FORCED_TOKENS).score(httpx.Client(), _endpoint(server), item.ids, item.start)
    finally:
        server.close()
    assert chosen == pytest.approx(item.reference_logprobs)
    assert tops == item.reference_top


def test_texts_are_scored_one_per_slot():
    server = FakeLlamaServer(slots=3)
    try:
        with httpx.Client() as client:
            assert scorer(FORCED_TOKENS).parallel(client, _endpoint(server)) == 3
            assert scorer(PROMPT_LOGPROBS).parallel(client, _endpoint(server)) == 1
    finally:
        server.close()
    with pytest.raises(EngineError, match="no quality scorer"):
        scorer("echo")


LLAMA = {"engine": "llamacpp", "model": "/m/SmolLM2", "weights": "F16", "parallel": None, "threads": None,
         "cache_type_k": None, "cache_type_v": None, "draft_model": None}
VLLM = {"model": "/m/SmolLM2", "dtype": "auto", "quantization": None, "max_num_seqs": 256}


def test_llama_cpp_configurations_share_a_quality_only_across_scheduling_knobs():
    key = quality_key(LLAMA)
    assert quality_key({**LLAMA, "parallel": 8, "threads": 2, "ctx_size": 16384, "cache_reuse": 256}) == key
    assert quality_key({**LLAMA, "cache_type_k": "f16"}) == key  # llama.cpp's default KV cache type
    assert quality_key({**LLAMA, "weights": "Q8_0"}) != key
    assert quality_key({**LLAMA, "cache_type_k": "q8_0", "cache_type_v": "q8_0"}) != key
    assert quality_key(LLAMA) != quality_key(VLLM)  # another engine: never the same measurement


def test_another_engine_is_never_lossless_against_the_reference():
    assert not lossless_by_construction(LLAMA, VLLM)
    assert lossless_by_construction({**LLAMA, "draft_model": "derived:Q4_K_M", "parallel": 4}, LLAMA)
    assert not lossless_by_construction({**LLAMA, "weights": "Q8_0"}, LLAMA)
    assert lossless_by_construction({**VLLM, "max_num_seqs": 8}, VLLM)
