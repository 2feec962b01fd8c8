"""Speculative decoding's draft acceptance forced to the recorded lengths against natural stops.

A replay forces every output to its recorded length (ignore-EOS); a model forced past its natural
end repeats itself, and drafts look better there than on the text users get. For each engine,
method and draft length K, one engine serves the trace's real prompts one at a time, greedy, each
twice (`tracetune.replay.acceptance`, the probe `tune` runs on every speculative trial): with
natural stops (up to the recorded length) and forced to it. Printed side by side:

- acceptance (accepted over proposed draft tokens), natural and forced, and on the tokens past the
  natural end alone;
- tokens per verification step each predicts (1 + accepted per draft: the most speculation can
  speed decoding up by; where the engine does not count its drafts, 1 + K x acceptance, exact when
  every draft is K long);
- TPOT p50 at 1 client, natural and forced, and its speedup over the same engine without
  speculation measured the same way (what each prediction is worth on this machine).

    python benchmarks/spec_natural.py                       # vLLM ngram and llama.cpp draft, K 2,4,8
    python benchmarks/spec_natural.py --engines llamacpp --ks 2,4 --prompts 16
    python benchmarks/spec_natural.py --ks 4 --prompts 6 --length 384 --out benchmarks/data/spec_natural_long.json

Results go to benchmarks/data/spec_natural_cpu.json (--out) with the machine, date and versions.
About 15 minutes on 2 cores (vLLM's starts take ~40 s each).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import platform
from pathlib import Path

from engines import engine_config
from spec_k import _cores, _cpu_name

ROOT = Path(__file__).resolve().parent.parent
# What each engine speculates with: (label, search-space values but K).
METHODS = {"vllm": [("ngram", {"speculative": "ngram"})],
           "llamacpp": [("draft Q4", {"speculative": "draft_model", "draft_model": "derived:Q4_K_M"})]}
K_KNOB = {"vllm": "num_speculative_tokens", "llamacpp": "draft_max"}


def measure(engine: str, label: str, values: dict, k: int | None, args, model: Path, requests) -> dict:
    """One engine serving `requests` twice each (natural, forced): the probe's numbers."""
    from tracetune.replay.acceptance import measure_acceptance

    values = {**values, K_KNOB[engine]: k} if k is not None else {"speculative": "none"}
    kind, config = engine_config(engine, values, model, eager=True)
    server = kind.make(args.run_dir / f"{engine}-{label.replace(' ', '_')}-k{k}")
    try:
        startup = server.launch(config, timeout_s=900)
        acceptance = measure_acceptance(server, requests, timeout_s=600)
    finally:
        server.stop()
    row = {"engine": engine, "method": label, "k": k, "startup_s": startup, **acceptance.as_dict(),
           "past_end_rate": acceptance.past_end_rate, "past_end_tokens": acceptance.past_end_tokens}
    for name, part in (("natural", acceptance.natural), ("forced", acceptance.forced)):
        row[f"{name}_tpot_p50_s"] = part.tpot_p50_s
        counted = not math.isnan(part.tokens_per_step) or k is None
        row[f"{name}_tokens_per_step"] = part.tokens_per_step if counted else 1 + k * part.rate
    row = {key: None if isinstance(v, float) and math.isnan(v) else v for key, v in row.items()}  # strict JSON
    print(line(row), flush=True)
    return row


def _pct(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.0%}"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}ms"


def _ratio(base: float | None, value: float | None) -> float | None:
    """How many times faster `value` is than `base` (TPOTs); None where either is missing."""
    return base / value if base and value else None


