"""A Tuner whose engine runs are scripted (no vLLM): a `ScriptedRunner` is handed to it as its
`TrialRunner`; the study logic, the database and the sampler are real. Used to test resume,
failures-as-infeasible, claims and redaction quickly."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracetune.engine_adapter.platform import Platform
from tracetune.errors import EngineError
from tracetune.quality.probe import ProbeItem, QualityResult, Reference
from tracetune.replay.metrics import Estimate, Summary
from tracetune.replay.trace import load_trace
from tracetune.replay.types import ReplayOptions
from tracetune.search_spaces.space import load_space
from tracetune.tuner.runner import Measurement, QualityProbe, TrialRunner
from tracetune.tuner.study import StudySettings, Tuner

SEQS = """\
name: seqs
fixed: {enforce_eager: true}
parameters:
  max_num_seqs: {choices: [1, 2, 4, 8]}
"""
TRACE = "\n".join(f'{{"timestamp": {i * 0.1}, "prompt": "hello number {i}", "output_length": 8}}'
                  for i in range(6)) + "\n"


def fake_model(folder: Path) -> Path:
    """A model folder the main job's model check accepts (nothing loads it: the runner is scripted)."""
    folder.mkdir()
    (folder / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(b"")
    (folder / "tokenizer.json").write_text("{}")
    return folder


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
REFERENCE = Reference(items=[ProbeItem(prompt_ids=[1], reference_ids=[2], reference_logprobs=[-0.5])])


class ScriptedRunner:
    """A `TrialRunner` whose measurements come from `script`; the reference is always TTFT 0.5 s,
    50 tok/s, no loss. Every label it measures is appended to `calls`."""

    def __init__(self, script: Script, *, calls: list, delay_s: float = 0.0) -> None:
        self.script, self.calls, self.delay_s = script, calls, delay_s
        self._lock = threading.Lock()

    def measure(self, config: Any, label: str, *, probe: QualityProbe | None, start: float = 1.0,
                prune: Any = None) -> Measurement:
        with self._lock:
            self.calls.append(label)
        if self.delay_s:
            time.sleep(self.delay_s)
        if label == "reference":
            return Measurement(summary=fake_summary(0.5, 50.0), quality=fake_quality(0.0), startup_s=1.0,
                               log_tail="reference log", reference=REFERENCE)
        ttft, tps, loss, *rest = self.script(config)
        summary = fake_summary(ttft, tps, rest[0] if rest else 0.0)
        summary.client_overloaded = bool(rest[1]) if len(rest) > 1 else False
        return Measurement(summary=summary, quality=fake_quality(loss), startup_s=1.0,
                           requests_jsonl='{"index": 0}\n', log_tail=f"log of {label}")


class Events(list):
    """A `Reporter` that records every event as (name, fields)."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        if not name.startswith("on_"):
            raise AttributeError(name)
        return lambda **fields: self.append((name[3:], fields))


def make_tuner(tmp_path: Path, script: Script, *, space_yaml: str, study: str = "s", trials: int = 4,
               url: str | None = None, sampler: str = "random", seed: int = 0, heartbeat_s: int = 2,
               secrets: list[str] | None = None, base: dict | None = None, calls: list | None = None,
               delay_s: float = 0.0, enqueue: list | None = None, slos=None, runner: TrialRunner | None = None,
               events: Events | None = None, **settings: Any) -> Tuner:
    """A study of `space_yaml` on a six-request trace whose runner is `runner` (default: `script`'s);
    `settings` are further `StudySettings` fields."""
    (tmp_path / "trace.jsonl").write_text(TRACE)
    (tmp_path / "space.yaml").write_text(space_yaml)
    url = url or f"sqlite:///{tmp_path / 'study.db'}"
    settings = StudySettings(study_name=study, storage_url=url, trials=trials,
                             objectives=settings.pop("objectives", ["ttft_p99", "output_tps", "quality_loss"]),
                             slos=slos or [], max_quality_loss=None, sampler=sampler, seed=seed,
                             replay=ReplayOptions(), heartbeat_s=heartbeat_s, secrets=secrets or [],
                             enqueue=enqueue or [], **settings)
    calls = calls if calls is not None else []
    tuner = Tuner(settings, trace=load_trace(tmp_path / "trace.jsonl"), space=load_space(tmp_path / "space.yaml"),
                  model_dir=tmp_path / "model", platform=Platform.CPU, base=base,
                  runner=runner or ScriptedRunner(script, calls=calls, delay_s=delay_s), report=events)
    tuner.calls = calls  # type: ignore[attr-defined]
    return tuner


def crash(reason: str = "the engine crashed during the replay") -> None:
    raise EngineError(reason, exit_code=-9, log_tail="Traceback ...\nRuntimeError: boom")
