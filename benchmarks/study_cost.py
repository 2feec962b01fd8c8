"""What a study costs under the classic capacity rules and the guided ones, side by side in one run,
on the simulated engine's zoo of configurations, whose true capacities and true front are known.

    .venv/bin/python benchmarks/study_cost.py [--seeds 3] [--noise 0.03] [--json OUT]

The zoo is the simulated engine's search space (`engine_adapter/sim/space.yaml`: slots 2-32 x
bf16/fp8/int4, 15 configurations; its reference is 8 slots in bf16), each served by the engine's own
timing model (`engine_adapter/sim/model.py`: 50 ms to the first token and 10 ms a token in bf16,
fp8 0.7x and int4 0.5x those, every token 5% slower per other request holding a slot) in virtual
time (`capacity.virtual`). `--noise N`: each replay runs with its times scaled by one factor drawn
in [1 - N, 1 + N] (a machine whose speed wanders from level to level), so repeats can disagree.

A study here is the reference's capacity search from the trace's rate, then every configuration of
the zoo in an order shuffled by the seed (as a sampler would visit them), each with the trace's rate
measured first, as `tune` does (in full, but under the guided rules it ends once it certainly
misses the SLO, the reference's too), and its search pruned where a configuration already measured with no more quality
loss passes a level it fails (`capacity.search`'s prune rule, as the tuner's early stop uses it), or
stopped at 1x where it missed the SLO at the trace's rate (`tuner.incumbents`; the reference too,
`tuner.measure`). The classic rules
start each trial at the reference's capacity; the guided ones where the study's measured trials
predict (`tuner.capacity_prior`). Reported per rule set: levels
and replay seconds (the time an engine is busy) per configuration, the worst capacity error against
the truth of the configurations searched to the end, and whether the front found (capacity and
quality loss; a pruned configuration is never on it, nor, as in the tuner, one below the trace's
rate, which misses the SLO there) is the true front.

Trace and levels: examples/chat.jsonl (the quickstart's 60 requests, 30 s) at the quickstart's SLO
(TTFT p95 < 2 s, TPOT p95 < 200 ms), 95% attainment, default level windows, precision 10%.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics
import sys
from pathlib import Path
from typing import Any

from tracetune.capacity.levels import LevelRunner
from tracetune.capacity.step import CapacityOptions
from tracetune.capacity.virtual import VirtualSend
from tracetune.engine_adapter.registry import engine_kind
from tracetune.engine_adapter.sim.config import SimConfig, loss_nats, model_of
from tracetune.engine_adapter.sim.model import SimModel
from tracetune.replay.metrics import parse_slos, summarize
from tracetune.replay.types import PreparedRequest, ReplayOptions
from tracetune.search_spaces.space import SearchSpace, load_space
from tracetune.tuner.capacity_prior import CapacityPrior
from tracetune.tuner.objectives import keeps_slos

ROOT = Path(__file__).resolve().parents[1]
RULES = ("classic", "guided")
DEFAULT_SLO = "ttft:p95<2s,tpot:p95<20ms"
SLO = DEFAULT_SLO
PRECISION = 0.1


def chat_trace() -> list[PreparedRequest]:
    lines = [json.loads(x) for x in (ROOT / "examples" / "chat.jsonl").read_text().splitlines() if x.strip()]
    return [PreparedRequest(index=i, id=None, scheduled_s=float(d["timestamp"]), max_tokens=int(d["output_length"]),
                            input_tokens=float(len(d["prompt"].split()))) for i, d in enumerate(lines)]


def sim_space() -> SearchSpace:
    return load_space(ROOT / "engine_adapter" / "sim" / "space.yaml", engine_kind("sim"))


def zoo(space: SearchSpace) -> list[dict[str, Any]]:
    """Every configuration of the space, as its knob values."""
    slots = space.parameters["max_num_seqs"].choices or []
    precisions = space.parameters["precision"].choices or []
    return [{"max_num_seqs": n, "precision": p} for n in slots for p in precisions]


BASE: dict[str, float] = {}  # the timing the zoo's configurations share (--ttft-ms, --tpot-ms; default the sim's)


def config_of(values: dict[str, Any]) -> SimConfig:
    return SimConfig(max_num_seqs=values["max_num_seqs"], dtype=values["precision"], **BASE)


@dataclasses.dataclass
class Noisy:
    """The model with each replay's times scaled by one factor in [1 - noise, 1 + noise]."""

    model: SimModel
    noise: float
    rng: random.Random

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        f = 1 + self.rng.uniform(-self.noise, self.noise)
        m = dataclasses.replace(self.model, ttft_s=self.model.ttft_s * f, tpot_s=self.model.tpot_s * f)
        return VirtualSend(m)(*args, **kwargs)


