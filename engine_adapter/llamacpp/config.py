"""llama.cpp's settings (`LlamaCppConfig`), apart from the server that runs them, so that the checks
of a started server (`verify.py`) read them without importing the server."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tracetune.engine_adapter.llamacpp.gguf import gguf_path

WeightFormat = Literal["F16", "BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M"]
CacheType = Literal["f16", "q8_0", "q4_0"]
QUANTIZED_CACHE = ("q8_0", "q4_0")
# A draft made from the target itself: "derived:<weight format>" (same tokenizer by construction).
DERIVED_PREFIX = "derived:"


class LlamaCppConfig(BaseModel):
    """Everything tracetune can set on a llama-server. None means "llama-server's default"."""

    model_config = ConfigDict(extra="forbid")

    engine: Literal["llamacpp"] = "llamacpp"  # tells stored configs of different engines apart
    model: Path = Field(description="Local model directory (Hugging Face layout) the GGUF weights are made from.")
    weights: WeightFormat = Field("F16", description="GGUF weight format made from the model.")
    gguf: Path | None = Field(None, description="An explicit GGUF file to serve (overrides weights).")
    served_model_name: str | None = Field(None, min_length=1,
                                          description="Name clients request; default: the model directory's name.")
    parallel: int | None = Field(None, gt=0, description="Server slots: requests decoded together (--parallel).")
    ctx_size: int | None = Field(None, gt=0, description="Context size of all slots together (--ctx-size).")
    batch_size: int | None = Field(None, gt=0, description="Logical batch size (--batch-size).")
    ubatch_size: int | None = Field(None, gt=0, description="Physical micro-batch size (--ubatch-size).")
    cache_type_k: CacheType | None = Field(None, description="K cache type (--cache-type-k).")
    cache_type_v: CacheType | None = Field(None, description="V cache type (--cache-type-v); quantized needs "
                                                             "flash attention.")
    flash_attn: Literal["on", "off", "auto"] | None = None
    draft_model: str | None = Field(None, min_length=1,
                                    description="Draft model for speculative decoding: a GGUF file, a Hugging Face "
                                                "directory (converted to F16 GGUF), or derived:<FORMAT> (the model's "
                                                "own GGUF in that format, e.g. derived:Q4_K_M).")
    draft_max: int | None = Field(None, gt=0, le=64, description="Most tokens drafted per step (--spec-draft-n-max).")
    draft_min: int | None = Field(None, ge=0, le=64, description="Fewest tokens drafted (--spec-draft-n-min).")
    cache_reuse: int | None = Field(None, ge=0,
                                    description="Smallest chunk reused from a slot's cache by KV shifting "
                                                "(--cache-reuse).")
    threads: int | None = Field(None, gt=0, description="Threads generating (--threads).")
    threads_batch: int | None = Field(None, gt=0, description="Threads processing prompts (--threads-batch).")
    extra_args: list[str] = Field(default_factory=list, description="Passed to llama-server verbatim, last.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment for the server.")

    @model_validator(mode="after")
    def _check(self) -> LlamaCppConfig:
        if self.cache_type_v in QUANTIZED_CACHE and self.flash_attn == "off":
            raise ValueError(f"a quantized V cache (cache_type_v={self.cache_type_v}) needs flash attention; "
                             f"flash_attn='off' refuses it")
        if self.draft_model is None and (self.draft_max is not None or self.draft_min is not None):
            raise ValueError("draft_max/draft_min only apply with a draft_model")
        if self.draft_max is not None and self.draft_min is not None and self.draft_min > self.draft_max:
            raise ValueError(f"`draft_min <= draft_max` must hold, but got ({self.draft_min}, {self.draft_max})")
        if self.batch_size is not None and self.ubatch_size is not None and self.ubatch_size > self.batch_size:
            raise ValueError(f"`ubatch_size <= batch_size` must hold, but got ({self.ubatch_size}, {self.batch_size})")
        return self

    def name(self) -> str:
        return self.served_model_name or Path(self.model).name

    def gpus(self) -> int:
        """One replica: llama-server on this machine's CPU (or one GPU)."""
        return 1

    def speculation(self) -> str:
        """"draft_model" with a draft, else "none" (the only method tracetune runs on llama.cpp)."""
        return "none" if self.draft_model is None else "draft_model"

    def weights_file(self) -> Path:
        """The GGUF it serves: the explicit one, or where the model's `weights` GGUF is cached."""
        return Path(self.gguf) if self.gguf is not None else gguf_path(self.model, self.weights)
