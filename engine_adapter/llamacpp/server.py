"""llama.cpp's server (`llama-server`) as an `Engine`: typed config -> argv -> managed process.

A setting left at None is not passed, so llama-server's own default applies: the empty config is
"llama.cpp's defaults" on F16 weights made from the model. Two things tracetune always sets, for
measuring: `--metrics` (its counters), `--slots` with a `--slot-save-path` (so every slot's cache
can be erased before a phase), and `--cache-ram 0` (llama-server otherwise keeps idle slots'
prompts in a host-memory cache that no endpoint can empty, so a capacity search, which replays the
same requests at every level, would hit prompts the previous level left). Its log is written at
verbosity 4, where llama.cpp states what it applied (`verify.py` checks every knob against it).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from tracetune.engine_adapter.llamacpp.binaries import llamacpp_dir, tool
from tracetune.engine_adapter.llamacpp.config import DERIVED_PREFIX, QUANTIZED_CACHE, LlamaCppConfig
from tracetune.engine_adapter.llamacpp.gguf import FORMATS, gguf_checkpoint, gguf_path
from tracetune.engine_adapter.llamacpp.verify import unapplied
from tracetune.engine_adapter.managed import ManagedServer
from tracetune.engine_adapter.platform import Platform, cpu_flags
from tracetune.errors import EngineError, InputError

if TYPE_CHECKING:
    from tracetune.engine_adapter.config import EngineConfig

API_KEY_ENV = "LLAMA_API_KEY"
LOG_VERBOSITY = "4"  # llama.cpp states the context it built (KV types, flash attention, batch) from 4 up
# On a CPU with AMX the build's AMX kernels take every quantized weight (Q8_0, Q4_0, Q4_K_M, ...):
# there llama-server b11312 died of a segmentation fault in ggml_backend_amx_mul_mat while warming
# up, whatever the slots, flash attention or micro-batch (measured on a 2-core Xeon with AMX; F16,
# which AMX does not take, served). `--no-repack` keeps weights out of the AMX and repacked
# buffers; the cause is not known (llama.cpp issue 20824 reports the same crash on one machine
# and not another), so it is set on every AMX CPU.
AMX_FLAG = "amx_int8"


def own(config: EngineConfig) -> LlamaCppConfig:
    """`config` as llama.cpp's settings; a TypeError for another engine's (a caller bug, not user input)."""
    if not isinstance(config, LlamaCppConfig):
        raise TypeError(f"llama.cpp was handed {type(config).__name__}, another engine's settings")
    return config


def derived_format(draft: str) -> str | None:
    """The weight format of a derived draft's name (derived:q4_k_m -> Q4_K_M), None for a path."""
    if not draft.startswith(DERIVED_PREFIX):
        return None
    return draft.removeprefix(DERIVED_PREFIX).upper()


def draft_file(config: LlamaCppConfig) -> Path | None:
    """The GGUF file of the config's draft (a derived one where it is cached, made or not)."""
    draft = config.draft_model
    if draft is None:
        return None
    fmt = derived_format(draft)
    if fmt is not None:
        return gguf_path(config.model, fmt)
    path = Path(draft)
    return gguf_path(path, "F16") if path.is_dir() else path


def given_api_key(config: EngineConfig) -> str | None:
    """The key `config` hands llama-server itself (`--engine-arg=--api-key=...` or its environment)."""
    config = own(config)
    extra = list(config.extra_args)
    for i, arg in enumerate(extra):
        if arg == "--api-key" and i + 1 < len(extra):
            return extra[i + 1]
        if arg.startswith("--api-key="):
            return arg.split("=", 1)[1]
    return config.env.get(API_KEY_ENV)


def relocated(config: EngineConfig, move: Callable[[str], str]) -> LlamaCppConfig:
    """`config` serving its GGUF (and draft GGUF) from `move(path)`, under the name measured."""
    config = own(config)
    # llama-server reads the GGUF files only; the model directory they were made from stays as measured.
    update: dict[str, object] = {"gguf": Path(move(str(config.weights_file()))), "served_model_name": config.name()}
    draft = draft_file(config)
    if draft is not None:
        update["draft_model"] = move(str(draft))
    return config.model_copy(update=update)


def build_command(config: EngineConfig, platform: Platform, *, host: str = "127.0.0.1", port: int = 8000,
                  python: str = "", slot_dir: Path | None = None) -> tuple[list[str], dict[str, str]]:
    """llama-server's argv for `config` and the environment it needs (on top of the parent's).
    `slot_dir`: where slot actions may write (tracetune's own runs: erasing slots needs it). The
    program is the cached build's, or plain `llama-server` where none is built (an export)."""
    config = own(config)
    try:
        server = str(tool("llama-server"))
    except InputError:
        server = "llama-server"
    argv = [server, "--model", str(config.weights_file()), "--host", host, "--port", str(port),
            "--alias", config.name(), "--metrics", "--slots", "--cache-ram", "0", "--log-verbosity", LOG_VERBOSITY]
    if slot_dir is not None:
        argv.extend(["--slot-save-path", str(slot_dir)])

    def flag(name: str, value: object) -> None:
        if value is not None:
            argv.extend([name, str(value)])

    flag("--parallel", config.parallel)
    flag("--ctx-size", config.ctx_size)
    flag("--batch-size", config.batch_size)
    flag("--ubatch-size", config.ubatch_size)
    flag("--cache-type-k", config.cache_type_k)
    flag("--cache-type-v", config.cache_type_v)
    flag("--flash-attn", config.flash_attn)
    draft = draft_file(config)
    if draft is not None:
        # Without --spec-type llama-server loads the draft model and never drafts with it (measured).
        argv.extend(["--spec-type", "draft-simple", "--model-draft", str(draft)])
    flag("--spec-draft-n-max", config.draft_max)
    flag("--spec-draft-n-min", config.draft_min)
    flag("--cache-reuse", config.cache_reuse)
    flag("--threads", config.threads)
    flag("--threads-batch", config.threads_batch)
    if platform == Platform.CPU and AMX_FLAG in cpu_flags():
        argv.append("--no-repack")
    argv.extend(config.extra_args)
    return argv, dict(config.env)