def options(rules: str, start: float = 1.0, precision: float = PRECISION, confirm: bool = True) -> CapacityOptions:
    return CapacityOptions(slos=tuple(parse_slos(SLO)), precision=precision, rules=rules, start_scale=start,
                           confirm=confirm)


def truth(requests: list[PreparedRequest], model: SimModel) -> float:
    r = LevelRunner("http://simulated", "sim", requests, ReplayOptions(), options("classic", precision=0.01,
                                                                                    confirm=False),
                    send=VirtualSend(model))
    return r.search().capacity_scale or 0.0


def search(requests: list[PreparedRequest], send: Any, rules: str, start: float,
           prune_at: float | None) -> dict[str, Any]:
    """One configuration's search as a study runs it (`tuner.measure`), the reference's too: the
    trace's rate in full (the latency objectives come from it; it ends once it certainly misses the
    SLO under the guided rules), then the search, stopped at 1x where it missed the SLO there
    (`tuner.incumbents`; the reference's, `tuner.measure`)."""
    opts = options(rules, start)
    r = LevelRunner("http://simulated", "sim", requests, ReplayOptions(), opts, send=send)
    seed = r.level(1.0, abandon=False, end_on_slo_miss=opts.ends_decided)
    if not keeps_slos(summarize(r.results[1.0], opts.slos), list(opts.slos)):
        prune_at = max(prune_at or 1.0, 1.0)
    result = r.search(seed_steps=[seed], prune_at=prune_at)
    return {"k": result.capacity_scale or 0.0, "high": result.bracket_high, "levels": len(r.measured),
            "replay_s": sum(res.duration_s for _, res in r.measured), "verdict": str(result.verdict),
            "raw": result.as_dict()}


def prune_level(measured: list[dict[str, Any]], loss: float) -> float | None:
    """The highest capacity among measured, unpruned configurations with no more quality loss."""
    rivals = [m["k"] for m in measured if m["verdict"] != "pruned" and m["loss"] <= loss and m["k"] > 0]
    return max(rivals, default=None)


def feasible(k: float) -> float:
    """A capacity as the front reads it: 0 below the trace's rate, where a configuration misses the SLO
    and is infeasible whatever its capacity (`tuner.objectives.keeps_slos`)."""
    return k if k >= 1.0 else 0.0


def front(points: list[tuple[str, float, float]]) -> set[str]:
    """Labels of the (label, capacity, loss) points no other beats (higher capacity, lower loss)."""
    def beats(a: tuple[str, float, float], b: tuple[str, float, float]) -> bool:
        return a[1] >= b[1] and a[2] <= b[2] and (a[1] > b[1] or a[2] < b[2])

    return {p[0] for p in points if p[1] > 0 and not any(beats(q, p) for q in points)}


