"""Judging a measured quality: the gate (`--max-quality-loss` in nats, KL divergence, perplexity or top-1
units, read beyond the reference's own noise floor), the floor's estimates, a result's verdict in words,
and the study's self-check (configurations lossless by construction must measure within the floor)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from tracetune.errors import InputError
from tracetune.quality.probe import Reference, StoredQuality
from tracetune.replay.metrics import Estimate, StoredEstimate, bootstrap_ci
from tracetune.stored import Stored, mapping, number
from tracetune.types import JsonDict

# The gate's units: how each reads a stored quality dict, and which side of the limit passes.
GATE_UNITS = {
    "nats": "mean NLL increase per token, nats (the plain-number form)",
    "kld": "mean KL divergence per token from the reference, nats",
    "ppl": "perplexity increase, percent",
    "top1": "top-1 agreement with the reference, at least this share",
}


# The gate a study applies unless told otherwise (`--max-quality-loss none` turns it off): at most
# +1% perplexity beyond the reference's own noise. Perplexity is the unit users compare quantized
# models by; 1% keeps only near-lossless settings, and stays above what the default probe resolves
# (its interval is about +-0.3 points on the bundled model: docs/quality.md).
DEFAULT_GATE = "ppl:+1%"
NO_GATE = "none"


@dataclasses.dataclass(frozen=True)
class QualityGate:
    """`--max-quality-loss`: a limit in one unit. Losses are read beyond the reference's own noise
    floor where the study measured one (a lossless config then passes a strict gate), else raw."""

    unit: str  # nats | kld | ppl | top1
    limit: float  # ppl: a fraction (0.01 for +1%)

    @property
    def spec(self) -> str:
        """The gate as `parse_gate` reads it (what a study stores)."""
        return f"ppl:+{self.limit * 100:g}%" if self.unit == "ppl" else f"{self.unit}:{self.limit:g}"

    def __str__(self) -> str:
        if self.unit == "ppl":
            return f"ppl<=+{self.limit * 100:g}%"
        if self.unit == "top1":
            return f"top1>={self.limit:g}"
        return f"{self.unit}<={self.limit:g}"

    def violation(self, quality: StoredQuality | None) -> float:
        """<= 0 when the gate holds (Optuna's convention): how far the worse end of the measured 95%
        interval lies past the limit, so a configuration passes only when its whole interval is
        within the gate (`decide`); inf when the unit was not measured. A configuration lossless by
        construction passes: what it measured beyond the floor is the probe's noise (its verdict
        says so), not a loss of the configuration."""
        measured = self.measured(quality)
        if measured is None:
            return math.inf
        worst = measured.low if self.unit == "top1" else measured.high
        gap = self.limit - worst if self.unit == "top1" else worst - self.limit
        return min(gap, 0.0) if (quality or {}).get("lossless") else gap

    def measured(self, quality: StoredQuality | None) -> Estimate | None:
        """The stored quality in the gate's unit, beyond the reference's noise floor where the study
        measured one, with its 95% interval (ppl: a fraction); None when the unit was not measured."""
        if not quality:
            return None
        if self.unit == "top1":
            return _estimate(quality.get("top1_agreement"))
        loss = _beyond_floor(quality, "nll" if self.unit in ("nats", "ppl") else "kld")
        if loss is None or self.unit != "ppl":
            return loss
        return Estimate(math.expm1(loss.value), math.expm1(loss.low), math.expm1(loss.high))

    def decide(self, quality: StoredQuality | None) -> GateDecision:
        """The gate's judgement of a stored quality, read from its interval (`GateDecision`)."""
        measured = self.measured(quality)
        if measured is None:
            return GateDecision(NOT_MEASURED, self, None)
        if self.violation(quality) <= 0:
            return GateDecision(WITHIN, self, measured)
        best = measured.high if self.unit == "top1" else measured.low
        if (best < self.limit) if self.unit == "top1" else (best > self.limit):
            return GateDecision(OUTSIDE, self, measured)
        return GateDecision(UNDECIDED, self, measured, _tokens_to_decide(self, quality or {}))


# The gate's words on a configuration: its whole interval within the limit, its whole interval past
# it, or the interval reaching both sides (the probe cannot tell yet); or the unit not measured.
WITHIN, OUTSIDE, UNDECIDED, NOT_MEASURED = "within", "outside", "undecided", "not measured"


