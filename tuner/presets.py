"""Informed first trials: configurations that usually pay off, tried before the sampler's own
proposals, among what the search space (already stripped of what this platform cannot run) offers.
Each engine names its own (`EngineKind.presets`: vLLM's 8-bit weights and ngram speculation,
llama.cpp's Q8_0 weights), in the order the engines are registered; this module gives them what the
space offers and whether the trace's recorded outputs copy their prompts (a trace without recorded
outputs gives no evidence). Each preset changes only its knobs against its engine's defaults: every
other parameter of the space takes the value nearest the engine's own (`EngineKind.default_like`),
not a random one.

Presets are ordinary trials: they count toward --trials and are measured like any other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from tracetune.engine_adapter.choice import ENGINE
from tracetune.replay.trace import TraceRecord
from tracetune.search_spaces.space import SearchSpace
from tracetune.tuner.trial_record import ParamValue
from tracetune.types import Scalar

if TYPE_CHECKING:
    from tracetune.engine_adapter.kind import EngineKind

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


def near_defaults(space: SearchSpace, kind: EngineKind, changes: Mapping[str, Scalar]) -> dict[str, ParamValue]:
    """`changes` on top of the space's values nearest `kind`'s defaults (its engine chosen where the space
    chooses engines), "max" read as the largest choice; a parameter the space lacks, or a value it does not
    offer, is left to the sampler."""
    out: dict[str, ParamValue] = {}
    for name, want in {ENGINE: kind.name, **kind.default_like, **changes}.items():
        param = space.parameters.get(name)
        if param is None or param.choices is None:
            continue
        value = max(param.choices) if want == "max" else want
        if value in param.choices:
            out[name] = value
    return {name: value for name, value in out.items() if space.active(name, out)}


def presets(space: SearchSpace, records: Sequence[TraceRecord],
            kinds: Sequence[EngineKind] | None = None) -> list[dict[str, ParamValue]]:
    """The first trials worth trying in this space for this trace, in order: each engine's of `kinds`
    (every registered engine where none are given) that the space offers."""
    from tracetune.engine_adapter.registry import ENGINES, engine_kind

    rate = copy_rate(records)
    copies = rate is not None and rate >= COPY_RATE
    out: list[dict[str, ParamValue]] = []
    for kind in kinds if kinds is not None else [engine_kind(name) for name in ENGINES]:
        if kind.presets is not None and (ENGINE not in space.parameters or _offers(space, ENGINE, kind.name)):
            out += [near_defaults(space, kind, changes) for changes in kind.presets(
                lambda name, value: _offers(space, name, value), copies)]
    return out
