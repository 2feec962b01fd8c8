"""llama.cpp's informed first trial (`tuner.presets`), in the search space's vocabulary: 8-bit GGUF
weights (Q8_0) with its most slots and threads. On a 2-core AVX2 CPU it served 2.65x the output
tokens of vLLM's defaults at +0.8% perplexity (issue 34's measurement). Slots and threads at the most
the space offers (llama-server's own default uses every core); the rest as llama-server's defaults
(`DEFAULT_LIKE`) where the space offers them, else sampled. Unset, a sampled quantized KV cache with
flash attention off made the preset a configuration that cannot run, and a sampled single thread left
one of two cores idle (the quickstart's studies, 2026-12-04)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracetune.types import Scalar

if TYPE_CHECKING:
    from tracetune.engine_adapter.kind import Offers

# llama-server's own defaults as search-space values: its flash attention "auto" turns on where the
# backend has it, as a CPU's does.
DEFAULT_LIKE: dict[str, Scalar] = {"kv_cache_type": "f16", "batch_size": 2048, "ubatch_size": 512,
                                   "cache_reuse": 0, "flash_attn": "on"}


def presets(offers: Offers, copies: bool) -> list[dict[str, Scalar]]:
    """Q8_0 weights with the most slots and threads, where the space offers Q8_0."""
    if not offers("weight_format", "Q8_0"):
        return []
    return [{"weight_format": "Q8_0", "parallel_slots": "max", "threads": "max"}]
