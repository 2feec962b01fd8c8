"""vLLM, the engine tracetune starts and tunes: its settings and command line per platform
(`server.py`: `VLLMConfig`, `build_command`, `VLLMServer` and the checks on its log), the
search-space knobs it understands (`knobs.py`), search-space values turned into settings and its
defaults as the reference config (`translate.py`), quantized checkpoints it can load
(`quantize.py`). Its counters' names are in `engine_adapter/metrics.py`. Other packages reach all
of this through its `EngineKind` (`engine_adapter.registry.engine_kind("vllm")`)."""