@dataclasses.dataclass(frozen=True)
class GateDecision:
    """One quality decision: `word` (WITHIN, OUTSIDE, UNDECIDED or NOT_MEASURED), the measured
    value in the gate's unit, and for an undecided one the probe size (scored tokens) that would
    decide it, None when it cannot be estimated (the value sits on the limit, or the size is unknown)."""

    word: str
    gate: QualityGate
    measured: Estimate | None
    tokens_to_decide: int | None = None

    @property
    def within(self) -> bool:
        return self.word == WITHIN

    def text(self, gate_words: str | None = None) -> str:
        """In words, e.g. "undecided against the quality gate ppl<=+1%: perplexity -3.78% [-13.37%, +4.86%]
        reaches both sides of the limit; a probe of about 41,000 tokens would decide it"."""
        gate = gate_words or f"the quality gate {self.gate}"
        if self.word == NOT_MEASURED:
            return f"quality not measured, so {gate} cannot judge it"
        head = f"{self.word} {gate}" if self.word != UNDECIDED else f"undecided against {gate}"
        if self.word != UNDECIDED or self.measured is None:
            return head
        size = (f"; a probe of about {self.tokens_to_decide:,} scored tokens would decide it"
                if self.tokens_to_decide else "")
        return f"{head}: its 95% interval {self._interval()} reaches both sides of the limit{size}"

    def _interval(self) -> str:
        m = self.measured
        assert m is not None
        if self.gate.unit == "ppl":
            return f"[{m.low * 100:+.2f}%, {m.high * 100:+.2f}%]"
        return f"[{m.low:.4g}, {m.high:.4g}]"


def _tokens_to_decide(gate: QualityGate, quality: StoredQuality) -> int | None:
    """The probe size whose interval would clear the limit: the interval's half-width shrinks as
    1/sqrt(scored tokens) (its chunks are near-independent: `quality.probe`), so it must shrink to
    the distance between the value and the limit. Read in the unit's linear form (nats for ppl)."""
    measured = gate.measured(quality)
    n = int(quality.get("n_tokens") or 0)
    if measured is None or not n:
        return None
    limit = math.log1p(gate.limit) if gate.unit == "ppl" else gate.limit
    value, low, high = ((math.log1p(measured.value), math.log1p(measured.low), math.log1p(measured.high))
                        if gate.unit == "ppl" else (measured.value, measured.low, measured.high))
    margin, half = abs(value - limit), (high - low) / 2
    if margin <= 0 or half <= 0:
        return None
    return max(math.ceil(n * (half / margin) ** 2), n + 1)


def _estimate(raw: object) -> Estimate | None:
    """A stored estimate ({"value", "ci_low", "ci_high"}; an interval-less one: the value alone)."""
    entry = mapping(raw)
    if not entry:
        return None
    value = number(entry["value"])
    return Estimate(value, number(entry.get("ci_low", value)), number(entry.get("ci_high", value)))


def _beyond_floor(quality: StoredQuality, unit: str) -> Estimate | None:
    beyond = (quality.get("beyond_floor") or {}).get(unit)
    if beyond is not None:
        return _estimate(beyond)
    return _estimate(quality.get("nll_delta_per_token" if unit == "nll" else "kld"))


def with_units(quality: StoredQuality | None) -> StoredQuality | None:
    """A stored quality with its perplexity change: a study stored before the probe reported it
    (NLL only, nats/token) gets it from the NLL increase (perplexity ratio - 1 = exp(NLL delta) - 1),
    interval and all, so it reads in the units every page uses. A copy; None stays None."""
    if not quality or quality.get("ppl_change") or not quality.get("nll_delta_per_token"):
        return quality
    nll = _estimate(quality["nll_delta_per_token"])
    assert nll is not None
    ppl: StoredEstimate = {"value": math.expm1(nll.value), "ci_low": math.expm1(nll.low),
                           "ci_high": math.expm1(nll.high)}
    out = quality.copy()
    out["ppl_change"] = ppl
    return out


def shown_quality(config: Stored | None, quality: StoredQuality | None) -> StoredQuality | None:
    """A configuration's stored quality as pages read it: in perplexity too (`with_units`); None on
    random weights, whose quality is not measurable (`random_weights`)."""
    return None if random_weights(config) else with_units(quality)


def random_weights(config: Stored | None) -> bool:
    """A configuration measured on random weights (load_format dummy): its speed is measured, its
    quality is not measurable (random weights agree with themselves whatever the configuration)."""
    return (config or {}).get("load_format") == "dummy"


def parse_gate(text: str | float | None, flag: str = "--max-quality-loss") -> QualityGate | None:
    """`0.05` (nats), `nats:0.05`, `kld:0.01`, `ppl:+1%` (or `ppl:1%`), `top1:0.99`; `none`: no gate."""
    if text is None or str(text).strip().lower() == NO_GATE:
        return None
    spec = str(text).strip()
    unit, _, value = spec.rpartition(":")
    unit = unit.strip().lower() or "nats"
    value = value.strip()
    try:
        if unit not in GATE_UNITS:
            raise ValueError
        if unit == "ppl":
            if not value.endswith("%"):
                raise ValueError
            limit = float(value.rstrip("%").lstrip("+")) / 100
        else:
            limit = float(value)
        if not math.isfinite(limit) or limit < 0 or (unit == "top1" and limit > 1):
            raise ValueError
    except ValueError:
        units = "; ".join(f"{u}: {d}" for u, d in GATE_UNITS.items())
        raise InputError(f"{flag}: cannot read {spec!r}; write UNIT:LIMIT, e.g. 'kld:0.01', 'ppl:+1%', 'top1:0.99', "
                         f"a number of nats such as 0.05 ({units}), or 'none' for no gate") from None
    return QualityGate(unit, limit)


