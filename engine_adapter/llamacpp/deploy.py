"""How an export runs llama.cpp's server (`EngineKind.deployment`): the official server image
(ghcr.io/ggml-org/llama.cpp:server-b<N>, whose ENTRYPOINT is /app/llama-server and which holds curl
for its health check) on the CPU, serving GGUF files; and how those files are made again from the
model where tracetune made them (`remade`), since the deployment host needs them.

What only tracetune's measurements pass is left out: `--slots` (an endpoint that shows every
slot's prompt), `--slot-save-path` and the debug log level `verify.py` reads. `--metrics` and
`--cache-ram 0` stay: the counters serve a deployment too, and the host-memory prompt cache was
off in every measurement (on, it takes up to 8 GiB more memory)."""

from __future__ import annotations

import shlex
from pathlib import Path

from tracetune.engine_adapter.kind import Deployment, EngineConfig
from tracetune.engine_adapter.llamacpp.binaries import SERVER_IMAGE_TAG
from tracetune.engine_adapter.llamacpp.gguf import QUANTIZED, gguf_path
from tracetune.engine_adapter.llamacpp.server import derived_format, own

# The llama.cpp release the image runs, as its git tag (server-b11312 -> b11312).
RELEASE = SERVER_IMAGE_TAG.removeprefix("server-")


def _made(path: Path, source: Path, weights: str) -> str:
    """How `path` (the `weights` GGUF of the model directory `source`) is made again."""
    f16 = gguf_path(source, "F16") if weights in QUANTIZED else path
    outtype = "f16" if weights in QUANTIZED else weights.lower()
    steps = [["python", "convert_hf_to_gguf.py", str(source), "--outtype", outtype, "--outfile", f16.name]]
    if weights in QUANTIZED:
        steps.append(["llama-quantize", f16.name, path.name, weights])
    how = "llama.cpp's converter" + (" and llama-quantize" if weights in QUANTIZED else "")
    return (f"GGUF file {path.name}: {weights} weights tracetune made from {source} with {how}; to make it again "
            f"on another machine, in a llama.cpp checkout of tag {RELEASE} (its convert_hf_to_gguf.py and a build "
            f"of llama-quantize): " + " && ".join(shlex.join(step) for step in steps))


def remade(config: EngineConfig) -> list[str]:
    """For each GGUF file `config` serves that tracetune made (the weights, a derived or converted
    draft), where it came from and the commands that make it again; nothing for a file the user gave."""
    config = own(config)
    lines = []
    if config.gguf is None:
        lines.append(_made(config.weights_file(), Path(config.model), config.weights))
    draft = config.draft_model
    if draft is not None:
        fmt = derived_format(draft)
        if fmt is not None:
            lines.append(_made(gguf_path(config.model, fmt), Path(config.model), fmt))
        elif Path(draft).is_dir():
            lines.append(_made(gguf_path(Path(draft), "F16"), Path(draft), "F16"))
    return lines


DEPLOYMENT = Deployment(
    program=("llama-server",),
    entrypoint=("/app/llama-server",),  # the server image's ENTRYPOINT (.devops/cpu.Dockerfile, target server)
    launcher=1,  # build_command's argv starts with the server binary
    container="llama-server",
    name_flag="--alias",
    tag="{version}",  # image_version is the whole tag, server-b<N>
    platform="cpu",
    health=("CMD", "curl", "-f", "http://localhost:{port}/health"),  # the image installs curl for its own check
    weight_files=True,
    measurement_args={"--slots": 0, "--slot-save-path": 1, "--log-verbosity": 1},
    remake=remade,
)
