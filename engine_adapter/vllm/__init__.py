"""vLLM, the engine tracetune starts and tunes: its settings and command line per platform
(`server.py`: `VLLMConfig`, `build_command`, `VLLMServer` and the checks on its log), the
command-line flags and search-space knobs that reach those settings, described once
(`settings.py`, with how one stored config differs from another), search-space values turned into
settings, its defaults as the reference config and a config made ready to start (`translate.py`),
draft models (`draft.py`) and quantized checkpoints it can load (`quantize.py`). Its counters'
names are in `engine_adapter/metrics.py`. Other packages reach all of this through its
`EngineKind` (`engine_adapter.registry.engine_kind("vllm")`)."""