def study(requests: list[PreparedRequest], configs: list[dict[str, Any]], space: SearchSpace, rules: str,
          noise: float, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    order = configs[:]
    rng.shuffle(order)
    reference = SimConfig(**BASE)
    ref = search(requests, Noisy(model_of(reference), noise, rng), rules, 1.0, None)
    ref.update(label="reference", loss=loss_nats(reference))
    prior = CapacityPrior(space, fallback=ref["k"] or 1.0)
    measured: list[dict[str, Any]] = []
    for values in order:
        config = config_of(values)
        start = prior.start(values)[0] if rules == "guided" else (ref["k"] or 1.0)
        start = min(max(start, 0.125), 256.0)
        row = search(requests, Noisy(model_of(config), noise, rng), rules, start,
                     prune_level([ref, *measured], loss_nats(config)))
        row.update(label=f"{values['max_num_seqs']}/{values['precision']}", loss=loss_nats(config), values=values)
        prior.add(len(measured), values, row.pop("raw"), 0.125)
        measured.append(row)
    ref.pop("raw")
    return {"reference": ref, "trials": measured}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3, help="studies per rule set, each its own order (default 3)")
    ap.add_argument("--noise", type=float, default=0.03, help="each replay's speed wanders by +-N (default 0.03)")
    ap.add_argument("--ttft-ms", type=float, help="the zoo's time to the first token in bf16 (default: the sim's)")
    ap.add_argument("--tpot-ms", type=float, help="the zoo's time a token in bf16 (default: the sim's)")
    ap.add_argument("--slo", default=DEFAULT_SLO, help=f"default {DEFAULT_SLO}")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    global SLO
    SLO = args.slo
    BASE.update({k: v for k, v in (("ttft_ms", args.ttft_ms), ("tpot_ms", args.tpot_ms)) if v is not None})
    requests, space = chat_trace(), sim_space()
    configs = zoo(space)
    true = {f"{v['max_num_seqs']}/{v['precision']}": truth(requests, model_of(config_of(v))) for v in configs}
    losses = {f"{v['max_num_seqs']}/{v['precision']}": loss_nats(config_of(v)) for v in configs}
    true["reference"], losses["reference"] = truth(requests, model_of(SimConfig(**BASE))), 0.0
    true_front = front([(k, feasible(true[k]), losses[k]) for k in true])
    print(f"zoo: {len(configs)} configurations + the reference; true front: {', '.join(sorted(true_front))}")
    timing = SimConfig(**BASE)
    print(f"bf16 {timing.ttft_ms:g} ms to the first token, {timing.tpot_ms:g} ms a token; SLO {SLO}; noise "
          f"+-{args.noise:.0%} a replay; {args.seeds} studies per rule set; precision {PRECISION:.0%}\n")
    print(f"{'rules':<9}{'levels/config':>14}{'replay s/config':>16}{'pruned':>8}{'worst error':>12}"
          f"{'front found':>13}")
    out: dict[str, list[dict[str, Any]]] = {}
    for rules in RULES:
        studies = [study(requests, configs, space, rules, args.noise, seed) for seed in range(args.seeds)]
        out[rules] = studies
        rows = [r for s in studies for r in [s["reference"], *s["trials"]]]
        full = [r for r in rows if r["verdict"] != "pruned" and true[r["label"]] > 0]
        worst = max((abs(r["k"] / true[r["label"]] - 1) for r in full), default=0.0)
        found = sum(front([(r["label"], feasible(r["k"]) if r["verdict"] != "pruned" else 0.0, r["loss"])
                           for r in [s["reference"], *s["trials"]]]) == true_front for s in studies)
        print(f"{rules:<9}{statistics.mean(r['levels'] for r in rows):>14.2f}"
              f"{statistics.mean(r['replay_s'] for r in rows):>16.0f}"
              f"{sum(r['verdict'] == 'pruned' for r in rows) / len(studies):>8.1f}{worst:>12.0%}"
              f"{found:>8} of {len(studies)}")
    ratio = {m: sum(r[m] for s in out["guided"] for r in [s["reference"], *s["trials"]]) /
             sum(r[m] for s in out["classic"] for r in [s["reference"], *s["trials"]]) for m in ("levels", "replay_s")}
    print(f"\nguided / classic: levels {ratio['levels']:.2f}x, replay seconds {ratio['replay_s']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"truth": true, "true_front": sorted(true_front), **out}, indent=1,
                                        default=lambda x: None if isinstance(x, float) and math.isinf(x) else x))
    return 0


if __name__ == "__main__":
    sys.exit(main())
