"""llama.cpp's server (`llama-server`), the CPU engine beside vLLM: where its build is
(`binaries.py`, made by scripts/install_llamacpp.sh), GGUF weights made from the model
(`gguf.py`), its settings (`config.py`), those a command line gives checked before anything starts
(`given.py`), command line and managed server (`server.py`), every setting checked as
applied once it serves (`verify.py`), its flags and knobs described once (`settings.py`), and
search-space values turned into settings with its defaults as reference (`translate.py`). Its
counters' names are in `engine_adapter/metrics.py`. Other packages reach it through its
`EngineKind` (`engine_adapter.registry.engine_kind("llamacpp")`); imports stay lazy here."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from tracetune.engine_adapter.kind import EngineKind, QualityIdentity


def kind() -> EngineKind:
    """llama.cpp's `EngineKind`."""
    from tracetune.engine_adapter.kind import EngineKind
    from tracetune.engine_adapter.llamacpp.binaries import SERVER_IMAGE_TAG, unavailable
    from tracetune.engine_adapter.llamacpp.deploy import DEPLOYMENT
    from tracetune.engine_adapter.llamacpp.gguf import gguf_checkpoint
    from tracetune.engine_adapter.llamacpp.given import DEFAULT_SLOTS, check_given
    from tracetune.engine_adapter.llamacpp.presets import DEFAULT_LIKE, presets
    from tracetune.engine_adapter.llamacpp.server import (
        API_KEY_ENV,
        LlamaCppConfig,
        build_command,
        given_api_key,
        make_server,
        relocated,
    )
    from tracetune.engine_adapter.llamacpp.settings import FLAGS, KNOBS, config_diff
    from tracetune.engine_adapter.llamacpp.translate import (
        prepared,
        reference_config,
        to_engine_config,
        unrunnable_choices,
    )

    return EngineKind("llamacpp", LlamaCppConfig, make_server, build_command, translate=to_engine_config,
                      reference=reference_config, unrunnable=unrunnable_choices, knobs=KNOBS, relocate=relocated,
                      label="llama.cpp", flags=FLAGS, prepare=prepared, check_given=check_given,
                      make_checkpoint=gguf_checkpoint, api_key_env=API_KEY_ENV, given_api_key=given_api_key,
                      config_diff=config_diff, image="ghcr.io/ggml-org/llama.cpp", image_version=SERVER_IMAGE_TAG,
                      deployment=DEPLOYMENT, available=unavailable,
                      slots=lambda c: cast(LlamaCppConfig, c).parallel or DEFAULT_SLOTS, quality=_quality(),
                      default_like=DEFAULT_LIKE, presets=presets)


# What its output quality depends on: the GGUF weights (format or file), the K and V cache types (f16
# is the default), flash attention, its draft (lossless) and unknown arguments; slots, context, batch
# sizes, cache reuse and threads are scheduling.
def _quality() -> QualityIdentity:
    from tracetune.engine_adapter.kind import QualityIdentity

    return QualityIdentity(settings=("model", "weights", "gguf", "cache_type_k", "cache_type_v", "flash_attn",
                                     "draft_model", "extra_args"), lossless=("draft_model",), unset=("auto", "f16"))
