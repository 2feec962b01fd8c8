"""The engines of a study that chooses between them (`--engine vllm+llamacpp`), side by side: each
by its best configuration within the quality gate, measured by the study's deciding objective
(capacity: with its bracket, so that "better" is said only where the brackets do not overlap)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence


@dataclasses.dataclass(frozen=True)
class Entry:
    """One measured configuration of one engine, within the quality gate."""

    engine: str                 # as users read it: "vLLM", "llama.cpp"
    name: str                   # "its defaults", "trial 3"
    value: float                # the deciding objective (capacity: the highest passing level, req/s)
    high: float | None = None   # capacity: the lowest failing level above it (None: no bracket)

    def upper(self) -> float:
        """The most this configuration may be worth: its bracket's top, else its value."""
        return self.value if self.high is None else self.high


def best_of(entries: Sequence[Entry], maximize: bool) -> Entry | None:
    """The entry best by value (for capacity ties, the narrower bracket: it is surer)."""
    sign = 1 if maximize else -1
    return max(entries, key=lambda e: (sign * e.value, -e.upper()), default=None)


def standings_text(entries: Sequence[Entry], engines: Sequence[str], by: str, maximize: bool,
                   fmt: Callable[[float], str], outside_gate: dict[str, int],
                   unprobed: dict[str, int] | None = None) -> str:
    """'engines, by capacity within the quality gate: vLLM 4.45 req/s [4.45, 5.29] (its defaults, best
    of 3); llama.cpp below 2.22 req/s (its defaults, best of 2): vLLM's best carries at least 2.00x
    llama.cpp's best.' `outside_gate`: each engine's measured trials the gate turned down; `unprobed`:
    those among `entries` whose quality was not probed (they missed the SLOs at the trace's rate)."""
    parts, bests = [], []
    for engine in engines:
        mine = [e for e in entries if e.engine == engine]
        best = best_of(mine, maximize)
        turned = outside_gate.get(engine, 0)
        if best is None:
            beyond = f", {turned} outside it" if turned else ""
            parts.append(f"{engine}: none measured within the gate{beyond}")
            continue
        bests.append(best)
        extra = f", {turned} outside the gate" if turned else ""
        if (unknown := (unprobed or {}).get(engine, 0)):
            extra += f", {unknown} with quality not probed"
        parts.append(f"{engine} {_value_text(best, fmt)} ({best.name}, best of {len(mine)}{extra})")
    text = f"engines, by {by} within the quality gate: " + "; ".join(parts)
    return text + _order_text(bests, maximize) + "."


def _value_text(entry: Entry, fmt: Callable[[float], str]) -> str:
    if entry.high is None:
        return fmt(entry.value)
    if entry.value <= 0:
        return f"below {fmt(entry.high)}"
    return f"{fmt(entry.value)} [{fmt(entry.value).split()[0]}, {fmt(entry.high).split()[0]}]"


def _order_text(bests: Sequence[Entry], maximize: bool) -> str:
    """Which engine's best is ahead, by how much at least, or that their brackets overlap."""
    if len(bests) < 2:
        return ""
    ranked = sorted(bests, key=lambda e: e.value, reverse=maximize)
    first, second = ranked[0], ranked[1]
    if not maximize:
        return f": {first.engine}'s best is ahead of {second.engine}'s (point values)"
    if first.value <= second.upper():
        return ": their brackets overlap, so neither engine is ahead at this precision"
    if first.high is None and second.high is None:
        ratio = f" {first.value / second.value:.2f}x" if second.value > 0 else " ahead of"
        return f": {first.engine}'s best is{ratio} {second.engine}'s (point values)"
    return f": {first.engine}'s best carries at least {first.value / second.upper():.2f}x {second.engine}'s best"
