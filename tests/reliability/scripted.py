"""A Tuner whose engine runs are scripted (no vLLM): the study logic, the database and the
sampler are real. Used to test resume, failures-as-infeasible, claims and redaction quickly."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

from tracetune.errors import EngineError
from tracetune.engine_adapter.platform import Platform
from tracetune.replay.metrics import Estimate, Summary
from tracetune.replay.types import ReplayOptions
from tracetune.replay.trace import load_trace
from tracetune.search_spaces.space import load_space
from tracetune.tuner.quality import ProbeItem, QualityResult, Reference
from tracetune.tuner.study import StudySettings, Tuner

TRACE = "\n".join(f'{{"timestamp": {i * 0.1}, "prompt": "hello number {i}", "output_length": 8}}'
                  for i in range(6)) + "\n"


def est(v: float) -> Estimate:
    return Estimate(v, v * 0.9, v * 1.1)


def fake_summary(ttft: float, tps: float, error_rate: float = 0.0) -> Summary:
    latency = {m: {s: est(ttft) for s in ("mean", "p50", "p90", "p99")} for m in ("ttft", "tpot", "itl", "e2e")}
    errors = round(error_rate * 10)
    return Summary(requests=10, succeeded=10 - errors, errors=errors, error_rate=error_rate, duration_s=10.0,
                   request_throughput_rps=est(1.0), output_throughput_tps=est(tps), latency=latency,
                   schedule_lag={}, error_examples=["timed out after 5.0s"] if errors else [])


def fake_quality(loss: float) -> QualityResult:
    return QualityResult(nll_delta_per_token=est(loss), greedy_agreement=est(1.0), exact_match=1.0,
                         accuracy=None, n_prompts=4)


# measure(config) -> (ttft_s, output_tps, quality_loss[, error_rate[, client_overloaded]]) or raises EngineError
Script = Callable[[Any], tuple]


def make_tuner(tmp_path: Path, script: Script, *, space_yaml: str, study: str = "s", trials: int = 4,
               url: str | None = None, sampler: str = "random", seed: int = 0, heartbeat_s: int = 2,
               secrets: list[str] | None = None, base: dict | None = None, calls: list | None = None,
               delay_s: float = 0.0, enqueue: list | None = None, slos=None) -> Tuner:
    (tmp_path / "trace.jsonl").write_text(TRACE)
    (tmp_path / "space.yaml").write_text(space_yaml)
    url = url or f"sqlite:///{tmp_path / 'study.db'}"
    settings = StudySettings(study_name=study, storage_url=url, trials=trials,
                             objectives=["ttft_p99", "output_tps", "quality_loss"], slos=slos or [],
                             max_quality_loss=None, sampler=sampler, seed=seed, replay=ReplayOptions(),
                             heartbeat_s=heartbeat_s, secrets=secrets or [], enqueue=enqueue or [])
    tuner = Tuner(settings, trace=load_trace(tmp_path / "trace.jsonl"), space=load_space(tmp_path / "space.yaml"),
                  model_dir=tmp_path / "model", platform=Platform.CPU, run_dir=tmp_path / "run", base=base)
    calls = calls if calls is not None else []
    lock = threading.Lock()

    def measure(config, label, *, with_quality, start=1.0, prune=None):
        with lock:
            calls.append(label)
        if delay_s:
            import time
            time.sleep(delay_s)
        if label == "reference":
            tuner.reference = Reference(items=[ProbeItem(prompt_ids=[1], reference_ids=[2], reference_logprobs=[-0.5])])
            return {"summary": fake_summary(0.5, 50.0), "quality": fake_quality(0.0), "startup_s": 1.0,
                    "requests_jsonl": "", "log_tail": "reference log"}
        out = script(config)
        ttft, tps, loss, *rest = out
        summary = fake_summary(ttft, tps, rest[0] if rest else 0.0)
        summary.client_overloaded = bool(rest[1]) if len(rest) > 1 else False
        return {"summary": summary, "quality": fake_quality(loss),
                "startup_s": 1.0, "requests_jsonl": '{"index": 0}\n', "log_tail": f"log of {label}"}

    tuner._measure = measure  # type: ignore[method-assign]
    tuner.calls = calls  # type: ignore[attr-defined]
    return tuner


def crash(reason: str = "the engine crashed during the replay") -> None:
    raise EngineError(reason, exit_code=-9, log_tail="Traceback ...\nRuntimeError: boom")
