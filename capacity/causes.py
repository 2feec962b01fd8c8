"""Why a load level failed, in words with its numbers: a pure reading of what the level measured.

What it reads: the level's request records (which SLO metric each miss missed, TTFT and TPOT
percentiles), the requests in flight over the level (the time-average of the requests between their
send and their end, over the span of the sends, as `capacity.sustain.block_trends` counts them), the
configuration's slots where its engine says them (`EngineKind.slots_of`: vLLM's max_num_seqs,
llama-server's parallel; None when unset and the engine's default is not known) and the engine's own
counters where the level kept them (only counters over the whole level are read: preemptions; the
gauges are a snapshot at its end, not read).

The rules, the first that holds (a request that missed both TTFT and TPOT counts for both):
- *errors*: more than half the misses are requests that failed -> "N of M requests failed, first
  error: ...";
- *slots*: TTFT misses are more than half the misses, TPOT p50 meets its target (or the SLO sets
  none) and the mean in flight, rounded, exceeds the slots -> "about N requests in flight for S
  slots: TTFT is the wait for a slot" with TTFT p50/p90 against the threshold and TPOT p50;
- *tpot*: TPOT misses outnumber TTFT misses and are more than half the misses -> "tokens too slow:
  TPOT p50 X against Y (the batch: about N in flight for S slots)";
- *ttft*: TTFT misses are more than half the misses (slots unknown, or not all busy) -> "first
  tokens late" with TTFT p50/p90, TPOT p50 and the requests in flight;
- otherwise *mixed*: how many misses missed what, with the percentiles.
Preemptions counted by the engine over the level are said after the rule ("N preemptions: the KV
cache was full"). A level cut short (abandoned) kept only its finished requests: the requests in
flight are then a lower bound ("at least N"). Nothing is claimed without its number.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from tracetune.engine_adapter.metrics import EngineMetrics
from tracetune.replay.metrics import SLO, meets_slos, seconds_text, threshold
from tracetune.replay.types import RequestRecord
from tracetune.stored import Stored, number

# A level as a capacity search measured it: (scale, is it a repeat, its request records).
Level = tuple[float, bool, Sequence[RequestRecord]]


@dataclasses.dataclass(frozen=True)
class Cause:
    """The rule that explains a level's misses (`rule`: errors, slots, tpot, ttft, mixed) and its words."""

    rule: str
    text: str


def in_flight(records: Sequence[RequestRecord]) -> float:
    """The time-average of the requests in flight (between their send and their end) over the span of
    the sends; NaN when every request was sent at once."""
    send = np.asarray([r.send_s for r in records], dtype=float)
    if send.size < 2 or np.ptp(send) <= 0:
        return math.nan
    end = send + np.asarray([r.e2e_s for r in records], dtype=float)
    a, b = float(send.min()), float(send.max())
    return float(np.clip(np.minimum(end, b) - np.maximum(send, a), 0, None).sum()) / (b - a)


def _percentiles(values: Sequence[float]) -> tuple[float, float]:
    return (float(np.percentile(values, 50)), float(np.percentile(values, 90))) if values else (math.nan, math.nan)


