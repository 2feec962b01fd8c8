"""Inference engines tracetune can start, measure and stop: the `Engine` contract (`base.py`), the
lifecycle of every server it starts (`managed.py`), the engine seam as typed parts (`kind.py`:
`EngineKind`), the engines by name (`registry.py`), vLLM (`vllm/`: settings, command, knob table,
translation, reference, quantized checkpoints; its counters in `metrics.py`), a running
OpenAI-compatible endpoint (`openai_endpoint.py`), and the HTTP client every engine is measured with
(`http_stream.py`, `openai_client.py`). Imports are lazy:
this package is also imported by the engine watchdog (`engine_adapter._guard`), which must start
instantly."""
