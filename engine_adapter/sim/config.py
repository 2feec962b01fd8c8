"""The simulated engine's settings (`SimConfig`) and what they make of its truth: the queueing model
a config serves by (`model_of`) and its synthetic quality loss (`loss_nats`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tracetune.engine_adapter.sim.model import PRECISIONS, SimModel

SimPrecision = Literal["bf16", "fp8", "int4"]
# The name it serves as its model when none is given: it loads no model.
SIM_MODEL = "sim"


class SimConfig(BaseModel):
    """Everything tracetune can set on the simulated engine; the defaults are its reference."""

    model_config = ConfigDict(extra="forbid")

    engine: Literal["sim"] = "sim"  # tells stored configs of different engines apart
    model: Path = Field(Path(SIM_MODEL), description="Only its name is used: the simulator loads no weights.")
    served_model_name: str | None = Field(None, min_length=1,
                                          description="Name clients request; default: the model's name.")
    max_num_seqs: int = Field(8, ge=1, le=1024, description="Slots: requests served at once, first come first "
                                                            "served.")
    dtype: SimPrecision = Field("bf16", description="Precision: fp8 and int4 run faster and lose quality "
                                                    "(`model.PRECISIONS`).")
    ttft_ms: float = Field(50.0, gt=0, description="Milliseconds from a slot to the first token, in bf16.")
    tpot_ms: float = Field(10.0, gt=0, description="Milliseconds a token with one request decoding, in bf16.")
    alpha: float = Field(0.05, ge=0, description="Slow-down of every token per other request holding a slot.")
    extra_args: list[str] = Field(default_factory=list, description="Passed to the server verbatim, last.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment for the server.")

    @model_validator(mode="before")
    @classmethod
    def _unset(cls, data: object) -> object:
        """A setting given as None (a flag left out) is the simulator's default."""
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data

    def name(self) -> str:
        return self.served_model_name or Path(self.model).name or SIM_MODEL

    def gpus(self) -> int:
        """One replica, counted as one accelerator."""
        return 1

    def speculation(self) -> str:
        """The simulator does not speculate."""
        return "none"


def model_of(config: SimConfig) -> SimModel:
    """The queueing model `config` serves by: its slots, its TTFT and TPOT at its precision's speed."""
    speed = PRECISIONS[config.dtype].speed
    return SimModel(slots=config.max_num_seqs, ttft_s=config.ttft_ms / 1000 * speed,
                    tpot_s=config.tpot_ms / 1000 * speed, alpha=config.alpha)


def loss_nats(config: SimConfig) -> float:
    """The mean NLL increase per token `config` answers with against bf16 (the quality probe's unit)."""
    return PRECISIONS[config.dtype].loss_nats
