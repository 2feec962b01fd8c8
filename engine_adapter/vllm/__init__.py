"""vLLM, the engine tracetune starts and tunes: its settings and command line per platform
(`server.py`: `VLLMConfig`, `build_command`, `VLLMServer` and the checks on its log), search-space
values turned into settings (`translate.py`), quantized checkpoints it can load (`quantize.py`).
Its counters' names are in `engine_adapter/metrics.py`, its serve command for export in
`dashboard/export.py` (through `build_command`)."""
