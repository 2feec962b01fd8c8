"""The simulated engine's settings as a user reaches them, described once: each `SimConfig` field's
command-line flag (`FLAGS`) and the search-space knob that sets it (`KNOBS`). Flags that mean what
vLLM's mean share vLLM's spelling (`--max-num-seqs`, `--served-model-name`, `--model`: `--help`
names the simulator beside vLLM's meaning); the simulator's own start with `--sim-` and say it is
one. The knob `precision` sets the field `dtype` (`translate.py`)."""

from __future__ import annotations

import typing

from tracetune.engine_adapter.kind import EngineFlag, Knob, Knobs
from tracetune.engine_adapter.sim.config import SimConfig, SimPrecision

PRECISION_CHOICES: tuple[str, ...] = typing.get_args(SimPrecision)
_WHAT = "simulator (for tests and benchmarks, not a real engine)"

FLAGS: tuple[EngineFlag, ...] = (
    EngineFlag("model", "--model", metavar="DIR",
               help="only the name is served, no weights are read (a tokenizer's folder serves length-only "
                    "traces)"),
    EngineFlag("served_model_name", "--served-model-name", metavar="NAME"),
    EngineFlag("max_num_seqs", "--max-num-seqs", "int", "N", "slots: requests served at once"),
    EngineFlag("dtype", "--sim-precision", choices=PRECISION_CHOICES,
               help=f"{_WHAT}: precision (fp8 and int4 run faster and lose quality; default bf16)"),
    EngineFlag("ttft_ms", "--sim-ttft-ms", "positive", "MS",
               f"{_WHAT}: milliseconds from a slot to the first token in bf16 "
               f"(default {SimConfig.model_fields['ttft_ms'].default:g})"),
    EngineFlag("tpot_ms", "--sim-tpot-ms", "positive", "MS",
               f"{_WHAT}: milliseconds a token with one request decoding in bf16 "
               f"(default {SimConfig.model_fields['tpot_ms'].default:g})"),
    EngineFlag("alpha", "--sim-alpha", "float", "F",
               f"{_WHAT}: every token slows by this share per other request holding a slot "
               f"(default {SimConfig.model_fields['alpha'].default:g})"),
    EngineFlag("extra_args", "--engine-arg", "many", "ARG", "extra server argument, repeatable"),
    EngineFlag("env", "--engine-env", "pairs", "KEY=VALUE", "extra environment variable for the server, repeatable"),
)

KNOBS: Knobs = {
    "max_num_seqs": Knob("slots: requests served at once"),
    "precision": Knob("precision (bf16, fp8, int4): faster, with a known synthetic quality loss",
                      values=PRECISION_CHOICES),
}
