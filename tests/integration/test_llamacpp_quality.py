"""The quality probe on a real llama-server (the cached build of scripts/install_llamacpp.sh, F16
weights of the bundled model, 2 slots): a small reference built and scored by forced tokens, the
same server as a candidate measuring no loss, and each forced position's log-probability equal to
the full distribution's (the forced token among its top-k carries the same value). A few seconds."""

from __future__ import annotations

import time

import pytest

from tracetune.engine_adapter.llamacpp.server import LlamaCppConfig, LlamaServer
from tracetune.quality.probe import measure_candidate, measure_reference

pytestmark = pytest.mark.integration
PROMPTS = [("The capital of France is", "paris"), ("Write a haiku about the sea.\n", None)]


@pytest.fixture(scope="module")
def engine(default_model, tmp_path_factory):
    server = LlamaServer(tmp_path_factory.mktemp("llamacpp-quality"))
    server.launch(LlamaCppConfig(model=default_model, parallel=2), timeout_s=120)
    assert server.quality_probe and server.scoring == "forced_tokens"
    yield server
    server.stop()


def test_llama_server_scores_the_probe_by_forced_tokens(engine):
    started = time.perf_counter()
    reference = measure_reference(engine.endpoint, PROMPTS, max_tokens=12, scoring=engine.scoring)
    quality = measure_candidate(engine.endpoint, reference, scoring=engine.scoring)
    print(f"reference + floor + candidate: {time.perf_counter() - started:.1f} s, {quality.n_tokens} tokens")
    assert quality.scorer == "forced_tokens" and quality.n_tokens >= 2 * 12
    for item in reference.items:
        assert item.reference_top is not None and len(item.reference_logprobs) == len(item.ids) - item.start
        for position, (chosen, top) in enumerate(zip(item.reference_logprobs, item.reference_top), item.start):
            assert len(top) == 20 and chosen <= max(top.values()) + 1e-6
            if str(item.ids[position]) in top:
                assert top[str(item.ids[position])] == pytest.approx(chosen, abs=1e-5)
    # the same weights and kernels: no loss beyond the server's own noise
    assert quality.kld is not None and quality.kld.value < 1e-3
    # Top-1 agrees everywhere but, at most, one near tie: with a KLD of ~2e-6 (the same distributions),
    # one of 36-40 positions flipped once on a 2-core AMX Xeon (2026-12-06), the server's batch noise.
    assert quality.top1_agreement is not None and quality.top1_agreement.high > 0.99
    assert quality.top1_agreement.value * quality.n_tokens >= quality.n_tokens - 1.5
    assert abs(quality.nll_delta_per_token.value) < 1e-3 and quality.within_floor
