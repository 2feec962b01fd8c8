"""Informed first trials: configurations that usually pay off, tried before the sampler's own
proposals, among what the search space (already stripped of what this platform cannot run) offers.

- 8-bit weights with an 8-bit KV cache (or 8-bit weights alone where the platform runs no fp8 KV
  cache): the common capacity win of quantization, measured before the sampler reaches it by chance.
- ngram speculation when the trace's recorded outputs copy text from their prompts (prompt-lookup
  decoding drafts tokens from the prompt, so it pays when outputs repeat it: RAG answers, code
  edits, summaries). A trace without recorded outputs gives no evidence, and no such preset.

Each preset changes only those knobs against vLLM's defaults: every other parameter of the space takes
the value nearest vLLM's own (the largest batch limits offered, chunked prefill and prefix caching on,
no speculation), not a random one: measured on the quickstart, the 8-bit preset with sampled batch
limits (8 sequences, 512-token chunks) served nothing within the SLO, while 8-bit weights + fp8 KV with
64 sequences served 1.30x the defaults' capacity.

Presets are ordinary trials: they count toward --trials and are measured like any other.
"""

from __future__ import annotations

from collections.abc import Sequence

from tracetune.replay.trace import TraceRecord
from tracetune.search_spaces.space import SearchSpace
from tracetune.tuner.trial_record import ParamValue

# Share of a response's word 4-grams found in its prompt from which ngram speculation is tried first.
COPY_RATE = 0.2


def _offers(space: SearchSpace, name: str, value: ParamValue) -> bool:
    param = space.parameters.get(name)
    return param is not None and param.choices is not None and value in param.choices


def copy_rate(records: Sequence[TraceRecord]) -> float | None:
    """Mean share of the recorded responses' word 4-grams that also occur in their prompts (None
    when no record has both a text prompt and a response)."""
    rates = []
    for r in records:
        prompt = r.prompt if r.prompt is not None else " ".join(m.content for m in r.messages or [] if m.content)
        if not r.response or not prompt:
            continue
        words, seen = r.response.split(), prompt.split()
        grams = {tuple(words[i:i + 4]) for i in range(len(words) - 3)}
        if grams:
            source = {tuple(seen[i:i + 4]) for i in range(len(seen) - 3)}
            rates.append(len(grams & source) / len(grams))
    return sum(rates) / len(rates) if rates else None


# vLLM's defaults as search-space values: True/False/None taken as they are, "max" the largest choice
# (in a space choosing between engines, the engine is vLLM).
DEFAULT_LIKE = {"engine": "vllm", "max_num_seqs": "max", "max_num_batched_tokens": "max",
                "enable_chunked_prefill": True, "enable_prefix_caching": True, "speculative": "none",
                "kv_cache_dtype": "auto", "weight_bits": 16}


def near_defaults(space: SearchSpace, changes: dict[str, ParamValue]) -> dict[str, ParamValue]:
    """`changes` on top of the space's values nearest vLLM's defaults (parameters the space lacks, or a
    default it does not offer, are left to the sampler)."""
    out: dict[str, ParamValue] = {}
    for name, want in DEFAULT_LIKE.items():
        param = space.parameters.get(name)
        if param is None or param.choices is None:
            continue
        value = max(param.choices) if want == "max" else want
        if value in param.choices:
            out[name] = value
    out.update(changes)
    return {name: value for name, value in out.items() if space.active(name, out)}


def presets(space: SearchSpace, records: Sequence[TraceRecord]) -> list[dict[str, ParamValue]]:
    """The first trials worth trying in this space for this trace, in order."""
    out: list[dict[str, ParamValue]] = []
    if _offers(space, "weight_bits", 8):
        out.append(near_defaults(space, {"weight_bits": 8, "kv_cache_dtype": "fp8"}
                                 if _offers(space, "kv_cache_dtype", "fp8") else {"weight_bits": 8}))
    rate = copy_rate(records)
    if _offers(space, "speculative", "ngram") and rate is not None and rate >= COPY_RATE:
        out.append(near_defaults(space, {"speculative": "ngram"}))
    if _offers(space, "weight_format", "Q8_0"):
        out.append(_llamacpp_q8(space))
    return out


# llama-server's own defaults, for the knobs a preset leaves as they are (where the space offers them):
# its flash attention "auto" turns on where the backend has it, as a CPU's does
LLAMACPP_DEFAULT_LIKE: dict[str, ParamValue] = {"kv_cache_type": "f16", "batch_size": 2048, "ubatch_size": 512,
                                                "cache_reuse": 0, "flash_attn": "on"}


def _llamacpp_q8(space: SearchSpace) -> dict[str, ParamValue]:
    """llama.cpp with 8-bit GGUF weights (Q8_0) and its most slots, the rest as llama-server's defaults
    where the space offers them (else sampled): on a 2-core AVX2 CPU it served 2.65x the output tokens
    of vLLM's defaults at +0.8% perplexity (issue 34's measurement). Slots and threads at the most
    the space offers (llama-server's own default uses every core). Unset, a sampled quantized KV
    cache with flash attention off made the preset a configuration that cannot run, and a sampled
    single thread left one of two cores idle (the quickstart's studies, 2026-12-04)."""
    out: dict[str, ParamValue] = {"engine": "llamacpp", "weight_format": "Q8_0"}
    out.update({name: value for name, value in LLAMACPP_DEFAULT_LIKE.items() if _offers(space, name, value)})
    for name in ("parallel_slots", "threads"):
        param = space.parameters.get(name)
        if param is not None and param.choices:
            out[name] = max(param.choices)
    return {name: value for name, value in out.items() if name in space.parameters and space.active(name, out)}