def made_ready(config: LlamaCppConfig, progress: Callable[[str], None] = lambda m: None) -> None:
    """Make the GGUF files `config` serves (weights and a derived or converted draft) when missing."""
    if config.gguf is None:
        gguf_checkpoint(config.model, config.weights, progress)
    elif not Path(config.gguf).is_file():
        raise EngineError(f"GGUF file {config.gguf} does not exist")
    draft = config.draft_model
    if draft is not None:
        fmt = derived_format(draft)
        if fmt is not None:
            gguf_checkpoint(config.model, fmt, progress)
        elif Path(draft).is_dir():
            gguf_checkpoint(Path(draft), "F16", progress)
        elif not Path(draft).is_file():
            raise EngineError(f"draft model {draft} does not exist")


class LlamaServer(ManagedServer[LlamaCppConfig]):
    """A llama-server process managed by tracetune."""

    name = "llamacpp"
    quality_probe = True  # by forced tokens: it returns no prompt log-probabilities (`engine_adapter.scoring`)
    scoring = "forced_tokens"
    shown = "llama-server"
    already_running = "this LlamaServer is already running"
    never_started = "llama-server was never started"
    started_but = "llama-server started but did not apply its settings: "
    port_taken = "bind"
    start_timeout_s = 300.0

    def __init__(self, run_dir: Path, *, host: str = "127.0.0.1", port: int | None = None,
                 platform: Platform | None = None, env: Mapping[str, str] | None = None) -> None:
        super().__init__(run_dir, host=host, port=port, env=env)
        self.platform = platform or Platform.CPU

    def settings(self, config: EngineConfig) -> LlamaCppConfig:
        return own(config)

    def prepare(self, config: LlamaCppConfig) -> None:
        llamacpp_dir()  # InputError saying how to build it, before anything is made
        made_ready(config)

    def command(self, config: LlamaCppConfig, port: int, start: int) -> tuple[list[str], dict[str, str]]:
        slot_dir = self.run_dir / f"llamacpp-slots-{start}-{port}"
        slot_dir.mkdir(parents=True, exist_ok=True)
        return build_command(config, self.platform, host=self.host, port=port, slot_dir=slot_dir)

    def headers(self, config: LlamaCppConfig) -> dict[str, str]:
        key = given_api_key(config) or self.env.get(API_KEY_ENV) or os.environ.get(API_KEY_ENV)
        return {"Authorization": f"Bearer {key}"} if key else {}

    def started_problems(self, config: LlamaCppConfig) -> list[str]:
        return unapplied(config, self._json("/props"), self._json("/slots"), self.log_text())

    def _json(self, path: str) -> object:
        response = self.get(path)
        if response.status_code != 200:
            raise EngineError(f"GET {path} answered HTTP {response.status_code}: {response.text[:300]}")
        return response.json()

    def reset_prefix_cache(self) -> None:
        """Erase every slot's cached prompt (POST /slots/{id}?action=erase)."""
        ep = self._require_endpoint()
        slots = self._json("/slots")
        ids = [s["id"] for s in slots if isinstance(s, dict) and "id" in s] if isinstance(slots, list) else []
        for slot in ids:
            try:
                response = httpx.post(f"{ep.base_url}/slots/{slot}", params={"action": "erase"},
                                      headers=ep.headers, timeout=30)
            except httpx.HTTPError as exc:
                raise EngineError(f"POST /slots/{slot}?action=erase failed: {exc}") from exc
            if response.status_code != 200:
                raise EngineError(f"POST /slots/{slot}?action=erase answered HTTP {response.status_code}: "
                                  f"{response.text[:300]}")


def make_server(run_dir: Path | None = None, *, platform: Platform | None = None,
                port: int | None = None, env: Mapping[str, str] | None = None) -> LlamaServer:
    """A not yet started llama-server logging under `run_dir` (the registry's factory)."""
    if run_dir is None:
        raise EngineError("a llama-server needs a run directory for its logs")
    return LlamaServer(run_dir, platform=platform, port=port, env=env)


__all__ = ["DERIVED_PREFIX", "FORMATS", "QUANTIZED_CACHE", "LlamaCppConfig", "LlamaServer", "build_command",
           "given_api_key", "make_server", "relocated"]