def floor_estimates(reference_probe: JsonDict | list[JsonDict] | None, *, seed: int = 0) -> dict[str, Estimate]:
    """The noise floor of a stored reference probe, per unit, with intervals over prompts: "nll"
    (nats/token), "kld", "top1", and "ppl" (perplexity change, a fraction). Empty without a floor."""
    return _estimates(Reference.from_json(reference_probe).floor if reference_probe else None, seed=seed)


def _estimates(floor: dict[str, list[float]] | None, *, seed: int = 0) -> dict[str, Estimate]:
    out = {k: bootstrap_ci(v, "mean", seed=seed) for k, v in (floor or {}).items() if v}
    if "nll" in out:
        out["ppl"] = Estimate(math.expm1(out["nll"].value), math.expm1(out["nll"].low), math.expm1(out["nll"].high))
    return out


def verdict(quality: StoredQuality | None) -> str:
    """A stored quality result against the floor, in words ("" without a floor)."""
    if not quality or quality.get("within_floor") is None:
        return ""
    if quality.get("lossless") and not quality["within_floor"]:
        return "probe too noisy (lossless by construction, measured beyond the floor)"
    return "within noise floor" if quality["within_floor"] else "beyond noise floor"


def units_text(quality: StoredQuality | None) -> str:
    """KL divergence, perplexity change and top-1 agreement of a stored quality result, and its
    verdict against the floor ("-" when the units were not measured)."""
    quality = with_units(quality)
    if not quality or not quality.get("ppl_change"):
        return "-"
    kld, top1 = _value(quality.get("kld")), _value(quality.get("top1_agreement"))
    ppl = _value(quality.get("ppl_change"))
    parts = ([f"KLD {kld:.4f}"] if kld is not None else []) + [f"ppl {number(ppl) * 100:+.1f}%"] \
        + ([f"top-1 {top1:.2f}"] if top1 is not None else [])
    return " · ".join(parts + ([verdict(quality)] if verdict(quality) else []))


def cost_text(quality: StoredQuality | None) -> str:
    """A stored quality result's loss in plain words, perplexity first, e.g. "+13.4% perplexity
    [+12.9%, +13.9%] (KLD 0.067, top-1 0.90)" (a study that stored NLL only: its perplexity from it,
    `with_units`); "an unmeasured quality" when there is none."""
    quality = with_units(quality)
    if not quality or not quality.get("ppl_change"):
        return "an unmeasured quality"
    ppl: StoredEstimate = quality.get("ppl_change") or {}
    text = f"{ppl['value'] * 100:+.1f}% perplexity [{ppl['ci_low'] * 100:+.1f}%, {ppl['ci_high'] * 100:+.1f}%]"
    kld, top1 = _value(quality.get("kld")), _value(quality.get("top1_agreement"))
    units = []
    if kld is not None:
        units.append(f"KLD {kld:.3f}")
    if top1 is not None:
        units.append(f"top-1 {top1:.2f}")
    return text + (f" ({', '.join(units)})" if units else "")


def _value(estimate: StoredEstimate | None) -> float | None:
    """A stored estimate's value; None without the estimate (missing, or stored as null or empty)."""
    return estimate["value"] if estimate else None


def floor_text(reference_probe: JsonDict | list[JsonDict] | None, estimates: dict[str, Estimate] | None = None) -> str:
    """One line: the reference against itself, and the probe's size ("" when no floor was measured).
    `estimates`: the probe's `floor_estimates`, where the caller has them already."""
    if not reference_probe:
        return ""
    ref = Reference.from_json(reference_probe)
    est = _estimates(ref.floor) if estimates is None else estimates
    if "nll" not in est:
        return ""
    size = f"{len(ref.items)} texts, {sum(len(i.reference_logprobs) for i in ref.items)} tokens"
    parts = [f"KLD {est['kld'].value:.4f} [{est['kld'].low:.4f}, {est['kld'].high:.4f}]"] if "kld" in est else []
    parts.append(f"ppl {est['ppl'].value * 100:+.2f}% [{est['ppl'].low * 100:+.2f}%, {est['ppl'].high * 100:+.2f}%]")
    if "top1" in est:
        parts.append(f"top-1 {est['top1'].value:.3f}")
    return f"noise floor (the reference against itself, {size}): " + " · ".join(parts)


def self_check(qualities: Sequence[tuple[int, StoredQuality | None]]) -> str:
    """The study's probe self-check over (trial, stored quality): lossless-by-construction trials
    within the floor, or the probe too noisy ("" when no such trial was measured)."""
    lossless = [(n, q) for n, q in qualities if q and q.get("lossless") and q.get("within_floor") is not None
                and q.get("reused_from") is None]  # a reused result is not another check
    if not lossless:
        return ""
    noisy = [n for n, q in lossless if not q["within_floor"]]
    if noisy:
        return (f"quality probe too noisy on this platform: trial(s) {', '.join(map(str, noisy))} cannot change the "
                f"output (lossless by construction) yet measured beyond the noise floor; quality differences of "
                f"that size are the probe's noise, not the configurations' (more --probe-prompts/--probe-tokens "
                f"narrow it)")
    return (f"quality self-check passed: lossless-by-construction trial(s) {', '.join(str(n) for n, _ in lossless)} "
            f"within the noise floor")
