"""GGUF weights made from the user's model (a Hugging Face directory), once, and cached.

F16 and BF16 come from llama.cpp's own converter (`convert_hf_to_gguf.py`, ~12 s for the bundled
135M model); Q8_0, Q6_K, Q5_K_M and Q4_K_M from `llama-quantize` applied to the F16 file (~1 s
each). Files are cached under `$TRACETUNE_HOME/gguf/`, keyed by the source weights' digest, the
format and the llama.cpp build, and written atomically under a file lock like the quantized
checkpoints (`vllm/quantize.py`): a killed conversion never leaves a file that later loads. What the
converter and quantizer print goes to a log beside the file; progress lines go to `progress`.

A GGUF file the user names (`--gguf`) is checked before anything starts (`check_gguf_file`), and its
metadata read without loading it (`gguf_metadata`).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tracetune.engine_adapter.kind import Progress
from tracetune.engine_adapter.llamacpp.binaries import build_label, llamacpp_dir, tool
from tracetune.engine_adapter.models import check_model_dir, tracetune_home, weights_digest
from tracetune.errors import InputError, ModelError

# Weight formats tracetune makes: the converter's (unquantized) and llama-quantize's (from F16).
CONVERTED = ("F16", "BF16")
QUANTIZED = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M")
FORMATS = CONVERTED + QUANTIZED
# What llama-server's /props says of a file of each format (`model_ftype`).
FTYPE_NAMES = {"F16": "F16", "BF16": "BF16", "Q8_0": "Q8_0", "Q6_K": "Q6_K", "Q5_K_M": "Q5_K - Medium",
               "Q4_K_M": "Q4_K - Medium"}
MAGIC = b"GGUF"  # the first four bytes of every GGUF file


def check_gguf_file(path: Path, flag: str = "--gguf") -> Path:
    """`path` as a GGUF file to serve: a regular file that can be read and starts with GGUF's magic
    bytes; an InputError naming `flag` and what is wrong otherwise (llama-server would only say so
    once started)."""
    path = Path(path)
    fix = f"name a .gguf file, or leave {flag} out to serve weights made from --model"
    if not path.exists():
        raise InputError(f"{flag} {path}: no such file; {fix}")
    if path.is_dir():
        raise InputError(f"{flag} {path}: is a folder, not a GGUF file; {fix}")
    if not path.is_file():  # a device, a pipe or a socket: reading one may never end
        raise InputError(f"{flag} {path}: is not a regular file; {fix}")
    try:
        with open(path, "rb") as f:
            head = f.read(len(MAGIC))
    except OSError as exc:
        raise InputError(f"{flag} {path}: cannot be read ({exc.strerror or exc})") from None
    if not head:
        raise InputError(f"{flag} {path}: is empty, not a GGUF file; {fix}")
    if head != MAGIC:
        raise InputError(f"{flag} {path}: not a GGUF file (it starts with {head!r}, not {MAGIC!r}); {fix}")
    return path


def gguf_metadata(path: Path) -> dict[str, int | float | str]:
    """The metadata of GGUF file `path` that is one number or string (arrays, such as its vocabulary,
    left out), read with the gguf package without loading the weights; empty where it cannot be read."""
    try:
        import gguf

        fields = gguf.GGUFReader(str(path)).fields
        return {name: value for name, field in fields.items()
                if field.types and field.types[0] != gguf.GGUFValueType.ARRAY
                and isinstance(value := field.contents(), int | float | str)}
    except Exception:  # a header the package cannot read (a newer version, a cut file): nothing known
        return {}


def gguf_path(model_dir: Path, weights: str) -> Path:
    """Where the `weights` GGUF of `model_dir` is cached (made or not)."""
    model_dir = Path(model_dir)
    key = weights_digest(model_dir, "gguf", weights, build_label())
    return tracetune_home() / "gguf" / f"{model_dir.name}-{weights}-{key[:12]}.gguf"


def _run(argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
    with open(log, "ab") as out:
        out.write(("$ " + " ".join(argv) + "\n").encode())
        out.flush()
        code = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise ModelError(f"{Path(argv[1] if argv[0] == sys.executable else argv[0]).name} failed "
                         f"(exit code {code}; log {log}):\n{tail}")


def _convert(model_dir: Path, weights: str, out: Path, log: Path) -> None:
    home = llamacpp_dir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(home / "gguf-py"), str(home)])}
    _run([sys.executable, str(home / "convert_hf_to_gguf.py"), str(model_dir), "--outtype", weights.lower(),
          "--outfile", str(out)], log, env)


def gguf_checkpoint(model_dir: Path, weights: str, progress: Progress = lambda m: None) -> Path:
    """The cached `weights` GGUF of `model_dir` (a Hugging Face directory), made on first use."""
    if weights not in FORMATS:
        raise ModelError(f"unknown GGUF weight format {weights!r}; tracetune makes {', '.join(FORMATS)}")
    model_dir = check_model_dir(model_dir)
    final = gguf_path(model_dir, weights)
    if final.is_file():
        return final
    source = gguf_checkpoint(model_dir, "F16", progress) if weights in QUANTIZED else None
    final.parent.mkdir(parents=True, exist_ok=True)
    log = final.with_suffix(".log")
    with open(final.parent / (final.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be making it right now
        if final.is_file():
            return final
        how = "llama.cpp's converter" if source is None else "llama-quantize"
        progress(f"making {weights} GGUF weights of {model_dir.name} with {how} (once)")
        fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=".partial-", suffix=".gguf")
        os.close(fd)
        try:
            if source is None:
                _convert(model_dir, weights, Path(tmp), log)
            else:
                _run([str(tool("llama-quantize")), str(source), tmp, weights], log)
            os.replace(tmp, final)  # atomic on one filesystem
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    progress(f"{weights} GGUF ready: {final}")
    return final
