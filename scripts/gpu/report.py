"""Tables for docs/results/h200.md from the two H200 study databases (stored next to it, xz).

    .venv/bin/python scripts/gpu/report.py            # prints markdown

Every number comes from the stored per-trial summaries and per-request records. Goodput at
other SLOs is recomputed from the stored per-request TTFT/TPOT (the study's own SLO was stated
before the run; the sweep shows how the comparison depends on that choice).
"""

from __future__ import annotations

import dataclasses
import json
import lzma
import shutil
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from tracetune.engine_adapter.registry import engine_kind  # noqa: E402
from tracetune.replay.metrics import parse_slos, summarize  # noqa: E402
from tracetune.replay.types import ReplayOptions, ReplayResult, RequestRecord  # noqa: E402
from tracetune.tuner.storage import ResultStore  # noqa: E402

config_diff = engine_kind("vllm").config_diff  # how a stored vLLM config reads against another

RESULTS = ROOT / "docs" / "results" / "h200"


def open_store(name: str) -> ResultStore:
    tmp = Path(tempfile.mkdtemp()) / f"{name}.db"
    with lzma.open(RESULTS / f"{name}.db.xz") as src, open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return ResultStore(f"sqlite:///{tmp}")


def ms(e: dict) -> str:
    return f"{e['value'] * 1000:.0f} [{e['ci_low'] * 1000:.0f}, {e['ci_high'] * 1000:.0f}]"


def goodput(jsonl: str, duration: float, ttft_s: float, tpot_s: float):
    """Goodput of stored per-request records under per-request SLOs, with the tuner's own
    definition (replay.metrics.summarize): (value, ci_low, ci_high) in requests/s."""
    fields = {f.name for f in dataclasses.fields(RequestRecord)}
    records = [RequestRecord(**{k: v for k, v in json.loads(line).items() if k in fields})
               for line in jsonl.splitlines() if line.strip()]
    slos = parse_slos(f"ttft:p99<{ttft_s * 1000:g}ms,tpot:p99<{tpot_s * 1000:g}ms")
    g = summarize(ReplayResult(records, duration, ReplayOptions()), slos).goodput_rps
    return g.value, g.low, g.high


def main() -> None:
    for study, name in (("h200-a", "study_a"), ("h200-b", "study_b")):
        store = open_store(name)
        ref = store.reference(study)
        rows = store.trials(study)
        print(f"\n### {study}\n")
        print("| trial | differs from the reference (vLLM defaults) | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | "
              "TPOT p99 ms | output tok/s | quality: NLL delta nats/token | top-1 agreement | "
              "engine start s | trial wall s |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        s = ref["summary"]
        L = s["latency_s"]
        print(f"| ref | (none) | {ms(L['ttft']['p50'])} | {ms(L['ttft']['p99'])} | {ms(L['tpot']['p50'])} | "
              f"{ms(L['tpot']['p99'])} | {s['output_throughput_tps']['value']:.0f} | 0 (by definition) | 1 | | |")
        for r in rows:
            if r["status"] != "measured":
                print(f"| {r['trial_number']} | {r['values']} | {r['status']}: {r['failure_reason'][:120]} |")
                continue
            s, q, L = r["summary"], r["quality"], r["summary"]["latency_s"]
            diff = {k: v for k, v in config_diff(r["config"], ref["config"]).items() if k not in ("model",)}
            if "W4A16" in str(r["config"]["model"]) or "W8A8" in str(r["config"]["model"]):
                diff["model"] = Path(r["config"]["model"]).name.split("-bf16-")[-1]
            nll = q["nll_delta_per_token"]
            agree = q.get("top1_agreement") or q.get("greedy_agreement")  # older studies: greedy only
            print(f"| {r['trial_number']} | {', '.join(f'{k}={v}' for k, v in diff.items())} | "
                  f"{ms(L['ttft']['p50'])} | {ms(L['ttft']['p99'])} | "
                  f"{ms(L['tpot']['p50'])} | {ms(L['tpot']['p99'])} | "
                  f"{s['output_throughput_tps']['value']:.0f} | "
                  f"{nll['value']:+.4f} [{nll['ci_low']:+.4f}, {nll['ci_high']:+.4f}] | "
                  f"{agree['value']:.2f} [{agree['ci_low']:.2f}, {agree['ci_high']:.2f}] | "
                  f"{r['startup_s']:.0f} | {r['wall_s']:.0f} |")
        if study != "h200-a":
            continue
        # Goodput at the study's SLO (stated before the run) and, recomputed from the stored
        # per-request records, at tighter SLOs. The reference's per-request records were not stored
        # by the version that ran (only its summary), so it appears at the study's SLO only.
        measured = [r for r in rows if r["status"] == "measured"]
        g = ref["summary"]["goodput_rps"]
        print(f"\nAt the study's SLO (TTFT p99 < 2 s, TPOT p99 < 50 ms): reference {g['value']:.2f} req/s "
              f"[{g['ci_low']:.2f}, {g['ci_high']:.2f}], " + ", ".join(
                  f"trial {r['trial_number']} {r['summary']['goodput_rps']['value']:.2f} req/s" for r in measured)
              + f"; best / reference = {max(r['summary']['goodput_rps']['value'] for r in measured) / g['value']:.3f}")
        print("\nGoodput of the measured trials at tighter per-request SLOs (req/s, 95% bootstrap CI over requests):\n")
        print("| SLO (TTFT <=, TPOT <=) | " + " | ".join(f"trial {r['trial_number']}" for r in measured) + " |")
        print("|---|" + "---|" * len(measured))
        for ttft, tpot in [(2.0, 0.050), (0.2, 0.015), (0.2, 0.010), (0.1, 0.008)]:
            cells = []
            for r in measured:
                v = goodput(r["requests_jsonl"], r["summary"]["duration_s"], ttft, tpot)
                cells.append(f"{v[0]:.2f} [{v[1]:.2f}, {v[2]:.2f}]")
            print(f"| {ttft * 1000:.0f} ms, {tpot * 1000:.0f} ms | " + " | ".join(cells) + " |")

if __name__ == "__main__":
    main()
