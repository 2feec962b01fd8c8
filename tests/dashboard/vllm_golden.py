"""vLLM exports as they were before the export learned a second engine (tests/dashboard/golden/):
`cases` names each export, `render` writes it, `python -m tests.dashboard.vllm_golden` records them
again (only when a change to vLLM's exports is meant)."""

from __future__ import annotations

import copy
import dataclasses as dc
import json
import sys
from collections.abc import Iterator
from pathlib import Path

from tracetune.dashboard.data import StudyView
from tracetune.dashboard.export import FORMATS, ExportOptions, export

GOLDEN = Path(__file__).parent / "golden" / "vllm_exports.json"
# The GPU release tracetune runs moves with vLLM: recorded as this placeholder.
VERSION = "<GPU_VLLM_VERSION>"


def cases(study: StudyView) -> Iterator[tuple[str, str]]:
    """(name, export text) for every format of: a GPU study's trial 1, its reference and an infeasible
    trial; a CPU study's trial with CPU-only settings and secrets; a random-weight trial; options set."""
    from tracetune.engine_adapter.platform import GPU_VLLM_VERSION

    cpu = dc.replace(study, platform="cpu", vllm_version="0.32.0")
    cpu_trial = copy.deepcopy(cpu.trial(1))
    cpu_trial.config.update(enforce_eager=True, kv_cache_space_gib=4.0, extra_args=["--api-key", "sk-x" * 8],
                            env={"VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_LOGGING_LEVEL": "INFO",
                                 "HF_TOKEN": "hf_abcdefghijklmnopqrstuv"})
    dummy = copy.deepcopy(study.trial(0))
    dummy.config.update(load_format="dummy")
    shaped = ExportOptions(gpus=2, namespace="serving", replicas=3, cpu="12", memory="96Gi", shm_gib=4,
                           name="mine", models_pvc="llm", port=9000)
    views = (("gpu-t1", study, study.trial(1), ExportOptions()),
             ("gpu-ref", study, study.reference_run, ExportOptions()),
             ("gpu-t3", study, study.trial(3), ExportOptions(engine_version="0.26.0")),
             ("cpu-t1", cpu, cpu_trial, ExportOptions()),
             ("dummy", study, dummy, ExportOptions(allow_dummy_weights=True, gpus=0)),
             ("shaped", cpu, cpu.trial(0), shaped))
    for name, view, trial, options in views:
        for fmt in FORMATS:
            yield f"{name}/{fmt}", export(view, trial, fmt, options).replace(GPU_VLLM_VERSION, VERSION)


if __name__ == "__main__":
    import tempfile

    from tests.dashboard.synthetic import make_study
    from tracetune.dashboard import data

    with tempfile.TemporaryDirectory() as tmp:
        view = data.load_study(make_study(Path(tmp) / "study.db"), "synth")
        GOLDEN.write_text(json.dumps(dict(cases(view)), indent=1, sort_keys=True) + "\n")
    sys.stdout.write(f"wrote {GOLDEN}\n")