def _x(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"x{value:.1f}"


def line(row: dict) -> str:
    return (f"  {row['engine']:<8} {row['method']:<8} K={row['k'] or '-':<2} accepted natural "
            f"{_pct(row['natural_rate'])}, forced {_pct(row['forced_rate'])}; TPOT p50 "
            f"{_ms(row['natural_tpot_p50_s'])} / {_ms(row['forced_tpot_p50_s'])}")


def table(rows: list[dict]) -> str:
    """One line per engine, method and K: acceptance natural | forced | past the end, the tokens per
    step each predicts, TPOT natural | forced and its speedup over no speculation on that engine."""
    base = {r["engine"]: r for r in rows if r["k"] is None}
    head = (f"{'engine':<8} {'method':<8} {'K':>2} {'acc nat':>7} {'frc':>4} {'past':>4} "
            f"{'step nat':>8} {'frc':>4} {'TPOT nat':>8} {'frc':>5} {'spd nat':>7} {'frc':>4}")
    lines = [head]
    for r in rows:
        b = base.get(r["engine"])
        speed = {name: _ratio(b and b[f"{name}_tpot_p50_s"], r[f"{name}_tpot_p50_s"]) for name in ("natural", "forced")}
        lines.append(
            f"{r['engine']:<8} {r['method']:<8} {r['k'] or '-':>2} {_pct(r['natural_rate']):>7} "
            f"{_pct(r['forced_rate']):>4} {_pct(r['past_end_rate']):>4} {_x(r['natural_tokens_per_step']):>8} "
            f"{_x(r['forced_tokens_per_step']):>4} {_ms(r['natural_tpot_p50_s']):>8} "
            f"{_ms(r['forced_tpot_p50_s']):>5} {_x(speed['natural']):>7} {_x(speed['forced']):>4}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", default="vllm,llamacpp", help="engines, comma-separated (vllm, llamacpp)")
    p.add_argument("--ks", default="2,4,8", help="draft lengths K, comma-separated")
    p.add_argument("--prompts", type=int, default=12, help="trace prompts measured (default 12)")
    p.add_argument("--tokens", type=int, default=256, help="most output tokens per request (default 256)")
    p.add_argument("--trace", type=Path, default=ROOT / "examples" / "chat.jsonl")
    p.add_argument("--length", type=int, metavar="N",
                   help="force every request to N output tokens (as a trace recorded from a model whose answers "
                        "run longer than this one's)")
    p.add_argument("--completions", action="store_true",
                   help="send the trace's prompts as plain completions (default: as one chat turn each)")
    p.add_argument("--run-dir", type=Path, default=ROOT / "runs" / "spec-natural")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "data" / "spec_natural_cpu.json")
    args = p.parse_args()

    from tracetune.engine_adapter.models import prepare_default_model
    from tracetune.replay.acceptance import probe_requests
    from tracetune.replay.send import prepare
    from tracetune.replay.trace import load_trace
    from tracetune.replay.types import ReplayOptions

    model = prepare_default_model(print)
    requests = probe_requests(prepare(load_trace(args.trace), ReplayOptions()), args.prompts, args.tokens)
    if args.length:  # every answer recorded longer than this model's own
        requests = [dataclasses.replace(r, max_tokens=args.length) for r in requests]
    if not args.completions:  # ShareGPT's prompts were chat turns: sent as the instruct model's chat
        requests = [dataclasses.replace(r, prompt=None, messages=[{"role": "user", "content": r.prompt}])
                    if r.prompt is not None else r for r in requests]
    ks = [int(k) for k in args.ks.split(",")]
    rows = []
    for engine in args.engines.split(","):
        rows.append(measure(engine, "none", {}, None, args, model, requests))
        for label, values in METHODS[engine]:
            rows += [measure(engine, label, values, k, args, model, requests) for k in ks]
    print(table(rows))
    print("acc: draft tokens accepted; nat: natural stops, frc: forced to the recorded length; past: acc on\n"
          "the tokens past the natural end; step: tokens per verification step; spd: TPOT speedup over\n"
          "the same engine without speculation (one request at a time)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {"cpu": _cpu_name(), "cores": _cores(), "python": platform.python_version()},
        "trace": str(args.trace.relative_to(ROOT) if args.trace.is_relative_to(ROOT) else args.trace),
        "prompts": len(requests), "max_tokens": args.tokens, "length": args.length, "chat": not args.completions,
        "rows": rows},
        indent=2, default=str))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