def cause(records: Sequence[RequestRecord], slos: Sequence[SLO], *, slots: int | None = None,
          engine: EngineMetrics | None = None, complete: bool = True) -> Cause | None:
    """Why the level of `records` missed its SLO (the module's rules); None when nothing missed.
    `complete` False: the level was cut short, its records are those that finished."""
    ttft_max, tpot_max = threshold(slos, "ttft"), threshold(slos, "tpot")
    answered = [r for r in records if r.success or r.cut]  # a cut request did not fail: it was cut, unfinished
    failed = [r for r in records if not (r.success or r.cut)]
    late_ttft = [r for r in answered if r.ttft_s is None or r.ttft_s >= ttft_max]
    late_tpot = [r for r in records if r.success and (r.tpot_s or 0.0) >= tpot_max]
    missed = sum(not meets_slos(r, slos) for r in records)
    if missed == 0:
        return None
    ttft = _percentiles([r.ttft_s for r in answered if r.ttft_s is not None])
    tpot_p50 = _percentiles([t for r in records if (t := r.tpot_s) is not None])[0]
    flight = in_flight(records)
    about = ("about" if complete else "at least") + f" {flight:.0f} requests in flight" if math.isfinite(flight) else ""
    for_slots = f" for {slots} slot{'s' if slots > 1 else ''}" if slots and about else ""
    ttft_text = f"TTFT p50 {seconds_text(ttft[0])}, p90 {seconds_text(ttft[1])}" + (
        f" against {seconds_text(ttft_max)}" if math.isfinite(ttft_max) else "")
    tpot_ok = not math.isfinite(tpot_max) or (math.isfinite(tpot_p50) and tpot_p50 < tpot_max)
    tpot_text = "" if math.isnan(tpot_p50) else f"TPOT p50 {seconds_text(tpot_p50)}" + (
        (" within " if tpot_ok else " against ") + seconds_text(tpot_max) if math.isfinite(tpot_max) else "")
    share = f"{len(late_ttft)} of {missed} misses late in TTFT"
    if 2 * len(failed) > missed:
        first = min(failed, key=lambda r: r.send_s)
        found = Cause("errors", f"{len(failed)} of {len(records)} requests failed, first error: {first.error[:200]}")
    elif 2 * len(late_ttft) > missed and tpot_ok and slots and round(flight) > slots:
        found = Cause("slots", f"{about}{for_slots}: TTFT is the wait for a slot ({ttft_text}; "
                               f"{tpot_text or 'TPOT not measured'}; {share})")
    elif len(late_tpot) > len(late_ttft) and 2 * len(late_tpot) > missed:
        batch = f" (the batch: {about}{for_slots})" if about else ""
        found = Cause("tpot", f"tokens too slow: {tpot_text}{batch}; {len(late_tpot)} of {missed} misses by TPOT")
    elif 2 * len(late_ttft) > missed:
        context = ", ".join(p for p in (tpot_text, f"{about}{for_slots}" if about else "") if p)
        found = Cause("ttft", f"first tokens late: {ttft_text}" + (f" ({context})" if context else "") + f"; {share}")
    else:
        other = missed - len({id(r) for r in (*failed, *late_ttft, *late_tpot)})  # E2E, ITL
        numbers = "; ".join(p for p in (ttft_text, tpot_text, about + for_slots) if p)
        found = Cause("mixed", f"{missed} misses: {len(late_ttft)} by TTFT, {len(late_tpot)} by TPOT, "
                               f"{len(failed)} failed, {other} by another target ({numbers})")
    if engine is not None and engine.preemptions > 0:
        found = dataclasses.replace(found, text=f"{found.text}; {engine.preemptions:.0f} preemptions: the KV "
                                                f"cache was full, running requests were evicted")
    return found


def explain_steps(steps: Sequence[Stored], levels: Sequence[Level], slos: Sequence[SLO], *,
                  slots: int | None = None, trace_rate_engine: EngineMetrics | None = None) -> list[str]:
    """The cause of each failed step of a search ("" for a passed one, one whose client was
    overloaded or whose machine was busy, or one without records), from the levels it measured
    (`levels`, in search order: a level measured again at once, its window too short, counts by its
    last measurement).
    `trace_rate_engine`: the engine's counters over the trace's own rate, read for the last step there."""
    records = _records_of(steps, levels)
    last_at_one = max((i for i, s in enumerate(steps) if number(s.get("scale")) == 1.0), default=-1)
    out = []
    for i, (step, kept) in enumerate(zip(steps, records)):
        if step.get("passed") or step.get("client_overloaded") or step.get("machine_busy") or not kept:
            out.append("")
            continue
        found = cause(kept, slos, slots=slots, engine=trace_rate_engine if i == last_at_one else None,
                      complete=not step.get("abandoned"))
        out.append(found.text if found else "")
    return out


def _records_of(steps: Sequence[Mapping[str, object]], levels: Sequence[Level]) -> list[Sequence[RequestRecord]]:
    """Each step's records: runs of steps with the same (scale, repeat) matched in order to runs of
    levels with the same; a run of levels longer than its steps' (a window too short, measured again)
    gives its last ones."""
    def runs(keys: Sequence[tuple[float, bool]]) -> list[tuple[tuple[float, bool], list[int]]]:
        out: list[tuple[tuple[float, bool], list[int]]] = []
        for i, key in enumerate(keys):
            if out and out[-1][0] == key:
                out[-1][1].append(i)
            else:
                out.append((key, [i]))
        return out

    level_runs = runs([(scale, repeat) for scale, repeat, _ in levels])
    found: list[Sequence[RequestRecord]] = [() for _ in steps]
    at = 0
    for key, indices in runs([(number(s.get("scale")), bool(s.get("repeat"))) for s in steps]):
        match = next((j for j in range(at, len(level_runs)) if level_runs[j][0] == key), None)
        if match is None:
            continue
        mine = level_runs[match][1][-len(indices):]
        for step_index, level_index in zip(indices[-len(mine):], mine):
            found[step_index] = levels[level_index][2]
        at = match + 1
    return found
