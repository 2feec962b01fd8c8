"""Whether a started llama-server applied every setting it was given, read from what it reports:
`/props` (slots, weight format), `/slots` (speculation per slot) and its log at verbosity 4 (the
context it built: size, batch, micro-batch, flash attention, K/V cache types, threads, the draft
and its draft lengths, cache reuse refused). A setting llama-server ignored or changed is named,
so no trial measures a knob that silently did nothing (e.g. a draft model given without
`--spec-type`: loaded, never used)."""

from __future__ import annotations

import re

from tracetune.engine_adapter.llamacpp.config import LlamaCppConfig
from tracetune.engine_adapter.llamacpp.gguf import FTYPE_NAMES

_CONTEXT = {name: re.compile(rf"llama_context: {name}\s+= (\S+)") for name in ("n_ctx", "n_batch", "n_ubatch",
                                                                                 "flash_attn")}
_KV_TYPES = re.compile(r"llama_kv_cache: size = .* K \((\w+)\): .* V \((\w+)\):")
_THREADS = re.compile(r"system_info: n_threads = (\d+) \(n_threads_batch = (\d+)\)")
_DRAFT = re.compile(r"adding speculative implementation 'draft-simple'")
_DRAFT_LENGTHS = re.compile(r"- n_max=(\d+), n_min=(\d+)")
_NO_CACHE_REUSE = re.compile(r"cache_reuse is not supported|cache reuse is not supported")
CTX_PAD = 256  # llama.cpp rounds the context up to a multiple of 256


def _first(pattern: re.Pattern[str], log: str) -> tuple[str, ...] | None:
    """The groups of `pattern`'s first match (the target model's context comes before the draft's)."""
    m = pattern.search(log)
    return m.groups() if m else None


def _context_problems(config: LlamaCppConfig, log: str) -> list[str]:
    problems = []
    found = {name: (groups or (None,))[0] for name, pattern in _CONTEXT.items() for groups in [_first(pattern, log)]}
    if config.ctx_size is not None:
        n_ctx = int(found["n_ctx"]) if found["n_ctx"] else None
        if n_ctx is None or not config.ctx_size <= n_ctx < config.ctx_size + CTX_PAD:
            problems.append(f"ctx_size={config.ctx_size}: the server built a context of {n_ctx} tokens")
    for knob, name in (("batch_size", "n_batch"), ("ubatch_size", "n_ubatch")):
        want = getattr(config, knob)
        value = found[name]
        got = int(value) if value else None
        if want is not None and got != want:
            problems.append(f"{knob}={want}: the server uses {name} = {got}")
    if config.flash_attn in ("on", "off"):
        got_fa = found["flash_attn"]
        if got_fa != {"on": "enabled", "off": "disabled"}[config.flash_attn]:
            problems.append(f"flash_attn={config.flash_attn}: the server's flash attention is {got_fa}")
    kv = _first(_KV_TYPES, log)
    for knob, i in (("cache_type_k", 0), ("cache_type_v", 1)):
        want = getattr(config, knob)
        if want is not None and (kv is None or kv[i] != want):
            problems.append(f"{knob}={want}: the server's cache is {kv[i] if kv else 'not stated in its log'}")
    return problems


def _threads_problems(config: LlamaCppConfig, log: str) -> list[str]:
    threads = _first(_THREADS, log)
    problems = []
    for knob, i in (("threads", 0), ("threads_batch", 1)):
        want = getattr(config, knob)
        if want is not None and (threads is None or int(threads[i]) != want):
            problems.append(f"{knob}={want}: the server runs {threads[i] if threads else 'an unstated number of'}")
    if config.threads is not None and config.threads_batch is None and threads and int(threads[1]) != config.threads:
        problems.append(f"threads={config.threads}: prompts run on {threads[1]} threads")
    return problems


def _draft_problems(config: LlamaCppConfig, slots: object, log: str) -> list[str]:
    if config.draft_model is None:
        return []
    problems = []
    speculative = [s.get("speculative") for s in slots if isinstance(s, dict)] if isinstance(slots, list) else []
    if not _DRAFT.search(log) or not speculative or not all(speculative):
        problems.append(f"draft_model={config.draft_model}: the server does not draft with it "
                        f"(slots speculative: {speculative})")
    lengths = _first(_DRAFT_LENGTHS, log)
    for knob, i in (("draft_max", 0), ("draft_min", 1)):
        want = getattr(config, knob)
        if want is not None and (lengths is None or int(lengths[i]) != want):
            problems.append(f"{knob}={want}: the server drafts with {lengths[i] if lengths else 'unstated'}")
    return problems


def unapplied(config: LlamaCppConfig, props: object, slots: object, log: str) -> list[str]:
    """Every setting of `config` the server did not apply, as a person reads it (empty: all applied)."""
    problems = []
    props = props if isinstance(props, dict) else {}
    if config.parallel is not None and props.get("total_slots") != config.parallel:
        problems.append(f"parallel={config.parallel}: the server has {props.get('total_slots')} slots")
    if config.gguf is None and props.get("model_ftype") != FTYPE_NAMES[config.weights]:
        problems.append(f"weights={config.weights}: the server loaded {props.get('model_ftype')} weights")
    problems += _context_problems(config, log) + _threads_problems(config, log) + _draft_problems(config, slots, log)
    if config.cache_reuse and _NO_CACHE_REUSE.search(log):
        problems.append(f"cache_reuse={config.cache_reuse}: the server disabled cache reuse")
    return problems
