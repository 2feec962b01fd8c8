"""vLLM's informed first trials (`tuner.presets`), in the search space's vocabulary.

- 8-bit weights with an 8-bit KV cache (or 8-bit weights alone where the platform runs no fp8 KV
  cache): the common capacity win of quantization, measured before the sampler reaches it by chance.
- ngram speculation when the trace's recorded outputs copy text from their prompts (prompt-lookup
  decoding drafts tokens from the prompt, so it pays when outputs repeat it: RAG answers, code
  edits, summaries).

Every other parameter takes the value nearest vLLM's own (`DEFAULT_LIKE`: the largest batch limits
offered, chunked prefill and prefix caching on, no speculation), not a random one: measured on the
quickstart, the 8-bit preset with sampled batch limits (8 sequences, 512-token chunks) served nothing
within the SLO, while 8-bit weights + fp8 KV with 64 sequences served 1.30x the defaults' capacity.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracetune.types import Scalar

if TYPE_CHECKING:
    from tracetune.engine_adapter.kind import Offers

# vLLM's defaults as search-space values: True/False/None taken as they are, "max" the largest choice.
DEFAULT_LIKE: dict[str, Scalar] = {"max_num_seqs": "max", "max_num_batched_tokens": "max",
                                   "enable_chunked_prefill": True, "enable_prefix_caching": True,
                                   "speculative": "none", "kv_cache_dtype": "auto", "weight_bits": 16}


def presets(offers: Offers, copies: bool) -> list[dict[str, Scalar]]:
    """The module's presets that the space offers (ngram only where the outputs copy their prompts)."""
    out: list[dict[str, Scalar]] = []
    if offers("weight_bits", 8):
        out.append({"weight_bits": 8, "kv_cache_dtype": "fp8"} if offers("kv_cache_dtype", "fp8")
                   else {"weight_bits": 8})
    if copies and offers("speculative", "ngram"):
        out.append({"speculative": "ngram"})
    return out
